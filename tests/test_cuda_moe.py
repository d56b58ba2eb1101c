"""Mixture-of-experts layers on the CUDA backend (csrc/cuda/qsc_moe.cuh).

Everywhere the library is built: the device's router math (softmax, top-k with the CPU's tie-breaking, weight
normalisation), the grouping of the routing by expert (k_moe_group's host twin) against numpy's stable sort, and the
forward's MoE launches (routing, grouping, gather, grouped products over views of the repacked stacked tensors,
combine) through their host twins on a one-layer host model, against the CPU block (csrc/qs_block.c's moe_ffn) on the
same layer description; the C check of the moe group. On a GPU (skipped with the reason otherwise): the same on the
device, the grouping kernel against its twin, a synthetic qwen3moe model against the CPU engine (prefill, decode
replayed from a CUDA graph).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import numpy as np
import pytest

from quantscope.core.engine import Model
from quantscope.core.engine import cuda_backend as cb
from quantscope.core.engine import cuda_description as cd
from quantscope.core.engine import cuda_library as cl
from quantscope.core.engine.reference import reference_logits
from quantscope.core.gguf import GGUFFile
from quantscope.core.native import ffi as cpu_ffi
from quantscope.core.native import lib as cpu_lib
from quantscope.core.quant import ggml_type

from . import test_cuda
from .conftest import require_model
from .test_cuda import assert_as_accurate_as_cpu, cos_rel, weight_bytes

cuda_lib, gpu = test_cuda.cuda_lib, test_cuda.gpu  # the fixtures: the built library, a usable GPU


# ------------------------------------------------------------------------------------------- a moe layer, by hand
class MoeLayer:
    """One CPU ``qs_block`` whose attention adds nothing (zero projections, no norms: the FFN's input is x itself)
    and whose FFN is a mixture of experts, with the arrays its pointers reach."""

    def __init__(self, rng: np.random.Generator, *, E: int = 256, NE: int = 8, K: int = 2, F: int = 256,
                 wtype: str = "Q8_0", biases: bool = False, oai: bool = False, FS: int = 0, tie: str = "",
                 n_ctx: int = 16, scale: float = 0.0, norm: int = 1) -> None:
        self.keep: list[Any] = []
        self.E, self.NE, self.K = E, NE, K
        b = self.block = cpu_ffi.new("qs_block *")
        b.n_embd, b.eps = E, 1e-6
        a = b.attn
        a.n_head = a.n_head_kv = 1
        a.head_dim = 32
        for field, shape in (("wq", (32, E)), ("wk", (32, E)), ("wv", (32, E)), ("wo", (E, 32))):
            self._weight(getattr(a, field), np.zeros(shape, np.float32).view(np.uint8).reshape(-1), "F32", *shape)
        a.scale, a.n_ctx = 1.0, n_ctx
        cache_bytes = n_ctx * 32 * 4
        for field in ("k_cache", "v_cache"):
            arr = np.zeros(cache_bytes, np.uint8)
            self.keep.append(arr)
            setattr(a, field, cpu_ffi.cast("void *", cpu_ffi.from_buffer(arr)))
        a.k_cache_bytes = a.v_cache_bytes = cache_bytes
        b.rope.dim, b.rope.base = 32, 10000.0
        f = b.ffn
        f.n_ff, f.swiglu_oai = F, int(oai)
        self._weight(f.gate, weight_bytes(wtype, NE * F, E, rng), wtype, NE * F, E)
        self._weight(f.up, weight_bytes(wtype, NE * F, E, rng), wtype, NE * F, E)
        self._weight(f.down, weight_bytes(wtype, NE * E, F, rng), wtype, NE * E, F)
        m = b.moe
        m.n_expert, m.n_used, m.norm, m.scale = NE, K, norm, scale
        router = rng.standard_normal((NE, E)).astype(np.float32) * 0.1
        if tie == "all":  # every logit equal: the first K experts
            router[:] = router[0]
        elif tie == "pairs":  # experts 2i and 2i+1 tie: the boundary of the top K falls inside a tie
            router[1::2] = router[0::2]
        self._weight(m.router, router.view(np.uint8).reshape(-1), "F32", NE, E)
        if biases:
            for field, n in (("b_router", NE), ("b_gate", NE * F), ("b_up", NE * F), ("b_down", NE * E)):
                self._vec(getattr(m, field), rng.standard_normal(n).astype(np.float32) * 0.1)
        if FS:
            m.n_ff_shexp = FS
            self._weight(m.sh_gate, weight_bytes(wtype, FS, E, rng), wtype, FS, E)
            self._weight(m.sh_up, weight_bytes(wtype, FS, E, rng), wtype, FS, E)
            self._weight(m.sh_down, weight_bytes(wtype, E, FS, rng), wtype, E, FS)
            self._vec(m.sh_gate_inp, rng.standard_normal(E).astype(np.float32) * 0.1)

    def _weight(self, w: Any, data: np.ndarray, tname: str, rows: int, k: int) -> None:
        data = np.ascontiguousarray(data)
        self.keep.append(data)
        w.ptr = cpu_ffi.cast("uint8_t *", cpu_ffi.from_buffer(data))
        w.type, w.bytes, w.rows, w.k = ggml_type(tname).id, data.nbytes, rows, k

    def _vec(self, v: Any, data: np.ndarray) -> None:
        self.keep.append(data)
        v.ptr, v.len = cpu_ffi.cast("float *", cpu_ffi.from_buffer(data)), data.size

    def cpu(self, x: np.ndarray) -> np.ndarray:
        """x after the CPU block: x + moe(x)."""
        y = np.ascontiguousarray(x, np.float32).copy()
        T = y.shape[0]
        pos = np.arange(T, dtype=np.int32)
        rc = cpu_lib.qs_block_forward(self.block, cpu_ffi.cast("float *", cpu_ffi.from_buffer(y)), T,
                                      cpu_ffi.cast("int32_t *", cpu_ffi.from_buffer(pos)), 0, 1)
        assert rc == 0, rc
        return y

    def host(self, x: np.ndarray) -> np.ndarray:
        """moe(x) as the device computes it, compiled for the host."""
        return host_moe_ffn(self.block, x)


def cuda_block(cpu_block: Any) -> Any:
    """The same description in the CUDA library's types (as model_description copies it)."""
    b = cl.ffi.new("qs_block *")
    cl.ffi.memmove(b, cpu_ffi.buffer(cpu_block), cl.ffi.sizeof("qs_block"))
    return b


def host_moe_ffn(cpu_block: Any, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    err = cl.ffi.new("char[512]")
    rc = cl._library().qsc_host_moe_ffn(cuda_block(cpu_block), cl._p(x, "float *"), x.shape[0],
                                        cl._p(out, "float *"), err, 512)
    assert rc == 0, cl.ffi.string(err).decode()
    return out


def host_route(logits: np.ndarray, K: int, norm: int = 1, scale: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    logits = np.ascontiguousarray(logits, np.float32)
    T, NE = logits.shape
    sel, w = np.empty((T, K), np.int32), np.empty((T, K), np.float32)
    assert cl._library().qsc_host_moe_route(cl._p(logits, "float *"), T, NE, K, norm, scale,
                                            cl._p(sel, "int32_t *"), cl._p(w, "float *")) == 0
    return sel, w


def route_rules(logits: np.ndarray, K: int, norm: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """The CPU's routing rules in numpy: softmax, a stable descending sort (the lower index first on ties), the
    weights normalized with the sum clamped at 2^-14, times scale (0: 1)."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    sel = np.argsort(-logits, axis=1, kind="stable")[:, :K]
    w = np.take_along_axis(p, sel, 1)
    if norm:
        w = w / np.maximum(w.sum(1, keepdims=True), 2.0**-14)
    return sel.astype(np.int32), w * (scale if scale else 1.0)


# ------------------------------------------------------------------------------------ host emulation of the router
def test_host_routing_follows_the_cpu_rules(cuda_lib):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((64, 16)).astype(np.float32) * 3
    logits[3] = 0.5  # all tied: experts 0..K-1
    logits[4, [2, 9, 11]] = 9.0  # a three-way tie at the top: 2, 9, 11 in that order
    logits[5, 7] = -np.inf  # a masked expert is never picked while another one is left
    for K, norm, scale in ((1, 1, 0.0), (4, 1, 0.0), (4, 0, 0.0), (8, 1, 2.5), (16, 1, 0.0)):
        sel, w = host_route(logits, K, norm, scale)
        want_sel, want_w = route_rules(logits, K, norm, scale)
        assert np.array_equal(sel, want_sel), (K, np.nonzero((sel != want_sel).any(1)))
        assert np.allclose(w, want_w, rtol=2e-6, atol=1e-9), K
    assert list(host_route(logits, 4)[0][3]) == [0, 1, 2, 3]
    assert list(host_route(logits, 3)[0][4]) == [2, 9, 11]
    assert 7 not in host_route(logits, 15)[0][5]


@pytest.mark.parametrize("NE", [33, 128, 300])
def test_host_routing_of_many_experts_follows_the_cpu_rules(cuda_lib, NE):
    """More experts than a warp's lanes (k_moe_route: lane l scans experts l, l + 32, ...; the lanes' partials
    combined): ties within one lane's experts and across lanes still go to the lower index."""
    rng = np.random.default_rng(NE)
    logits = rng.standard_normal((32, NE)).astype(np.float32)
    logits[0, [e for e in (5, 37, 69, 101) if e < NE]] = 8.0  # ties in one lane (5 mod 32)
    logits[4, [0, 32]] = 9.0  # lane 0 holds both
    logits[1, [NE - 1, 3, 40 % NE]] = 8.0  # ties across lanes
    logits[2] = -1.0  # all tied
    logits[3, : NE // 2] = -np.inf
    for K in (1, 4, 8):
        sel, w = host_route(logits, K)
        want_sel, want_w = route_rules(logits, K, 1, 0.0)
        assert np.array_equal(sel, want_sel), (K, np.nonzero((sel != want_sel).any(1)))
        assert np.allclose(w, want_w, rtol=2e-6, atol=1e-9), K


def test_host_routing_clamps_a_vanishing_weight_sum(cuda_lib):
    """norm divides by the picked probabilities' sum clamped below at 2^-14 (llama.cpp's clamp): one expert of
    almost all the mass, the others' weights stay below 1 instead of blowing up."""
    logits = np.array([[60.0] + [0.0] * 7], np.float32)
    sel, w = host_route(logits[:, ::-1].copy(), 1)
    assert list(sel[0]) == [7] and np.isclose(w[0, 0], 1.0)
    sel, w = host_route(np.array([[0.0] * 7 + [60.0]], np.float32), 2, norm=1)
    p_small = np.exp(np.float32(-60.0))
    assert sel[0, 0] == 7 and w[0, 1] == pytest.approx(p_small / max(1.0 + p_small, 2**-14), rel=1e-5)


def test_host_routing_refuses_bad_sizes(cuda_lib):
    lib = cl._library()
    x = np.zeros(8, np.float32)
    sel, w = np.zeros(8, np.int32), np.zeros(8, np.float32)
    for T, NE, K in ((0, 8, 1), (1, 0, 1), (1, 8, 0), (1, 8, 9), (1, 5000, 1)):
        assert lib.qsc_host_moe_route(cl._p(x, "float *"), T, NE, K, 1, 0.0, cl._p(sel, "int32_t *"),
                                      cl._p(w, "float *")) == -1


# ------------------------------------------------------------------------------------ the grouping by expert
def group(sel: np.ndarray, NE: int, tile: int, device: bool = False) -> dict[str, np.ndarray]:
    """qsc_host_moe_group (or qsc_kernel_moe_group) of sel [T][K]: pairs, trow, off, tiles [n][3]."""
    sel = np.ascontiguousarray(sel, np.int32)
    T, K = sel.shape
    P = T * K
    out = {"pairs": np.full(P, -7, np.int32), "trow": np.full(P, -7, np.int32),
           "off": np.full(NE + 1, -7, np.int32), "tiles": np.full(3 * P, -7, np.int32), "n": np.zeros(1, np.int32)}
    err = cl.ffi.new("char[512]")
    fn = cl._library().qsc_kernel_moe_group if device else cl._library().qsc_host_moe_group
    rc = fn(cl._p(sel, "int32_t *"), T, K, NE, tile, *(cl._p(out[k], "int32_t *") for k in
                                                       ("pairs", "trow", "off", "tiles", "n")), err, 512)
    assert rc == 0, cl.ffi.string(err).decode()
    out["tiles"] = out["tiles"][: 3 * int(out["n"][0])].reshape(-1, 3)
    return out


def group_rules(sel: np.ndarray, NE: int, tile: int) -> dict[str, np.ndarray]:
    """The grouping in numpy: the pairs t * K + j stably sorted by expert (each expert's in token order: the CPU
    block's), the counts' exclusive scan, token t's sorted rows by ascending expert, tiles of `tile` rows."""
    T, K = sel.shape
    flat = sel.reshape(-1)
    pairs = np.argsort(flat, kind="stable").astype(np.int32)
    off = np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=NE))]).astype(np.int32)
    row_of = np.empty_like(pairs)
    row_of[pairs] = np.arange(pairs.size, dtype=np.int32)
    trow = np.stack([row_of[t * K + np.argsort(sel[t], kind="stable")] for t in range(T)]).reshape(-1)
    tiles = [(e, r, min(tile, off[e + 1] - r)) for e in range(NE) for r in range(off[e], off[e + 1], tile)]
    return {"pairs": pairs, "trow": trow, "off": off, "tiles": np.array(tiles, np.int32).reshape(-1, 3)}


def random_selection(rng: np.random.Generator, T: int, K: int, NE: int) -> np.ndarray:
    return np.stack([rng.permutation(NE)[:K] for _ in range(T)]).astype(np.int32)


GROUP_CASES = [(T, K, NE, tile) for T in (1, 2, 7, 64) for K, NE in ((1, 4), (2, 8), (4, 16), (8, 128))
               for tile in (1, 8, 64)]


@pytest.mark.parametrize("T,K,NE,tile", GROUP_CASES)
def test_host_grouping_follows_the_cpu_order(cuda_lib, T, K, NE, tile):
    """k_moe_group's host twin: the (token, slot) pairs sorted by expert in token order, the offsets, each token's
    rows in ascending expert order (the combine's order of addition) and the tiles, as numpy's stable sort gives
    them; never more tiles than the launch grid's worst case (moe_max_tiles)."""
    rng = np.random.default_rng([T, K, NE, tile])
    sel = random_selection(rng, T, K, NE)
    if T == 64:  # a crowded expert: several tiles of it
        for t in range(T // 2):
            sel[t] = np.concatenate([[0], 1 + rng.permutation(NE - 1)[: K - 1]])[::-1]
    got, want = group(sel, NE, tile), group_rules(sel, NE, tile)
    for key in ("pairs", "trow", "off", "tiles"):
        assert np.array_equal(got[key], want[key]), (key, got[key], want[key])
    P = T * K
    assert len(got["tiles"]) <= (P + min(NE, P) * (tile - 1)) // tile


def test_host_grouping_refuses_a_bad_selection(cuda_lib):
    sel = np.array([[0, 1], [2, 2]], np.int32)  # token 1 picks expert 2 twice
    out = np.zeros(64, np.int32)
    err = cl.ffi.new("char[512]")
    p = cl._p(out, "int32_t *")
    assert cl._library().qsc_host_moe_group(cl._p(sel, "int32_t *"), 2, 2, 4, 8, p, p, p, p, p, err, 512) == -1
    assert "token 1: slot 1 picks expert 2" in cl.ffi.string(err).decode()
    sel = np.array([[0, 9]], np.int32)
    assert cl._library().qsc_host_moe_group(cl._p(sel, "int32_t *"), 1, 2, 4, 8, p, p, p, p, p, err, 512) == -1


@pytest.mark.parametrize("T,K,NE,tile", [c for c in GROUP_CASES if c[3] != 8] + [(512, 8, 128, 64), (3, 4, 4096, 8)])
def test_gpu_grouping_equals_its_host_twin(gpu, T, K, NE, tile):
    """k_moe_group on the device (ballots per expert, one block) against its host twin, word for word."""
    rng = np.random.default_rng([T, K, NE, tile, 1])
    sel = random_selection(rng, T, K, NE)
    got, want = group(sel, NE, tile, device=True), group(sel, NE, tile)
    for key in ("pairs", "trow", "off", "tiles", "n"):
        assert np.array_equal(got[key], want[key]), key


# ------------------------------------------------------------------------------- host emulation vs the CPU block
MOE_CASES = {
    "q8_0": dict(wtype="Q8_0"),
    "q4_k": dict(wtype="Q4_K", NE=6, K=3),
    "f32-k1-unnormalized": dict(wtype="F32", K=1, norm=0, scale=0.5),
    "f16-ties-all": dict(wtype="F16", tie="all"),
    "q4_0-ties-pairs": dict(wtype="Q4_0", tie="pairs", K=3),
    "gpt-oss": dict(wtype="Q8_0", biases=True, oai=True, NE=8, K=4),  # expert biases, clamped SwiGLU
    "shared-expert": dict(wtype="Q6_K", FS=512, NE=8, K=2),  # qwen35moe's sigmoid-gated shared expert
    "many-experts-ties": dict(wtype="Q8_0", tie="pairs", NE=40, K=6, F=64),  # more experts than a warp's lanes
}


@pytest.mark.parametrize("case", list(MOE_CASES))
@pytest.mark.parametrize("T", [1, 2, 7, 64])
def test_host_moe_ffn_matches_the_cpu_block(cuda_lib, case, T):
    """The device's MoE FFN (routing, its grouping, one grouped product per matrix over views of the repacked
    tensors, biases, the clamped SwiGLU, the shared expert) through the launches' host twins, against the CPU block on
    the same description: equal up to the int8 dots' float rounding. T 1 takes the decode tiles (one per picked
    expert), 2 and 7 tiles of 8 rows, 64 the tensor-core tiles of 64 (MMA types, at least 16 rows per expert on
    average; the 40 experts' case keeps tiles of 8). A wrong expert (a tie broken the other way, a view off by one
    expert, a tile's rows misplaced) is off by O(1)."""
    rng = np.random.default_rng([T, sum(case.encode())])
    layer = MoeLayer(rng, n_ctx=64, **MOE_CASES[case])
    x = rng.standard_normal((T, layer.E)).astype(np.float32)
    want = layer.cpu(x) - x
    got = layer.host(x)
    scale = float(np.abs(want).max())
    assert scale > 1e-3
    # Up to T = 16 the two agree to ~3e-7 of the scale; from T = 32 on the CPU block's batched products round
    # differently (measured: 7e-6 on q8_0, 1.2e-3 of the scale in one row of the shared expert's huge random Q6_K
    # outputs, the same bits as the expert-by-expert host build this grouping replaced).
    atol = (2e-3 if T >= 32 else 2e-4) * scale
    assert np.allclose(got, want, rtol=1e-3, atol=atol), (case, np.abs(got - want).max(), scale)


def test_host_moe_ffn_each_expert_is_its_own_view(cuda_lib):
    """Routing every token to one expert (a huge router bias) gives that expert's FFN: each expert's rows of the
    stacked tensors, not its neighbour's."""
    rng = np.random.default_rng(9)
    layer = MoeLayer(rng, wtype="Q4_K", NE=4, K=1, biases=True)
    x = rng.standard_normal((3, layer.E)).astype(np.float32)
    outs = []
    for e in range(4):
        bias = np.full(4, -100.0, np.float32)
        bias[e] = 100.0
        layer._vec(layer.block.moe.b_router, bias)
        want = layer.cpu(x) - x
        got = layer.host(x)
        assert np.allclose(got, want, rtol=1e-3, atol=2e-4 * np.abs(want).max()), e
        outs.append(got)
    assert all(not np.allclose(outs[i], outs[j], atol=1e-3) for i in range(4) for j in range(i))


def gpu_moe_ffn(cpu_block: Any, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    err = cl.ffi.new("char[512]")
    rc = cl._library().qsc_kernel_moe_ffn(cuda_block(cpu_block), cl._p(x, "float *"), x.shape[0],
                                          cl._p(out, "float *"), err, 512)
    assert rc == 0, cl.ffi.string(err).decode()
    return out


@pytest.mark.parametrize("case", list(MOE_CASES))
@pytest.mark.parametrize("T", [1, 2, 7, 40, 64])
def test_gpu_moe_ffn_matches_the_cpu_block(gpu, case, T):
    """The device's MoE FFN of one layer (qsc_kernel_moe_ffn: enqueue_moe on a one-layer model: the grouping kernel,
    the grouped GEMV at T 1, k_moe_matmul<8> tiles at 2 and 7, the grouped tensor-core tiles at 40 and 64 for MMA
    types where the experts average 16 rows, else tiles of 8) against the CPU block and the host twins: every
    weight type, ties, expert biases, the clamped SwiGLU, the shared expert, more experts than a warp's lanes."""
    rng = np.random.default_rng([T, sum(case.encode()), 1])
    layer = MoeLayer(rng, n_ctx=64, **MOE_CASES[case])
    x = rng.standard_normal((T, layer.E)).astype(np.float32)
    want = layer.cpu(x) - x
    got = gpu_moe_ffn(layer.block, x)
    scale = float(np.abs(want).max())
    atol = (2e-3 if T >= 32 else 2e-4) * scale  # (the CPU block's batched rounding: the host test above)
    assert np.allclose(got, want, rtol=1e-3, atol=atol), (case, np.abs(got - want).max(), scale)
    host = layer.host(x)
    assert np.allclose(got, host, rtol=1e-4, atol=2e-5 * scale), (case, np.abs(got - host).max(), scale)


def test_kernel_moe_ffn_checks_before_any_device_call(cuda_lib):
    """A bad group is refused by the check, with its reason, also where no GPU is (no CUDA error)."""
    layer = MoeLayer(np.random.default_rng(4), wtype="Q8_0")
    b = cuda_block(layer.block)
    b.moe.b_down.len = 3
    x = np.zeros((2, layer.E), np.float32)
    out = np.empty_like(x)
    err = cl.ffi.new("char[512]")
    assert cl._library().qsc_kernel_moe_ffn(b, cl._p(x, "float *"), 2, cl._p(out, "float *"), err, 512) == -1
    assert "moe.b_down has 3 values" in cl.ffi.string(err).decode()
    b = cuda_block(layer.block)
    assert cl._library().qsc_kernel_moe_ffn(b, cl._p(x, "float *"), 0, cl._p(out, "float *"), err, 512) == -1
    assert "n_tokens 0" in cl.ffi.string(err).decode()


# --------------------------------------------------------------------------------------- the C check of the group
_ONES = np.ones(4096, np.float32)


def _check(block: Any) -> str:
    """qsc_check_model on a one-layer model around ``block`` ("" when it passes the moe checks)."""
    ones = _ONES[: block.n_embd]
    for v in (block.attn_norm, block.ffn_norm):  # (the hand-made layer has none: the GPU wants pre-norms)
        v.ptr, v.len = cl._p(ones, "float *"), ones.size
    md = cl.ffi.new("qsc_model_desc *")
    md.n_layers, md.n_vocab, md.eps, md.embed_scale = 1, 32, 1e-6, 1.0
    err = cl.ffi.new("char[512]")
    cl._library().qsc_check_model(md, block, err, 512)
    return cl.ffi.string(err).decode()


def test_c_check_of_the_moe_group(cuda_lib):
    rng = np.random.default_rng(2)
    layer = MoeLayer(rng, wtype="Q8_0", FS=256, biases=True)
    b = cuda_block(layer.block)
    assert _check(b).startswith("tok_embd:")  # a valid layer: the check goes on to the (absent) embedding
    cases = [
        (lambda b: setattr(b.moe, "n_used", 9), "layer 0: moe: 8 experts, 9 used"),
        (lambda b: setattr(b.moe, "n_used", 0), "layer 0: moe: 8 experts, 0 used"),
        (lambda b: setattr(b.moe, "n_expert", 5000), "layer 0: moe: 5000 experts"),
        (lambda b: setattr(b.moe, "scale", float("nan")), "scale nan"),
        (lambda b: setattr(b.moe.router, "ptr", cl.ffi.NULL), "layer 0: moe.router is missing"),
        (lambda b: setattr(b.moe.router, "rows", 7), "layer 0: moe.router is 7 x 256"),
        (lambda b: setattr(b.moe.sh_down, "bytes", b.moe.sh_down.bytes - 1), "layer 0: moe.sh_down"),
        (lambda b: setattr(b.moe.b_gate, "len", 5), "layer 0: moe.b_gate has 5 values"),
        (lambda b: setattr(b.moe.sh_gate_inp, "ptr", cl.ffi.NULL), "layer 0: moe.sh_gate_inp"),
        (lambda b: setattr(b.moe, "n_ff_shexp", 0), "layer 0: moe.sh_gate given without a shared expert"),
        (lambda b: setattr(b.ffn.down, "rows", 256), "layer 0: ffn.down"),  # one expert's rows, not eight
        (lambda b: setattr(b.ffn, "swiglu_oai", 2), "swiglu_oai 2"),
    ]
    for change, message in cases:
        b = cuda_block(layer.block)
        change(b)
        assert message in _check(b), (message, _check(b))


def test_host_moe_ffn_refuses_a_bad_group(cuda_lib):
    layer = MoeLayer(np.random.default_rng(3), wtype="Q8_0")
    b = cuda_block(layer.block)
    b.moe.b_down.len = 3
    x = np.zeros((1, layer.E), np.float32)
    out = np.empty_like(x)
    err = cl.ffi.new("char[512]")
    assert cl._library().qsc_host_moe_ffn(b, cl._p(x, "float *"), 1, cl._p(out, "float *"), err, 512) == -1
    assert "moe.b_down has 3 values" in cl.ffi.string(err).decode()


# ------------------------------------------------------------------------------------------ a whole moe model
TINY_MOE = dict(name="tiny-moe", n_layers=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
                like="a test-sized qwen3moe", rope_base=1e6, arch="qwen3moe", n_expert=16, n_expert_used=4,
                expert_ff=256)


@pytest.fixture(scope="module")
def synthetic_moe(tmp_path_factory) -> Model:
    """core/synthetic.py's qwen3moe layout at test size (2 layers of 256, heads of 64, 16 experts of 256, 4 per
    token, an F32 router, Q4_K/Q6_K experts), with the vocabulary of $QUANTSCOPE_VOCAB_SOURCE or SmolLM2."""
    from quantscope.core.synthetic import Shape, write_synthetic

    vocab = os.environ.get("QUANTSCOPE_VOCAB_SOURCE") or require_model("smollm2")
    path = write_synthetic(tmp_path_factory.mktemp("synthetic") / "tiny-moe.gguf", Shape(**TINY_MOE), vocab,
                           seed=4)
    return Model(GGUFFile(path))


def test_moe_model_description_passes_the_gpu_check(cuda_lib, synthetic_moe):
    """A qwen3moe file's description (router, stacked experts) is one the GPU takes: the C check passes, and every
    layer's group reaches the device as described."""
    model = synthetic_moe
    c = model.config
    cd.check_config(c)
    desc, _ = cd.model_description(model, 64)
    cd.check_description(desc)
    for i in range(c.n_layers):
        b = desc.layers[i]
        assert (b.moe.n_expert, b.moe.n_used, b.moe.norm) == (16, 4, 1)
        assert (b.moe.router.rows, b.moe.router.k, b.ffn.gate.rows, b.ffn.down.rows) == (16, 256, 16 * 256, 16 * 256)
    b = desc.layers[1]
    b.moe.n_used = 17
    with pytest.raises(cl.CudaError, match=re.escape("layer 1: moe: 16 experts, 17 used")):
        cd.check_description(desc)


def test_gpu_moe_model_matches_cpu(gpu, synthetic_moe):
    """Prefill of 40 tokens (all logits), then 12 decode steps on the device (the routing grouped on the device, the
    steps after the first replayed from a CUDA graph), against the CPU engine and the float64 reference."""
    model = synthetic_moe
    ids = [int(i) for i in np.random.default_rng(6).integers(10, min(30000, model.config.n_vocab), 52)]
    cpu = model.session(128).forward(ids, all_logits=True)
    with cb.CudaSession(model, 128) as s:
        got = np.concatenate([s.forward(ids[:40], all_logits=True),
                              np.stack([s.forward([t]) for t in ids[40:]])])
        assert s.n_past == len(ids)
    assert_as_accurate_as_cpu(got, cpu, reference_logits(model.config, model.weights, ids))


def test_gpu_moe_decode_graph_equals_no_graph(gpu, synthetic_moe):
    """Decode steps replayed from the CUDA graph (the grouping read from device memory at every replay: different
    tokens route to different experts) give the logits of the same steps enqueued one by one, and of the host
    emulation."""
    model = synthetic_moe
    ids = [int(i) for i in np.random.default_rng(11).integers(10, min(30000, model.config.n_vocab), 24)]
    runs = []
    for graphs, host in ((True, False), (False, False), (False, True)):
        with cb.CudaSession(model, 64, graphs=graphs, host_emulation=host) as s:
            s.forward(ids[:8])
            runs.append(np.stack([s.forward([t]) for t in ids[8:]]))
    assert np.array_equal(runs[0], runs[1])
    assert np.allclose(runs[0], runs[2], rtol=1e-3, atol=1e-3 * np.abs(runs[2]).max())


def test_host_moe_model_matches_cpu(cuda_lib, synthetic_moe):
    """The synthetic qwen3moe model's whole forward through the host twins (qsc_host_model_create takes experts):
    prefill of 40 tokens and 6 decode steps, against the CPU engine and the float64 reference."""
    model = synthetic_moe
    ids = [int(i) for i in np.random.default_rng(6).integers(10, min(30000, model.config.n_vocab), 46)]
    cpu = model.session(64).forward(ids, all_logits=True)
    with cb.CudaSession(model, 64, host_emulation=True) as s:
        got = np.concatenate([s.forward(ids[:40], all_logits=True), np.stack([s.forward([t]) for t in ids[40:]])])
    assert_as_accurate_as_cpu(got, cpu, reference_logits(model.config, model.weights, ids))


def test_gpu_moe_chunked_prefill_equals_one_prefill(gpu, synthetic_moe):
    """Prefill in chunks of 8 (max_batch) gives the logits of one prefill: the per-chunk routing and scatter."""
    model = synthetic_moe
    ids = [int(i) for i in np.random.default_rng(7).integers(10, min(30000, model.config.n_vocab), 30)]
    with cb.CudaSession(model, 64) as s:
        one = s.forward(ids, all_logits=True)
    with cb.CudaSession(model, 64, max_batch=8) as s:
        chunked = s.forward(ids, all_logits=True)
    assert np.allclose(one, chunked, rtol=1e-4, atol=1e-4 * np.abs(one).max())


# ------------------------------------------------------------------ the architecture fixtures' experts, GPU-sized
#: tests/arch_fixtures.py's mixtures of experts with heads the GPU takes (its fixtures' heads of 16 are not): 4
#: heads of 32 in 128, experts at least 64 wide; F32 and a quantized variant
GPU_FIXTURES = [("mixtral", "F32"), ("mixtral", "Q8_0"), ("qwen3moe", "F32"), ("qwen3moe", "Q4_0")]


@pytest.fixture(scope="module")
def gpu_sized_fixture(tmp_path_factory):
    from . import arch_fixtures as af

    made: dict[tuple[str, str], Model] = {}

    def get(name: str, quant: str) -> Model:
        if (name, quant) not in made:
            ff = af.SPECS[name].expert_ff  # (0: feed_forward_length, 128)
            spec = dataclasses.replace(af.SPECS[name], rope_dim=32, expert_ff=ff and max(64, ff))
            path = tmp_path_factory.mktemp("gpu-fixtures") / f"{name}-{quant}.gguf"
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(af, "N_EMBD", 128)
                mp.setattr(af, "HEAD_DIM", 32)
                mp.setitem(af.SPECS, name, spec)
                af.write_fixture(name, path, quant)
            made[(name, quant)] = Model(GGUFFile(path))
        return made[(name, quant)]

    return get


@pytest.mark.parametrize("name,quant", GPU_FIXTURES)
def test_gpu_sized_moe_fixtures_pass_the_gpu_check(cuda_lib, gpu_sized_fixture, name, quant):
    model = gpu_sized_fixture(name, quant)
    c = model.config
    assert (c.head_dim, c.n_embd, c.n_expert) == (32, 128, 8 if name == "mixtral" else 16)
    cd.check_config(c)
    desc, _ = cd.model_description(model, 64)
    cd.check_description(desc)


@pytest.mark.parametrize("name,quant", GPU_FIXTURES)
def test_gpu_moe_fixtures_match_cpu(gpu, gpu_sized_fixture, name, quant):
    """Mixtral's and qwen3moe's experts (softmax routing over 8 or 16 experts, F32 or quantized) on the device:
    prefill of 40 tokens, then 8 decode steps, against the CPU engine and the float64 reference."""
    model = gpu_sized_fixture(name, quant)
    ids = [int(i) for i in np.random.default_rng(8).integers(3, model.config.n_vocab, 48)]
    cpu = model.session(64).forward(ids, all_logits=True)
    with cb.CudaSession(model, 64) as s:
        got = np.concatenate([s.forward(ids[:40], all_logits=True), np.stack([s.forward([t]) for t in ids[40:]])])
    ref = reference_logits(model.config, model.weights, ids)
    if quant == "F32":
        assert_as_accurate_as_cpu(got, cpu, ref)
        return
    # Quantized: the router's inputs are 8-bit in both engines, so a token whose top experts nearly tie may route
    # differently from the float64 reference (the CPU engine's own cosine to it falls to 0.85 at one position of
    # mixtral-Q8_0): the GPU must be as close to the reference as the CPU is, position for position as a whole.
    g_cos, g_rel = cos_rel(got, ref)
    c_cos, c_rel = cos_rel(cpu, ref)
    assert np.median(g_rel) <= 1.25 * np.median(c_rel) + 0.005, (np.median(g_rel), np.median(c_rel))
    assert np.quantile(g_rel, 0.9) <= 1.5 * np.quantile(c_rel, 0.9) + 0.01, (g_rel, c_rel)
    assert g_cos.min() >= c_cos.min() - 0.05, (g_cos, c_cos)
    assert np.median(cos_rel(got, cpu)[0]) > 0.998
