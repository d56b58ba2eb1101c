"""Flash attention for prefill (csrc/cuda/qsc_flash.cuh, launched from qsc_fast.cuh).

Everywhere the library is built: the kernel's blocks, KV tiles and online-softmax recurrence run on the host, against
the float64 reference, the CPU attention (core.native.nn, with soft-capping and sinks) and k_attention's algorithm
as it is today (also emulated on the host). On a GPU (skipped with the reason otherwise): the device kernel, which
``gpu_attention`` reaches from 16 query tokens on.
"""

from __future__ import annotations

import cffi
import numpy as np
import pytest

from quantscope.core.engine import cuda_kernels as ck
from quantscope.core.native import nn

from . import test_cuda
from .test_native_nn import attention_ref

cuda_lib, gpu = test_cuda.cuda_lib, test_cuda.gpu  # the session fixtures, shared
CDEF = """
int qsc_host_flash(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim, const void *k_cache,
                   const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window, float scale, float softcap,
                   const float *sinks, float *out);
int qsc_host_kattn(const float *q, int n_q, const int32_t *q_pos, int n_heads, int head_dim, const void *k_cache,
                   const void *v_cache, int kv_f16, int n_kv_heads, int n_kv, int window, float scale, float *out);
"""


@pytest.fixture(scope="module")
def lib(cuda_lib):
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return ffi, ffi.dlopen(str(cuda_lib))


def _args(lib, q, q_pos, k, v):
    """The leading arguments of both entry points (the cdata keep their arrays alive) and the output array."""
    ffi, _ = lib
    q = np.ascontiguousarray(q, np.float32)
    pos = np.ascontiguousarray(q_pos, np.int32)
    k, v = np.ascontiguousarray(k), np.ascontiguousarray(v)
    out = np.full(q.shape, np.nan, np.float32)
    p = (ffi.from_buffer("float[]", q), q.shape[0], ffi.from_buffer("int32_t[]", pos), q.shape[1], q.shape[2],
         ffi.from_buffer(k), ffi.from_buffer(v), int(k.dtype == np.float16), k.shape[1])
    return p, out


def host_flash(lib, q, q_pos, k, v, n_kv, scale, window=0, softcap=0.0, sinks=None):
    ffi, L = lib
    p, out = _args(lib, q, q_pos, k, v)
    s = np.ascontiguousarray(sinks, np.float32) if sinks is not None else None
    rc = L.qsc_host_flash(*p, n_kv, window, scale, softcap,
                          ffi.from_buffer("float[]", s) if s is not None else ffi.NULL, ffi.from_buffer("float[]", out))
    return out if rc == 0 else None


def host_kattn(lib, q, q_pos, k, v, n_kv, scale, window=0):
    ffi, L = lib
    p, out = _args(lib, q, q_pos, k, v)
    assert L.qsc_host_kattn(*p, n_kv, window, scale, ffi.from_buffer("float[]", out)) == 0
    return out


def case(rng, dtype, hd, n_q=40, n_ctx=100, n_kv_heads=2, n_heads=6, n_past=53):
    k = rng.standard_normal((n_ctx, n_kv_heads, hd)).astype(dtype)
    v = rng.standard_normal((n_ctx, n_kv_heads, hd)).astype(dtype)
    q = (rng.standard_normal((n_q, n_heads, hd)) * 0.3).astype(np.float32)
    q_pos = np.arange(n_past, n_past + n_q, dtype=np.int32)  # a prefill chunk after n_past cached tokens
    return q, q_pos, k, v, n_past + n_q


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("window", [0, 5, 40])
@pytest.mark.parametrize("hd", [32, 64, 128])
def test_flash_matches_cpu_attention_and_k_attention(lib, dtype, window, hd):
    """40 query tokens x 3 heads per KV head = 120 rows: 4 blocks per KV head, the last one partial; 93 keys: three
    full tiles and a partial one; windows smaller than a tile (whole tiles masked for a row) and larger."""
    rng = np.random.default_rng(hd + window)
    q, q_pos, k, v, n_kv = case(rng, dtype, hd)
    ref = attention_ref(q, q_pos, k, v, n_kv, 0.125, window)
    got = host_flash(lib, q, q_pos, k, v, n_kv, 0.125, window)
    assert got is not None
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-5), np.abs(got - ref).max()
    cpu = nn.attention(q, q_pos, k, v, n_kv, scale=0.125, window=window)
    assert np.allclose(got, cpu, rtol=1e-4, atol=1e-5)
    today = host_kattn(lib, q, q_pos, k, v, n_kv, 0.125, window)
    assert np.allclose(today, ref, rtol=1e-4, atol=1e-5)
    assert np.allclose(got, today, rtol=1e-4, atol=1e-5)


def test_flash_scattered_positions_and_query_past_the_cache(lib):
    """Rows of one block with far-apart positions (the block's key range is the union), and a query whose position
    lies past n_kv (it sees the cache up to n_kv - 1, as k_attention)."""
    rng = np.random.default_rng(11)
    q, _, k, v, _ = case(rng, np.float16, 64, n_q=20, n_ctx=90)
    q_pos = np.array([0, 3, 89, 40, 41, 7, 60, 61, 62, 2, 1, 85, 33, 31, 70, 71, 72, 10, 11, 95], np.int32)
    n_kv = 90
    ref = attention_ref(q, q_pos, k, v, n_kv, 0.2, 0)
    got = host_flash(lib, q, q_pos, k, v, n_kv, 0.2)
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-5)
    assert np.allclose(host_kattn(lib, q, q_pos, k, v, n_kv, 0.2), ref, rtol=1e-4, atol=1e-5)


def test_flash_gqa_groups_larger_than_a_block(lib):
    """40 query heads on one KV head: a block's 32 rows are heads of one token, the next block starts mid-token."""
    rng = np.random.default_rng(12)
    q, q_pos, k, v, n_kv = case(rng, np.float32, 32, n_q=3, n_ctx=40, n_kv_heads=1, n_heads=40, n_past=30)
    got = host_flash(lib, q, q_pos, k, v, n_kv, 0.3)
    assert np.allclose(got, attention_ref(q, q_pos, k, v, n_kv, 0.3, 0), rtol=1e-4, atol=1e-5)


def test_flash_softcap_and_sinks_match_the_cpu(lib):
    rng = np.random.default_rng(13)
    q, q_pos, k, v, n_kv = case(rng, np.float16, 64)
    q *= 8  # scores large enough for the cap to bite
    sinks = np.array([-1.0, 0.5, 2.0, 40.0, -30.0, 0.0], np.float32)
    for softcap, sk in ((30.0, None), (0.0, sinks), (20.0, sinks)):
        cpu = nn.attention(q, q_pos, k, v, n_kv, scale=0.125, window=7, softcap=softcap, sinks=sk)
        got = host_flash(lib, q, q_pos, k, v, n_kv, 0.125, 7, softcap, sk)
        assert np.allclose(got, cpu, rtol=1e-4, atol=1e-5), (softcap, sk is not None, np.abs(got - cpu).max())
    no_cap = host_flash(lib, q, q_pos, k, v, n_kv, 0.125, 7)
    assert not np.allclose(host_flash(lib, q, q_pos, k, v, n_kv, 0.125, 7, 30.0), no_cap, rtol=1e-3)


def test_flash_refuses_heads_over_128(lib):
    rng = np.random.default_rng(14)
    q, q_pos, k, v, n_kv = case(rng, np.float32, 256, n_q=2, n_ctx=8, n_past=3)
    assert host_flash(lib, q, q_pos, k, v, n_kv, 0.1) is None


# ------------------------------------------------------------------------------------ GPU
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_gpu_prefill_attention_matches_reference(gpu, dtype, window, hd):
    """40 query tokens: the flash kernel for heads up to 128, k_attention for 256."""
    rng = np.random.default_rng(hd + window + 1)
    q, q_pos, k, v, n_kv = case(rng, dtype, hd)
    ref = attention_ref(q, q_pos, k, v, n_kv, 0.125, window)
    got = ck.gpu_attention(q, q_pos, k, v, n_kv, scale=0.125, window=window)
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-5)
