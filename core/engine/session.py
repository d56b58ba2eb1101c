"""Inference session: KV cache and the forward pass (prefill of a batch, decode of one token) on native kernels.

The forward pass reads like the paper (llama2.c style): embed, then per layer RMSNorm -> q/k/v -> RoPE -> attention
over the cache -> output projection -> residual -> RMSNorm -> gated FFN -> residual; final norm; lm_head. Each
layer is one call of the native ``qs_block_forward`` (csrc/qs_block.c) with pointers bound once per session, so
Python only loops over layers; sizes are checked once, when the model loads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..gguf import GGUFFile
from ..model import (
    LayerWeights,
    ModelConfig,
    ModelError,
    ModelWeights,
    Weight,
    bind_weights,
    check_weights,
    read_config,
)
from ..native import ffi, lib, nn
from ..native import kernels as K

#: Positions the native block accepts in one cache (csrc/qs_block.c checks the same bound).
MAX_SESSION_CTX = 1 << 24


class ContextFull(RuntimeError):
    """The KV cache has no room for more tokens."""


@dataclass
class _Bound:
    """A weight with its cffi pointer, validated once."""

    type_id: int
    ptr: object
    rows: int
    k: int
    nbytes: int


#: (key in Model.layers, attribute of LayerWeights) of the matrices of a block (wk/wv absent on gemma4's layers
#: that read an earlier layer's cache; ple_* only with per-layer embeddings).
_LAYER_WEIGHTS = (("wq", "wq"), ("wk", "wk"), ("wv", "wv"), ("wo", "wo"), ("w_gate", "w_gate"), ("w_up", "w_up"),
                  ("w_down", "w_down"), ("ple_gate", "ple_gate"), ("ple_proj", "ple_proj"), ("w_router", "router"))
#: a gated delta-net layer's own matrices (LayerWeights.gdn): key -> GDNWeights field
_GDN_WEIGHTS = (("gdn_z", "z"), ("gdn_beta", "beta"), ("gdn_alpha", "alpha"))
#: qwen35moe's shared expert: key -> LayerWeights field
_SHARED_WEIGHTS = (("wsg", "sh_gate"), ("wsu", "sh_up"), ("wsd", "sh_down"))


def _layer_matrices(lw: LayerWeights) -> list[tuple[str, Weight]]:
    """(key, matrix) of every weight matrix the layer's block reads (V counted once where it is K's projection)."""
    out = [(key, getattr(lw, attr)) for key, attr in _LAYER_WEIGHTS
           if getattr(lw, attr) is not None and not (key == "wv" and lw.wv is lw.wk)]
    if lw.gdn is not None:
        out += [(key, getattr(lw.gdn, attr)) for key, attr in _GDN_WEIGHTS]
    out += [(key, getattr(lw, attr)) for key, attr in _SHARED_WEIGHTS if getattr(lw, attr) is not None]
    return out


#: the matrices that hold every expert's rows back to back in a mixture-of-experts layer
_EXPERT_KEYS = ("w_gate", "w_up", "w_down")


def _bind(w: Weight) -> _Bound:
    if w.k <= 0 or w.k % w.type.block_elems or w.data.size != w.rows * w.type.row_bytes(w.k):
        raise ModelError(f"{w.name}: {w.data.size} bytes for {w.rows}x{w.k} {w.type.name}")
    return _Bound(w.type.id, ffi.cast("uint8_t *", ffi.from_buffer(w.data)), w.rows, w.k, int(w.data.size))


def _fp(a: np.ndarray) -> object:
    return ffi.cast("float *", ffi.from_buffer(a, require_writable=False))


class Model:
    """A loaded model: config, weights bound to the mapped file, ready to create sessions."""

    def __init__(self, f: GGUFFile | None, threads: int = 0, weights: ModelWeights | None = None,
                 tie_output: bool = False) -> None:
        """Bind ``f``'s weights (or take ready ``weights``, e.g. from a bump file). ``tie_output`` uses
        token_embd as the lm_head even when the file has an output.weight (what a bump conversion does)."""
        self.file = f
        if weights is None:
            assert f is not None
            weights = bind_weights(f, read_config(f))
        if tie_output and not weights.tied:
            weights = dataclasses.replace(weights, output=weights.tok_embd, tied=True)
        check_weights(weights)  # every size the native block trusts, against the config
        self.weights: ModelWeights = weights
        self.config: ModelConfig = weights.config
        self.threads = threads or K.default_threads()
        self._keep: list[object] = []
        self.layers: list[dict[str, _Bound]] = []
        for lw in self.weights.layers:
            bound = {key: _bind(w) for key, w in _layer_matrices(lw)}
            if lw.wv is not None and lw.wv is lw.wk:  # V is K's projection (gemma4): one copy, repacked once
                bound["wv"] = bound["wk"]
            self.layers.append(bound)
        self._sessions_made = False
        #: bytes of the weights now held in the repacked layout (see :meth:`repack`)
        self.repacked_bytes = 0
        #: drop the embedding table's file pages after each lookup: true once nothing else reads that mapping
        #: (set by :meth:`repack`); the page cache maps whole large folios, ~1 MB per looked-up row
        self.release_embd_pages = False
        self.tok_embd = self.weights.tok_embd
        self.output = _bind(self.weights.output)
        pm = self.weights.ple_model_proj
        self.ple_model_proj = _bind(pm) if pm is not None else None

    def repack(self, progress: Callable[[float], None] | None = None,
               cancel: Callable[[], bool] | None = None) -> int:
        """Copy every matrix that has a repacked layout into it (anonymous memory, huge pages) and release this
        process's pages of the file's copy; later sessions run the repacked kernels (docs/engine.md#repacked-
        weights). Only when the CPU runs SIMD kernels (AVX2 or AVX-512 VNNI); call before creating sessions.
        ``progress`` gets the fraction of bytes done; ``cancel()`` true stops with
        :class:`~..native.kernels.RepackCancelled` (the model stays usable, partly repacked). Returns the bytes
        repacked."""
        if K.isa() == "scalar" or self._sessions_made:
            return 0
        todo = [(lb, key, w) for lw, lb in zip(self.weights.layers, self.layers, strict=True)
                for key, w in _layer_matrices(lw)]
        todo.append((None, "output", self.weights.output))
        ne = self.config.n_expert
        # an expert matrix repacks as one matrix when each expert's rows are whole row groups (its slice of the
        # repacked copy is then one expert's repacked layout)
        todo = [(lb, key, w) for lb, key, w in todo
                if K.can_repack(w.type, w.rows // ne if ne and key in _EXPERT_KEYS else w.rows, w.k)]
        total = sum(w.data.nbytes for _, _, w in todo) or 1
        done = 0
        for lb, key, w in todo:
            def step(n: int, base: int = done) -> None:
                if progress is not None:
                    progress((base + n) / total)

            rp = K.Repacked(w.type, w.data, w.rows, w.k, threads=self.threads, progress=step, cancel=cancel,
                            release_source=True)
            bound = _Bound(rp.type_id, rp.ptr, rp.rows, rp.k, rp.nbytes)
            self._keep.append(rp)
            if lb is None:
                self.output = bound
            else:
                if key == "wk" and lb.get("wv") is lb["wk"]:
                    lb["wv"] = bound
                lb[key] = bound
            # the file's copy is no longer read (a tied embedding's rows fault back in singly); released chunk by
            # chunk above, so the file's pages and the copy are never both resident
            done += w.data.nbytes
        self.repacked_bytes = done
        self.release_embd_pages = done > 0 and (not self.weights.tied or any(lb is None for lb, _, _ in todo))
        return done

    @classmethod
    def load(cls, path: str, threads: int = 0, tie_output: bool = False) -> Model:
        return cls(GGUFFile(path), threads, tie_output=tie_output)

    @classmethod
    def load_bump(cls, bump_path: str, config_path: str, threads: int = 0) -> Model:
        """Weights from a BUMPWGT3 file and its config.json (C-Kernel-Engine's layout)."""
        from ..model.from_bump import bind_bump

        return cls(None, threads, weights=bind_bump(bump_path, config_path))

    def session(self, n_ctx: int = 2048, kv_dtype: type | str = np.float16, v_type: str | None = None) -> Session:
        """A session of ``n_ctx`` positions; cache types as :class:`Session` takes them."""
        return Session(self, n_ctx, kv_dtype, v_type=v_type)


def _set_weight(d: Any, w: _Bound | None) -> None:
    """A ``qs_weight`` from a bound matrix (None: absent, all zero)."""
    if w is not None:
        d.ptr, d.type, d.bytes, d.rows, d.k = w.ptr, w.type_id, w.nbytes, w.rows, w.k


def _set_vec(d: Any, v: np.ndarray | None) -> None:
    """A ``qs_vec`` from a float32 vector (None: absent)."""
    if v is not None:
        d.ptr, d.len = _fp(v), int(v.size)


def layer_policy(c: ModelConfig, li: int) -> Any:
    """A ``qs_block`` holding layer ``li``'s policy only (what ``c`` decides, no weights): sizes, attention
    window, scale, soft-cap, temperature, KV reuse, V norm and q/k norm span, RoPE (NoPE, base, scaling); what
    :func:`layer_description` starts from and what the GPU backend reads."""
    b = ffi.new("qs_block *")
    hd = c.head_dim_at(li)
    b.n_embd, b.eps, b.residual_scale = c.n_embd, c.rms_eps, c.residual_scale
    a = b.attn
    a.n_head, a.n_head_kv, a.head_dim = c.n_head, c.n_head_kv_at(li), hd
    a.window, a.scale, a.softcap = c.layer_window(li), c.attn_scale or 1.0 / math.sqrt(hd), c.attn_softcap
    a.temp_scale, a.temp_floor = c.attn_temp_scale, c.original_ctx()
    a.kv_reuse, a.v_norm = int(c.kv_source(li) != li), int(c.v_norm)
    a.qk_norm_full, a.non_causal = int(c.qk_norm_full), int(not c.causal)
    r = b.rope
    r.skip, r.dim, r.neox, r.base = int(not c.uses_rope(li)), c.rope_dim_at(li), int(c.rope_neox), \
        c.layer_rope_base(li)
    r.freq_scale, r.ext_factor, r.mscale = c.layer_rope_freq_scale(li), c.rope_ext_factor, c.rope_mscale
    r.corr0, r.corr1 = c.yarn_corr_dims(li)
    return b


def check_attention_layer(c: ModelConfig, layer: int) -> None:
    """Refuse a layer index that is not an attention layer of ``c`` (the probe's attention weights)."""
    if isinstance(layer, bool) or not 0 <= layer < c.n_layers or c.is_recurrent(layer):
        raise ValueError(f"layer {layer} has no attention weights")


def attention_weights(model: Model, layer: int, queries: np.ndarray, positions: np.ndarray, keys: np.ndarray,
                      n_past: int, k_type: str | None = None) -> np.ndarray:
    """Layer ``layer``'s attention weights ``(T, n_head, n_past)`` for ``queries`` at ``positions`` against its
    cached ``keys``, by the native attention's own code with the layer's policy as its description holds it
    (:func:`layer_policy`: scale, window, soft-cap) and its sinks: what every session's ``attention_weights``
    returns, wherever its keys live. ``k_type``: the keys' cache type (None: float32 / float16 by their dtype)."""
    c = model.config
    check_attention_layer(c, layer)
    a = layer_policy(c, layer).attn
    return nn.attention_probs(queries, positions, keys, n_past, scale=float(a.scale), window=int(a.window),
                              softcap=float(a.softcap), sinks=model.weights.layers[layer].sinks,
                              threads=model.threads, k_type=k_type)


def layer_description(c: ModelConfig, li: int, lw: LayerWeights, lb: dict[str, _Bound],
                      rope_factors: np.ndarray | None) -> Any:
    """Layer ``li``'s forward description (a ``qs_block``), without the session's buffers: the weights as
    ``{ptr, type, bytes, rows, k}``, the vectors as ``{ptr, len}``, grouped, and every per-layer policy (window,
    RoPE base, scaling and factors, NoPE, soft-cap, multipliers, V from K, routing, delta-net sizes) decided from
    ``c`` here, so that the native side derives none of them."""
    b = layer_policy(c, li)
    b.out_scale = float(lw.out_scale[0]) if lw.out_scale is not None else 0.0
    for field in ("attn_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm"):
        _set_vec(getattr(b, field), getattr(lw, field))
    _set_vec(b.rope.freqs, None if c.rope_freqs_global_only and c.is_sliding(li) else rope_factors)
    f = b.ffn
    f.n_ff, f.gelu, f.swiglu_oai = c.n_ff_at(li), int(c.gelu), int(c.swiglu_oai)
    _set_weight(f.gate, lb.get("w_gate"))
    _set_weight(f.up, lb.get("w_up"))
    _set_weight(f.down, lb.get("w_down"))
    e = b.moe
    e.n_expert, e.n_used, e.norm, e.scale = c.n_expert, c.n_expert_used, int(c.n_expert > 0), c.expert_weights_scale
    _set_weight(e.router, lb.get("w_router"))
    for field, attr in (("b_router", "b_router"), ("b_gate", "b_gate"), ("b_up", "b_up"), ("b_down", "b_down")):
        _set_vec(getattr(e, field), getattr(lw, attr))
    if lw.sh_gate_inp is not None:
        e.n_ff_shexp = c.n_ff_shexp
        for field, key in (("sh_gate", "wsg"), ("sh_up", "wsu"), ("sh_down", "wsd")):
            _set_weight(getattr(e, field), lb[key])
        _set_vec(e.sh_gate_inp, lw.sh_gate_inp)
    gw = lw.gdn
    if gw is not None:  # a gated delta-net layer: its mixer instead of attention
        g = b.gdn
        g.conv, g.state, g.k_heads, g.v_heads = c.ssm_conv, c.ssm_state, c.ssm_k_heads, c.ssm_v_heads
        _set_weight(g.qkv, lb["wq"])
        _set_weight(g.out, lb["wo"])
        for field in ("z", "beta", "alpha"):
            _set_weight(getattr(g, field), lb[f"gdn_{field}"])
        for field, vec in (("conv_w", gw.conv), ("dt_bias", gw.dt_bias), ("a", gw.a), ("norm", gw.norm)):
            _set_vec(getattr(g, field), vec)
    else:
        a = b.attn
        a.q_gate = int(c.q_gate)
        for field, key in (("wq", "wq"), ("wk", "wk"), ("wv", "wv"), ("wo", "wo")):
            _set_weight(getattr(a, field), lb.get(key))
        for field in ("bq", "bk", "bv", "bo", "q_norm", "k_norm", "sinks"):
            _set_vec(getattr(a, field), getattr(lw, field))
    if c.ple_dim:
        p = b.ple
        p.dim = c.ple_dim
        _set_weight(p.gate, lb.get("ple_gate"))
        _set_weight(p.proj, lb.get("ple_proj"))
        _set_vec(p.post_norm, lw.ple_post_norm)
    return b


def ple_inputs(m: Model, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Gemma 4's per-layer inputs ``[n_layers][T][ple_dim]`` for tokens ``ids`` whose scaled embeddings are ``x``:
    each token's row of per_layer_token_embd times sqrt(ple_dim), plus the scaled embedding projected by
    per_layer_model_proj (times 1/sqrt(n_embd)) and RMS-normalized per layer, the sum times 1/sqrt(2) (llama.cpp's
    project_per_layer_inputs). The CPU session and the CUDA backend both take them from here."""
    c, w = m.config, m.weights
    L, P, T = c.n_layers, c.ple_dim, ids.size
    pm = m.ple_model_proj
    assert w.ple_tok_embd is not None and pm is not None and w.ple_proj_norm is not None
    e = w.ple_tok_embd
    tok = K.get_rows(e.type, e.data, e.rows, e.k, ids, threads=m.threads) * np.float32(math.sqrt(P))
    xa = np.ascontiguousarray(x, dtype=np.float32)
    proj = np.empty((T, pm.rows), dtype=np.float32)
    K.check(lib.qs_matmat(pm.type_id, pm.ptr, pm.rows, pm.k, _fp(xa), T, _fp(proj), m.threads), "matmul")
    proj = np.ascontiguousarray((proj * np.float32(1.0 / math.sqrt(c.n_embd))).reshape(T * L, P))
    norm = np.ascontiguousarray(w.ple_proj_norm, dtype=np.float32)
    if norm.size != P:
        raise ModelError(f"norm of {norm.size} values for rows of {P}")
    normed = np.empty_like(proj)
    lib.qs_rmsnorm(_fp(proj), _fp(norm), _fp(normed), T * L, P, c.rms_eps)
    out = (normed.reshape(T, L * P) + tok) * np.float32(1.0 / math.sqrt(2.0))
    return np.ascontiguousarray(out.reshape(T, L, P).transpose(1, 0, 2))


class ForwardTrace:
    """What :meth:`Session.forward` keeps for the probe (docs/probe.md): ``resid``, the residual stream entering each
    layer and leaving the last (``n_layers + 1`` float32 arrays of ``(T, n_embd)``); ``queries``, each attention
    layer's queries as its attention used them (``(T, n_head, head_dim)``, filled by the native block through its
    ``probe.q`` pointer); ``after_layer(i)`` is called after layer ``i`` (progress; it may raise to stop, and the
    session's recurrent state is then half-updated: reset it, as :func:`~.probe.run_probe`'s throw-away session needs
    not)."""

    def __init__(self, after_layer: Callable[[int], None] | None = None) -> None:
        self.resid: list[np.ndarray] = []
        self.queries: dict[int, np.ndarray] = {}
        self.positions = np.empty(0, np.int32)
        self.after_layer = after_layer


#: activation statistics: key -> the dtype its arrays must have (:meth:`Session.set_activation_stats`)
STATS_KEYS = {"attn": np.float32, "wo": np.float32, "ffn": np.float32, "down": np.float32, "count": np.int64}


def check_activation_stats(stats: list[dict[str, np.ndarray]], n_layers: int) -> None:
    """Refuse statistics that are not one dict per layer of writable contiguous arrays of :data:`STATS_KEYS`'
    types (what both sessions' ``set_activation_stats`` accept)."""
    if len(stats) != n_layers:
        raise ValueError(f"{len(stats)} statistics for {n_layers} layers")
    for li, d in enumerate(stats):
        for key, a in d.items():
            dtype = STATS_KEYS.get(key)
            if dtype is None:
                raise ValueError(f"layer {li}: no statistics are named {key!r}")
            if a.dtype != dtype or not a.flags.c_contiguous or not a.flags.writeable:
                raise ValueError(f"layer {li} {key}: a writable contiguous {np.dtype(dtype)} array is needed")


def head_scales(c: ModelConfig, logits: np.ndarray) -> np.ndarray:
    """The head's last steps on its logits (in place where it can): granite's scale, gemma2's soft-cap."""
    if c.logit_scale != 1.0:  # granite
        logits /= np.float32(c.logit_scale)
    if c.final_softcap:  # gemma2
        cap = np.float32(c.final_softcap)
        logits = np.tanh(logits / cap) * cap
    return logits


@runtime_checkable
class InferenceSession(Protocol):
    """The one session protocol: everything a caller (the chat and the CLI through :class:`~.generate.Engine`,
    perplexity and KL divergence, the importance matrix, the probe) uses of a session, so that each runs on
    either backend without knowing which. The CPU :class:`Session` and the GPU ``cuda_backend.CudaSession``
    both satisfy it (tests/test_session_protocol.py checks the signatures and runs every caller against a
    session that has nothing else). ``Session.forward_from`` (the quantizer's cost model, CPU sessions only) is
    not part of it."""

    n_ctx: int
    n_past: int

    @property
    def kv_bytes(self) -> int: ...

    def reset(self) -> None: ...

    def truncate(self, n: int) -> None: ...

    def checkpoint(self) -> None: ...

    def close(self) -> None: ...

    def forward(self, tokens: list[int] | np.ndarray, all_logits: bool = False, logits: bool = True,
                trace: ForwardTrace | None = None) -> np.ndarray: ...

    def head(self, x: np.ndarray) -> np.ndarray: ...

    def attention_weights(self, layer: int, queries: np.ndarray, positions: np.ndarray) -> np.ndarray: ...

    def set_activation_stats(self, stats: list[dict[str, np.ndarray]] | None) -> None: ...


class Session:
    """One conversation's state: the KV cache and the number of cached positions."""

    def __init__(self, model: Model, n_ctx: int, kv_dtype: type | str = np.float16, first_layer: int = 0,
                 v_type: str | None = None) -> None:
        """``kv_dtype``: the KV cache's type (:data:`~quantscope.core.native.nn.KV_CACHE_TYPES`: ``f16``, ``f32``,
        ``bf16``, ``q8_0``, ``q4_0``, or numpy's float16 / float32), of K, and of V too unless ``v_type`` names
        another (llama.cpp's ``--cache-type-k/-v``). ``first_layer``: the layers before it get no cache or state
        (they run elsewhere: a split session's GPU layers, core/engine/split.py)."""
        c = model.config
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int | np.integer) or not 0 < n_ctx <= MAX_SESSION_CTX:
            raise ValueError(f"context size must be an integer in 1..{MAX_SESSION_CTX}, got {n_ctx!r}")
        k_type = nn.kv_cache_type(kv_dtype)
        v_type = nn.kv_cache_type(v_type) if v_type is not None else k_type
        #: the cache types of K and V (names of :data:`~quantscope.core.native.nn.KV_CACHE_TYPES`)
        self.cache_types = (k_type, v_type)
        for li in range(first_layer, c.n_layers):  # a block type needs head sizes of whole blocks: one line
            if not c.is_recurrent(li):
                for t in self.cache_types:
                    nn.kv_row_bytes(t, c.head_dim_at(li))
        self.model = model
        model._sessions_made = True  # the blocks below hold the weight pointers: no repacking after this
        self.n_ctx = n_ctx = int(n_ctx)
        # one (n_ctx, kv heads, row) cache per layer; a layer that reads an earlier one's (gemma4) shares it
        self.k_cache: list[np.ndarray] = []
        self.v_cache: list[np.ndarray] = []
        # gated delta-net layers (qwen35): a recurrent state instead of a KV cache (a 1-position stand-in there)
        self.conv_state: dict[int, np.ndarray] = {}
        self.ssm_state: dict[int, np.ndarray] = {}
        self._checkpoint: tuple[int, dict[int, np.ndarray], dict[int, np.ndarray]] | None = None
        for li in range(c.n_layers):
            src = c.kv_source(li)
            if li < first_layer or c.is_recurrent(li):
                self.k_cache.append(nn.kv_cache_zeros(k_type, 1, 1, 32))
                self.v_cache.append(nn.kv_cache_zeros(v_type, 1, 1, 32))
                if li >= first_layer:
                    self.conv_state[li] = np.zeros((c.ssm_conv - 1, c.ssm_channels), np.float32)
                    self.ssm_state[li] = np.zeros((c.ssm_v_heads, c.ssm_state, c.ssm_state), np.float32)
                continue
            if src != li:
                self.k_cache.append(self.k_cache[src])
                self.v_cache.append(self.v_cache[src])
                continue
            self.k_cache.append(nn.kv_cache_zeros(k_type, n_ctx, c.n_head_kv_at(li), c.head_dim_at(li)))
            self.v_cache.append(nn.kv_cache_zeros(v_type, n_ctx, c.n_head_kv_at(li), c.head_dim_at(li)))
        self.n_past = 0
        self._block_structs = self._blocks()

    def reset(self) -> None:
        self.n_past = 0
        self._checkpoint = None
        self._zero_state()

    def set_activation_stats(self, stats: list[dict[str, np.ndarray]] | None) -> None:
        """Have every layer add its products' squared inputs into ``stats[layer]`` on prompts (keys ``attn``,
        ``wo``, ``ffn``, ``down``: float32 sums, ``count``: int64 rows per expert; absent keys are not collected),
        or stop (``None``). The arrays must stay alive while set (the session keeps a reference)."""
        if stats is not None:
            check_activation_stats(stats, len(self._block_structs))
        self._stats = stats
        for li, b in enumerate(self._block_structs):
            d = stats[li] if stats is not None else {}
            for key, field, dtype in (("attn", "attn", np.float32), ("wo", "wo", np.float32),
                                      ("ffn", "ffn", np.float32), ("down", "down", np.float32),
                                      ("count", "exp_count", np.int64)):
                a = d.get(key)
                ctype = "int64_t *" if dtype is np.int64 else "float *"
                setattr(b.probe, field, ffi.cast(ctype, ffi.from_buffer(a, require_writable=True)) if a is not None
                        else ffi.NULL)
                setattr(b.probe, field + "_len", 0 if a is None else int(a.size))

    def attention_weights(self, layer: int, queries: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Layer ``layer``'s attention weights ``(T, n_head, n_past)`` for ``queries`` (a :class:`ForwardTrace`'s)
        at ``positions`` against this session's cached keys, by the native attention's own code (0 where a query
        does not see a key)."""
        check_attention_layer(self.model.config, layer)
        return attention_weights(self.model, layer, queries, positions, self.k_cache[layer], self.n_past,
                                 self.cache_types[0])

    def close(self) -> None:
        """Nothing to free early (the caches are host arrays); for the protocol's callers, which close sessions."""

    def _zero_state(self) -> None:
        for a in (*self.conv_state.values(), *self.ssm_state.values()):
            a.fill(0.0)

    @property
    def recurrent(self) -> bool:
        """Has the model recurrent layers, whose state cannot be rewound position by position?"""
        return bool(self.ssm_state)

    def checkpoint(self) -> None:
        """Remember the recurrent state at the current position, so that :meth:`truncate` can return to it (a
        regenerated reply); a no-op for attention-only models, whose cache rewinds to any position."""
        if self.recurrent:
            self._checkpoint = (self.n_past, {i: a.copy() for i, a in self.conv_state.items()},
                                {i: a.copy() for i, a in self.ssm_state.items()})

    def truncate(self, n: int) -> None:
        """Forget cached positions from ``n`` on (e.g. to rewind a turn). A model with recurrent layers keeps
        ``n_past`` only up to its checkpoint (:meth:`checkpoint`) or else starts over: read ``n_past`` after."""
        n = max(0, min(self.n_past, n))
        if not self.recurrent or n == self.n_past:
            self.n_past = n
            return
        ck = self._checkpoint
        if ck is not None and ck[0] <= n:
            for i, a in ck[1].items():
                self.conv_state[i][...] = a
            for i, a in ck[2].items():
                self.ssm_state[i][...] = a
            self.n_past = ck[0]
        else:
            self.reset()

    @property
    def kv_bytes(self) -> int:
        """The KV cache and the recurrent state (what a session holds beyond the weights)."""
        c = self.model.config
        kv = sum(self.k_cache[i].nbytes + self.v_cache[i].nbytes for i in range(c.n_layers)
                 if c.kv_source(i) == i and not c.is_recurrent(i))
        return int(kv + sum(a.nbytes for a in (*self.conv_state.values(), *self.ssm_state.values())))

    def _mm(self, w: _Bound, x: np.ndarray) -> np.ndarray:
        y = np.empty((x.shape[0], w.rows), dtype=np.float32)
        rc = lib.qs_matmat(w.type_id, w.ptr, w.rows, w.k, _fp(x), x.shape[0], _fp(y), self.model.threads)
        K.check(rc, "matmul")
        return y

    def _rmsnorm(self, x: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
        y = np.empty_like(x)
        if w.size != n or x.size % n:
            raise ModelError(f"norm of {w.size} values for rows of {n}")
        lib.qs_rmsnorm(_fp(x), _fp(w), _fp(y), x.size // n, n, self.model.config.rms_eps)
        return y

    def _blocks(self) -> list[object]:
        """One ``qs_block`` per layer: the forward description (csrc/qs_api_nn.h), every per-layer policy decided
        here once (:func:`layer_description`) plus this session's cache and state buffers."""
        m = self.model
        blocks = []
        k_type, v_type = (nn.KV_CACHE_TYPES[t] for t in self.cache_types)
        rope_factors = m.weights.rope_factors(self.n_ctx)
        for li, (lw, lb) in enumerate(zip(m.weights.layers, m.layers, strict=True)):
            b = layer_description(m.config, li, lw, lb, rope_factors)
            a = b.attn
            a.k_type, a.v_type, a.n_ctx = k_type, v_type, self.n_ctx
            a.k_cache, a.v_cache = ffi.from_buffer(self.k_cache[li]), ffi.from_buffer(self.v_cache[li])
            a.k_cache_bytes, a.v_cache_bytes = self.k_cache[li].nbytes, self.v_cache[li].nbytes
            if lw.gdn is not None and li in self.conv_state:  # (a layer before first_layer has no state here)
                g = b.gdn
                g.conv_state = _fp(self.conv_state[li]) if self.conv_state[li].size else ffi.NULL
                g.conv_state_len = int(self.conv_state[li].size)
                g.ssm_state, g.ssm_state_len = _fp(self.ssm_state[li]), int(self.ssm_state[li].size)
            blocks.append(b)
        return blocks

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        """The token embeddings of ``ids``; with the model's ``release_embd_pages``, eight rows at a time with the
        table's file pages dropped after each (a prompt's lookups never pile up in RSS)."""
        e = self.model.tok_embd
        threads = self.model.threads
        if not self.model.release_embd_pages:
            return K.get_rows(e.type, e.data, e.rows, e.k, ids, threads=threads)
        x = np.empty((ids.size, e.k), np.float32)
        for i in range(0, ids.size, 8):
            x[i : i + 8] = K.get_rows(e.type, e.data, e.rows, e.k, ids[i : i + 8], threads=threads)
            K.drop_pages(e.data)
        return x

    def _ple_inputs(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        return ple_inputs(self.model, ids, x)

    def forward(self, tokens: list[int] | np.ndarray, all_logits: bool = False, logits: bool = True,
                trace: ForwardTrace | None = None) -> np.ndarray:
        """Run ``tokens`` at positions ``n_past…``; returns logits of the last token (or of every token), or an
        empty array with ``logits=False`` (a prompt chunk whose only product is the KV cache). ``trace``: keep the
        residual stream and the queries of this call (:class:`ForwardTrace`; off, nothing is copied)."""
        x = self._layers(tokens, trace)
        if not logits:
            return np.empty(0, np.float32)
        logits = self.head(x if all_logits else x[-1:])
        return logits if all_logits else logits[0]

    def final_rows(self, tokens: list[int] | np.ndarray) -> np.ndarray:
        """Run ``tokens`` at positions ``n_past…`` and return every row after the final norm ([tokens, n_embd]):
        what an embedding model pools (core/engine/encoder.py)."""
        x = self._layers(tokens, None)
        return self._rmsnorm(x, self.model.weights.output_norm, self.model.config.n_embd)

    def _layers(self, tokens: list[int] | np.ndarray, trace: ForwardTrace | None) -> np.ndarray:
        """:meth:`forward` up to the head: the residual stream leaving the last layer."""
        m, c = self.model, self.model.config
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        T = ids.size
        if T == 0:
            raise ValueError("forward needs at least one token")
        if self.n_past + T > self.n_ctx:
            raise ContextFull(f"context full: {self.n_past} + {T} tokens > {self.n_ctx}")
        if ids.min() < 0 or ids.max() >= c.n_vocab:
            raise ValueError(f"token ids must lie in 0..{c.n_vocab - 1}")
        if self.n_past == 0 and self.recurrent:
            self._zero_state()
        pos = np.arange(self.n_past, self.n_past + T, dtype=np.int32)
        x = self._embed(ids)
        if c.embed_scale != 1.0:
            x *= np.float32(c.embed_scale)
        ple = self._ple_inputs(ids, x) if c.ple_dim else None
        xp = ffi.cast("float *", ffi.from_buffer(x))
        posp = ffi.cast("int32_t *", ffi.from_buffer(pos))
        if trace is not None:
            trace.resid, trace.queries, trace.positions = [x.copy()], {}, pos.copy()
        for li, b in enumerate(self._block_structs):
            if ple is not None:
                b.ple.inputs, b.ple.inputs_len = _fp(ple[li]), ple[li].size
            if trace is None:
                rc = lib.qs_block_forward(b, xp, T, posp, self.n_past, m.threads)
                K.check(rc, "transformer block")
                continue
            q = None if c.is_recurrent(li) else np.empty((T, c.n_head, c.head_dim_at(li)), np.float32)
            if q is not None:
                b.probe.q, b.probe.q_len = _fp(q), q.size
            try:
                rc = lib.qs_block_forward(b, xp, T, posp, self.n_past, m.threads)
            finally:
                b.probe.q, b.probe.q_len = ffi.NULL, 0
            K.check(rc, "transformer block")
            trace.resid.append(x.copy())
            if q is not None:
                trace.queries[li] = q
            if trace.after_layer is not None:
                trace.after_layer(li)
        self.n_past += T
        return x

    def forward_from(self, x: np.ndarray, first_layer: int) -> np.ndarray:
        """Logits of every row of ``x``, the residual stream entering layer ``first_layer`` at positions 0..T-1 (a
        :class:`ForwardTrace`'s ``resid[first_layer]``), without running the layers before it: what one layer's
        changed weights do to a prompt (the quantizer's cost model). Starts from an empty cache; a model whose
        layers read another layer's cache or per-layer embeddings is refused."""
        m, c = self.model, self.model.config
        if c.ple_dim or any(c.kv_source(i) != i for i in range(c.n_layers)):
            raise ValueError("this model's layers read state from earlier layers: run the whole forward pass")
        if isinstance(first_layer, bool) or not 0 <= first_layer <= c.n_layers:
            raise ValueError(f"first layer {first_layer!r} is outside 0..{c.n_layers}")
        x = np.array(x, dtype=np.float32, order="C")  # a copy: the blocks update it in place
        if x.ndim != 2 or x.shape[1] != c.n_embd or not 0 < x.shape[0] <= self.n_ctx:
            raise ValueError(f"rows of {c.n_embd} values, 1..{self.n_ctx} of them, are needed, not {x.shape}")
        self.reset()
        T = x.shape[0]
        pos = np.arange(T, dtype=np.int32)
        xp = ffi.cast("float *", ffi.from_buffer(x))
        posp = ffi.cast("int32_t *", ffi.from_buffer(pos))
        for li in range(first_layer, c.n_layers):
            K.check(lib.qs_block_forward(self._block_structs[li], xp, T, posp, 0, m.threads), "transformer block")
        self.n_past = T
        return self.head(x)

    def head(self, x: np.ndarray) -> np.ndarray:
        """Logits of residual-stream rows ``x`` (n, n_embd): the final norm, the output head, granite's scale and
        gemma2's soft-cap (what :meth:`forward` does after the last layer; the probe's logit lens)."""
        m, c = self.model, self.model.config
        if x.ndim != 2 or x.shape[1] != c.n_embd:
            raise ValueError(f"rows of {c.n_embd} values are needed, not {x.shape}")
        h = self._rmsnorm(np.ascontiguousarray(x, dtype=np.float32), m.weights.output_norm, c.n_embd)
        return head_scales(c, self._mm(m.output, h))
