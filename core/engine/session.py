"""Inference session: KV cache and the forward pass (prefill of a batch, decode of one token) on native kernels.

The forward pass reads like the paper (llama2.c style): embed, then per layer RMSNorm -> q/k/v -> RoPE -> attention
over the cache -> output projection -> residual -> RMSNorm -> gated FFN -> residual; final norm; lm_head. Every
per-token operation runs in C (matmul, norms, RoPE, attention, activations); Python only sequences the calls,
through pre-bound cffi pointers to skip per-call validation (sizes are checked once, when the model loads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile
from ..model import ModelConfig, ModelWeights, Weight, bind_weights, read_config
from ..native import ffi, lib
from ..native import kernels as K


class ContextFull(RuntimeError):
    """The KV cache has no room for more tokens."""


@dataclass
class _Bound:
    """A weight with its cffi pointer, validated once."""

    type_id: int
    ptr: object
    rows: int
    k: int


def _bind(w: Weight) -> _Bound:
    if w.data.size != w.rows * w.type.row_bytes(w.k):
        raise ValueError(f"{w.name}: {w.data.size} bytes for {w.rows}x{w.k} {w.type.name}")
    return _Bound(w.type.id, ffi.cast("uint8_t *", ffi.from_buffer(w.data)), w.rows, w.k)


def _fp(a: np.ndarray) -> object:
    return ffi.cast("float *", ffi.from_buffer(a, require_writable=False))


class Model:
    """A loaded model: config, weights bound to the mapped file, ready to create sessions."""

    def __init__(self, f: GGUFFile, threads: int = 0) -> None:
        self.file = f
        self.config: ModelConfig = read_config(f)
        self.weights: ModelWeights = bind_weights(f, self.config)
        self.threads = threads or K.default_threads()
        self._keep: list[object] = []
        self.layers = []
        for lw in self.weights.layers:
            self.layers.append({n: _bind(getattr(lw, n)) for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")})
        self.tok_embd = self.weights.tok_embd
        self.output = _bind(self.weights.output)

    @classmethod
    def load(cls, path: str, threads: int = 0) -> Model:
        return cls(GGUFFile(path), threads)

    def session(self, n_ctx: int = 2048, kv_dtype: type = np.float16) -> Session:
        return Session(self, n_ctx, kv_dtype)


class Session:
    """One conversation's state: the KV cache and the number of cached positions."""

    def __init__(self, model: Model, n_ctx: int, kv_dtype: type = np.float16) -> None:
        c = model.config
        self.model = model
        self.n_ctx = n_ctx
        shape = (c.n_layers, n_ctx, c.n_head_kv, c.head_dim)
        self.k_cache = np.zeros(shape, dtype=kv_dtype)
        self.v_cache = np.zeros(shape, dtype=kv_dtype)
        self.n_past = 0

    def reset(self) -> None:
        self.n_past = 0

    def truncate(self, n: int) -> None:
        """Forget cached positions from ``n`` on (e.g. to rewind a turn)."""
        self.n_past = max(0, min(self.n_past, n))

    @property
    def kv_bytes(self) -> int:
        return int(self.k_cache.nbytes + self.v_cache.nbytes)

    def _mm(self, w: _Bound, x: np.ndarray) -> np.ndarray:
        y = np.empty((x.shape[0], w.rows), dtype=np.float32)
        rc = lib.qs_matmat(w.type_id, w.ptr, w.rows, w.k, _fp(x), x.shape[0], _fp(y), self.model.threads)
        if rc != 0:
            raise K.KernelError(f"matmul failed ({rc})")
        return y

    def _rmsnorm(self, x: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
        y = np.empty_like(x)
        lib.qs_rmsnorm(_fp(x), _fp(w), _fp(y), x.size // n, n, self.model.config.rms_eps)
        return y

    def forward(self, tokens: list[int] | np.ndarray, all_logits: bool = False) -> np.ndarray:
        """Run ``tokens`` at positions ``n_past…``; returns logits of the last token (or of every token)."""
        m, c = self.model, self.model.config
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        T = ids.size
        if T == 0:
            raise ValueError("forward needs at least one token")
        if self.n_past + T > self.n_ctx:
            raise ContextFull(f"context full: {self.n_past} + {T} tokens > {self.n_ctx}")
        if ids.min() < 0 or ids.max() >= c.n_vocab:
            raise ValueError(f"token ids must lie in 0..{c.n_vocab - 1}")
        pos = np.arange(self.n_past, self.n_past + T, dtype=np.int32)
        x = K.get_rows(m.tok_embd.type, m.tok_embd.data, m.tok_embd.rows, m.tok_embd.k, ids, threads=m.threads)
        if c.embed_scale != 1.0:
            x *= np.float32(c.embed_scale)
        H, KV, hd, E = c.n_head, c.n_head_kv, c.head_dim, c.n_embd
        scale = c.attn_scale or 1.0 / math.sqrt(hd)
        posp = ffi.cast("int32_t *", ffi.from_buffer(pos))
        kv_f16 = int(self.k_cache.dtype == np.float16)
        for li, (lw, lb) in enumerate(zip(m.weights.layers, m.layers, strict=True)):
            h = self._rmsnorm(x, lw.attn_norm, E)
            q = self._mm(lb["wq"], h)
            k = self._mm(lb["wk"], h)
            v = self._mm(lb["wv"], h)
            if lw.bq is not None:
                q += lw.bq
            if lw.bk is not None:
                k += lw.bk
            if lw.bv is not None:
                v += lw.bv
            if lw.q_norm is not None and lw.k_norm is not None:
                q = self._rmsnorm(q, lw.q_norm, hd)
                k = self._rmsnorm(k, lw.k_norm, hd)
            base = c.layer_rope_base(li)
            lib.qs_rope(_fp(q), T, H, hd, c.rope_dim, posp, base, 1.0, int(c.rope_neox))
            lib.qs_rope(_fp(k), T, KV, hd, c.rope_dim, posp, base, 1.0, int(c.rope_neox))
            kc, vc = self.k_cache[li], self.v_cache[li]
            kc[self.n_past : self.n_past + T] = k.reshape(T, KV, hd)
            vc[self.n_past : self.n_past + T] = v.reshape(T, KV, hd)
            att = np.empty((T, H * hd), dtype=np.float32)
            rc = lib.qs_attention(_fp(q), T, posp, H, hd, ffi.from_buffer(kc), ffi.from_buffer(vc), kv_f16, KV,
                                  self.n_past + T, c.layer_window(li), scale, _fp(att), m.threads)
            if rc != 0:
                raise K.KernelError(f"attention failed ({rc})")
            o = self._mm(lb["wo"], att)
            if lw.post_attn_norm is not None:
                o = self._rmsnorm(o, lw.post_attn_norm, E)
            x += o
            h = self._rmsnorm(x, lw.ffn_norm, E)
            g = self._mm(lb["w_gate"], h)
            u = self._mm(lb["w_up"], h)
            if c.gelu:
                lib.qs_geglu_tanh(_fp(g), _fp(u), _fp(g), g.size)
            else:
                lib.qs_swiglu(_fp(g), _fp(u), _fp(g), g.size)
            d = self._mm(lb["w_down"], g)
            if lw.post_ffn_norm is not None:
                d = self._rmsnorm(d, lw.post_ffn_norm, E)
            x += d
        self.n_past += T
        last = x if all_logits else x[-1:]
        last = self._rmsnorm(np.ascontiguousarray(last), m.weights.output_norm, E)
        logits = self._mm(m.output, last)
        return logits if all_logits else logits[0]
