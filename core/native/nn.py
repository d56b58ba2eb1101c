"""Typed wrappers over the native float kernels of the inference engine (RMSNorm, RoPE, softmax, gated
activations, attention over a KV cache). Arrays are float32 and C-contiguous; sizes are validated here."""

from __future__ import annotations

import functools

import numpy as np

from . import ffi, lib
from .kernels import _in, _out, _ptr, native_error


def _f32_inplace(x: np.ndarray, what: str) -> np.ndarray:
    if x.dtype != np.float32 or not x.flags.c_contiguous or not x.flags.writeable:
        raise ValueError(f"{what} must be a writeable C-contiguous float32 array")
    return x


def rmsnorm(x: np.ndarray, weight: np.ndarray | None, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """Row-wise ``x / sqrt(mean(x²) + eps) * weight`` over the last dimension."""
    xa = _in(x, np.float32, "x")
    n = xa.shape[-1]
    w = None
    if weight is not None:
        w = _in(weight, np.float32, "weight").reshape(-1)
        if w.size != n:
            raise ValueError(f"weight has {w.size} elements, rows have {n}")
    y = np.empty_like(xa) if out is None else _f32_inplace(out, "out")
    if y.shape != xa.shape:
        raise ValueError("out must have the shape of x")
    lib.qs_rmsnorm(_ptr(xa, "float *"), _ptr(w, "float *") if w is not None else ffi.NULL, _out(y, "float *"),
                   xa.size // n if n else 0, n, eps)
    return y


def rope(x: np.ndarray, positions: np.ndarray, *, rot_dim: int | None = None, freq_base: float = 10000.0,
         freq_scale: float = 1.0, neox: bool = False, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """Rotary embedding in place on ``x`` of shape ``(n_tokens, n_heads, head_dim)``.

    ``neox=False`` rotates pairs ``(2i, 2i+1)``; ``neox=True`` pairs ``(i, i + rot_dim/2)``; angle
    ``pos * freq_scale * freq_base^(-2i/rot_dim) / freq_factors[i]`` (``freq_factors``: ``rot_dim/2`` positive
    divisors, Llama 3's ``rope_freqs.weight``, or ``None``). Returns ``x``.
    """
    xa = _f32_inplace(x, "x")
    if xa.ndim != 3:
        raise ValueError("x must be (n_tokens, n_heads, head_dim)")
    n_tok, n_heads, head_dim = xa.shape
    rd = head_dim if rot_dim is None else rot_dim
    if rd <= 0 or rd % 2 or rd > head_dim or rd > 1024:
        raise ValueError(f"rot_dim {rd} must be even and at most head_dim {head_dim} (and 1024)")
    pos = _in(positions, np.int32, "positions").reshape(-1)
    if pos.size != n_tok:
        raise ValueError(f"{pos.size} positions for {n_tok} tokens")
    ff = ffi.NULL
    if freq_factors is not None:
        ffa = _in(freq_factors, np.float32, "freq_factors").reshape(-1)
        if ffa.size != rd // 2:
            raise ValueError(f"{ffa.size} frequency factors for {rd // 2} pairs")
        ff = _ptr(ffa, "float *")
    rc = lib.qs_rope(_out(xa, "float *"), n_tok, n_heads, head_dim, rd, _ptr(pos, "int32_t *"), freq_base,
                     freq_scale, int(neox), ff)
    if rc != 0:
        raise native_error("rope", rc)
    return xa


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last dimension, in place (rows of all ``-inf`` become zeros). Returns ``x``."""
    xa = _f32_inplace(x, "x")
    n = xa.shape[-1]
    if n:
        lib.qs_softmax(_out(xa, "float *"), xa.size // n, n)
    return xa


def layernorm(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float,
              out: np.ndarray | None = None) -> np.ndarray:
    """Row-wise LayerNorm over the last dimension: ``(x - mean) / sqrt(var + eps) * weight + bias``."""
    xa = _in(x, np.float32, "x")
    n = xa.shape[-1]
    ptrs, keep = [], []
    for name, v in (("weight", weight), ("bias", bias)):
        if v is None:
            ptrs.append(ffi.NULL)
            continue
        a = _in(v, np.float32, name).reshape(-1)
        if a.size != n:
            raise ValueError(f"{name} has {a.size} elements, rows have {n}")
        keep.append(a)
        ptrs.append(_ptr(a, "float *"))
    y = np.empty_like(xa) if out is None else _f32_inplace(out, "out")
    if y.shape != xa.shape:
        raise ValueError("out must have the shape of x")
    lib.qs_layernorm(_ptr(xa, "float *"), ptrs[0], ptrs[1], _out(y, "float *"), xa.size // n if n else 0, n, eps)
    return y


def gelu_tanh(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """GELU in its tanh form (ggml_gelu), no gate."""
    xa = _in(x, np.float32, "x")
    y = np.empty_like(xa) if out is None else _f32_inplace(out, "out")
    if y.shape != xa.shape:
        raise ValueError("out must have the shape of x")
    lib.qs_gelu_tanh(_ptr(xa, "float *"), _out(y, "float *"), xa.size)
    return y


def _glu(fn: object, gate: np.ndarray, up: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    g = _in(gate, np.float32, "gate")
    u = _in(up, np.float32, "up")
    if g.shape != u.shape:
        raise ValueError(f"gate {g.shape} and up {u.shape} differ")
    y = np.empty_like(g) if out is None else _f32_inplace(out, "out")
    if y.shape != g.shape:
        raise ValueError("out must have the shape of gate")
    fn(_ptr(g, "float *"), _ptr(u, "float *"), _out(y, "float *"), g.size)  # type: ignore[operator]
    return y


def swiglu(gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``silu(gate) * up``."""
    return _glu(lib.qs_swiglu, gate, up, out)


def geglu_tanh(gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``gelu_tanh(gate) * up`` (the tanh approximation of GELU)."""
    return _glu(lib.qs_geglu_tanh, gate, up, out)


def swiglu_oai(gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """gpt-oss's clamped SwiGLU: ``g·sigmoid(1.702·g)·(u + 1)`` with ``g = min(gate, 7)``, ``u = clip(up, -7, 7)``."""
    return _glu(lib.qs_swiglu_oai, gate, up, out)


#: KV cache element types by llama.cpp's ``--cache-type-k/-v`` names, in its order of size: the ggml type id
#: (csrc/qs_api_nn.h, ``QS_KV_*``). Q8_0 / Q4_0 hold ggml blocks of 32 along head_dim, one row per (position, KV
#: head); BF16 rows are ``uint16`` bit patterns (numpy has no bfloat16).
KV_CACHE_TYPES: dict[str, int] = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2}
_KV_DTYPE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "q8_0": np.uint8, "q4_0": np.uint8}


def kv_cache_type(kind: object) -> str:
    """The cache type named by ``kind``: one of :data:`KV_CACHE_TYPES` (any case), or numpy's float32 / float16
    (the engine's ``kv_dtype`` before cache types); anything else is a ValueError of one line."""
    if isinstance(kind, str):
        if kind.lower() in KV_CACHE_TYPES:
            return kind.lower()
    else:
        try:
            dt = np.dtype(kind)  # type: ignore[call-overload]
        except TypeError:
            dt = None
        if dt == np.float32:
            return "f32"
        if dt == np.float16:
            return "f16"
    raise ValueError(f"KV cache type must be one of {', '.join(KV_CACHE_TYPES)}, not {kind!r}")


def kv_row_bytes(kind: str, head_dim: int) -> int:
    """Bytes of one cache row (``head_dim`` elements of ``kind``); a block type needs ``head_dim % 32 == 0``."""
    n = int(lib.qs_kv_row_bytes(KV_CACHE_TYPES[kv_cache_type(kind)], int(head_dim)))
    if n < 0:
        raise ValueError(f"a {kind} KV cache needs a head size that is a multiple of 32, not {head_dim}")
    return n


def kv_cache_zeros(kind: str, n_ctx: int, n_kv_heads: int, head_dim: int) -> np.ndarray:
    """An empty cache of ``kind``: ``(n_ctx, n_kv_heads, row)``, row ``head_dim`` floats / halves / bf16 bit
    patterns, or the bytes of ``head_dim / 32`` blocks."""
    kind = kv_cache_type(kind)
    dt = np.dtype(_KV_DTYPE[kind])
    return np.zeros((n_ctx, n_kv_heads, kv_row_bytes(kind, head_dim) // dt.itemsize), dt)


def _kv_rows(cache: np.ndarray, kind: str, head_dim: int) -> int:
    """Rows of ``cache`` as a ``kind`` cache of ``head_dim`` (its shape and dtype checked)."""
    dt = np.dtype(_KV_DTYPE[kind])
    if (cache.dtype != dt or cache.ndim != 3 or not cache.flags.c_contiguous
            or cache.shape[2] * dt.itemsize != kv_row_bytes(kind, head_dim)):
        raise ValueError(f"a {kind} cache of head size {head_dim} must be a C-contiguous (n_ctx, n_kv_heads, "
                         f"{kv_row_bytes(kind, head_dim) // dt.itemsize}) {dt} array")
    return cache.shape[0] * cache.shape[1]


def kv_store(cache: np.ndarray, kind: str, row0: int, rows: np.ndarray) -> None:
    """Write float rows ``(n, head_dim)`` into ``cache`` (a ``kind`` cache) from flat row ``row0`` (position x
    n_kv_heads + head) on, rounded as the engine writes them (ggml's quantize_row_*_ref for the block types)."""
    kind = kv_cache_type(kind)
    r = _in(rows, np.float32, "rows")
    if r.ndim != 2:
        raise ValueError("rows must be (n, head_dim)")
    n_rows = _kv_rows(cache, kind, r.shape[1])
    if not 0 <= row0 <= n_rows - r.shape[0] or not cache.flags.writeable:
        raise ValueError(f"rows {row0}..{row0 + r.shape[0]} do not fit a writeable cache of {n_rows}")
    rc = lib.qs_kv_store(ffi.from_buffer(cache), KV_CACHE_TYPES[kind], row0, _ptr(r, "float *"), r.shape[0],
                         r.shape[1])
    if rc != 0:
        raise native_error("KV store", rc)


def kv_load(cache: np.ndarray, kind: str, head_dim: int) -> np.ndarray:
    """A ``kind`` cache as floats ``(n_ctx, n_kv_heads, head_dim)`` (a copy: tests and the probe, never attention)."""
    kind = kv_cache_type(kind)
    n_rows = _kv_rows(cache, kind, head_dim)
    y = np.empty((cache.shape[0], cache.shape[1], head_dim), np.float32)
    rc = lib.qs_kv_load(ffi.from_buffer(cache), KV_CACHE_TYPES[kind], 0, _out(y, "float *"), n_rows, head_dim)
    if rc != 0:
        raise native_error("KV load", rc)
    return y


def _attention_args(q: np.ndarray, q_pos: np.ndarray, k_cache: np.ndarray, n_kv: int, window: int,
                    softcap: float, sinks: np.ndarray | None,
                    k_type: str | None) -> tuple[np.ndarray, np.ndarray, object, str]:
    """The checks :func:`attention` and :func:`attention_probs` share: (q as float32, positions, sinks pointer,
    K's cache type: ``k_type`` or, when None, float32 / float16 from the array's dtype)."""
    qa = _in(q, np.float32, "q")
    if qa.ndim != 3:
        raise ValueError("q must be (n_q, n_heads, head_dim)")
    n_q, n_heads, head_dim = qa.shape
    if k_type is None:
        if k_cache.dtype not in (np.float32, np.float16) or k_cache.ndim != 3 or k_cache.shape[2] != head_dim:
            raise ValueError(f"caches must be (n_ctx, n_kv_heads, {head_dim}), float32 or float16")
        k_type = "f16" if k_cache.dtype == np.float16 else "f32"
    k_type = kv_cache_type(k_type)
    if not k_cache.flags.c_contiguous:
        raise ValueError("caches must be C-contiguous")
    _kv_rows(k_cache, k_type, head_dim)
    n_ctx, n_kv_heads = k_cache.shape[0], k_cache.shape[1]
    if n_kv_heads == 0 or n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} heads are not a multiple of {n_kv_heads} KV heads")
    if not 0 <= n_kv <= n_ctx:
        raise ValueError(f"n_kv {n_kv} outside 0..{n_ctx}")
    if window < 0:
        raise ValueError(f"window {window} is negative")
    pos = _in(q_pos, np.int32, "q_pos").reshape(-1)
    if pos.size != n_q:
        raise ValueError(f"{pos.size} positions for {n_q} queries")
    if not (np.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap {softcap} must be finite and >= 0")
    sk = ffi.NULL
    if sinks is not None:
        sa = _in(sinks, np.float32, "sinks").reshape(-1)
        if sa.size != n_heads:
            raise ValueError(f"{sa.size} sinks for {n_heads} heads")
        sk = _ptr(sa, "float *")
    return qa, pos, sk, k_type


def attention(q: np.ndarray, q_pos: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, n_kv: int, *,
              scale: float, window: int = 0, threads: int = 0, out: np.ndarray | None = None,
              softcap: float = 0.0, sinks: np.ndarray | None = None, k_type: str | None = None,
              v_type: str | None = None) -> np.ndarray:
    """Causal scaled-dot-product attention of query rows against a KV cache.

    ``q``: ``(n_q, n_heads, head_dim)`` float32; ``q_pos``: each query's position; caches
    ``(n_ctx, n_kv_heads, row)`` with the first ``n_kv`` positions valid: float32 or float16 (``k_type`` /
    ``v_type`` None), or of the named :data:`KV_CACHE_TYPES` (:func:`kv_cache_zeros`, :func:`kv_store`). Query
    ``i`` sees keys ``p <= q_pos[i]`` (and ``p > q_pos[i] - window`` when ``window > 0``). GQA: head ``h`` uses KV
    head ``h // (n_heads // n_kv_heads)``. ``softcap > 0``: scaled scores ``s`` become ``softcap·tanh(s/softcap)``
    (gemma2). ``sinks``: one finite logit per head that joins each softmax's denominator (gpt-oss).
    """
    if k_type is None and v_type is None and (k_cache.dtype != v_cache.dtype or k_cache.shape != v_cache.shape):
        raise TypeError("k_cache and v_cache must be alike (shape, float32 or float16, C-contiguous)")
    if not v_cache.flags.c_contiguous:
        raise TypeError("v_cache must be C-contiguous")
    qa, pos, sk, k_type = _attention_args(q, q_pos, k_cache, n_kv, window, softcap, sinks, k_type)
    n_q, n_heads, head_dim = qa.shape
    v_type = kv_cache_type(v_type) if v_type is not None else ("f16" if v_cache.dtype == np.float16 else "f32")
    _kv_rows(v_cache, v_type, head_dim)
    if v_cache.shape[:2] != k_cache.shape[:2]:
        raise ValueError("k_cache and v_cache must hold the same positions and KV heads")
    n_ctx, n_kv_heads = k_cache.shape[0], k_cache.shape[1]
    y = np.empty_like(qa) if out is None else _f32_inplace(out, "out")
    if y.shape != qa.shape:
        raise ValueError("out must have the shape of q")
    rc = lib.qs_attention_kv(_ptr(qa, "float *"), n_q, _ptr(pos, "int32_t *"), n_heads, head_dim,
                             ffi.from_buffer(k_cache), ffi.from_buffer(v_cache), KV_CACHE_TYPES[k_type],
                             KV_CACHE_TYPES[v_type], n_kv_heads, n_kv, n_ctx, window, scale, softcap, sk,
                             _out(y, "float *"), threads)
    if rc != 0:
        raise native_error("attention", rc)
    return y


def attention_probs(q: np.ndarray, q_pos: np.ndarray, k_cache: np.ndarray, n_kv: int, *, scale: float,
                    window: int = 0, softcap: float = 0.0, sinks: np.ndarray | None = None,
                    threads: int = 0, k_type: str | None = None) -> np.ndarray:
    """The weights :func:`attention` gives each cached key, computed by the same native code:
    ``(n_q, n_heads, n_kv)`` float32, 0 where a query does not see a key (docs/probe.md). Arguments as there."""
    qa, pos, sk, k_type = _attention_args(q, q_pos, k_cache, n_kv, window, softcap, sinks, k_type)
    n_q, n_heads, head_dim = qa.shape
    n_ctx, n_kv_heads = k_cache.shape[0], k_cache.shape[1]
    y = np.empty((n_q, n_heads, n_kv), np.float32)
    rc = lib.qs_attention_probs(_ptr(qa, "float *"), n_q, _ptr(pos, "int32_t *"), n_heads, head_dim,
                                ffi.from_buffer(k_cache), k_cache.nbytes, KV_CACHE_TYPES[k_type],
                                n_kv_heads, n_kv, n_ctx, window, scale, softcap, sk, _out(y, "float *"), y.size,
                                threads)
    if rc != 0:
        raise native_error("attention weights", rc)
    return y


# ---------------------------------------------------------------------------------------------------- the plan
def _names(prefix: str) -> dict[int, str]:
    return {int(getattr(lib, n)): n[len(prefix):].lower() for n in dir(lib)
            if n.startswith(prefix) and n not in (prefix + "KINDS", prefix + "NONE", prefix + "MAX")}


@functools.cache
def plan_names() -> dict[str, dict[int, str]]:
    """The plan's vocabulary, read from the library's constants (csrc/qs_api_nn.h: a new slot or kind needs no
    edit here): step kinds, buffers, weight and vector slots, probe points, GLU modes."""
    return {"kinds": _names("QS_STEP_"), "bufs": _names("QS_BUF_"),
            "weights": _names("QS_W_"), "vecs": _names("QS_V_"), "taps": _names("QS_TAP_"),
            "glus": _names("QS_GLU_"), "residuals": _names("QS_RES_")}


def block_plan(block: object) -> list[str]:
    """The steps of one layer's description (a ``qs_block``) as ``qs_block_plan`` builds them for every backend
    (docs/engine.md, "The layer as a plan"), one line each, e.g. ``proj h -> q:q k:k+bk v:v+bv``."""
    steps = ffi.new("qs_step[]", int(lib.QS_PLAN_MAX))
    n = lib.qs_block_plan(block, steps, int(lib.QS_PLAN_MAX))
    if n < 0:
        raise native_error("plan", n)
    names = plan_names()
    BUFFERS, WEIGHTS, VECTORS = names["bufs"], names["weights"], names["vecs"]
    out = []
    for s in steps[0:n]:
        kind = names["kinds"][s.kind]
        src, dst, vec = BUFFERS[s.src], BUFFERS[s.dst], VECTORS.get(s.vec)
        scale = f" x{s.scale:g}" if s.scale != 1.0 else ""
        if kind == "norm":
            out.append(f"norm {vec or 'copy'}: {src} -> {dst}")
        elif kind == "tap":
            out.append(f"tap {names['taps'][s.arg]}: {src}")
        elif kind == "proj":
            parts = [f"{BUFFERS[s.out[i]]}:{WEIGHTS[s.w[i]]}" + (f"+{VECTORS[s.bias[i]]}" if s.bias[i] else "")
                     for i in range(s.n)]
            out.append(f"proj {src} -> {' '.join(parts)}")
        elif kind == "residual" and s.arg == lib.QS_RES_POST_LN:
            out.append(f"residual ln {vec}+{VECTORS[s.bias[0]]}{scale}: x = ln(x + {src})")
        elif kind == "residual":
            out.append(f"residual {vec or 'none'}{scale}: x += {src}")
        elif kind == "glu":
            out.append(f"glu {names['glus'][s.arg]}: {src} * {BUFFERS[s.src2]} -> {dst}")
        elif kind == "scale":
            out.append(f"scale{scale}: x")
        elif kind == "qgate_split":
            out.append(f"qgate_split {src} -> {dst} {BUFFERS[s.src2]}" + (f" +{VECTORS[s.bias[0]]}" if s.bias[0]
                                                                            else ""))
        elif kind in ("attend", "gdn", "moe", "qgate"):
            out.append(f"{kind}: {src} -> {dst}")
        else:
            out.append(kind)
    return out
