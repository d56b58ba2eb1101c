"""The device's kernels one at a time, each beside its host twin: ``gpu_X`` runs kernel X on the GPU, ``host_X``
runs its arithmetic on the CPU (csrc/cuda/qsc_emul.cuh: no GPU needed); a pair shares its argument checks. What
the kernel tests and benches call; a whole forward pass is a :class:`~.cuda_backend.CudaSession` (its host
emulation too).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base.ggml_types import GGMLType
from .cuda_description import MAX_HEAD
from .cuda_library import (
    _ERR_LEN,
    CudaError,
    CudaUnavailable,
    _check,
    _err,
    _floats,
    _gpu_type,
    _i32,
    _library,
    _matrix,
    _p,
    _type,
    cuda_status,
    ffi,
)

#: flash-decoding's bounds (csrc/cuda/qsc_decode.cuh: FD_MAX_T, FD_MAX_SPLIT)
FLASHDEC_MAX_T, FLASHDEC_MAX_SPLIT = 15, 128

#: Activation types the device quantizers produce (ggml ids) and their (block elements, block bytes).
ACT_LAYOUT = {8: (32, 34), 9: (32, 36), 15: (256, 292)}


def host_dequantize(qtype: GGMLType | int | str, w: np.ndarray, rows: int, k: int) -> np.ndarray:
    """Repack + the device's element decode, run on the CPU: float32 ``(rows, k)``."""
    t = _gpu_type(qtype)
    a = _matrix(w, t, rows, k)
    out = np.empty((rows, k), np.float32)
    if _library().qsc_host_dequantize(t.id, _p(a, "uint8_t *"), rows, k, _p(out, "float *")) != 0:
        raise CudaError("qsc_host_dequantize failed")
    return out


def _quantize_args(x: np.ndarray, act: GGMLType | int | str) -> tuple[GGMLType, np.ndarray, np.ndarray]:
    """The activation type, the values as contiguous float32 and the output bytes of a quantizer call (checked)."""
    t = _type(act)
    if t.id not in ACT_LAYOUT:
        raise ValueError(f"{t.name} is not a GPU activation type (Q8_0, Q8_1, Q8_K)")
    v = _floats(x, "x").reshape(-1)
    blk, nbytes = ACT_LAYOUT[t.id]
    if v.size == 0 or v.size % blk:
        raise ValueError(f"{t.name} needs a positive multiple of {blk} values, got {v.size}")
    return t, v, np.empty(v.size // blk * nbytes, np.uint8)


def host_quantize(x: np.ndarray, act: GGMLType | int | str) -> np.ndarray:
    """The device's activation quantizer math on the CPU, in the CPU's byte layout (Q8_0, Q8_1 or Q8_K)."""
    t, v, out = _quantize_args(x, act)
    if _library().qsc_host_quantize(t.id, _p(v, "float *"), v.size, _p(out, "uint8_t *")) != 0:
        raise CudaError("qsc_host_quantize failed")
    return out


def host_matmat(qtype: GGMLType | int | str, w: np.ndarray, rows: int, k: int, x: np.ndarray) -> np.ndarray:
    """``X @ W.T`` through the device's repack, activation quantizers and int8 unit dots, run on the CPU."""
    t = _gpu_type(qtype)
    a = _matrix(w, t, rows, k)
    xa = _floats(x, "x")
    if xa.ndim != 2 or xa.shape[1] != k or xa.shape[0] == 0:
        raise ValueError(f"x must have shape (n > 0, {k}), got {xa.shape}")
    y = np.empty((xa.shape[0], rows), np.float32)
    rc = _library().qsc_host_matmat(t.id, _p(a, "uint8_t *"), rows, k, _p(xa, "float *"), xa.shape[0],
                                    _p(y, "float *"))
    if rc != 0:
        raise CudaError("qsc_host_matmat failed")
    return y


def _gpu() -> Any:
    ok, why = cuda_status()
    if not ok:
        raise CudaUnavailable(why)
    return _library()


def gpu_matmat(qtype: GGMLType | int | str, w: np.ndarray, rows: int, k: int, x: np.ndarray) -> np.ndarray:
    """``X @ W.T`` with the device's quantize + matmul kernels (n_x = 1: the decode kernel, else prefill)."""
    t = _gpu_type(qtype)
    a = _matrix(w, t, rows, k)
    xa = _floats(x, "x")
    if xa.ndim != 2 or xa.shape[1] != k or not 0 < xa.shape[0] <= 8 * 65535:
        raise ValueError(f"x must have shape (n, {k}) with 0 < n <= 524280, got {xa.shape}")
    y = np.empty((xa.shape[0], rows), np.float32)
    err = _err()
    _check(_gpu().qsc_kernel_matmat(t.id, _p(a, "uint8_t *"), rows, k, _p(xa, "float *"), xa.shape[0],
                                    _p(y, "float *"), err, _ERR_LEN), err, "matmat")
    return y


def gpu_quantize(x: np.ndarray, act: GGMLType | int | str) -> np.ndarray:
    """The device's activation quantizer, returned in the CPU's byte layout."""
    t, v, out = _quantize_args(x, act)
    err = _err()
    _check(_gpu().qsc_kernel_quantize(t.id, _p(v, "float *"), v.size, _p(out, "uint8_t *"), err, _ERR_LEN), err,
           "quantize")
    return out


def gpu_get_rows(qtype: GGMLType | int | str, w: np.ndarray, rows: int, k: int, ids: np.ndarray,
                 scale: float = 1.0) -> np.ndarray:
    """Embedding lookup on the device: rows ``ids`` dequantized, times ``scale``."""
    t = _gpu_type(qtype)
    a = _matrix(w, t, rows, k)
    idx = np.asarray(ids, dtype=np.int64).reshape(-1)
    if idx.size == 0 or idx.min() < 0 or idx.max() >= rows:
        raise IndexError(f"row ids must be non-empty and lie in 0..{rows - 1}")
    i32 = idx.astype(np.int32)
    out = np.empty((idx.size, k), np.float32)
    err = _err()
    _check(_gpu().qsc_kernel_get_rows(t.id, _p(a, "uint8_t *"), rows, k, _p(i32, "int32_t *"), idx.size, scale,
                                      _p(out, "float *"), err, _ERR_LEN), err, "get_rows")
    return out


def gpu_rmsnorm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """Row-wise RMSNorm over the last dimension on the device."""
    xa = _floats(x, "x")
    n = xa.shape[-1]
    w = None if weight is None else _floats(weight, "weight", (n,))
    y = np.empty_like(xa)
    err = _err()
    _check(_gpu().qsc_kernel_rmsnorm(_p(xa, "float *"), ffi.NULL if w is None else _p(w, "float *"),
                                     _p(y, "float *"), xa.size // n, n, eps, err, _ERR_LEN), err, "rmsnorm")
    return y


def gpu_rope(x: np.ndarray, positions: np.ndarray, *, rot_dim: int | None = None, freq_base: float = 10000.0,
             neox: bool = False) -> np.ndarray:
    """RoPE on ``(n_tokens, n_heads, head_dim)`` float32 on the device; returns a new array."""
    xa = _floats(x, "x").copy()
    if xa.ndim != 3:
        raise ValueError("x must be (n_tokens, n_heads, head_dim)")
    n_tok, n_heads, hd = xa.shape
    rd = hd if rot_dim is None else rot_dim
    if rd <= 0 or rd % 2 or rd > hd:
        raise ValueError(f"rot_dim {rd} must be even and at most head_dim {hd}")
    pos = _i32(positions, "positions", n_tok)
    err = _err()
    _check(_gpu().qsc_kernel_rope(_p(xa, "float *"), n_tok, n_heads, hd, rd, _p(pos, "int32_t *"), freq_base,
                                  int(neox), err, _ERR_LEN), err, "rope")
    return xa


#: The gated units of the FFN by name: the ``mode`` of qsc_kernel_glu / qsc_host_glu.
GLU_MODES = {"swiglu": 0, "gelu": 1, "swiglu_oai": 2}


def _glu_args(gate: np.ndarray, up: np.ndarray, mode: str | bool) -> tuple[np.ndarray, np.ndarray, int]:
    g = _floats(gate, "gate")
    u = _floats(up, "up", g.shape)
    name = ("gelu" if mode else "swiglu") if isinstance(mode, bool) else mode
    if name not in GLU_MODES or g.size == 0:
        raise ValueError(f"gated unit {mode!r} on {g.size} values: one of {', '.join(GLU_MODES)} on at least one")
    return g, u, GLU_MODES[name]


def gpu_glu(gate: np.ndarray, up: np.ndarray, gelu: bool | str) -> np.ndarray:
    """The gated unit on the device: SiLU (False / "swiglu"), GELU-tanh (True / "gelu") or gpt-oss's clamped
    SwiGLU ("swiglu_oai")."""
    g, u, mode = _glu_args(gate, up, gelu)
    n = g.shape[-1]
    out = np.empty_like(g)
    err = _err()
    _check(_gpu().qsc_kernel_glu(_p(g, "float *"), _p(u, "float *"), _p(out, "float *"), g.size // n, n, mode, err,
                                 _ERR_LEN), err, "glu")
    return out


def _attention_args(q: np.ndarray, q_pos: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_kv: int,
                    window: int, softcap: float, sinks: np.ndarray | None) -> tuple[Any, ...]:
    qa = _floats(q, "q")
    if qa.ndim != 3:
        raise ValueError("q must be (n_q, n_heads, head_dim)")
    n_q, n_heads, hd = qa.shape
    if k_cache.dtype not in (np.float32, np.float16) or v_cache.dtype != k_cache.dtype:
        raise TypeError("k_cache and v_cache must both be float32 or both float16")
    if k_cache.ndim != 3 or k_cache.shape != v_cache.shape or k_cache.shape[2] != hd:
        raise ValueError(f"caches must be (n_ctx, n_kv_heads, {hd}) and equal")
    n_kv_heads = k_cache.shape[1]
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}")
    if not 0 < hd <= MAX_HEAD:
        raise ValueError(f"head_dim {hd} must lie in 1..{MAX_HEAD}")
    if not 0 < n_kv <= k_cache.shape[0]:
        raise ValueError(f"n_kv {n_kv} outside 1..{k_cache.shape[0]}")
    if not 0 <= window < 2**31 or not (np.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"window {window} / soft-cap {softcap} out of range")
    pos = _i32(q_pos, "q_pos", n_q)
    if pos.size and pos.min() < 0:
        raise ValueError("query positions must be >= 0")
    sk = None if sinks is None else _floats(sinks, "sinks", (n_heads,))
    if sk is not None and not np.isfinite(sk).all():
        raise ValueError("sinks must be finite")
    kc = np.ascontiguousarray(k_cache[:n_kv])
    vc = np.ascontiguousarray(v_cache[:n_kv])
    return qa, pos, kc, vc, sk, (n_q, n_heads, hd, n_kv_heads)


def gpu_attention(q: np.ndarray, q_pos: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_kv: int, *,
                  scale: float, window: int = 0, softcap: float = 0.0,
                  sinks: np.ndarray | None = None) -> np.ndarray:
    """Attention over a ``(n_ctx, n_kv_heads, head_dim)`` F32/F16 cache on the device (as core.native.nn's, with
    its soft-cap and sinks; any head size up to :data:`MAX_HEAD`)."""
    qa, pos, kc, vc, sk, (n_q, n_heads, hd, n_kv_heads) = _attention_args(q, q_pos, k_cache, v_cache, n_kv, window,
                                                                         softcap, sinks)
    out = np.empty_like(qa)
    err = _err()
    _check(_gpu().qsc_kernel_attention_ext(_p(qa, "float *"), n_q, _p(pos, "int32_t *"), n_heads, hd,
                                           _p(kc, "void *"), _p(vc, "void *"), int(kc.dtype == np.float16),
                                           n_kv_heads, n_kv, window, scale, softcap,
                                           ffi.NULL if sk is None else _p(sk, "float *"), _p(out, "float *"), err,
                                           _ERR_LEN), err, "attention")
    return out


def host_attention(q: np.ndarray, q_pos: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_kv: int, *,
                   scale: float, window: int = 0, softcap: float = 0.0,
                   sinks: np.ndarray | None = None) -> np.ndarray:
    """:func:`gpu_attention`'s arithmetic run on the CPU as the kernel runs it (8 online softmaxes over the keys
    round-robin, merged with the sink): the host emulation of k_attention."""
    qa, pos, kc, vc, sk, (n_q, n_heads, hd, n_kv_heads) = _attention_args(q, q_pos, k_cache, v_cache, n_kv, window,
                                                                         softcap, sinks)
    out = np.empty_like(qa)
    rc = _library().qsc_host_attention(_p(qa, "float *"), n_q, _p(pos, "int32_t *"), n_heads, hd, _p(kc, "void *"),
                                       _p(vc, "void *"), int(kc.dtype == np.float16), n_kv_heads, n_kv, window, scale,
                                       softcap, ffi.NULL if sk is None else _p(sk, "float *"), _p(out, "float *"))
    if rc != 0:
        raise CudaError("qsc_host_attention refused its arguments")
    return out


def _flashdec(host: bool, q: np.ndarray, q_pos: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_kv: int,
              scale: float, window: int, softcap: float, sinks: np.ndarray | None,
              n_split: int) -> tuple[np.ndarray, int]:
    qa, pos, kc, vc, sk, (n_q, n_heads, hd, n_kv_heads) = _attention_args(q, q_pos, k_cache, v_cache, n_kv, window,
                                                                         softcap, sinks)
    if not 0 < n_q <= FLASHDEC_MAX_T:
        raise ValueError(f"flash-decoding takes 1..{FLASHDEC_MAX_T} query tokens, got {n_q}")
    if hd % (8 if kc.dtype == np.float16 else 4):
        raise ValueError(f"head_dim {hd}: a cache row must be whole 16-byte chunks")
    if n_split > FLASHDEC_MAX_SPLIT:
        raise ValueError(f"n_split {n_split} over {FLASHDEC_MAX_SPLIT}")
    out = np.empty_like(qa)
    args = (_p(qa, "float *"), n_q, _p(pos, "int32_t *"), n_heads, hd, _p(kc, "void *"), _p(vc, "void *"),
            int(kc.dtype == np.float16), n_kv_heads, n_kv, window, scale, softcap,
            ffi.NULL if sk is None else _p(sk, "float *"), n_split, _p(out, "float *"))
    if host:
        rc = _library().qsc_host_flashdec(*args)
        if rc <= 0:
            raise CudaError("qsc_host_flashdec refused its arguments")
        return out, int(rc)
    err = _err()
    rc = _gpu().qsc_kernel_flashdec(*args, err, _ERR_LEN)
    _check(min(rc, 0), err, "flash-decoding")
    return out, int(rc)


def host_flashdec(q: np.ndarray, q_pos: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_kv: int, *,
                  scale: float, window: int = 0, softcap: float = 0.0, sinks: np.ndarray | None = None,
                  n_split: int = 0) -> tuple[np.ndarray, int]:
    """Flash-decoding (csrc/cuda/qsc_decode.cuh) run on the CPU as the device runs it: the keys split across
    ``n_split`` blocks (0: the forward's choice, with ``n_kv`` as the context and 132 SMs), each block's partial
    softmax for its group of query heads, then the merge. Arguments as :func:`gpu_attention`; 1..15 query tokens.
    Returns (output, split count used)."""
    return _flashdec(True, q, q_pos, k_cache, v_cache, n_kv, scale, window, softcap, sinks, n_split)


def gpu_flashdec(q: np.ndarray, q_pos: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_kv: int, *,
                 scale: float, window: int = 0, softcap: float = 0.0, sinks: np.ndarray | None = None,
                 n_split: int = 0) -> tuple[np.ndarray, int]:
    """:func:`host_flashdec` on the device (0: the forward's split count for this GPU's SMs)."""
    return _flashdec(False, q, q_pos, k_cache, v_cache, n_kv, scale, window, softcap, sinks, n_split)


def rope_desc(rot_dim: int, *, base: float = 10000.0, neox: bool = False, freq_scale: float = 1.0,
              ext_factor: float = 0.0, corr: tuple[float, float] = (0.0, 0.0), mscale: float = 1.0,
              factors: np.ndarray | None = None, skip: bool = False) -> tuple[Any, list[Any]]:
    """A ``qs_rope_desc`` (the forward description's RoPE group) for the qk_post entry points, and the arrays its
    pointers reach (keep them alive while it is used)."""
    r = ffi.new("qs_rope_desc *")
    r.skip, r.dim, r.neox, r.base, r.freq_scale = int(skip), rot_dim, int(neox), base, freq_scale
    r.ext_factor, r.corr0, r.corr1, r.mscale = ext_factor, corr[0], corr[1], mscale
    keep: list[Any] = []
    if factors is not None:
        f = _floats(factors, "factors").reshape(-1)
        keep.append(f)
        r.freqs.ptr, r.freqs.len = _p(f, "float *"), f.size
    return r, keep


def _qk_post(host: bool, q: np.ndarray, k: np.ndarray | None, pos: np.ndarray, rope: Any, q_norm: np.ndarray | None,
             k_norm: np.ndarray | None, qk_full: bool, eps: float, temp_scale: float,
             temp_floor: int) -> tuple[np.ndarray, np.ndarray | None]:
    qa = _floats(q, "q").copy()
    if qa.ndim != 3:
        raise ValueError("q must be (n_tokens, n_head, head_dim)")
    T, H, hd = qa.shape
    ka = None if k is None else _floats(k, "k").copy()
    if ka is not None and (ka.ndim != 3 or ka.shape[0] != T or ka.shape[2] != hd):
        raise ValueError(f"k must be ({T}, n_head_kv, {hd})")
    KV = 0 if ka is None else ka.shape[1]
    if (q_norm is None) != (k_norm is None) or (q_norm is not None and ka is None):
        raise ValueError("q_norm and k_norm go together, with k")
    qn = None if q_norm is None else _floats(q_norm, "q_norm", ((H * hd) if qk_full else hd,))
    kn = None if k_norm is None else _floats(k_norm, "k_norm", ((KV * hd) if qk_full else hd,))
    p = _i32(pos, "pos", T)
    args = (_p(qa, "float *"), ffi.NULL if ka is None else _p(ka, "float *"), T, H, KV, hd,
            ffi.NULL if qn is None else _p(qn, "float *"), ffi.NULL if kn is None else _p(kn, "float *"), int(qk_full),
            eps, _p(p, "int32_t *"), rope, temp_scale, temp_floor)
    if host:
        if _library().qsc_host_qk_post(*args) != 0:
            raise CudaError("qsc_host_qk_post refused its arguments")
    else:
        err = _err()
        _check(_gpu().qsc_kernel_qk_post(*args, err, _ERR_LEN), err, "qk_post")
    return qa, ka


def host_qk_post(q: np.ndarray, k: np.ndarray | None, pos: np.ndarray, rope: Any, *, q_norm: np.ndarray | None = None,
                 k_norm: np.ndarray | None = None, qk_full: bool = False, eps: float = 1e-6, temp_scale: float = 0.0,
                 temp_floor: int = 1) -> tuple[np.ndarray, np.ndarray | None]:
    """What k_qk_post does to ``q`` (T, n_head, hd) and ``k`` (T, n_head_kv, hd) - q/k RMSNorms, RoPE as the
    ``qs_rope_desc`` ``rope`` says (:func:`rope_desc`), the query temperature - run on the CPU; new arrays."""
    return _qk_post(True, q, k, pos, rope, q_norm, k_norm, qk_full, eps, temp_scale, temp_floor)


def gpu_qk_post(q: np.ndarray, k: np.ndarray | None, pos: np.ndarray, rope: Any, *, q_norm: np.ndarray | None = None,
                k_norm: np.ndarray | None = None, qk_full: bool = False, eps: float = 1e-6, temp_scale: float = 0.0,
                temp_floor: int = 1) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`host_qk_post` on the device (the k_qk_post kernel itself)."""
    return _qk_post(False, q, k, pos, rope, q_norm, k_norm, qk_full, eps, temp_scale, temp_floor)


def host_glu(gate: np.ndarray, up: np.ndarray, mode: str) -> np.ndarray:
    """The device's gated unit (``mode`` of :data:`GLU_MODES`) run on the CPU."""
    g, u, m = _glu_args(gate, up, mode)
    out = np.empty_like(g)
    if _library().qsc_host_glu(_p(g, "float *"), _p(u, "float *"), _p(out, "float *"), g.size, m) != 0:
        raise CudaError("qsc_host_glu failed")
    return out


def _logits(host: bool, x: np.ndarray, logit_scale: float, softcap: float) -> np.ndarray:
    xa = _floats(x, "logits").copy()
    if xa.size == 0 or not (np.isfinite(softcap) and softcap >= 0) or not np.isfinite(logit_scale):
        raise ValueError(f"{xa.size} logits / soft-cap {softcap} / logit scale {logit_scale} out of range")
    if host:
        if _library().qsc_host_logits(_p(xa, "float *"), xa.size, logit_scale, softcap) != 0:
            raise CudaError("qsc_host_logits failed")
    else:
        err = _err()
        _check(_gpu().qsc_kernel_logits(_p(xa, "float *"), xa.size, logit_scale, softcap, err, _ERR_LEN), err,
               "logits")
    return xa


def host_logits(x: np.ndarray, logit_scale: float = 1.0, softcap: float = 0.0) -> np.ndarray:
    """The head's logit scale and final soft-cap as the device applies them, run on the CPU."""
    return _logits(True, x, logit_scale, softcap)


def gpu_logits(x: np.ndarray, logit_scale: float = 1.0, softcap: float = 0.0) -> np.ndarray:
    """:func:`host_logits` on the device."""
    return _logits(False, x, logit_scale, softcap)


def host_residual(x: np.ndarray, o: np.ndarray, post_w: np.ndarray | None, *, eps: float, rs: float = 1.0,
                  out_scale: float = 1.0) -> np.ndarray:
    """k_norm_quant's residual update run on the CPU: ``(x + rs * [RMSNorm](o) * post_w) * out_scale`` per row."""
    xa = _floats(x, "x").copy()
    if xa.ndim != 2 or xa.size == 0:
        raise ValueError("x must be (n_rows, n)")
    oa = _floats(o, "o", xa.shape)
    w = None if post_w is None else _floats(post_w, "post_w", (xa.shape[1],))
    if _library().qsc_host_residual(_p(xa, "float *"), _p(oa, "float *"), ffi.NULL if w is None else _p(w, "float *"),
                                    xa.shape[0], xa.shape[1], eps, rs, out_scale) != 0:
        raise CudaError("qsc_host_residual failed")
    return xa

