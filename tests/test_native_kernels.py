"""Native kernels: dequantization bit-exact with the numpy reference, ggml's activation quantizers, dot products
against a float64 evaluation of the same quantized scheme, matvec against float64 on dequantized weights — on
every ISA level this CPU has (scalar, AVX2, AVX-512), on random and real data."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as GQ
from gguf.quants import quantize as gguf_quantize

from quantscope.core.gguf import GGUFFile
from quantscope.core.native import kernels as K
from quantscope.core.quant import dequantize, ggml_type

from .test_dequant import REQUIRED, realistic_blocks

LEVELS = K.ISA_NAMES[: K.ISA_NAMES.index(K.isa_detected()) + 1]
DOT_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "F16",
             "BF16", "F32",
             "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4"]
FALLBACK_TYPES: list[str] = []  # every type with a kernel has a dot now
# byte offsets of the fp16 min-scale field(s) of formats with a subtracted/added minimum
MIN_FIELD = {"Q4_1": (2, 0), "Q5_1": (2, 0), "Q4_K": (2, 0), "Q5_K": (2, 0), "Q2_K": (82, 80)}


def test_detects_an_isa():
    assert K.isa_detected() in K.ISA_NAMES
    assert K.isa() == K.isa_detected()
    with K.forced_isa("scalar") as lvl:
        assert lvl == "scalar" and K.isa() == "scalar"
    assert K.isa() == K.isa_detected()


def test_isa_names_are_this_builds_cpu_family():
    """The level names come from the library: the family the extension was compiled for, the machine's own."""
    import platform

    family = {"x86_64": "x86_64", "AMD64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())
    assert K.ARCH == family
    names = {"x86_64": ("scalar", "avx2", "avx512"), "arm64": ("scalar", "neon", "dotprod", "i8mm")}
    assert K.ISA_NAMES == names[K.ARCH]
    other = "neon" if K.ARCH == "x86_64" else "avx2"
    with pytest.raises(ValueError, match=f"unknown instruction set '{other}' on {K.ARCH}"):
        K.set_isa(other)
    assert K.isa() == K.isa_detected()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="AVX512_VBMI is an x86-64 feature")
def test_vbmi_detection_agrees_with_the_kernel_s_cpu_flags():
    """The AVX-512 lattice dots run only where the CPU has AVX512_VBMI (an illegal instruction otherwise)."""
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    assert K.has_vbmi() == ("avx512vbmi" in flags)


def same_or_both_nan(a: np.ndarray, b: np.ndarray) -> bool:
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32)))


# numpy converts F16 to float32 in software on x86-64 (a signalling NaN keeps its payload, as our C does) and with
# the hardware instruction on ARM64, which sets the quiet bit of a NaN: the reference's NaNs are then quiet.
def _numpy_quiets_f16_nan() -> bool:
    with np.errstate(invalid="ignore"):
        return bool(np.array([0x7C01], np.uint16).view(np.float16).astype(np.float32).view(np.uint32)[0] & 0x400000)


NUMPY_QUIETS_F16_NAN = _numpy_quiets_f16_nan()


def same_bits(ours: np.ndarray, ref: np.ndarray, f16: bool = False) -> bool:
    """Bit for bit; F16 values where the platform's numpy quiets F16 NaNs: ours are compared quietened too."""
    a, b = ours.view(np.uint32), ref.view(np.uint32)
    if f16 and NUMPY_QUIETS_F16_NAN:
        a = np.where(np.isnan(ours), a | np.uint32(0x00400000), a)
    return bool(np.array_equal(a, b))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", [n for n in REQUIRED if n != "F32"])
def test_dequantize_bit_exact(name, level):
    rng = np.random.default_rng(sum(name.encode()) + 17)
    t = ggml_type(name)
    raw = realistic_blocks(name, 33, max(1, 2048 // t.block_elems), rng)
    wild = rng.integers(0, 256, size=(5, t.block_bytes * 3), dtype=np.uint8)
    with K.forced_isa(level):
        assert same_bits(K.dequantize(raw, t), dequantize(raw, t), name == "F16")
        assert same_or_both_nan(K.dequantize(wild, t), dequantize(wild, t))
        big = realistic_blocks(name, 600, max(1, 1024 // t.block_elems), rng)  # multi-threaded path
        assert same_bits(K.dequantize(big, t, threads=2), dequantize(big, t), name == "F16")


def test_dequantize_real_tensors_every_level(model_path):
    picks = {"smollm2": ["blk.0.ffn_up.weight", "token_embd.weight"],
             "gemma3": ["blk.0.attn_output.weight", "blk.0.ffn_down.weight", "blk.0.attn_q.weight"],
             "qwen2.5-coder": ["blk.0.ffn_down.weight", "blk.2.ffn_down.weight", "blk.0.attn_v.weight"]}
    for model, names in picks.items():
        with GGUFFile(model_path(model)) as f:
            for n in names:
                t = f.tensor(n)
                rows = f.tensor_rows(t)[:2048]
                ref = dequantize(rows, t.type)
                for level in LEVELS:
                    with K.forced_isa(level):
                        got = K.dequantize(rows, t.type)
                        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), (n, level)


# ---------------------------------------------------------------- activation quantizers
def ref_q8_0(x: np.ndarray, with_sum: bool = False) -> np.ndarray:
    """ggml quantize_row_q8_0_ref / q8_1_ref in numpy (roundf = half away from zero)."""
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * inv).astype(np.float32)
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    parts = [d.astype(np.float16).view(np.uint8)]
    if with_sum:
        s = (q.astype(np.int32).sum(axis=1, keepdims=True).astype(np.float32) * d).astype(np.float16)
        parts.append(s.view(np.uint8))
    parts.append(q.view(np.uint8))
    return np.concatenate(parts, axis=1).reshape(-1)


def ref_q8_k(x: np.ndarray) -> np.ndarray:
    """ggml quantize_row_q8_K_ref in numpy (nearest_int = round half to even)."""
    out = []
    for b in x.reshape(-1, 256).astype(np.float32):
        i = int(np.argmax(np.abs(b)))
        mx = b[i]
        if np.abs(b).max() == 0:
            out.append(np.zeros(292, np.uint8))
            continue
        iscale = np.float32(-127) / mx
        q = np.minimum(127, np.rint((iscale * b).astype(np.float32))).astype(np.int8)
        bs = q.reshape(16, 16).astype(np.int16).sum(axis=1).astype("<i2")
        d = (np.float32(1) / iscale).astype("<f4")
        out.append(np.concatenate([np.frombuffer(d.tobytes(), np.uint8), q.view(np.uint8),
                                   bs.view(np.uint8)]))
    return np.concatenate(out)


def activations(rng: np.random.Generator, n: int, outliers: bool = True) -> np.ndarray:
    x = rng.standard_normal(n).astype(np.float32)
    if not outliers:
        return x
    x[:: 97] *= 20  # outliers
    x[5:37] = 0  # an all-zero block
    x[64:96] = np.float32(0.5) * np.arange(32, dtype=np.float32)  # exact .5 ties
    return x


def test_q8_0_matches_ggml_and_gguf_py():
    x = activations(np.random.default_rng(1), 4096)
    ours = K.quantize_activation(x, "Q8_0")
    assert np.array_equal(ours, ref_q8_0(x))
    assert np.array_equal(ours, gguf_quantize(x.reshape(1, -1), GQ.Q8_0).reshape(-1))


def test_q8_1_matches_ggml():
    x = activations(np.random.default_rng(2), 4096)
    assert np.array_equal(K.quantize_activation(x, "Q8_1"), ref_q8_0(x, with_sum=True))


def test_q8_k_matches_ggml():
    x = activations(np.random.default_rng(3), 4864)[:4864 // 256 * 256]
    x[256:512] = 0
    assert np.array_equal(K.quantize_activation(x, "Q8_K"), ref_q8_k(x))


@pytest.mark.parametrize("level", LEVELS[1:])
def test_simd_activation_quantizers_equal_scalar(level):
    """Vector quantizers round exactly like ggml's scalar ones: ties (half away for Q8_0/Q8_1, half to even for
    Q8_K), zero blocks, a magnitude tie of opposite signs for Q8_K's signed max, tiny and huge scales."""
    rng = np.random.default_rng(5)
    for trial in range(60):
        x = (rng.standard_normal(4096) * rng.choice([1e-3, 1.0, 50.0])).astype(np.float32)
        x[::97] *= 20
        x[64:96] = np.float32(0.5) * np.arange(32, dtype=np.float32)
        x[5:37] = 0
        x[128:160] = np.arange(32, dtype=np.float32) - 15.5
        x[140] = 127  # amax 127 -> scale 1: every x.5 is a tie
        x[263] = -np.abs(x[256:512]).max()
        x[356] = -x[263]
        for act in ("Q8_0", "Q8_1", "Q8_K"):
            with K.forced_isa(level):
                got = K.quantize_activation(x, act)
            with K.forced_isa("scalar"):
                ref = K.quantize_activation(x, act)
            assert np.array_equal(got, ref), (act, trial)


def test_f16_bf16_activation_rounding():
    x = activations(np.random.default_rng(4), 1000)
    x[:3] = [np.nan, np.inf, 65520.0]
    assert np.array_equal(K.quantize_activation(x, "F16").view(np.float16)[3:], x[3:].astype(np.float16))
    bf = K.quantize_activation(x, "BF16").view(np.uint16)
    u = x.view(np.uint32)
    exp = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    assert np.array_equal(bf[1:], exp[1:]) and bf[0] & 0x7FC0 == 0x7FC0


# ---------------------------------------------------------------- dots
def exact_weights(name: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """float64 weights exactly as the dot scheme sees them; for Q8_1 partners also the min terms per block."""
    t = ggml_type(name)
    if name in ("Q4_1", "Q5_1"):
        blocks = raw.reshape(-1, t.block_bytes).copy()
        mins = blocks[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(-1)
        blocks[:, 2:4] = 0
        return dequantize(blocks.reshape(raw.shape), t).astype(np.float64), mins
    if name in MIN_FIELD:
        a = raw.reshape(-1, t.block_bytes).copy()
        b = a.copy()
        mo, so = MIN_FIELD[name]
        a[:, mo : mo + 2] = 0
        b[:, so : so + 2] = 0
        return (dequantize(a.reshape(raw.shape), t).astype(np.float64)
                + dequantize(b.reshape(raw.shape), t).astype(np.float64)), None
    return dequantize(raw, t).astype(np.float64), None


def activation_values(act: str, xq: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray | None]:
    if act in ("Q8_0", "Q8_1"):
        size, off = (34, 2) if act == "Q8_0" else (36, 4)
        b = xq.reshape(-1, size)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        s = b[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(-1) if act == "Q8_1" else None
        return (b[:, off:].view(np.int8).astype(np.float64) * d).reshape(-1), s
    if act == "Q8_K":
        b = xq.reshape(-1, 292)
        d = b[:, 0:4].copy().view("<f4").astype(np.float64)
        return (b[:, 4:260].view(np.int8).astype(np.float64) * d).reshape(-1), None
    if act == "F16":
        return xq.view(np.float16).astype(np.float64), None
    if act == "BF16":
        return (xq.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64), None
    return xq.view(np.float32).astype(np.float64), None


def scheme_reference(name: str, raw_row: np.ndarray, xq: np.ndarray, n: int) -> tuple[float, float]:
    """float64 value of the quantized dot, and the magnitude scale for a relative tolerance."""
    act = K.activation_type(name).name
    w, mins = exact_weights(name, raw_row)
    x, sums = activation_values(act, xq, n)
    prod = w.reshape(-1) * x
    total = prod.sum()
    scale = np.abs(prod).sum()
    if mins is not None:
        total += (mins * sums).sum()
        scale += np.abs(mins * sums).sum()
    return float(total), float(scale)


def weight_row(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    t = ggml_type(name)
    if t.block_elems == 1:
        v = rng.standard_normal(n).astype(np.float32)
        return {"F32": v.view(np.uint8), "F16": v.astype(np.float16).view(np.uint8),
                "BF16": (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)}[name]
    return realistic_blocks(name, 1, n // t.block_elems, rng).reshape(-1)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", DOT_TYPES)
def test_vec_dot_matches_scheme(name, level):
    rng = np.random.default_rng(sum(name.encode()) * 3 + len(level))
    act = K.activation_type(name)
    with K.forced_isa(level):
        for n in (256, 1024, 4864 // 256 * 256, 2816):
            if n % ggml_type(name).block_elems:
                continue
            w = weight_row(name, n, rng)
            x = activations(rng, n)
            xq = K.quantize_activation(x, act)
            got = K.vec_dot(name, w, xq, n)
            ref, scale = scheme_reference(name, w, xq, n)
            assert abs(got - ref) <= 1e-5 * scale + 1e-30, (name, level, n, got, ref)


@pytest.mark.parametrize("name", DOT_TYPES + FALLBACK_TYPES)
def test_simd_matches_scalar_and_float64(name):
    rng = np.random.default_rng(sum(name.encode()) + 99)
    t = ggml_type(name)
    rows, k = 48, 1024
    w = np.stack([weight_row(name, k, rng) for _ in range(rows)])
    x = np.stack([activations(rng, k, outliers=False) for _ in range(6)])  # 4-column GEMM tiles + a padded remainder
    dense = dequantize(w, t).astype(np.float64)
    ref = x.astype(np.float64) @ dense.T
    results = {}
    for level in LEVELS:
        with K.forced_isa(level):
            results[level] = K.matmat(t, w, rows, k, x)
            bound = (np.abs(x).astype(np.float64) @ np.abs(dense).T) * 1e-5 + 1e-30
            for j in range(6):  # matmat row j == matvec of x[j] (the prefill GEMM only reorders float sums)
                assert np.all(np.abs(K.matvec(t, w, rows, k, x[j]) - results[level][j]) <= bound[j]), (name, level, j)
            assert np.array_equal(K.matmat(t, w, rows, k, x, threads=1), results[level])
        err = np.linalg.norm(results[level] - ref) / np.linalg.norm(ref)
        assert err < 2e-2, (name, level, err)
    for level in LEVELS[1:]:
        scalar = results["scalar"]
        assert np.allclose(results[level], scalar, rtol=1e-4, atol=1e-4 * np.abs(scalar).max()), (name, level)


GEMM_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
              "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4"]
#: GEMM types whose group (one lane scale and min) is 16 elements
GEMM_GROUP16 = ("Q6_K", "Q2_K", "Q3_K", "IQ2_XS", "IQ2_S", "IQ1_M", "NVFP4")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", GEMM_TYPES)
def test_prefill_gemm_matches_row_dots(name, level):
    """The tiled GEMM (scalar tile, AVX2, AVX-512 VNNI) equals the row-by-row dot products up to float summation
    order, for ragged row and column counts and rows that are not a multiple of 64 elements; the thread count does
    not change its bits."""
    rng = np.random.default_rng(sum(name.encode()) + 5)
    t = ggml_type(name)
    for rows, k in ((50, 608 if t.block_elems == 32 else 768), (9, 2048)):
        w = np.stack([weight_row(name, k, rng) for _ in range(rows)])
        dense = np.abs(dequantize(w, t).astype(np.float64))
        for n_x in (4, 5, 7, 13, 37):
            x = np.stack([activations(rng, k) for _ in range(n_x)])
            with K.forced_isa(level):
                with K.prefill_gemm(True):
                    got = K.matmat(t, w, rows, k, x)
                    assert np.array_equal(K.matmat(t, w, rows, k, x, threads=1), got)
                with K.prefill_gemm(False):
                    ref = K.matmat(t, w, rows, k, x)
            bound = (np.abs(x).astype(np.float64) @ dense.T) * 1e-5 + 1e-30
            assert np.all(np.abs(got - ref) <= bound), (name, level, rows, k, n_x, float(np.abs(got - ref).max()))


def _decode_row(name: str, row: np.ndarray, k: int, simd: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from quantscope.core.native import ffi, lib

    t = ggml_type(name)
    group = 16 if name in GEMM_GROUP16 else 32
    k64 = (k + 63) // 64 * 64
    codes = np.full(k64, 0xAA, np.uint8)
    ws = np.full(k64 // 4, np.nan, np.float32)
    mins = np.full((k // group + 15) // 16 * 16, np.nan, np.float32)
    assert row.size == k // t.block_elems * t.block_bytes
    def p(a: np.ndarray, ctype: str) -> object:
        return ffi.cast(ctype, ffi.from_buffer(a))

    rc = lib.qs_gemm_decode_row(t.id, p(row, "uint8_t *"), k, simd, p(codes, "uint8_t *"), p(ws, "float *"),
                                p(mins, "float *"))
    assert rc == 0
    return codes, ws, mins


@pytest.mark.parametrize("name", GEMM_TYPES)
def test_gemm_row_decoders(name):
    """The scalar decoder rebuilds the dequantized row from codes, lane scales and group mins; the AVX2 and AVX-512
    decoders are bit-identical to it (random blocks, padding included)."""
    rng = np.random.default_rng(sum(name.encode()) + 17)
    t = ggml_type(name)
    group = 16 if name in GEMM_GROUP16 else 32
    for k in ((96, 608, 1024) if t.block_elems == 32 else (256, 768)):
        row = weight_row(name, k, rng)
        codes, ws, mins = _decode_row(name, row, k, 0)
        lanes = np.repeat(ws, 4)[:k].astype(np.float64)
        per_group = np.repeat(mins[: k // group], group).astype(np.float64)
        rebuilt = lanes * codes[:k] - per_group  # w = s*c - min for every type (see csrc/qs_gemm.h)
        assert np.allclose(rebuilt, dequantize(row, t).astype(np.float64), rtol=1e-6, atol=1e-6)
        assert not codes[k:].any() and not ws[k // 4 :].any() and not mins[k // group :].any()
        for level in LEVELS[1:]:  # the AVX2 and AVX-512 decoders (scalar where a level has none)
            with K.forced_isa(level):
                simd = _decode_row(name, row, k, 1)
            for a, b in zip(simd, (codes, ws, mins), strict=True):
                assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), (name, level)


def _real_tensors(model_path, picks: dict[str, list[str]]):
    """(file, tensor, k, rows, raw bytes) for each picked tensor of each model."""
    for model, names in picks.items():
        with GGUFFile(model_path(model)) as f:
            for n in names:
                t = f.tensor(n)
                yield f, t, t.ne[0], t.n_rows, f.tensor_bytes(t)


def test_prefill_gemm_on_real_tensors(model_path):
    rng = np.random.default_rng(3)
    picks = {"smollm2": ["blk.0.ffn_down.weight", "blk.0.attn_k.weight"],
             "gemma3": ["blk.0.attn_q.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight",
                        "blk.1.ffn_down.weight", "blk.1.attn_v.weight"],
             "qwen2.5-coder": ["blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "blk.2.ffn_down.weight"]}
    for f, t, k, rows, w in _real_tensors(model_path, picks):
        x = rng.standard_normal((19, k)).astype(np.float32)
        dense = np.abs(dequantize(f.tensor_rows(t), t.type).astype(np.float64))
        with K.prefill_gemm(False):
            ref = K.matmat(t.type, w, rows, k, x)
        bound = (np.abs(x).astype(np.float64) @ dense.T) * 1e-5
        for level in LEVELS[1:]:
            with K.forced_isa(level), K.prefill_gemm(True):
                got = K.matmat(t.type, w, rows, k, x)
            assert np.all(np.abs(got - ref) <= bound), (t.name, level)


def test_matvec_on_real_tensors(model_path):
    rng = np.random.default_rng(7)
    picks = {"smollm2": ["blk.0.ffn_up.weight", "blk.0.attn_k.weight"],
             "gemma3": ["blk.0.attn_output.weight", "blk.0.ffn_down.weight", "blk.1.ffn_down.weight"],
             "qwen2.5-coder": ["blk.0.ffn_down.weight", "blk.2.ffn_down.weight", "blk.0.ffn_up.weight",
                               "blk.0.attn_v.weight"]}
    for f, t, k, rows, w in _real_tensors(model_path, picks):
        x = rng.standard_normal(k).astype(np.float32)
        ref = dequantize(f.tensor_rows(t), t.type).astype(np.float64) @ x.astype(np.float64)
        ys = []
        for level in LEVELS:
            with K.forced_isa(level):
                y = K.matvec(t.type, w, rows, k, x, threads=2)
            assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 2e-2, (t.name, level)
            ys.append(y)
        for y in ys[1:]:
            assert np.allclose(y, ys[0], rtol=1e-4, atol=1e-4 * np.abs(ys[0]).max()), t.name


def test_wrappers_validate_sizes():
    w = np.zeros(10 * 144, np.uint8)
    x = np.zeros(256, np.float32)
    with pytest.raises(ValueError, match="1440"):
        K.matvec("Q4_K", w[:-1], 10, 256, x)
    with pytest.raises(ValueError, match="multiple"):
        K.matvec("Q4_K", w, 10, 250, np.zeros(250, np.float32))
    with pytest.raises(ValueError, match="256 elements"):
        K.matvec("Q4_K", w, 10, 256, x[:-1])
    with pytest.raises(TypeError, match="float32"):
        K.matvec("Q4_K", w, 10, 256, x.astype(np.float64))
    with pytest.raises(ValueError, match="whole"):
        K.dequantize(np.zeros(143, np.uint8), "Q4_K")
    with pytest.raises(ValueError, match="multiple of 256"):
        K.quantize_activation(np.zeros(100, np.float32), "Q8_K")
    with pytest.raises(NotImplementedError):
        K.dequantize(np.zeros(18, np.uint8), "Q1_0")
    with pytest.raises(ValueError, match="bytes"):
        K.vec_dot("Q8_0", np.zeros(34, np.uint8), np.zeros(33, np.uint8), 32)


# ---------------------------------------------------------------- thread pool
def _case(name="Q4_K", rows=512, k=1024, seed=11):
    from quantscope.core.bench import random_weights

    w = random_weights(name, rows, k, seed)
    x = np.random.default_rng(seed).standard_normal(k).astype(np.float32)
    return name, w, rows, k, x


def test_thread_count_does_not_change_bits():
    name, w, rows, k, x = _case()
    ref = K.matvec(name, w, rows, k, x, threads=1)
    for n in (2, 3, 4, 8):
        assert np.array_equal(K.matvec(name, w, rows, k, x, threads=n), ref)


def test_concurrent_callers_from_python_threads():
    from concurrent.futures import ThreadPoolExecutor

    cases = [_case(t, seed=i) for i, t in enumerate(["Q4_K", "Q6_K", "Q8_0", "Q5_0"])]
    expected = [K.matvec(n, w, r, k, x, threads=1) for n, w, r, k, x in cases]

    def run(i: int) -> bool:
        n, w, r, k, x = cases[i % 4]
        return all(np.array_equal(K.matvec(n, w, r, k, x, threads=2), expected[i % 4]) for _ in range(20))

    with ThreadPoolExecutor(4) as ex:
        assert all(ex.map(run, range(8)))


def test_pool_survives_fork():
    """A forked child (the GNU OpenMP hazard) can use the multi-threaded kernels."""
    import os
    import time

    name, w, rows, k, x = _case()
    ref = K.matvec(name, w, rows, k, x, threads=2)  # the parent's pool is running
    pid = os.fork()
    if pid == 0:  # child
        ok = np.array_equal(K.matvec(name, w, rows, k, x, threads=2), ref)
        os._exit(0 if ok else 3)
    deadline = time.monotonic() + 120  # a hang guard (the child multiplies under load too)
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    pytest.fail("forked child hung in the kernel thread pool")


def test_get_rows_any_type(model_path):
    with GGUFFile(model_path("qwen2.5-coder")) as f:
        t = f.tensor("token_embd.weight")  # Q5_0, 151936 x 896
        ids = np.array([0, 151935, 42, 42], np.int64)
        rows = K.get_rows(t.type, f.tensor_bytes(t), t.n_rows, t.ne[0], ids)
        ref = dequantize(f.tensor_rows(t)[ids], t.type)
        assert np.array_equal(rows.view(np.uint32), ref.view(np.uint32))
        with pytest.raises(IndexError):
            K.get_rows(t.type, f.tensor_bytes(t), t.n_rows, t.ne[0], np.array([151936]))


@pytest.mark.parametrize("isa", K.ISA_NAMES[1:])
def test_f16_bf16_rows_every_bit_pattern(isa: str) -> None:
    """The bulk F16/BF16 conversions (F16C or NEON, shifts) give the scalar conversion's bits for all 65536
    patterns, NaN payloads included (the instruction alone would quiet signalling NaNs), at every length remainder."""
    if isa not in LEVELS:
        pytest.skip(f"this CPU has no {isa}")
    pats = np.arange(65536, dtype=np.uint16)
    for t in ("F16", "BF16"):
        raw = pats.view(np.uint8)
        with K.forced_isa("scalar"):
            ref = K.dequantize(raw, t).view(np.uint32)
        with K.forced_isa(isa):
            got = K.dequantize(raw, t).view(np.uint32)
            for n in (1, 7, 9, 23):  # tails shorter than a vector
                assert np.array_equal(K.dequantize(raw[2:2 + 2 * n], t).view(np.uint32), ref[1:1 + n])
        assert np.array_equal(got, ref), t
        if t == "F16":
            finite = np.isfinite(pats.view(np.float16))
            assert np.array_equal(got.view(np.float32)[finite], pats.view(np.float16)[finite].astype(np.float32))
