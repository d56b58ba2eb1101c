"""Repacked weights (csrc/qs_repack*.c, docs/engine.md#repacked-weights): the AVX-512 kernels equal the scalar
reference on the repacked layout bit for bit (BF16's vdpbf16ps kernels within one rounding per step), and both
equal the row-by-row kernels on the file's layout up to float summation order, on random and real tensors; sizes
are checked in C; the engine gives the same logits repacked or not, reports progress and can be cancelled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from quantscope.core.engine.reference import reference_logits
from quantscope.core.engine.session import Model
from quantscope.core.gguf import GGUFFile
from quantscope.core.native import ffi, lib
from quantscope.core.native import kernels as K
from quantscope.core.quant import dequantize, ggml_type

from .test_native_kernels import activations, weight_row

REPACK_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4", "IQ4_XS", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                "Q6_K", "F32", "F16", "BF16"]
NEEDS_SIMD = pytest.mark.skipif(K.isa_detected() == "scalar", reason="the engine repacks only for SIMD kernels")
#: SIMD levels of the repacked kernels this machine can run (each is compared with the scalar reference bit for bit)
SIMD_LEVELS = K.ISA_NAMES[1 : K.ISA_NAMES.index(K.isa_detected()) + 1]


def _weights(name: str, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    return np.stack([weight_row(name, k, rng) for _ in range(rows)])


def _bound(x: np.ndarray, w: np.ndarray, t) -> np.ndarray:
    dense = np.abs(dequantize(w, t).astype(np.float64))
    return (np.abs(x).astype(np.float64) @ dense.T) * 1e-5 + 1e-30


def _layout_block(t) -> int:
    return 256 if t.block_elems == 256 else 16 if t.block_elems == 1 else 64


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the bfloat16 values as float32, rounded to nearest even (ggml's and qs_fp32_to_bf16's rounding)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def _dp_bound(x: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """How far vdpbf16ps may be from the scalar reference: both add the same products, each exact in float32 (two
    8-bit significands), to the same chains; the instruction may take a pair's two products in the other order, or
    add them at once, and flushes subnormals. Every one of the k steps then differs by at most one rounding of the
    running sum (2^-24 relative), and the flushed subnormals are below 1e-30 in all."""
    k = x.shape[1]
    return (np.abs(_bf16(x)).astype(np.float64) @ np.abs(dense.astype(np.float64)).T) * (k * 2.0**-24) + 1e-30


def _simd_levels_agree(rp, x: np.ndarray, ref: np.ndarray, dense: np.ndarray, what) -> None:
    """Every SIMD level on this machine gives the scalar reference's bits; BF16's vdpbf16ps kernels (AVX-512 with
    AVX512_BF16) come within _dp_bound, and its AVX-512F fallback gives the bits."""
    for level in SIMD_LEVELS:
        with K.forced_isa(level):
            if rp.type.name == "BF16" and level == "avx512":
                with K.bf16_dot(False) as on:
                    assert not on
                    assert np.array_equal(rp.matmat(x), ref), (what, "avx512f")
                    assert np.array_equal(rp.matmat(x[:1]), ref[:1]), (what, "avx512f")
                with K.bf16_dot(True) as on:
                    assert on == K.has_avx512_bf16()
                    got = rp.matmat(x)
                    assert np.all(np.abs(got - ref) <= _dp_bound(x, dense)), (what, level)
                    assert np.array_equal(rp.matmat(x[:1]), got[:1])  # one column and eight: the same sums
                    assert np.array_equal(rp.matmat(x, threads=1), got)
                continue
            got = rp.matmat(x)
            assert np.array_equal(got, ref), (what, level)
            assert np.array_equal(rp.matmat(x, threads=1), got)
            assert np.array_equal(rp.matmat(x[:1]), ref[:1]), (what, level)


@pytest.mark.parametrize("name", REPACK_TYPES)
def test_repacked_equals_scalar_reference_and_row_dots(name):
    rng = np.random.default_rng(sum(name.encode()) + 41)
    t = ggml_type(name)
    for rows, k in ((48, 1024), (16, 256 if t.block_elems == 256 else 128), (32, 2816), (16, 16)):
        if k % _layout_block(t):
            continue
        w = _weights(name, rows, k, rng)
        rp = K.Repacked(name, w, rows, k)
        assert rp.nbytes == lib.qs_repack_bytes(t.id, rows, k) > 0
        assert rp.nbytes == w.nbytes or t.block_elems > 1  # float layouts only reorder
        dense = dequantize(w, t).reshape(rows, k)
        for n_x in (1, 3, 4, 5, 8, 9, 17):  # the wide kernel (4 or 8 columns), the 1-column kernel and their mix
            x = np.stack([activations(rng, k, outliers=k >= 96) for _ in range(n_x)])
            with K.forced_isa("scalar"):
                ref_scalar = rp.matmat(x)
            if name in ("F32", "F16"):
                # float layouts keep the activations float32 (the file layout's F16 dot rounds them to F16, as
                # ggml does): judged against the float64 product
                ref = x.astype(np.float64) @ dense.astype(np.float64).T
            else:  # BF16 rounds the activations to BF16 in both layouts, as ggml does
                ref = np.stack([K.matvec(name, w, rows, k, xi) for xi in x])
            assert np.all(np.abs(ref_scalar - ref) <= _bound(x, w, t)), (name, rows, k, n_x)
            _simd_levels_agree(rp, x, ref_scalar, dense, (name, rows, k, n_x))


def test_bf16_layout_rounds_activations_as_ggml():
    """The BF16 layout's product is that of the activations rounded to BF16 (nearest even, as ggml's
    vec_dot_type), not of the float32 ones: with weights 1 the sum of the rounded values, exactly."""
    k = 64
    w = np.full((16, k), 0x3F80, np.uint16).view(np.uint8)  # 1.0
    x = np.zeros((1, k), np.float32)
    x[0, 0] = np.float32(1.0) + np.float32(2.0**-8)  # a tie: rounds to even, 1.0
    x[0, 1] = np.float32(1.0) + np.float32(3 * 2.0**-8)  # a tie: rounds up to 1 + 2^-6
    x[0, 2] = np.float32(1.0) + np.float32(2.0**-9)  # below half: 1.0
    rp = K.Repacked("BF16", w.reshape(-1), 16, k)
    want = float(_bf16(x).astype(np.float64).sum())
    assert want == 3 + 2.0**-6
    for level in ("scalar", *SIMD_LEVELS):
        with K.forced_isa(level):
            assert np.all(rp.matmat(x) == np.float32(want)), level


def test_bf16_activation_rounding_at_every_level():
    """The BF16 layout's activation conversion (scalar, AVX2, AVX-512) rounds as ggml: with the identity as weights
    the product is each activation rounded to BF16, on ties to even and odd, carries into the exponent, tiny and
    huge values (vdpbf16ps flushes subnormals: within 1e-30 there)."""
    rng = np.random.default_rng(5)
    n = 64
    w = np.zeros((n, n), np.uint16)
    w[np.arange(n), np.arange(n)] = 0x3F80
    rp = K.Repacked("BF16", w.view(np.uint8).reshape(-1), n, n)
    bits = rng.integers(0, 1 << 32, (3, n), dtype=np.uint64).astype(np.uint32)
    bits &= np.uint32(0xBFFFFFFF)  # below the exponent that could round to infinity (0 x inf is NaN elsewhere)
    bits[0, :8] = [0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3FFFFFFF, 0x00008000, 0x00018000, 0x7F7F7FFF, 0x807F8000]
    x = bits.view(np.float32)
    want = _bf16(x)
    for level in ("scalar", *SIMD_LEVELS):
        with K.forced_isa(level):
            got = rp.matmat(x)
            tiny = 1e-30 if level == "avx512" and K.has_avx512_bf16() else 0.0
            assert np.all(np.abs(got.astype(np.float64) - want) <= tiny), level
            assert np.array_equal(got[np.abs(want) > 1e-30], want[np.abs(want) > 1e-30]), level


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="the kernel's CPU flags are a Linux file")
def test_bf16_dot_detection_agrees_with_the_kernel_s_cpu_flags():
    """vdpbf16ps runs only where the CPU (and the OS's saved state) has AVX512_BF16; switching it off is possible
    everywhere, switching it on only there."""
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            flags = set(line.split(":", 1)[1].split())
            break
    has = "avx512_bf16" in flags and "avx512f" in flags
    assert K.has_avx512_bf16() == has
    with K.bf16_dot(True) as on:
        assert on == has
        with K.bf16_dot(False) as off:
            assert not off
        assert bool(lib.qs_bf16_dot_set(-1)) == has  # restored


def _packed_job(mats: list[tuple[str, int]], k: int, rng: np.random.Generator) -> tuple:
    """Repacked random matrices (type, rows) of row length k, and the type, pointer and row arrays of one job."""
    packed = [K.Repacked(name, _weights(name, rows, k, rng), rows, k) for name, rows in mats]
    return (packed, ffi.new("int[]", [rp.type_id for rp in packed]), ffi.new("uint8_t *[]", [rp.ptr for rp in packed]),
            ffi.new("int64_t[]", [rows for _, rows in mats]))


def test_products_of_one_input_in_one_job():
    """q/k/v and gate/up run as one pool job (guided chunks across the matrices): the same bits as one call per
    matrix, for decode and prefill, at 1 and 2 threads, on mixed layouts; bad arguments are refused."""
    rng = np.random.default_rng(7)
    k = 512
    mats = [("Q4_K", 48), ("Q6_K", 16), ("F16", 80), ("Q4_0", 32)]
    packed, types, ws, rows = _packed_job(mats, k, rng)
    for n_x in (1, 5, 12):
        x = np.stack([activations(rng, k) for _ in range(n_x)])
        xp = ffi.cast("float *", ffi.from_buffer(x))
        want = [rp.matmat(x, threads=1) for rp in packed]
        for threads in (1, 2):
            ys = [np.full((n_x, r), np.nan, np.float32) for _, r in mats]
            yp = ffi.new("float *[]", [ffi.cast("float *", ffi.from_buffer(y)) for y in ys])
            assert lib.qs_rp_matmat_multi(len(mats), types, ws, rows, k, xp, n_x, yp, threads) == 0
            for y, w in zip(ys, want, strict=True):
                assert np.array_equal(y, w), (n_x, threads)
    x = np.ones((1, k), np.float32)
    xp = ffi.cast("float *", ffi.from_buffer(x))
    ys = [np.zeros((1, r), np.float32) for _, r in mats]
    yp = ffi.new("float *[]", [ffi.cast("float *", ffi.from_buffer(y)) for y in ys])
    assert lib.qs_rp_matmat_multi(0, types, ws, rows, k, xp, 1, yp, 1) < 0
    many = 33  # more than 32 products in one job
    t33 = ffi.new("int[]", [packed[0].type_id] * many)
    w33 = ffi.new("uint8_t *[]", [packed[0].ptr] * many)
    r33 = ffi.new("int64_t[]", [48] * many)
    y33 = [np.zeros((1, 48), np.float32) for _ in range(many)]
    p33 = ffi.new("float *[]", [ffi.cast("float *", ffi.from_buffer(y)) for y in y33])
    assert lib.qs_rp_matmat_multi(many, t33, w33, r33, k, xp, 1, p33, 1) < 0
    assert lib.qs_rp_matmat_multi(many - 1, t33, w33, r33, k, xp, 1, p33, 1) == 0
    plain = ffi.new("int[]", [ggml_type("Q4_K").id])
    assert lib.qs_rp_matmat_multi(1, plain, ws, rows, k, xp, 1, yp, 1) < 0  # not a repacked type id
    assert lib.qs_rp_matmat_multi(1, types, ws, rows, k - 64, xp, 1, yp, 1) < 0  # k not whole layout blocks
    odd = ffi.new("int64_t[]", [40])
    assert lib.qs_rp_matmat_multi(1, types, ws, odd, k, xp, 1, yp, 1) < 0  # rows not whole groups


def test_products_of_their_own_inputs_in_one_job():
    """A decode step's experts' down products: one pool job, each matrix with its own input (the same input twice
    for two of them), the same bits as one call per matrix; a missing input is refused."""
    rng = np.random.default_rng(11)
    k = 512
    mats = [("Q4_K", 48), ("Q6_K", 16), ("Q4_K", 32), ("Q8_0", 16)]
    packed, types, ws, rows = _packed_job(mats, k, rng)
    xs = [activations(rng, k)[None, :] for _ in range(3)]
    xs.append(xs[1])
    want = [rp.matmat(x, threads=1) for rp, x in zip(packed, xs, strict=True)]
    xp = ffi.new("float *[]", [ffi.cast("float *", ffi.from_buffer(x)) for x in xs])
    for threads in (1, 2):
        ys = [np.full((1, r), np.nan, np.float32) for _, r in mats]
        yp = ffi.new("float *[]", [ffi.cast("float *", ffi.from_buffer(y)) for y in ys])
        assert lib.qs_rp_matmat_multi_x(len(mats), types, ws, rows, k, xp, 1, yp, threads) == 0
        for y, w in zip(ys, want, strict=True):
            assert np.array_equal(y, w), threads
    xp[2] = ffi.NULL
    assert lib.qs_rp_matmat_multi_x(len(mats), types, ws, rows, k, xp, 1, yp, 1) < 0


def test_repacked_on_real_tensors(model_path):
    rng = np.random.default_rng(5)
    picks = {"smollm2": ["blk.0.ffn_down.weight", "blk.0.attn_k.weight", "token_embd.weight"],
             "gemma3": ["blk.0.attn_q.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight",
                        "blk.1.ffn_down.weight"],
             "qwen2.5-coder": ["blk.0.ffn_up.weight", "blk.11.ffn_down.weight", "output.weight"]}
    seen = set()
    for model, names in picks.items():
        with GGUFFile(model_path(model)) as f:
            for n in names:
                t = f.tensor(n)
                k, rows, w = t.ne[0], t.n_rows, f.tensor_bytes(t)
                if not K.can_repack(t.type, rows, k):
                    continue
                seen.add(t.type.name)
                rp = K.Repacked(t.type, w, rows, k)
                x = rng.standard_normal((5, k)).astype(np.float32)
                ref = K.matmat(t.type, w, rows, k, x)
                got = rp.matmat(x)
                dense = np.abs(dequantize(f.tensor_rows(t), t.type).astype(np.float64))
                assert np.all(np.abs(got - ref) <= (np.abs(x).astype(np.float64) @ dense.T) * 1e-5), n
                for level in ("scalar", *SIMD_LEVELS):
                    with K.forced_isa(level):
                        assert np.array_equal(rp.matmat(x[:1]), got[:1]), (n, level)
                        assert np.array_equal(rp.matmat(x), got), (n, level)
    assert seen >= {"Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"}, seen


@pytest.mark.parametrize("name", ["IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K"])
def test_repacked_on_real_llama_quantize_rows(name):
    """16 real rows that llama-quantize wrote (tests/data/iq_blocks/TYPE-rows.bin, SmolLM2's blk.0.ffn_down with an
    importance matrix): every ISA equals the scalar reference bit for bit, and that equals the row dots up to float
    summation order."""
    from pathlib import Path

    t = ggml_type(name)
    raw = np.frombuffer((Path(__file__).parent / "data" / "iq_blocks" / f"{name}-rows.bin").read_bytes(), np.uint8)
    rows, k = 16, 1536
    assert raw.size == rows * t.row_bytes(k)
    rp = K.Repacked(name, raw, rows, k)
    x = np.random.default_rng(3).standard_normal((6, k)).astype(np.float32)
    with K.forced_isa("scalar"):
        ref = rp.matmat(x)
    dots = K.matmat(name, raw, rows, k, x)
    dense = np.abs(dequantize(raw, t).reshape(rows, k).astype(np.float64))
    assert np.all(np.abs(ref - dots) <= (np.abs(x).astype(np.float64) @ dense.T) * 1e-5)
    for level in SIMD_LEVELS:
        with K.forced_isa(level):
            assert np.array_equal(rp.matmat(x), ref), level
            assert np.array_equal(rp.matmat(x[:1]), ref[:1]), level


def test_float_layouts_on_real_values(model_path):
    """Real weights (Qwen2.5's ffn_down and output rows, dequantized) stored as F32, F16 and BF16: the SIMD kernels
    equal the scalar reference bit for bit (vdpbf16ps within _dp_bound), and the product is the float64 one (of the
    BF16-rounded activations for BF16) within float32 summation error."""
    rng = np.random.default_rng(11)
    with GGUFFile(model_path("qwen2.5-coder")) as f:
        for n in ("blk.11.ffn_down.weight", "output.weight"):
            t = f.tensor(n)
            dense = np.ascontiguousarray(dequantize(f.tensor_rows(t)[:64], t.type).reshape(64, t.ne[0]), np.float32)
            for name, w in (("F32", dense.view(np.uint8)), ("F16", dense.astype(np.float16).view(np.uint8)),
                            ("BF16", (dense.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8))):
                rows, k = dense.shape
                rp = K.Repacked(name, w, rows, k)
                x = rng.standard_normal((9, k)).astype(np.float32)
                wd = dequantize(w, ggml_type(name)).reshape(rows, k)
                xr = _bf16(x) if name == "BF16" else x
                want = xr.astype(np.float64) @ wd.astype(np.float64).T
                with K.forced_isa("scalar"):
                    ref = rp.matmat(x)
                bound = (np.abs(x).astype(np.float64) @ np.abs(dense.astype(np.float64)).T) * 1e-5
                assert np.all(np.abs(ref - want) <= bound), (n, name)
                _simd_levels_agree(rp, x, ref, wd, (n, name))


def test_shapes_without_a_layout_and_size_checks():
    assert not K.can_repack("IQ3_S", 64, 1024)  # no repacked layout for this type
    assert not K.can_repack("Q4_K", 40, 1024)  # rows not a multiple of 16
    assert not K.can_repack("Q4_0", 32, 96)  # k not a multiple of the 64-element layout block
    assert not K.can_repack("F16", 32, 72)  # k not a multiple of the float layouts' 16-element block
    assert K.can_repack("F16", 32, 80) and K.can_repack("BF16", 16, 16) and K.can_repack("F32", 48, 64)
    assert lib.qs_repack_type(ggml_type("IQ3_S").id) == -1
    w = _weights("Q4_K", 32, 512, np.random.default_rng(1))
    with pytest.raises(ValueError, match="no repacked layout"):
        K.Repacked("Q4_K", w[:20].reshape(-1), 20, 512)
    t = ggml_type("Q4_K")
    need = lib.qs_repack_bytes(t.id, 32, 512)
    dst = np.zeros(need, np.uint8)
    src = ffi.cast("uint8_t *", ffi.from_buffer(w))
    out = ffi.cast("uint8_t *", ffi.from_buffer(dst))
    assert lib.qs_repack(t.id, src, w.nbytes, 32, 512, out, need - 1, 0, 2, 1) == -1  # destination too short
    assert lib.qs_repack(t.id, src, w.nbytes - 1, 32, 512, out, need, 0, 2, 1) == -4  # source too short
    assert lib.qs_repack(t.id, src, w.nbytes, 32, 512, out, need, 0, 3, 1) == -1  # groups past the end
    assert lib.qs_repack(t.id, src, w.nbytes, 32, 512, out, need, 0, 2, 1) == 0
    x = np.ones((1, 512), np.float32)
    xp = ffi.cast("float *", ffi.from_buffer(x))
    y = np.zeros((1, 32), np.float32)
    yp = ffi.cast("float *", ffi.from_buffer(y))
    rtype = lib.qs_repack_type(t.id)
    assert lib.qs_matmat(rtype, out, 32, 512, xp, 1, yp, 1) == 0
    assert np.allclose(y[0], K.matmat("Q4_K", w, 32, 512, x)[0], rtol=1e-5, atol=1e-4)
    assert lib.qs_matmat(rtype, out, 24, 512, xp, 1, yp, 1) < 0  # 24 rows: not whole groups
    assert lib.qs_matmat(rtype, out, 32, 500, xp, 1, yp, 1) < 0
    assert lib.qs_weight_bytes(rtype, 32, 512) == need
    assert lib.qs_weight_bytes(t.id, 32, 512) == 32 * 512 // 256 * 144


def test_progress_and_cancel():
    w = _weights("Q4_0", 64, 128, np.random.default_rng(2))
    seen: list[int] = []
    rp = K.Repacked("Q4_0", w, 64, 128, progress=seen.append)
    assert seen and seen[-1] == w.nbytes and seen == sorted(seen)
    assert rp.type_id == lib.qs_repack_type(ggml_type("Q4_0").id)
    with pytest.raises(K.RepackCancelled):
        K.Repacked("Q4_0", w, 64, 128, cancel=lambda: True)


def _mapping_rss_kib(path, addr: int | None = None) -> int:
    """Resident KiB of this process's mappings of ``path`` (from /proc/self/smaps); with ``addr``, only of the one
    that contains it (other tests in this process may hold mappings of the same file)."""
    total, ours = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's header line
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                ours = line.rstrip().endswith(str(path)) and (addr is None or lo <= addr < hi)
            elif ours and head and head[0] == "Rss:":
                total += int(head[1])
    return total


def test_repack_releases_the_file_pages_as_it_goes(tmp_path):
    """With ``release_source`` the file's pages are dropped chunk by chunk (the copy and the file's pages are never
    both resident: issue 14's RSS budget); arrays that are not read-only file mappings are never touched."""
    import mmap

    from quantscope.core.bench import random_weights

    rows, k = 16 * 1088, 4096  # ~40 MB of Q4_K: five ~8 MiB chunks
    w = random_weights("Q4_K", rows, k)
    path = tmp_path / "w.bin"
    path.write_bytes(w.tobytes())
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    mapped = np.frombuffer(m, np.uint8)
    peak: list[int] = []
    kept = K.Repacked("Q4_K", mapped, rows, k, progress=lambda _n: peak.append(_mapping_rss_kib(path)))
    assert _mapping_rss_kib(path) > 30_000  # without release_source the file's pages stay
    K.drop_pages(mapped)
    assert _mapping_rss_kib(path) < 64
    peak.clear()
    released = K.Repacked("Q4_K", mapped, rows, k, release_source=True,
                          progress=lambda _n: peak.append(_mapping_rss_kib(path)))
    assert len(peak) >= 4 and max(peak) < 12_000, peak  # at most about one chunk resident at any time
    assert _mapping_rss_kib(path) < 64
    x = np.random.default_rng(3).standard_normal((2, k)).astype(np.float32)
    assert np.array_equal(kept.matmat(x), released.matmat(x))
    # anonymous and writable arrays: MADV_DONTNEED would zero them, so drop_pages leaves them alone
    anon = w.copy()
    K.drop_pages(anon)
    assert np.array_equal(anon, w)
    with open(path, "r+b") as f:
        cow = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), np.uint8)
    cow[:4] = 0
    K.drop_pages(cow)
    assert not cow[:4].any()
    del mapped, cow
    m.close()


@NEEDS_SIMD
@pytest.mark.parametrize("name", ["smollm2", "gemma3", "qwen2.5-coder"])
def test_engine_logits_repacked_or_not(model_path, name):
    ids = [1, 450, 7483, 310, 3444, 338, 3681, 29889, 13, 3492, 526]
    plain = Model.load(str(model_path(name)), threads=2)
    packed = Model.load(str(model_path(name)), threads=2)
    fractions: list[float] = []
    assert packed.repack(progress=fractions.append) > 0
    assert fractions[-1] == pytest.approx(1.0) and fractions == sorted(fractions)
    assert packed.repacked_bytes > 0
    a = plain.session(64).forward(ids, all_logits=True).astype(np.float64)
    b = packed.session(64).forward(ids, all_logits=True).astype(np.float64)
    # Reordered float sums make requantized activations round differently now and then, so the two part by about
    # the activation-quantization error; against the float64 reference (no activation quantization) the repacked
    # engine is as close as the plain one.
    ref = reference_logits(plain.config, plain.weights, ids)
    err, cos = {}, {}
    for label, got in (("plain", a), ("repacked", b)):
        cos[label] = float(((got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)).min())
        err[label] = float(np.median(np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)))
    assert err["repacked"] < 1.5 * err["plain"] + 0.01, err
    assert cos["repacked"] > cos["plain"] - 0.01, cos
    agree = {label: int((got.argmax(1) == ref.argmax(1)).sum()) for label, got in (("plain", a), ("repacked", b))}
    assert agree["repacked"] >= agree["plain"] - 2, agree
    tb = packed.session(64)  # on the repacked layout, one column and four columns per pass give the same bits
    steps = np.stack([tb.forward([tok]) for tok in ids])
    assert np.array_equal(steps, b.astype(np.float32))
    assert packed.repack() == 0  # sessions exist: their blocks hold pointers, nothing is swapped under them


@NEEDS_SIMD
def test_repacked_engine_leaves_no_file_pages_resident(model_path):
    """After repacking, the only reader of the file's mapping is the embedding lookup: the load and a prompt leave
    almost none of the file resident (issue 14's RSS budget), and the logits are the same either way."""
    path = model_path("gemma3")  # tied embeddings: the repacked copy is the lm_head, the file's table only looks up
    m = Model.load(str(path), threads=2)
    addr = m.tok_embd.data.ctypes.data
    assert m.repack() > 0 and m.release_embd_pages
    assert _mapping_rss_kib(path, addr) < 12288
    ids = np.random.default_rng(5).integers(0, m.config.n_vocab, size=64)
    got = m.session(80).forward(ids)
    assert _mapping_rss_kib(path, addr) < 12288
    m.release_embd_pages = False
    assert np.array_equal(m.session(80).forward(ids), got)


@NEEDS_SIMD
def test_repacked_model_when_the_file_is_truncated(model_path, tmp_path):
    """Repacked weights are copies, but the embedding lookups still read the file's mapping: after a truncation a
    lookup raises MappedFileError (the guard), never a crash, and the model's copies are untouched."""
    import shutil

    path = tmp_path / "m.gguf"
    shutil.copyfile(model_path("smollm2"), path)
    m = Model.load(str(path), threads=2)
    assert m.repack() > 0 and m.release_embd_pages
    s = m.session(32)
    before = s.forward([1, 2, 3])
    with open(path, "r+b") as f:
        f.truncate(4096)
    with pytest.raises(K.MappedFileError):
        s.forward([m.config.n_vocab - 1])
    assert np.isfinite(before).all()


@NEEDS_SIMD
def test_engine_repack_cancel_and_cli_switch(model_path, capsys):
    import threading

    from quantscope.cli.main import main
    from quantscope.core.engine.generate import Engine, LoadCancelled

    path = model_path("smollm2")
    ev = threading.Event()

    def progress(msg: str, frac: float) -> None:
        if msg == "repacking weights" and frac > 0.9:
            ev.set()

    with pytest.raises(LoadCancelled):
        Engine(path, n_ctx=64, threads=2, backend="cpu", progress=progress, cancel=ev)
    eng = Engine(path, n_ctx=64, threads=2, backend="cpu")
    assert "repacked" in eng.backend_reason and eng.model.repacked_bytes > 0
    eng = Engine(path, n_ctx=64, threads=2, backend="cpu", repack=False)
    assert "repacked" not in eng.backend_reason and eng.model.repacked_bytes == 0
    assert main(["generate", str(path), "-p", "The capital of France is", "-n", "4", "--seed", "1", "--backend",
                 "cpu", "--no-repack"]) == 0
    err = capsys.readouterr().err
    assert "backend: cpu" in err and "repacked" not in err
