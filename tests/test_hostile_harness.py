"""A hostile-input harness (issue 33): every CLI verb against a generated corpus of odd inputs (wrong types for
the metadata keys the verbs read, truncations, FIFOs, devices, folders, text that is no GGUF, a non-UTF-8 file
name) and against outputs that alias their input. Each run is a child process with a time limit and an address-
space limit (``RLIMIT_AS``); each must end in success or one ``quantscope: error:`` line (no traceback, no
"internal error"), leave every input byte for byte as it was and leave nothing behind but its declared outputs.

The default selection crosses every verb with the most telling inputs and every input with the cheap verbs (about
a minute on two cores); the full cross product is marked ``slow``."""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from quantscope.core import catalog

from . import hostile_files as H
from .test_bump import write_model

TIMEOUT_S = 300  # a hang guard per case, never a measure (cases run beside other processes)
AS_LIMIT = 6 << 30  # address space: numpy, the native library and a small model fit many times over

#: verb templates: {f} the input, {o} an output path in the case's folder, {t} a text file, {g} a good model
VERBS: dict[str, list[str]] = {
    "inspect": ["inspect", "{f}"],
    "inspect-json": ["inspect", "{f}", "--json"],
    "dump-block": ["dump-block", "{f}", "token_embd.weight"],
    "verify": ["verify", "{f}"],
    "tokenize": ["tokenize", "{f}", "hi"],
    "edit": ["edit", "{f}", "--set", "general.name=x", "-o", "{o}"],
    "edit-token": ["edit", "{f}", "--special-token", "bos=1", "--dry-run"],
    "export": ["export", "{f}", "--metadata", "-o", "{o}"],
    "export-tensor": ["export", "{f}", "token_embd.weight", "-o", "{o}"],
    "split": ["split", "{f}", "{o}", "--split-max-tensors", "2"],
    "merge": ["merge", "{f}", "{o}"],
    "quantize": ["quantize", "{f}", "{o}", "Q8_0", "--allow-requantize", "--threads", "1"],
    "quant-stats": ["quant-stats", "{f}", "--types", "Q8_0", "--max-rows", "1", "--threads", "1"],
    "imatrix-show": ["imatrix", "{f}"],
    "imatrix": ["imatrix", "{f}", "-p", "hello world", "-o", "{o}", "-t", "1"],
    "convert": ["convert", "{f}", "-o", "{o}"],
    "diff": ["diff", "{f}", "{g}", "--no-values"],
    "generate": ["generate", "{f}", "-p", "hi", "-n", "1", "-t", "1"],
    "perplexity": ["perplexity", "{f}", "-f", "{t}", "-t", "1"],
    "probe": ["probe", "{f}", "-p", "hi", "-t", "1"],
    "compare": ["compare", "{f}", "{g}", "-p", "hello world", "-t", "1"],
}
CHEAP = ("inspect", "inspect-json", "verify", "edit", "export", "quantize", "imatrix-show")
TELLING = ("good", "truncated", "fifo", "wrong-types")


def _good(p: Path, _smol: Path) -> Path:
    return write_model(p)


def _truncated(p: Path, smol: Path) -> Path:
    write_model(p)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return p


def _header_only(p: Path, smol: Path) -> Path:
    write_model(p)
    p.write_bytes(p.read_bytes()[:24])
    return p


def _empty(p: Path, _smol: Path) -> Path:
    p.write_bytes(b"")
    return p


def _text(p: Path, _smol: Path) -> Path:
    p.write_text("this is a text file, not a model\n" * 100)
    return p


def _fifo(p: Path, _smol: Path) -> Path:
    os.mkfifo(p)
    return p


def _folder(p: Path, _smol: Path) -> Path:
    p.mkdir()
    return p


def _dev_zero(_p: Path, _smol: Path) -> Path:
    return Path("/dev/zero")


def _non_utf8_name(p: Path, _smol: Path) -> Path:
    odd = Path(os.fsdecode(os.fsencode(p.parent) + b"/in\xff.gguf"))
    write_model(odd)
    return odd


INPUTS = {"good": _good, "truncated": _truncated, "header-only": _header_only, "empty": _empty, "text": _text,
          "fifo": _fifo, "folder": _folder, "dev-zero": _dev_zero, "non-utf8-name": _non_utf8_name,
          "wrong-types": H.wrong_types, "scalars-for-arrays": H.scalars_for_arrays,
          "string-context": H.string_context, "huge-ne": H.huge_ne, "unknown-type": H.unknown_type,
          "zero-dim": H.zero_dim}


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _state(folder: Path) -> dict[bytes, str]:
    """Every entry of the folder with the hash of each regular file (FIFOs and folders by kind)."""
    out = {}
    for e in os.scandir(os.fsencode(folder)):
        if e.is_file(follow_symlinks=False):
            with open(e.path, "rb") as fh:
                out[e.name] = hashlib.sha256(fh.read()).hexdigest()
        else:
            out[e.name] = "dir" if e.is_dir(follow_symlinks=False) else "other"
    return out


@pytest.fixture(scope="module")
def smol() -> Path:
    return catalog.model_path("smollm2")


@pytest.fixture(scope="module")
def good_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("good") / "g.gguf")


def run_case(folder: Path, verb: str, kind: str, smol: Path, good: Path, alias: bool = False) -> None:
    src = INPUTS[kind](folder / "in.gguf", smol)
    text = folder / "t.txt"
    text.write_text("hello world " * 50)
    out = src if alias else folder / "out.bin"
    argv = [a.format(f=src, o=out, t=text, g=good) for a in VERBS[verb]]
    before = _state(folder)
    env = {**os.environ, "PYTHONWARNINGS": "default", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    try:
        r = subprocess.run([sys.executable, "-m", "quantscope.cli", *argv], capture_output=True, timeout=TIMEOUT_S,
                           env=env, preexec_fn=_limits, cwd=folder, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{verb} on {kind}: no answer within {TIMEOUT_S} s")
    err = r.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err and "internal error" not in err, (verb, kind, err[-2000:])
    assert "Warning" not in err, (verb, kind, err[-2000:])  # a raw numpy/Python warning is a leak too
    if r.returncode != 0:
        errors = [ln for ln in err.splitlines() if ln.startswith("quantscope: error: ")]
        ok_diff = verb == "diff" and r.returncode == 1 and not errors
        assert ok_diff or (r.returncode == 2 and len(errors) == 1 and err.rstrip().endswith(errors[0])), (
            verb, kind, r.returncode, err[-2000:])
    after = _state(folder)
    for name, digest in before.items():  # every input as it was
        assert after.get(name) == digest, (verb, kind, name, "changed or removed")
    new = set(after) - set(before)
    declared = {os.fsencode(out.name)}
    if r.returncode != 0 or alias:
        assert not new, (verb, kind, new)  # a refusal leaves nothing behind
    else:
        assert all(n in declared or n.startswith(os.fsencode(out.name) + b"-") for n in new), (verb, kind, new)


def _cases(full: bool) -> list[tuple[str, str]]:
    if full:
        return [(v, k) for v in VERBS for k in INPUTS]
    return sorted({*((v, k) for v in VERBS for k in TELLING), *((v, k) for v in CHEAP for k in INPUTS)})


@pytest.mark.parametrize("verb, kind", _cases(False))
def test_verb_on_hostile_input(verb: str, kind: str, tmp_path: Path, smol: Path, good_model: Path) -> None:
    run_case(tmp_path, verb, kind, smol, good_model)


@pytest.mark.slow
@pytest.mark.parametrize("verb, kind", sorted(set(_cases(True)) - set(_cases(False))))
def test_verb_on_hostile_input_full(verb: str, kind: str, tmp_path: Path, smol: Path, good_model: Path) -> None:
    run_case(tmp_path, verb, kind, smol, good_model)


WRITERS = ("edit", "export", "export-tensor", "merge", "quantize", "imatrix", "convert")  # split: a prefix


@pytest.mark.parametrize("verb", WRITERS)
def test_writer_whose_output_is_its_input(verb: str, tmp_path: Path, smol: Path, good_model: Path) -> None:
    run_case(tmp_path, verb, "good", smol, good_model, alias=True)
