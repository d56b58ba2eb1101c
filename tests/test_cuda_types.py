"""The CUDA backend's weight types beyond the first eight (each type's room in csrc/cuda/qsc_types.cuh): Q5_1,
Q2_K, Q3_K, Q5_K, BF16, IQ4_NL, IQ4_XS, MXFP4, NVFP4, the i-quants IQ1_S … IQ3_S and TQ1_0 / TQ2_0, kept quantized on
the device.

Everywhere the library is built (no GPU needed): the device's repack + per-block decode and its unit dots, compiled
for the host, against the CPU codecs, on blocks from our own quantizers (where the type has one) and on random code
bytes with finite scales (every type):
(a) dequantization from the repacked layout equals the CPU's reference dequantizer bit for bit;
(b) the emulated row dots equal the CPU's ``vec_dot`` to float rounding. Both compute the same exact integer sums
    scaled by the same float products; the device adds its per-unit products in another order (lanes of a warp),
    so the two are not bit-identical. The bound checked is against the float64 value of that integer math:
    |got - exact| <= 2e-6 * sum |w_i x_i| per row, where one wrongly decoded element is ~1/k of that sum.
On a GPU (skipped with the reason otherwise): the matmul and embedding kernels on the same blocks.
"""

from __future__ import annotations

import numpy as np
import pytest

from quantscope.core.engine import cuda_description as cd
from quantscope.core.engine import cuda_kernels as ck
from quantscope.core.engine import cuda_library as cl
from quantscope.core.model import Weight
from quantscope.core.native import kernels as K
from quantscope.core.quant import dequantize, ggml_type

from .test_cuda import close_to_cpu, cuda_lib, gpu  # noqa: F401  (cuda_lib, gpu: the fixtures used below)
from .test_dequant import realistic_blocks
from .test_native_kernels import activations

#: the types qsc_types.cuh adds, the K-quants and Q5_1 / BF16 first
NEW_TYPES = ["Q5_1", "Q2_K", "Q3_K", "Q5_K", "BF16", "IQ4_NL", "IQ4_XS", "MXFP4", "NVFP4", "IQ2_XXS", "IQ2_XS",
             "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0"]
#: device bytes per block after repacking (the file's block, plus unpacked scales for Q3_K / Q5_K / IQ4_XS)
PACKED_BLOCK = {"Q5_1": 24, "Q2_K": 84, "Q3_K": 114, "Q5_K": 180, "BF16": 64, "IQ4_NL": 18, "IQ4_XS": 138,
                "MXFP4": 17, "NVFP4": 36, "IQ2_XXS": 66, "IQ2_XS": 74, "IQ2_S": 82, "IQ3_XXS": 98, "IQ3_S": 110,
                "IQ1_S": 50, "IQ1_M": 56, "TQ1_0": 54, "TQ2_0": 66}


def unit(name: str) -> int:
    """Elements per device block (F16-like rows: 32-element units)."""
    return max(ggml_type(name).block_elems, 32)


def sizes(name: str) -> tuple[int, ...]:
    return (256, 1024, 4864) if unit(name) >= 64 else (128, 576, 896, 4864)


def weights(name: str, rows: int, k: int, rng: np.random.Generator, quantizer: bool) -> np.ndarray:
    """Raw bytes of a rows x k matrix: from our quantizer (``quantizer``; BF16: rounded floats) or random codes."""
    t = ggml_type(name)
    if name == "BF16":
        v = (rng.standard_normal((rows, k)) * 0.05).astype(np.float32)
        if not quantizer:
            v *= rng.choice([1e-3, 1.0, 40.0], (rows, k)).astype(np.float32)
        return (v.view(np.uint32) >> 16).astype("<u2").view(np.uint8).reshape(-1)
    if quantizer:
        x = rng.standard_normal((rows, k)).astype(np.float32) * rng.choice([0.01, 0.5, 3.0], (rows, 1))
        return K.quantize_rows(t, x.astype(np.float32)).reshape(-1)
    return realistic_blocks(name, rows, k // t.block_elems, rng).reshape(-1)


def sources(name: str) -> list[bool]:
    """Block sources to test: our quantizer where the type has one, random codes always."""
    return [True, False] if name == "BF16" or K.can_quantize(ggml_type(name)) else [False]


def act_values(x: np.ndarray, name: str) -> np.ndarray:
    """The activation values the CPU's dot reads (its partner format, dequantized), float64."""
    act = K.activation_type(name)
    assert act is not None
    if act.name == "BF16":
        return (((x.view(np.uint32).astype(np.uint64) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16) << 16) \
            .astype(np.uint32).view(np.float32).astype(np.float64)
    q = K.quantize_activation(x, act)
    if act.name == "Q8_K":
        b = q.reshape(-1, 292)
        d = b[:, :4].copy().view("<f4").astype(np.float64)
        return (b[:, 4:260].view(np.int8).astype(np.float64) * d).reshape(-1)
    b = q.reshape(-1, 34 if act.name == "Q8_0" else 36)
    d = b[:, :2].copy().view("<f2").astype(np.float64)
    return (b[:, -32:].view(np.int8).astype(np.float64) * d).reshape(-1)


def min_correction(w: np.ndarray, rows: int, x: np.ndarray) -> np.ndarray:
    """Q5_1 against Q8_1: the min term uses the activation block's stored sum s (fp16 of d * Σq), not Σ d * q;
    per row, Σ_blocks m * (s - d * Σq)."""
    b = K.quantize_activation(x, "Q8_1").reshape(-1, 36)
    d, s = (b[:, o : o + 2].copy().view("<f2").astype(np.float64).reshape(-1) for o in (0, 2))
    delta = s - d * b[:, 4:].view(np.int8).astype(np.float64).sum(1)
    m = w.reshape(rows, -1, 24)[:, :, 2:4].copy().view("<f2").astype(np.float64).reshape(rows, -1)
    return m @ delta


# ------------------------------------------------------------------------------------ host emulation (no GPU)
@pytest.mark.usefixtures("cuda_lib")
def test_type_table_matches_the_cpu():
    """Every new type is a GPU type of the library, with the CPU's block geometry."""
    for name in NEW_TYPES:
        t = ggml_type(name)
        assert t.id in cl.gpu_types()
        assert K.can_dequantize(t) and K.activation_type(t) is not None


@pytest.mark.usefixtures("cuda_lib")
@pytest.mark.parametrize("name", NEW_TYPES)
def test_repacked_layout_stays_quantized(name):
    t = ggml_type(name)
    assert cl._library().qsc_type_supported(t.id) == 1
    for rows, k in ((1, unit(name)), (7, 4 * unit(name)), (300, 2 * unit(name))):
        n_blocks = rows * k // unit(name)
        got = cd.packed_bytes(t, rows, k)
        assert n_blocks * PACKED_BLOCK[name] <= got <= n_blocks * PACKED_BLOCK[name] + 4 * 255, (rows, k)
        assert got <= rows * t.row_bytes(k) * 1.04 + 4 * 256  # no float expansion
    with pytest.raises(ValueError):
        cd.packed_bytes(t, 3, unit(name) + 32 if unit(name) > 32 else 48)


@pytest.mark.usefixtures("cuda_lib")
@pytest.mark.parametrize("name", NEW_TYPES)
def test_host_repack_and_decode_bit_exact(name):
    """(a) The device's element decode of the repacked layout == the CPU's reference dequantizer, bit for bit."""
    rng = np.random.default_rng(sum(name.encode()) + 36)
    t = ggml_type(name)
    for quantizer in sources(name):
        for rows, k in ((7, sizes(name)[0]), (3, sizes(name)[-1])):
            w = weights(name, rows, k, rng, quantizer)
            ref = dequantize(w.reshape(rows, -1), t)
            got = ck.host_dequantize(t, w, rows, k)
            assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), (name, quantizer, rows, k)


@pytest.mark.usefixtures("cuda_lib")
@pytest.mark.parametrize("name", NEW_TYPES)
def test_host_dots_match_cpu_vec_dot(name):
    """(b) The device's unit dots (repack, activation quantizer, int8 sums, float scaling) against the CPU's
    vec_dot per row and against the float64 value of the same integer math, to float rounding."""
    rng = np.random.default_rng(sum(name.encode()) + 37)
    t = ggml_type(name)
    act = K.activation_type(t)
    rows = 24
    for quantizer in sources(name):
        for k in sizes(name):
            w = weights(name, rows, k, rng, quantizer)
            x = np.stack([activations(rng, k, outliers=j == 1) for j in range(3)])
            got = ck.host_matmat(t, w, rows, k, x)
            wd = dequantize(w.reshape(rows, -1), t).astype(np.float64)
            for j in range(x.shape[0]):
                xq = K.quantize_activation(x[j], act)
                cpu = np.array([K.vec_dot(t, w.reshape(rows, -1)[r], xq, k) for r in range(rows)], np.float32)
                xv = act_values(x[j], name)
                exact = wd @ xv + (min_correction(w, rows, x[j]) if act.name == "Q8_1" else 0.0)
                scale = np.abs(wd) @ np.abs(xv)
                assert np.all(np.abs(got[j] - exact) <= 2e-6 * scale), (name, quantizer, k, j)
                assert np.all(np.abs(cpu - exact) <= 2e-6 * scale), (name, quantizer, k, j)
                assert close_to_cpu(got[j], cpu), (name, quantizer, k, j)


def test_one_wrong_element_is_seen():
    """The bound of the dot test is tight enough to see one element decoded wrongly (so it can fail)."""
    rng = np.random.default_rng(3)
    k = 4864
    w = rng.standard_normal(k)
    x = rng.standard_normal(k)
    bad = w.copy()
    i = int(np.argmax(np.abs(w * x)))
    bad[i] = -bad[i]
    assert abs(bad @ x - w @ x) > 2e-6 * (np.abs(w) @ np.abs(x))


def test_new_types_are_uploaded_as_stored():
    """Weights of these types go to the device quantized (no F32 expansion), as the file stores them."""
    rng = np.random.default_rng(8)
    for name in NEW_TYPES:
        t = ggml_type(name)
        k = 2 * unit(name)
        raw = weights(name, 2, k, rng, False)
        got_t, data = cd.device_weight(Weight("w", t, raw, 2, k))
        assert got_t.name == name and data is raw


# ------------------------------------------------------------------------------------ GPU (skipped without one)
@pytest.mark.usefixtures("gpu")
@pytest.mark.parametrize("name", NEW_TYPES)
def test_gpu_matmat_matches_cpu(name):
    rng = np.random.default_rng(sum(name.encode()) + 38)
    t = ggml_type(name)
    rows = 100  # not a multiple of the 4 rows per block
    for k in sizes(name)[1:]:
        w = weights(name, rows, k, rng, sources(name)[0])
        x = np.stack([activations(rng, k, outliers=False) for _ in range(13)])
        host = ck.host_matmat(t, w, rows, k, x)
        for n_x in (1, 3, 8, 13):  # decode kernel, then the 8-column kernel with partial column groups
            got = ck.gpu_matmat(t, w, rows, k, x[:n_x])
            assert close_to_cpu(got, K.matmat(t, w, rows, k, x[:n_x])), (name, k, n_x)
            assert close_to_cpu(got, host[:n_x]), (name, k, n_x)


@pytest.mark.usefixtures("gpu")
@pytest.mark.parametrize("name", NEW_TYPES)
def test_gpu_get_rows_bit_exact(name):
    rng = np.random.default_rng(39)
    t = ggml_type(name)
    k = sizes(name)[1]
    w = weights(name, 40, k, rng, False)
    ids = np.array([0, 39, 7, 7, 12])
    ref = dequantize(w.reshape(40, -1), t)[ids]
    assert np.array_equal(ck.gpu_get_rows(t, w, 40, k, ids).view(np.uint32), ref.view(np.uint32))
