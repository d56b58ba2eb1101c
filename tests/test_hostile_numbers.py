"""Numbers from files checked for range before use (issue 33, items 5, 9, 10): importance values (NaN, infinities,
3e38) refused before quantizing and the quantized output checked for non-finite scales as llama-quantize does;
KLD base contexts against the model's trained context and this machine's memory, and record scales a writer
cannot produce; an imatrix that is not one is refused without being read whole."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from quantscope.core.engine import kld
from quantscope.core.gguf import GGUFFile
from quantscope.core.quant import quantize as Q
from quantscope.core.quant.imatrix import Imatrix, ImatrixEntry, ImatrixError, read_imatrix, write_imatrix

from . import quantize_models

CLI = [sys.executable, "-m", "quantscope.cli"]


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


def one_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("quantscope: error: "), proc.stderr
    assert "internal error" not in lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quantize_models.write_model("llama", tmp_path_factory.mktemp("num") / "llama.gguf")


def _imatrix(model: Path, path: Path, value: float, legacy: bool = False) -> Path:
    """An imatrix for every 2-D weight of ``model``, all ones but the first value of the first entry."""
    entries = {}
    with GGUFFile(model) as f:
        for t in f.tensors:
            if len(t.ne) == 2 and t.name.endswith(".weight") and "norm" not in t.name:
                entries[t.name] = ImatrixEntry(np.ones(t.ne[0], np.float32), np.ones(1, np.int64))
    first = next(iter(entries.values()))
    first.sums[0] = np.float32(value)
    if not legacy:
        write_imatrix(Imatrix(path, entries, ["x"], 1, 16), path)
        return path
    out = struct.pack("<i", len(entries))
    for name, e in entries.items():
        raw = name.encode()
        out += struct.pack("<i", len(raw)) + raw + struct.pack("<ii", 1, e.sums.size) + e.sums.astype("<f4").tobytes()
    path.write_bytes(out)
    return path


# ------------------------------------------------------------------------------------------- item 5: imatrix values
@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 3e38, -1.0])
def test_importance_values_out_of_range_are_refused(model: Path, tmp_path: Path, value: float, legacy: bool) -> None:
    im = _imatrix(model, tmp_path / ("im.dat" if legacy else "im.gguf"), value, legacy)
    with pytest.raises(ImatrixError, match="importance value"):
        read_imatrix(im)
    out = tmp_path / "q.gguf"
    one_error(run_cli("quantize", model, out, "Q4_K_M", "--imatrix", im), "importance value")
    assert not out.exists() and sorted(os.listdir(tmp_path)) == [im.name]


def test_a_good_imatrix_still_quantizes(model: Path, tmp_path: Path) -> None:
    im = _imatrix(model, tmp_path / "im.gguf", 2.0)
    assert run_cli("quantize", model, tmp_path / "q.gguf", "Q4_K_M", "--imatrix", im).returncode == 0


@pytest.mark.parametrize("target", ["Q4_K", "Q8_0", "F16"])
def test_output_that_decodes_non_finite_is_refused_and_removed(model: Path, tmp_path: Path, target: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever produced it, a quantized chunk with an infinite fp16 scale (or an F16 value that overflowed)
    fails the write, as llama-quantize's validation does, and nothing is left."""
    real = Q._encode

    def broken(tgt, rows, weights, threads, buf):  # type: ignore[no-untyped-def]
        data = np.array(real(tgt, rows, weights, threads, buf), copy=True)
        if tgt == target:
            data.reshape(-1).view(np.uint8)[:2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
        return data

    monkeypatch.setattr(Q, "_encode", broken)
    opts = Q.QuantizeOptions("Q4_K_M", tensor_types=((".*", target),), pure=True)
    with pytest.raises(Q.QuantizeError, match=r"not a finite number|does not fit"):
        Q.quantize_file(model, tmp_path / "q.gguf", opts)
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- item 10: imatrix magic, never read whole
def test_a_large_non_imatrix_is_refused_without_reading_it(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with open(big, "wb") as fh:
        fh.write(b"Hello, this is a text file, not an importance matrix.\n")
        fh.truncate(300 << 20)  # sparse
    tracemalloc.start()
    try:
        with pytest.raises(ImatrixError, match=r"not an imatrix|cannot fit"):
            read_imatrix(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


def test_an_imatrix_fifo_is_refused(tmp_path: Path) -> None:
    from quantscope.core.fsutil import PathRefused

    os.mkfifo(tmp_path / "im.fifo")
    with pytest.raises(PathRefused, match="FIFO"):
        read_imatrix(tmp_path / "im.fifo")


# ------------------------------------------------------------------------------------------ item 9: KLD base files
def _cfg(n_ctx_train: int = 8192) -> SimpleNamespace:
    return SimpleNamespace(n_ctx_train=n_ctx_train, n_layers=30, n_head_kv=3, head_dim=64, n_vocab=49152)


def test_kld_context_is_checked_against_the_model_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    kld.check_context(_cfg(), 8192)  # fine
    with pytest.raises(ValueError, match="longer than the model's trained context of 8,192"):
        kld.check_context(_cfg(), 65536)
    monkeypatch.setattr(kld, "memory_bytes", lambda: 1 << 30)
    with pytest.raises(ValueError, match="GiB"):
        kld.check_context(_cfg(1 << 20), 1 << 20)


def test_kld_base_with_a_context_beyond_the_model_is_one_line(tmp_path: Path, model_path) -> None:
    """A base file asking for 65,536 tokens on SmolLM2 (trained on 8,192): refused before anything runs."""
    m = model_path("smollm2")
    n_ctx, n_vocab = 65536, 49152
    p = tmp_path / "big.kld"
    with open(p, "wb") as fh:
        fh.write(kld.MAGIC + np.array([n_ctx, n_vocab, 1], "<i4").tobytes() + np.zeros(n_ctx, "<i4").tobytes())
        fh.truncate(kld.HEADER_BYTES + 4 * n_ctx + 2 * kld.scored_per_chunk(n_ctx) * kld.record_len(n_vocab))
    one_error(run_cli("perplexity", m, "-t", "2", "--kl-divergence-base", p, "--kl-divergence"),
              "longer than the model's trained context")


@pytest.mark.parametrize("scale, lo", [(3e38, -1.0), (float("inf"), -1.0), (1e-4, float("nan")), (-1e-4, -1.0),
                                       (1e-4, 5.0), (1e-4, -1e30)])
def test_kld_records_with_impossible_scales_are_refused(tmp_path: Path, scale: float, lo: float) -> None:
    n_ctx, n_vocab = 16, 10
    rec = np.zeros((kld.scored_per_chunk(n_ctx), kld.record_len(n_vocab)), "<u2")
    rec[3, :4] = np.array([scale, lo], np.float32).view(np.uint16)
    p = tmp_path / "b.kld"
    p.write_bytes(kld.MAGIC + np.array([n_ctx, n_vocab, 1], "<i4").tobytes() + np.zeros(n_ctx, "<i4").tobytes()
                  + rec.tobytes())
    with kld.KLDBase(p) as base, pytest.raises(kld.KLDFileError, match=r"position 3.*out of range"):
        base.records(0)


def test_kld_report_never_divides_by_zero() -> None:
    z = np.zeros(20)
    r = kld.KLDResult(16, 1, z + 1.0, z + 800.0, z, z, np.ones(20, bool))
    assert "Mean PPL(Q)/PPL(base)" in r.report()
