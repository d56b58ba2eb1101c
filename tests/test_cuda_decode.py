"""Flash-decoding: decode attention with the keys split across blocks (csrc/cuda/qsc_decode.cuh).

Everywhere the library is built: the host twin (the kernel's blocks, tiles, partials and merge run on the CPU, as a
host-emulated model runs them for T <= 15) against the CPU engine's attention (core.native.nn: soft-cap, sliding
window, sinks; F16 and F32 caches) and k_attention's host twin, at depths 1 .. 4100, head sizes 64 .. 256 and GQA
ratios 1, 4, 8; split counts from 1 to 128 (most splits past n_kv) give the same result; and the emulated whole-model
decode with flash-decoding matches the one with it turned off (QUANTSCOPE_CUDA_FLASHDEC=0, read once per process:
a child process). On a GPU (skipped with the reason otherwise): the kernel against the CPU, its host twin and
k_attention at the same shapes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from quantscope.core.engine import cuda_fit as fit
from quantscope.core.engine import cuda_kernels as ck
from quantscope.core.native import nn

from . import test_cuda

cuda_lib, gpu, arch_vocab = test_cuda.cuda_lib, test_cuda.gpu, test_cuda.arch_vocab  # the shared fixtures

DEPTHS = (1, 17, 256, 1000, 4100)
HEADS = (64, 80, 128, 256)
GROUPS = (1, 4, 8)
TOL = {"rtol": 1e-4, "atol": 1e-5}


def case(seed: int, dtype: type, hd: int, n_kv: int, group: int, n_kv_heads: int = 2, n_q: int = 1,
         q_scale: float = 0.3):
    """A cache of n_kv positions (a few more allocated) and n_q decode queries at its end."""
    rng = np.random.default_rng(seed)
    n_ctx = n_kv + 3
    k = rng.standard_normal((n_ctx, n_kv_heads, hd)).astype(dtype)
    v = rng.standard_normal((n_ctx, n_kv_heads, hd)).astype(dtype)
    q = (rng.standard_normal((n_q, n_kv_heads * group, hd)) * q_scale).astype(np.float32)
    q_pos = np.arange(n_kv - n_q, n_kv, dtype=np.int32)
    return q, q_pos, k, v


def cpu(q, q_pos, k, v, n_kv, scale, window=0, softcap=0.0, sinks=None):
    return nn.attention(q, q_pos, k, v, n_kv, scale=scale, window=window, softcap=softcap, sinks=sinks)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("hd", HEADS)
@pytest.mark.parametrize("depth", DEPTHS)
def test_flashdec_matches_cpu_attention(cuda_lib, depth, hd, group, dtype):
    """One decode token at each depth: the forward's split count (the host counts 132 SMs: several splits from a
    few hundred keys on), every query head of a group in one block; against the CPU and k_attention's twin."""
    q, q_pos, k, v = case(depth * 7 + hd + group, dtype, hd, depth, group)
    scale = 1.0 / np.sqrt(hd)
    got, n_split = ck.host_flashdec(q, q_pos, k, v, depth, scale=scale)
    assert 1 <= n_split <= ck.FLASHDEC_MAX_SPLIT
    if depth >= 1000:
        assert n_split > 1
    ref = cpu(q, q_pos, k, v, depth, scale)
    assert np.allclose(got, ref, **TOL), np.abs(got - ref).max()
    today = ck.host_attention(q, q_pos, k, v, depth, scale=scale)
    assert np.allclose(got, today, **TOL)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize(("depth", "hd", "group"), [(1000, 64, 4), (4100, 128, 8), (256, 256, 1), (4100, 80, 4)])
def test_flashdec_softcap_window_and_sinks_match_the_cpu(cuda_lib, depth, hd, group, dtype):
    """gemma2's soft-cap, sliding windows (inside one split, across splits, wider than the cache) and gpt-oss's
    sinks (a logit per query head in the merged denominator: below, among and far above the scores)."""
    q, q_pos, k, v = case(depth + hd, dtype, hd, depth, group, q_scale=2.0)  # scores large enough for the cap
    H = q.shape[1]
    scale = 1.0 / np.sqrt(hd)
    sinks = np.linspace(-30.0, 40.0, H).astype(np.float32) if H > 1 else np.array([2.0], np.float32)
    for window in (0, 5, 100, 3000, depth + 50):
        for softcap, sk in ((0.0, None), (20.0, None), (0.0, sinks), (30.0, sinks)):
            got, _ = ck.host_flashdec(q, q_pos, k, v, depth, scale=scale, window=window, softcap=softcap, sinks=sk)
            ref = cpu(q, q_pos, k, v, depth, scale, window, softcap, sk)
            assert np.allclose(got, ref, **TOL), (window, softcap, sk is not None, np.abs(got - ref).max())
    capped, _ = ck.host_flashdec(q, q_pos, k, v, depth, scale=scale, softcap=20.0)
    assert not np.allclose(capped, ck.host_flashdec(q, q_pos, k, v, depth, scale=scale)[0], rtol=1e-3)


@pytest.mark.parametrize("n_split", [1, 2, 3, 7, 33, 64, 128])
def test_split_count_does_not_change_the_result(cuda_lib, n_split):
    """Any split count: chunks of ceil(visible / n_split) rounded up to 32 keys, splits past the cache write an
    empty partial the merge skips (at depth 17 all but the first)."""
    for depth, window in ((1000, 0), (1000, 300), (17, 0)):
        q, q_pos, k, v = case(n_split + depth, np.float16, 128, depth, 4)
        got, used = ck.host_flashdec(q, q_pos, k, v, depth, scale=0.09, window=window, n_split=n_split)
        assert used == n_split
        ref = cpu(q, q_pos, k, v, depth, 0.09, window)
        assert np.allclose(got, ref, **TOL), (depth, window, np.abs(got - ref).max())


def test_forward_split_count_from_the_context_and_sms(cuda_lib):
    """n_split 0: the forward's choice, four blocks per SM (the host counts 132) bounded by one split per 128
    positions of the context and by 128 token-splits: 2 KV heads x 1 head chunk want 264, 4100 positions allow
    33; 15 tokens at most 8 each; 1 position: one split."""
    q, q_pos, k, v = case(1, np.float32, 128, 4100, 4)
    assert ck.host_flashdec(q, q_pos, k, v, 4100, scale=0.1)[1] == 33
    q, q_pos, k, v = case(2, np.float32, 128, 4100, 4, n_q=15)
    assert ck.host_flashdec(q, q_pos, k, v, 4100, scale=0.1)[1] == 8
    assert 15 * 8 <= 1 * 128 == fit.FLASHDEC_PARTS  # the partials cuda_fit counts per head cover every call
    q, q_pos, k, v = case(3, np.float32, 128, 1, 4)
    assert ck.host_flashdec(q, q_pos, k, v, 1, scale=0.1)[1] == 1


@pytest.mark.parametrize("n_q", [2, 7, 15])
def test_a_few_tokens_at_once(cuda_lib, n_q):
    """T <= 15 (a short chunk, speculative drafts): one block row per token, each with its own causal range; a
    query past the cache sees it up to n_kv - 1; positions out of order."""
    q, q_pos, k, v = case(n_q, np.float16, 64, 700, 8, n_q=n_q)
    q_pos = q_pos[::-1].copy()
    q_pos[0] = 705  # past n_kv = 700
    for window in (0, 40):
        got, _ = ck.host_flashdec(q, q_pos, k, v, 700, scale=0.125, window=window)
        assert np.allclose(got, cpu(q, q_pos, k, v, 700, 0.125, window), **TOL)


def test_refuses_what_it_does_not_take(cuda_lib):
    q, q_pos, k, v = case(4, np.float16, 68, 10, 1)  # 136-byte rows: not whole 16-byte chunks
    with pytest.raises(ValueError, match="16-byte"):
        ck.host_flashdec(q, q_pos, k, v, 10, scale=0.1)
    q, q_pos, k, v = case(5, np.float32, 64, 40, 1, n_q=16)  # prefill: k_flash's
    with pytest.raises(ValueError, match="query tokens"):
        ck.host_flashdec(q, q_pos, k, v, 40, scale=0.1)
    q, q_pos, k, v = case(6, np.float32, 68, 10, 1)  # F32 rows of 68: 17 chunks, taken
    assert np.allclose(ck.host_flashdec(q, q_pos, k, v, 10, scale=0.1)[0], cpu(q, q_pos, k, v, 10, 0.1), **TOL)


# ------------------------------------------------------------------------------ the emulated whole-model decode
_CHILD = """
import sys
import numpy as np
from quantscope.core.engine import Model
from quantscope.core.engine import cuda_backend as cb
from quantscope.core.gguf import GGUFFile
path, out, n_ctx, host = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[5] == "host"
ids = [int(t) for t in sys.argv[4].split(",")]
model = Model(GGUFFile(path), threads=2)
with cb.CudaSession(model, n_ctx, host_emulation=host) as s:
    rows = [s.forward(ids[:20], all_logits=True), s.forward(ids[20:27], all_logits=True)]
    rows += [s.forward([t])[None] for t in ids[27:]]
np.save(out, np.concatenate(rows))
"""


def _decode(path, out, n_ctx, ids, flashdec: bool, host: bool = True) -> np.ndarray:
    env = dict(os.environ, QUANTSCOPE_CUDA_FLASHDEC="1" if flashdec else "0")
    subprocess.run([sys.executable, "-c", _CHILD, str(path), str(out), str(n_ctx), ",".join(map(str, ids)),
                    "host" if host else "gpu"], env=env, check=True)
    return np.load(out)


def check_with_and_without_flashdec(key: str, tmp_path, vocab, host: bool) -> None:
    from .test_arch_fidelity import load

    model, _tok, base = load(key, tmp_path, vocab)
    n_ctx = min(base.n_ctx, 64)
    ids = [int(t) for t in base.tokens[1][:n_ctx]]
    path = tmp_path / f"{key}.gguf"
    on = _decode(path, tmp_path / "on.npy", n_ctx, ids, True, host)
    off = _decode(path, tmp_path / "off.npy", n_ctx, ids, False, host)
    assert on.shape == (n_ctx, model.config.n_vocab)
    assert np.allclose(on, off, rtol=1e-3, atol=1e-3), np.abs(on - off).max()  # (int8 activations amplify)
    assert not np.array_equal(on[20:], off[20:])
    assert np.array_equal(on[:20], off[:20])  # 20 tokens at once: not flash-decoding's


@pytest.mark.parametrize("key", ["llama-F32", "gemma2-F32", "gemma3-F32"])
def test_emulated_decode_with_and_without_flashdec(cuda_lib, arch_vocab, key, tmp_path):
    """A host-emulated session (20-token chunk, a 7-token chunk: flash-decoding with T = 7, then one token at a
    time) with flash-decoding and with it turned off: the same logits to float rounding, not the same bits (the
    path did change); gemma2: soft-cap and sliding window, gemma3: sliding window (gpt-oss's sinks: its experts
    have no host emulation of the whole forward; the GPU test below takes it)."""
    check_with_and_without_flashdec(key, tmp_path, arch_vocab, host=True)


# ------------------------------------------------------------------------------------ GPU
@pytest.mark.parametrize("key", ["llama-F32", "gemma2-F32", "gemma3-F32", "gpt-oss-F32"])
def test_gpu_decode_with_and_without_flashdec(gpu, arch_vocab, key, tmp_path):
    """The same session on the device: its one-token steps replay a CUDA graph captured with flash-decoding (n_kv
    read from device memory as the cache grows), against plain k_attention."""
    check_with_and_without_flashdec(key, tmp_path, arch_vocab, host=False)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("hd", HEADS)
@pytest.mark.parametrize("depth", DEPTHS)
def test_gpu_flashdec_matches_cpu_its_twin_and_k_attention(gpu, depth, hd, group, dtype):
    """The kernel (the device's own split count, then 1 and 128 splits) against the CPU, its host twin with the
    same splits and k_attention (gpu_attention: one token is below k_flash's 16)."""
    q, q_pos, k, v = case(depth * 7 + hd + group, dtype, hd, depth, group)
    scale = 1.0 / np.sqrt(hd)
    ref = cpu(q, q_pos, k, v, depth, scale)
    got, n_split = ck.gpu_flashdec(q, q_pos, k, v, depth, scale=scale)
    assert np.allclose(got, ref, **TOL), np.abs(got - ref).max()
    twin, _ = ck.host_flashdec(q, q_pos, k, v, depth, scale=scale, n_split=n_split)
    assert np.allclose(got, twin, rtol=1e-5, atol=1e-6), np.abs(got - twin).max()
    assert np.allclose(got, ck.gpu_attention(q, q_pos, k, v, depth, scale=scale), **TOL)
    for ns in (1, 128):
        assert np.allclose(ck.gpu_flashdec(q, q_pos, k, v, depth, scale=scale, n_split=ns)[0], ref, **TOL)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_gpu_flashdec_softcap_window_sinks_and_tokens(gpu, dtype):
    q, q_pos, k, v = case(9, dtype, 128, 4100, 8, q_scale=2.0)
    sinks = np.linspace(-30.0, 40.0, q.shape[1]).astype(np.float32)
    for window, softcap, sk in ((0, 20.0, None), (100, 0.0, sinks), (3000, 30.0, sinks)):
        got, _ = ck.gpu_flashdec(q, q_pos, k, v, 4100, scale=0.09, window=window, softcap=softcap, sinks=sk)
        ref = cpu(q, q_pos, k, v, 4100, 0.09, window, softcap, sk)
        assert np.allclose(got, ref, **TOL), (window, softcap, np.abs(got - ref).max())
        kat = ck.gpu_attention(q, q_pos, k, v, 4100, scale=0.09, window=window, softcap=softcap, sinks=sk)
        assert np.allclose(got, kat, **TOL)
    q, q_pos, k, v = case(10, dtype, 64, 700, 8, n_q=15)
    got, _ = ck.gpu_flashdec(q, q_pos, k, v, 700, scale=0.125, window=40)
    assert np.allclose(got, cpu(q, q_pos, k, v, 700, 0.125, 40), **TOL)
