"""Hostile paths and files (issue 12, items 2, 4, 5, 7): outputs aliasing inputs or each other, non-regular
outputs and inputs (FIFOs, devices, directories), all-or-nothing writes, kill -9 debris and stale temporaries,
hostile bump headers, header fields outside the checksum, control characters on the terminal and strict JSON.

Every file is made here (gguf-py's GGUFWriter, byte edits, mkfifo/mknod in tmp_path); each case asserts the clean
outcome: the exception and its message, or the exit status and the single ``quantscope: error: …`` line, the
input unchanged and nothing left behind.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import stat
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

from quantscope.core import fsutil
from quantscope.core.bump import BumpError, BumpWriteError, ConvertJob, is_bump, open_bump, verify_against
from quantscope.core.fsutil import OutputSet, PathRefused, json_safe, open_input, printable, write_atomic
from quantscope.core.gguf import GGUFError, GGUFFile

from .test_bump import write_model

CLI = [sys.executable, "-m", "quantscope.cli"]


def run_cli(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``timeout``: a hang guard (a read blocked on a FIFO), never a measure: a loaded machine starts Python slowly."""
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


def assert_one_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2 and exactly one stderr line ``quantscope: error: …`` holding every needle; returns the line."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("quantscope: error: "), proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def listing(d: Path) -> list[str]:
    return sorted(os.listdir(d))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small llama GGUF (kept read-only in a module folder; tests copy or link it)."""
    return write_model(tmp_path_factory.mktemp("src") / "m.gguf")


@pytest.fixture
def src(model_file: Path, tmp_path: Path) -> Path:
    p = tmp_path / "a.gguf"
    p.write_bytes(model_file.read_bytes())
    return p


@pytest.fixture
def bump(model_file: Path, tmp_path: Path) -> Path:
    out = tmp_path / "b" / "w.bump"
    out.parent.mkdir()
    ConvertJob(model_file, out, config_path=out.with_name("config.json")).run()
    return out


# ---------------------------------------------------------------------------------------------- outputs: aliasing
@pytest.mark.parametrize("how", ["same", "hardlink", "symlink", "dotdot"])
def test_convert_output_that_is_the_input_is_refused(src: Path, tmp_path: Path, how: str) -> None:
    before = digest(src)
    out = {"same": src, "hardlink": tmp_path / "hl.bump", "symlink": tmp_path / "sl.bump",
           "dotdot": tmp_path / "x" / ".." / "a.gguf"}[how]
    if how == "hardlink":
        os.link(src, out)
    elif how == "symlink":
        out.symlink_to(src)
    elif how == "dotdot":
        (tmp_path / "x").mkdir()
    names = listing(tmp_path)
    proc = run_cli("convert", src, "-o", out)
    assert_one_error(proc, "-o", "is the input file")
    assert digest(src) == before and listing(tmp_path) == names
    with pytest.raises(PathRefused, match="is the input file"):
        ConvertJob(src, out).run()
    assert digest(src) == before and listing(tmp_path) == names


@pytest.mark.parametrize("flag", ["--config", "--manifest"])
def test_config_or_manifest_naming_the_input_is_refused(src: Path, tmp_path: Path, flag: str) -> None:
    before = digest(src)
    proc = run_cli("convert", src, "-o", tmp_path / "w.bump", flag, src)
    assert_one_error(proc, flag, "is the input file")
    assert digest(src) == before and listing(tmp_path) == ["a.gguf"]


@pytest.mark.parametrize("a,b", [("-o", "--manifest"), ("-o", "--config"), ("--config", "--manifest")])
def test_two_outputs_naming_one_file_are_refused(src: Path, tmp_path: Path, a: str, b: str) -> None:
    old = tmp_path / "old.bump"
    old.write_bytes(b"previous content")
    link = tmp_path / "link.json"
    os.link(old, link)  # the second output is a hard link of the first
    paths = {"-o": tmp_path / "w.bump", "--config": tmp_path / "c.json", "--manifest": tmp_path / "m.json"}
    paths[a] = old
    paths[b] = link
    names = listing(tmp_path)
    proc = run_cli("convert", src, *(x for k, v in paths.items() for x in (k, v)))
    assert_one_error(proc, "name the same file")
    assert old.read_bytes() == b"previous content" and listing(tmp_path) == names


def test_outputs_through_a_symlinked_folder_are_compared_by_real_path(src: Path, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    with pytest.raises(PathRefused, match="name the same file"):
        ConvertJob(src, tmp_path / "real" / "w.bump", manifest_path=tmp_path / "alias" / "w.bump").check()
    assert listing(tmp_path / "real") == []


# ---------------------------------------------------------------------------------------------- outputs: not files
def test_output_fifo_is_refused_and_left_a_fifo(src: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.bump"
    os.mkfifo(fifo)
    proc = run_cli("convert", src, "-o", fifo, timeout=120)  # writing into the FIFO would block: the guard
    assert_one_error(proc, "-o", "is a FIFO (named pipe)", "must be a regular file")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert listing(tmp_path) == ["a.gguf", "pipe.bump"]
    proc = run_cli("convert", src, "-o", tmp_path / "w.bump", "--config", fifo, timeout=120)
    assert_one_error(proc, "--config", "is a FIFO")
    assert listing(tmp_path) == ["a.gguf", "pipe.bump"]


def test_output_swapped_for_a_fifo_during_the_write_is_not_replaced(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "w.bump"

    def progress(p) -> None:  # type: ignore[no-untyped-def]
        if p.phase == "writing" and not out.exists():
            os.mkfifo(out)

    with pytest.raises(PathRefused, match="is a FIFO"):
        ConvertJob(src, out, chunk_bytes=4096).run(progress)
    assert stat.S_ISFIFO(os.stat(out).st_mode) and listing(tmp_path) == ["a.gguf", "w.bump"]


def test_output_directory_is_refused(src: Path, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert_one_error(run_cli("convert", src, "-o", tmp_path / "d"), "is a directory")
    assert listing(tmp_path / "d") == []


def test_output_char_device_is_refused_before_anything_opens_it(src: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    dev = tmp_path / "null"
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        dev = Path("/dev/null")  # refusal proven to come before any open for writing (the spy below)
    st = os.stat(dev)
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def spy(path, flags, *a, **k):  # type: ignore[no-untyped-def]
        opened.append((os.fspath(path), flags))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", spy)
    with pytest.raises(PathRefused, match="is a character device"):
        ConvertJob(src, dev).run()
    monkeypatch.undo()
    writes = [p for p, fl in opened if fl & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)]
    assert writes == [] and not any(os.path.realpath(p) == os.path.realpath(dev) for p, _ in opened)
    st2 = os.stat(dev)
    assert stat.S_ISCHR(st2.st_mode) and (st2.st_ino, st2.st_rdev) == (st.st_ino, st.st_rdev)
    assert_one_error(run_cli("convert", src, "-o", dev), "is a character device")
    assert stat.S_ISCHR(os.stat(dev).st_mode)


# ---------------------------------------------------------------------------------------------- all or nothing
def test_config_that_cannot_be_written_leaves_no_bump(src: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    proc = run_cli("convert", src, "-o", tmp_path / "w.bump", "--config", tmp_path / "file" / "config.json")
    assert_one_error(proc, "--config", "is not a directory")
    assert listing(tmp_path) == ["a.gguf", "file"]
    (tmp_path / "cfgdir").mkdir()
    proc = run_cli("convert", src, "-o", tmp_path / "w.bump", "--config", tmp_path / "cfgdir")
    assert_one_error(proc, "--config", "is a directory")
    assert listing(tmp_path) == ["a.gguf", "cfgdir", "file"] and listing(tmp_path / "cfgdir") == []


def test_temporary_that_cannot_be_created_fails_before_writing(src: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    real = OutputSet.open

    def refuse_config(self: OutputSet, label: str) -> int:
        if label == "config.json":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(self, label)

    monkeypatch.setattr(OutputSet, "open", refuse_config)
    with pytest.raises(BumpWriteError, match=r"Cannot write config.json .*Permission denied; nothing was written"):
        ConvertJob(src, tmp_path / "w.bump", config_path=tmp_path / "config.json").run()
    assert listing(tmp_path) == ["a.gguf"]


def test_a_failed_rename_keeps_every_old_file(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, cfg, man = tmp_path / "w.bump", tmp_path / "config.json", tmp_path / "manifest.json"
    for p in (out, cfg, man):
        p.write_text(f"old {p.name}")
    real_replace = os.replace

    def failing(a, b):  # type: ignore[no-untyped-def]
        if Path(b) == man:
            raise OSError(errno.EIO, "Input/output error", str(b))
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(BumpWriteError, match=r"Input/output error.*nothing was kept"):
        ConvertJob(src, out, config_path=cfg, manifest_path=man).run()
    monkeypatch.undo()
    assert [p.read_text() for p in (out, cfg, man)] == ["old w.bump", "old config.json", "old manifest.json"]
    assert listing(tmp_path) == ["a.gguf", "config.json", "manifest.json", "w.bump"]
    res = ConvertJob(src, out, config_path=cfg, manifest_path=man).run()  # and a good run replaces all three
    assert is_bump(out) and json.loads(cfg.read_text())["hidden_size"] == 256 and res.manifest_path == man
    assert listing(tmp_path) == ["a.gguf", "config.json", "manifest.json", "w.bump"]


def test_named_temporaries_when_o_tmpfile_is_missing(src: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open
    seen: list[str] = []

    def no_tmpfile(path, flags, *a, **k):  # type: ignore[no-untyped-def]
        if hasattr(os, "O_TMPFILE") and flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        if flags & os.O_CREAT:
            seen.append(Path(path).name)
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", no_tmpfile)
    ConvertJob(src, tmp_path / "w.bump", config_path=tmp_path / "config.json").run()
    assert seen and all(n.startswith((".w.bump.quantscope-tmp-", ".config.json.quantscope-tmp-")) for n in seen)
    assert listing(tmp_path) == ["a.gguf", "config.json", "w.bump"]


# ---------------------------------------------------------------------------------------------- kill -9, stale temps
def test_kill_9_mid_convert_leaves_no_debris(model_path, tmp_path: Path) -> None:
    src = model_path("qwen2.5-coder")
    out = tmp_path / "w.bump"
    proc = subprocess.Popen([*CLI, "convert", str(src), "-o", str(out), "--config", str(tmp_path / "c.json")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    started = False
    for line in proc.stderr:
        if line.startswith("convert:"):  # bytes are being written
            started = True
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert started and listing(tmp_path) == []


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_of_dead_processes_are_removed(src: Path, tmp_path: Path) -> None:
    dead = _dead_pid()
    tok = "0123456789ab"
    stale = [f".w.bump.quantscope-tmp-{dead}-{tok}", f".config.json.quantscope-tmp-{dead}-{tok}",
             f".w.bump.quantscope-bak-{dead}-{tok}"]
    live = f".w.bump.quantscope-tmp-{os.getppid()}-{tok}"  # a running process's temporary: kept
    other = [".w.bump.tmp", f"w.bump.quantscope-tmp-{dead}-{tok}", f".notes.quantscope-tmp-{dead}",
             f".w.bump.tmp-{dead}-3", f".w.bump.bak-{dead}-1"]  # not our marker: kept (the old pattern included)
    for n in [*stale, live, *other]:
        (tmp_path / n).write_bytes(b"x" * 100)
    (tmp_path / f".dir.quantscope-tmp-{dead}-{tok}").mkdir()  # our pattern but not a regular file: kept
    (tmp_path / f".link.quantscope-tmp-{dead}-{tok}").symlink_to(src)  # a symlink: kept, its target untouched
    proc = run_cli("convert", src, "-o", tmp_path / "w.bump")
    assert proc.returncode == 0, proc.stderr
    assert listing(tmp_path) == sorted(["a.gguf", "w.bump", live, *other, f".dir.quantscope-tmp-{dead}-{tok}",
                                        f".link.quantscope-tmp-{dead}-{tok}"])
    assert src.is_file() and fsutil.clean_stale_temps(tmp_path) == []


# ---------------------------------------------------------------------------------------------- non-regular inputs
@pytest.mark.parametrize("cmd", [
    ["inspect", "{x}"], ["inspect", "{x}", "--json"], ["tokenize", "{x}", "hello"], ["verify", "{x}"],
    ["dump-block", "{x}", "token_embd.weight"], ["convert", "{x}", "-o", "{tmp}/w.bump"],
    ["verify", "{bump}", "--against", "{x}"], ["generate", "{x}", "-p", "hi", "-n", "1"],
    ["chat", "{x}"], ["bench", "{x}", "-p", "4", "-n", "1"],
])
@pytest.mark.parametrize("kind", ["fifo", "dir", "chardev"])
def test_non_regular_inputs_are_refused_at_once(cmd: list[str], kind: str, tmp_path: Path, bump: Path) -> None:
    x = {"fifo": tmp_path / "pipe.gguf", "dir": tmp_path / "d.gguf", "chardev": Path("/dev/zero")}[kind]
    if kind == "fifo":
        os.mkfifo(x)
    elif kind == "dir":
        x.mkdir()
    words = {"fifo": "is a FIFO (named pipe), not a regular file", "dir": "is a directory",
             "chardev": "is a character device"}[kind]
    names = listing(tmp_path)
    # a FIFO nobody writes blocks its reader and /dev/zero never ends: the timeout is the hang guard
    proc = run_cli(*(a.format(x=x, tmp=tmp_path, bump=bump) for a in cmd), timeout=120)
    assert_one_error(proc, str(x), words)
    assert listing(tmp_path) == names


def test_core_readers_refuse_a_fifo_without_blocking(tmp_path: Path) -> None:
    from quantscope.gui.document import OpenError, open_document

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(GGUFError, match="is a FIFO"):
        GGUFFile(fifo)
    with pytest.raises(BumpError, match="is a FIFO"):
        open_bump(fifo)
    assert is_bump(fifo) is False
    with pytest.raises(OpenError, match="is not a regular file") as ei:
        open_document(fifo)
    assert "is a FIFO" in ei.value.detail
    with pytest.raises(BumpError, match="is a FIFO"):
        verify_against(fifo)


def test_path_swapped_for_a_fifo_after_the_stat_is_still_refused(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    monkeypatch.setattr(fsutil, "check_input", lambda p: None)  # the stat saw a regular file
    with pytest.raises(PathRefused, match="is a FIFO"):
        open_input(fifo)  # the O_NONBLOCK open returns at once and fstat catches the swap


def test_verify_against_a_missing_or_non_gguf_file(bump: Path, tmp_path: Path) -> None:
    assert_one_error(run_cli("verify", bump, "--against", tmp_path / "nope.gguf"), "nope.gguf: no such file")
    (tmp_path / "t.txt").write_text("not a model\n")
    assert_one_error(run_cli("verify", bump, "--against", tmp_path / "t.txt"), "--against", "not a readable GGUF")
    assert_one_error(run_cli("verify", bump, "--against", bump), "not a readable GGUF")


# ---------------------------------------------------------------------------------------------- hostile bump headers
def _header(**kw: int) -> bytes:
    f = {"version": 3, "model_type": 1, "layers": 1, "vocab": 1, "embed": 1, "ctx": 16, "heads": 1, "hd": 1,
         "a_e": 1, "a_h": 1, "a_c": 16, **kw}
    return struct.pack("<8sIIIIIIIIQQQ32s32s", b"BUMPWGT3", f["version"], f["model_type"], f["layers"], f["vocab"],
                       f["embed"], f["ctx"], f["heads"], f["hd"], f["a_e"], f["a_h"], f["a_c"], bytes(32), bytes(32))


@pytest.mark.parametrize("fields,msg", [
    ({"heads": 4_000_000_000, "embed": 0, "hd": 0}, "embed_dim is 0"),
    ({"heads": 4_000_000_000, "embed": 4_000_000_000, "hd": 1, "a_e": 4_000_000_000}, "need at least"),
    ({"heads": 1, "embed": 4_000_000_000, "hd": 4_000_000_000}, "need at least"),
    ({"layers": 4_000_000_000}, "need at least"),
    ({"vocab": 4_000_000_000}, "need at least"),
    ({"ctx": 4_000_000_000, "a_c": 4_000_000_000}, "need at least"),
])
def test_140_byte_bump_claiming_huge_dims_fails_fast(tmp_path: Path, fields: dict[str, int], msg: str) -> None:
    p = tmp_path / "evil.bump"
    p.write_bytes(_header(**fields) + struct.pack("<I", 4) + bytes(8))
    assert p.stat().st_size == 140
    # fast = refused before anything the header's sizes claim is allocated or read (not a wall-clock figure)
    tracemalloc.start()
    try:
        with pytest.raises(BumpError, match=msg):
            open_bump(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak:,} bytes allocated before the refusal"
    for cmd in (["inspect", p], ["verify", p]):
        assert_one_error(run_cli(*cmd, timeout=120), msg)


def test_hostile_manifest_values_are_noted_and_the_layout_inferred(bump: Path) -> None:
    man = bump.with_name("manifest.json")
    man.write_text(json.dumps({"profile": "ckernel", "num_kv_heads": "two", "intermediate_size": 10**30}))
    got = open_bump(bump)
    assert got.profile_source == "inferred"
    assert len(got.notes) == 1 and "does not describe it" in got.notes[0] and "'two'" in got.notes[0]
    man.write_text("[1, 2")  # not JSON: ignored, the layout is inferred
    assert open_bump(bump).profile_source == "inferred"


@pytest.mark.parametrize("offset,data,msg", [
    (0x0C, struct.pack("<I", 7), "model_type 7 at byte 0x0c; expected 1"),
    (0x28, struct.pack("<Q", 320), "aligned_embed_dim 320 at byte 0x28 differs from embed_dim 256"),
    (0x30, struct.pack("<Q", 128), "aligned_head_dim 128 at byte 0x30 differs from head_dim 64"),
    (0x70, b"\x01", "reserved bytes 0x60..0x7f are not zero (first non-zero at byte 0x70)"),
])
def test_verify_reports_corrupted_header_fields_outside_the_checksum(bump: Path, offset: int, data: bytes,
                                                                       msg: str, model_file: Path) -> None:
    with open(bump, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)
    rep = verify_against(bump)
    assert rep.checksum_ok and not rep.ok and any(msg in p for p in rep.problems), rep.problems
    proc = run_cli("verify", bump)
    assert proc.returncode == 1 and "checksum  ok" in proc.stdout and msg in proc.stdout
    assert proc.stdout.rstrip().endswith("NOT VERIFIED")
    assert run_cli("verify", bump, "--against", model_file).returncode == 1


def test_verify_checks_config_json_beside_the_bump(bump: Path) -> None:
    assert verify_against(bump).ok
    cfg = bump.with_name("config.json")
    c = json.loads(cfg.read_text())
    c["hidden_size"], c["num_key_value_heads"] = 512, 3
    cfg.write_text(json.dumps(c))
    rep = verify_against(bump)
    assert rep.checksum_ok and not rep.ok
    assert "config.json: hidden_size is 512 but the bump has embed_dim 256" in rep.problems
    assert "config.json: num_key_value_heads is 3 but the bump has kv_heads 2" in rep.problems
    proc = run_cli("verify", bump)
    assert proc.returncode == 1 and "NOT VERIFIED" in proc.stdout


# ---------------------------------------------------------------------------------------------- terminal, JSON
EVIL = "evil\x1b[2J\x1b]0;owned\x07\n\r\t\x9b\u202e"


def _evil_gguf(path: Path) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("x." + EVIL, "v" + EVIL)
    w.add_array("x.list", ["a" + EVIL, "b"])
    w.add_float32("x.nan", float("nan"))
    w.add_float32("x.inf", float("inf"))
    w.add_float64("x.ninf", float("-inf"))
    w.add_array("x.farr", [1.5, float("nan"), float("inf"), float("-inf")])
    w.add_tensor("blk.0." + EVIL + ".weight", np.array([[1.0, float("nan"), float("inf"), 2.0]] * 2,
                                                        dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


CONTROL = [c for c in map(chr, [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x202E]) if c != "\n"]


def _no_control(text: str) -> None:
    bad = sorted({c for c in text if c in CONTROL})
    assert not bad, [hex(ord(c)) for c in bad]


def test_inspect_escapes_control_characters(tmp_path: Path) -> None:
    p = _evil_gguf(tmp_path / "evil.gguf")
    proc = run_cli("inspect", p)
    assert proc.returncode == 0, proc.stderr
    _no_control(proc.stdout)
    assert "x.evil\\x1b[2J\\x1b]0;owned\\x07\\n\\r\\t\\x9b\\u202e" in proc.stdout
    assert "blk.0.evil\\x1b[2J" in proc.stdout
    assert printable(EVIL) == "evil\\x1b[2J\\x1b]0;owned\\x07\\n\\r\\t\\x9b\\u202e"


def test_dump_block_and_errors_escape_control_characters(tmp_path: Path) -> None:
    p = _evil_gguf(tmp_path / "evil.gguf")
    proc = run_cli("dump-block", p, "blk.0." + EVIL + ".weight")
    assert proc.returncode == 0, proc.stderr
    _no_control(proc.stdout)
    assert "blk.0.evil\\x1b[2J" in proc.stdout
    line = assert_one_error(run_cli("inspect", tmp_path / ("missing\x1b[31m\nline.gguf")), "missing\\x1b[31m\\nline")
    _no_control(line)


def test_tokenize_never_prints_raw_control_characters(model_path) -> None:
    proc = run_cli("tokenize", model_path("smollm2"), "a\x1b[31mred\x07\x9b")
    assert proc.returncode == 0, proc.stderr
    _no_control(proc.stdout)


def test_inspect_json_is_strict_json(tmp_path: Path) -> None:
    p = _evil_gguf(tmp_path / "evil.gguf")
    proc = run_cli("inspect", p, "--json")
    assert proc.returncode == 0, proc.stderr

    def no_constants(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    d = json.loads(proc.stdout, parse_constant=no_constants)
    meta = {m["key"]: m["value"] for m in d["metadata"]}
    assert (meta["x.nan"], meta["x.inf"], meta["x.ninf"]) == ("nan", "inf", "-inf")
    assert meta["x.farr"]["head"] == [1.5, "nan", "inf", "-inf"]
    _no_control(proc.stdout)  # C0 by JSON itself, DEL/C1/bidi overrides by us: all as \uXXXX
    assert "x." + EVIL in {m["key"] for m in d["metadata"]}  # and they decode back exactly
    proc = run_cli("dump-block", p, "blk.0." + EVIL + ".weight", "--json")
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout, parse_constant=no_constants)
    assert json_safe({"a": (float("nan"), np.float32("inf")), 1: np.array([-np.inf])}) == {
        "a": ["nan", "inf"], "1": ["-inf"]}


def test_bump_inspect_json_is_strict(bump: Path) -> None:
    proc = run_cli("inspect", bump, "--json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["num_layers"] == 2


# ---------------------------------------------------------------------------------------------- other writers
def test_write_atomic_refuses_fifos_and_inputs(tmp_path: Path) -> None:
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    with pytest.raises(PathRefused, match="is a FIFO"):
        write_atomic(fifo, "x", "export")
    src = tmp_path / "in.gguf"
    src.write_bytes(b"model")
    with pytest.raises(PathRefused, match="is the input file"):
        write_atomic(tmp_path / "." / "in.gguf", b"png", "--screenshot", [src])
    assert src.read_bytes() == b"model" and stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(PathRefused, match="does not exist"):  # a missing folder is refused, never created
        write_atomic(tmp_path / "new" / "o.txt", "ok")
    assert listing(tmp_path) == ["in.gguf", "p"]


def test_chat_export_refuses_a_fifo(tmp_path: Path) -> None:
    from quantscope.core.chat.store import Conversation, export

    fifo = tmp_path / "chat.md"
    os.mkfifo(fifo)
    with pytest.raises(PathRefused, match="is a FIFO"):
        export(Conversation(1, "t"), fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and listing(tmp_path) == ["chat.md"]
    assert export(Conversation(1, "t"), tmp_path / "c.json").is_file()


def test_screenshot_over_the_input_or_a_fifo_is_refused(src: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "shot.png"
    os.mkfifo(fifo)
    before = digest(src)
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONWARNINGS": "ignore"}
    for out, msg in ((src, "is the input file"), (fifo, "is a FIFO")):
        proc = subprocess.run([*CLI, str(src), "--screenshot", str(out), "--view", "overview"], capture_output=True,
                              text=True, timeout=120, env=env)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("quantscope: error: ")]
        assert proc.returncode == 1 and len(errors) == 1 and msg in errors[0], proc.stderr
    assert digest(src) == before and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert listing(tmp_path) == ["a.gguf", "shot.png"]


# ---------------------------------------------------------------------------------------------- GUI dialog
def test_convert_dialog_refuses_aliased_and_fifo_outputs(qtbot, src: Path, tmp_path: Path) -> None:
    from quantscope.gui.views.convert_dialog import ConvertDialog
    from quantscope.gui.workers import TaskRunner

    runner = TaskRunner()
    dlg = ConvertDialog(src, runner)
    qtbot.addWidget(dlg)
    # the dialog checks which profiles take the file in a worker as it opens: let that end, so that a task
    # running below can only be a conversion the refusal should have prevented
    qtbot.waitUntil(lambda: dlg.refusals is not None and not runner.running(), timeout=120000)
    before = digest(src)
    fifo = tmp_path / "pipe.bump"
    os.mkfifo(fifo)
    cases = [
        (dict(output=src), "is the input file"),
        (dict(output=fifo), "is a FIFO (named pipe)"),
        (dict(output=tmp_path / "w.bump", config=tmp_path / "w.bump"), "name the same file"),
        (dict(output=tmp_path / "w.bump", manifest=src), "is the input file"),
    ]
    for fields, msg in cases:
        dlg.output.setText(str(fields["output"]))
        dlg.config_check.setChecked("config" in fields)
        dlg.manifest_check.setChecked("manifest" in fields)
        if "config" in fields:
            dlg.config.setText(str(fields["config"]))
        if "manifest" in fields:
            dlg.manifest.setText(str(fields["manifest"]))
        dlg.start()
        assert dlg.state == "idle" and dlg.task is None and not runner.running()
        assert msg in dlg.status.text() and "Cannot convert" in dlg.status.text() and msg in (dlg.error or "")
        assert dlg.start_btn.isEnabled()
    assert digest(src) == before and listing(tmp_path) == ["a.gguf", "pipe.bump"]


@pytest.mark.parametrize("given", ["out/", "sub/.", "..", "."])
def test_output_set_refuses_folder_like_names(tmp_path: Path, given: str) -> None:
    """``Path()`` drops a trailing slash: "out/" must not silently become a file called "out"."""
    with pytest.raises(PathRefused, match="not a file name"):
        OutputSet([("-o", f"{tmp_path}/{given}")])
    assert not (tmp_path / "out").exists() and sorted(os.listdir(tmp_path)) == []
