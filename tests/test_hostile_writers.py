"""Writers against every input and temporaries only we can match (issue 33, items 1 and 2): each writer's output is
checked against every file its command read (all shards of a split model, the imatrix, rule files, texts, KLD
bases), hard links and symlinks included; cleanup removes only names carrying our marker and a live-PID check
that cannot overflow; a missing output folder is refused, not created.

Every file is made here (gguf-py's writer via tests/test_bump.write_model, then split with our splitter)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantscope.core import fsutil
from quantscope.core.fsutil import OutputSet, PathRefused, write_atomic
from quantscope.core.gguf.split import split_gguf

from .test_bump import write_model

CLI = [sys.executable, "-m", "quantscope.cli"]
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "QT_QPA_PLATFORM": "offscreen"}


def run_cli(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=ENV)


def one_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode != 0, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("quantscope: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def snapshot(d: Path) -> dict[str, str]:
    return {p.name: digest(p) if p.is_file() and not p.is_symlink() else "" for p in d.iterdir()}


# ------------------------------------------------------------------------------------------- item 1: temporaries
USER_NAMES = [".bashrc.bak-20240101-1", ".zshrc.bak-20240101120000-1", ".notes.tmp-1-1", ".x.tmp-999999-0",
              ".m.json.tmp-99999-3", ".m.json.bak-1-99999999999999999999999999"]


@pytest.mark.parametrize("how", ["write_atomic", "export"])
def test_user_files_shaped_like_the_old_temporaries_survive(tmp_path: Path, how: str) -> None:
    """`.bashrc.bak-20240101-1` and friends are a user's files: no writer removes them, and a "PID" too large for
    os.kill (`.zshrc.bak-20240101120000-1`) does not make the write fail."""
    for n in USER_NAMES:
        (tmp_path / n).write_text(f"user file {n}")
    before = snapshot(tmp_path)
    if how == "write_atomic":
        write_atomic(tmp_path / "m.json", "{}")
    else:
        src = write_model(tmp_path.parent / f"{tmp_path.name}-m.gguf")
        proc = run_cli("export", src, "--metadata", "-o", tmp_path / "m.json")
        assert proc.returncode == 0, proc.stderr
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k != "m.json"} == before and "m.json" in after


def test_our_temporaries_carry_a_marker_and_a_random_token(tmp_path: Path) -> None:
    a, b = fsutil.temp_name(tmp_path / "x.gguf"), fsutil.temp_name(tmp_path / "x.gguf")
    assert a != b and a.name.startswith(".x.gguf.quantscope-tmp-") and a.parent == tmp_path
    assert fsutil._TEMP_RE.match(a.name) and not fsutil.is_stale_temp(a.name)  # ours, but this process lives
    assert not any(fsutil._TEMP_RE.match(n) for n in USER_NAMES)


@pytest.mark.parametrize("name", [".zshrc.quantscope-tmp-9999999999-0123456789ab", "\udcff\udcfe.bin",
                                  ".a.quantscope-tmp-0-0123456789ab", "x" * 255])
def test_odd_names_in_the_folder_never_break_a_write(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"odd")
    write_atomic(tmp_path / "out.txt", "ok")
    assert (tmp_path / name).read_bytes() == b"odd" and (tmp_path / "out.txt").read_text() == "ok"


def test_a_long_output_name_still_gets_a_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without O_TMPFILE the named temporary of a 250-character name must still fit in NAME_MAX."""
    monkeypatch.delattr(os, "O_TMPFILE", raising=False)
    out = tmp_path / ("n" * 250)
    write_atomic(out, "ok")
    assert out.read_text() == "ok" and sorted(os.listdir(tmp_path)) == [out.name]


# ------------------------------------------------------------------------------------ item 8: no silent mkdir
def test_a_missing_output_folder_is_refused_not_created(tmp_path: Path) -> None:
    with pytest.raises(PathRefused, match="does not exist"):
        write_atomic(tmp_path / "no" / "such" / "m.json", "{}")
    assert list(tmp_path.iterdir()) == []
    src = write_model(tmp_path / "m.gguf")
    one_error(run_cli("export", src, "--metadata", "-o", tmp_path / "sub" / "m.json"), "does not exist")
    assert sorted(os.listdir(tmp_path)) == ["m.gguf"]


# --------------------------------------------------------------------------------- item 2: one input set per verb
@pytest.fixture(scope="module")
def split_model(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("split")
    src = write_model(d / "whole.gguf")
    plan = split_gguf(src, d / "m", max_tensors=4)
    src.unlink()
    shards = [s.path for s in plan.shards]
    assert len(shards) >= 3
    return shards


@pytest.fixture
def shards(split_model: list[Path], tmp_path: Path) -> list[Path]:
    out = []
    for p in split_model:
        q = tmp_path / p.name
        q.write_bytes(p.read_bytes())
        out.append(q)
    return out


def _check_untouched(folder: Path, before: dict[str, str]) -> None:
    assert snapshot(folder) == before


@pytest.mark.parametrize("target", ["shard2", "hardlink", "symlink"])
def test_export_refuses_any_shard_of_its_model(shards: list[Path], tmp_path: Path, target: str) -> None:
    out = shards[1]
    if target == "hardlink":
        out = tmp_path / "hl.json"
        os.link(shards[2], out)
    elif target == "symlink":
        out = tmp_path / "sl.json"
        out.symlink_to(shards[-1])
    before = snapshot(tmp_path)
    one_error(run_cli("export", shards[0], "--metadata", "-o", out), "is the input file")
    _check_untouched(tmp_path, before)


def test_imatrix_output_refuses_any_shard(shards: list[Path], tmp_path: Path) -> None:
    before = snapshot(tmp_path)
    one_error(run_cli("imatrix", shards[0], "-p", "hello world", "-o", shards[1]), "is the input file")
    _check_untouched(tmp_path, before)


def test_kld_base_refuses_any_shard(shards: list[Path], tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 10)
    before = snapshot(tmp_path)
    one_error(run_cli("perplexity", shards[0], "-f", text, "--kl-divergence-base", shards[2]), "is the input file")
    one_error(run_cli("perplexity", shards[0], "-f", text, "--kl-divergence-base", text), "is the input file")
    _check_untouched(tmp_path, before)


def test_screenshot_refuses_any_shard(shards: list[Path], tmp_path: Path) -> None:
    before = snapshot(tmp_path)
    r = run_cli(shards[0], "--screenshot", shards[1])
    assert r.returncode != 0 and "is the input file" in r.stderr, r.stderr
    _check_untouched(tmp_path, before)


@pytest.mark.parametrize("which", ["imatrix", "tensor-type-file"])
def test_quantize_refuses_its_own_imatrix_or_rule_file(tmp_path: Path, which: str) -> None:
    import numpy as np

    from quantscope.core.quant.imatrix import Imatrix, ImatrixEntry, write_imatrix

    src = write_model(tmp_path / "m.gguf", types={k: "F32" for k in ("embd", "q", "k", "v", "o", "gate", "up",
                                                                     "down")})
    im = tmp_path / "im.gguf"
    write_imatrix(Imatrix(im, {"blk.0.attn_q.weight": ImatrixEntry(np.ones(256, np.float32),
                                                                   np.ones(1, np.int64))}, ["x"], 1, 16), im)
    rules = tmp_path / "rules.txt"
    rules.write_text("attn_q=Q8_0\n")
    out = im if which == "imatrix" else rules
    before = snapshot(tmp_path)
    one_error(run_cli("quantize", src, out, "Q8_0", "--imatrix", im, "--tensor-type-file", rules),
              "is the input file")
    _check_untouched(tmp_path, before)


def test_the_input_scope_collects_what_a_command_read(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("a")
    os.link(a, b)
    with fsutil.input_scope():
        fsutil.check_input(a)
        with pytest.raises(PathRefused, match="is the input file"):
            OutputSet([("-o", b)])  # a hard link of something the command read
        assert fsutil.scope_inputs() == [str(a)]
    OutputSet([("-o", b)])  # outside the scope nothing is remembered
    assert fsutil.scope_inputs() == []


# ------------------------------------------------------------------------- item 7: perplexity -f's input checks
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder", "too-big", "not-utf8"])
@pytest.mark.parametrize("verb", [["perplexity", "{m}", "-f", "{t}"], ["imatrix", "{m}", "-f", "{t}"],
                                  ["compare", "{m}", "{m}", "-f", "{t}"],
                                  ["quantize", "{m}", "{o}", "Q8_0", "--tensor-type-file", "{t}"]])
def test_every_text_input_is_checked(tmp_path: Path, kind: str, verb: list[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO, /dev/zero, a folder, an oversized or non-UTF-8 file given as the text: one line, at once."""
    m = write_model(tmp_path / "m.gguf")
    t = {"fifo": tmp_path / "t.fifo", "dev-zero": Path("/dev/zero"), "folder": tmp_path,
         "too-big": tmp_path / "big.txt", "not-utf8": tmp_path / "bad.txt"}[kind]
    if kind == "fifo":
        os.mkfifo(t)
    elif kind == "too-big":
        with open(t, "wb") as fh:
            fh.truncate(fsutil.MAX_TEXT_BYTES + 1)  # sparse: no disk used
    elif kind == "not-utf8":
        t.write_bytes(b"caf\xe9\n")
    before = snapshot(tmp_path)
    argv = [a.format(m=m, t=t, o=tmp_path / "o.gguf") for a in verb]
    line = one_error(run_cli(*argv, timeout=60))
    assert {"fifo": "FIFO", "dev-zero": "character device", "folder": "directory", "too-big": "at most",
            "not-utf8": "not UTF-8"}[kind] in line
    _check_untouched(tmp_path, before)


def test_a_broken_cache_file_is_remade_inside_a_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        model_path) -> None:
    """The input set must not stop a cache from replacing its own broken file (read to see it is broken)."""
    from quantscope.core import synthetic as S

    smol = model_path("smollm2")
    monkeypatch.setenv("QUANTSCOPE_MODELS", str(tmp_path))
    target = S.synthetic_path("tiny")
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF, cut short")
    with fsutil.input_scope():
        assert S.ensure_synthetic("tiny", vocab_source=smol) == target
    assert S.is_complete(target, "tiny", 0)
