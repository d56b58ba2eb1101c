"""The native weight quantizers against ggml's bytes (tests/data/quantize, recorded by
tests/record_quantize_fixtures.py from ggml_quantize_chunk), with and without importance weights."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from quantscope.core.native import kernels as K
from quantscope.core.quant import dequantize, ggml_type

from . import quantize_inputs

DATA = Path(__file__).parent / "data" / "quantize"


@pytest.fixture(scope="module")
def recorded() -> dict[str, np.ndarray]:
    path = DATA / "ggml_rows.npz"
    meta = json.loads((DATA / "meta.json").read_text())
    assert hashlib.sha256(path.read_bytes()).hexdigest() == meta["sha256"]
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def sets(recorded: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    s = quantize_inputs.generated_sets()
    s["real"] = (recorded["in_real"], recorded["im_real"])
    return s


def _first_diff(ours: np.ndarray, theirs: np.ndarray, t_name: str, n: int) -> str:
    t = ggml_type(t_name)
    flat_o, flat_t = ours.reshape(-1), theirs.reshape(-1)
    i = int(np.flatnonzero(flat_o != flat_t)[0])
    blk = i // t.block_bytes
    return (f"{int((flat_o != flat_t).sum())} bytes differ; first in block {blk} (row {blk // (n // t.block_elems)}),"
            f" byte {i % t.block_bytes}: ours {flat_o[i]} ggml {flat_t[i]}")


@pytest.mark.parametrize("mode", ["plain", "imatrix"])
@pytest.mark.parametrize("t_name", quantize_inputs.TYPES)
def test_same_bytes_as_ggml(t_name: str, mode: str, sets: dict, recorded: dict) -> None:
    assert K.can_quantize(t_name)
    for sname, (rows, imat) in sets.items():
        ours = K.quantize_rows(t_name, rows, imat if mode == "imatrix" else None, threads=1)
        theirs = recorded[f"{t_name}/{sname}/{mode}"].reshape(ours.shape)
        if not np.array_equal(ours, theirs):
            pytest.fail(f"{t_name} {sname} {mode}: " + _first_diff(ours, theirs, t_name, rows.shape[1]))


@pytest.mark.parametrize("t_name", quantize_inputs.TYPES)
def test_threads_change_nothing(t_name: str) -> None:
    rng = np.random.default_rng(7)
    rows = rng.normal(0, 0.05, (64, 1024)).astype(np.float32)
    imat = rng.uniform(0.1, 2.0, 1024).astype(np.float32)
    one = K.quantize_rows(t_name, rows, imat, threads=1)
    assert np.array_equal(one, K.quantize_rows(t_name, rows, imat, threads=2))


@pytest.mark.parametrize("t_name", quantize_inputs.TYPES)
def test_round_trip_error_is_small(t_name: str) -> None:
    """Dequantizing the quantized rows gives back the values within the type's precision."""
    rng = np.random.default_rng(11)
    rows = rng.normal(0, 1.0, (16, 512)).astype(np.float32)
    back = dequantize(K.quantize_rows(t_name, rows), t_name).reshape(rows.shape)
    rel = float(np.sqrt(np.mean((back - rows) ** 2)) / np.sqrt(np.mean(rows**2)))
    bound = {"Q8_0": 0.01, "Q6_K": 0.03, "Q5_0": 0.06, "Q5_1": 0.06, "Q5_K": 0.06, "Q4_0": 0.12, "Q4_1": 0.12,
             "Q4_K": 0.12, "IQ4_NL": 0.12, "IQ4_XS": 0.12, "MXFP4": 0.2, "Q3_K": 0.25, "Q2_K": 0.45,
             "TQ1_0": 0.85, "TQ2_0": 0.85}[t_name]
    assert rel < bound, rel


def test_sizes_are_checked() -> None:
    rows = np.zeros((2, 256), np.float32)
    with pytest.raises(ValueError, match="multiple of 256"):
        K.quantize_rows("Q4_K", np.zeros((2, 100), np.float32))
    with pytest.raises(ValueError, match="importance vector"):
        K.quantize_rows("Q4_K", rows, np.ones(255, np.float32))
    with pytest.raises(ValueError, match="no quantizer"):
        K.quantize_rows("IQ2_XXS", rows)
    from quantscope.core.native import ffi, lib

    src = np.zeros(512, np.float32)
    dst = np.zeros(300, np.uint8)
    p_src = ffi.cast("float *", ffi.from_buffer(src))
    p_dst = ffi.cast("uint8_t *", ffi.from_buffer(dst))
    assert lib.qs_quantize_rows(12, p_src, 2, 256, ffi.NULL, p_dst, 287, 1) == -3  # needs 288
    assert lib.qs_quantize_rows(12, p_src, 2, 100, ffi.NULL, p_dst, 300, 1) == -2
    assert lib.qs_quantize_rows(12, p_src, -1, 256, ffi.NULL, p_dst, 300, 1) == -2
    assert lib.qs_quantize_rows(12, p_src, 1 << 62, 256, ffi.NULL, p_dst, 300, 1) == -3
    assert lib.qs_quantize_rows(16, p_src, 2, 256, ffi.NULL, p_dst, 300, 1) == -1
    assert lib.qs_quantize_rows(12, p_src, 2, 256, ffi.NULL, p_dst, 288, 1) == 288
