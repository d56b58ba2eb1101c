"""A slow, plain numpy (float64) forward pass over dequantized weights: the oracle for the native engine.

It shares nothing with the native path but the config and the reference dequantizer: RMSNorm, RoPE (both
pairings), GQA attention with causal and sliding-window masks, the gated FFNs and the experts' routing are written
out here directly.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..model import LayerWeights, ModelConfig, ModelWeights, Weight, check_weights
from ..quant import dequantize


def _dense(w: Weight) -> np.ndarray:
    return dequantize(w.data.reshape(w.rows, -1), w.type).astype(np.float64)


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, pos: np.ndarray, base: float, dim: int, neox: bool,
          factors: np.ndarray | None = None, freq_scale: float = 1.0, ext: float = 0.0,
          corr: tuple[float, float] = (0.0, 0.0), mscale: float = 1.0) -> np.ndarray:
    out = x.copy()
    half = dim // 2
    inv = base ** (-2.0 * np.arange(half) / dim)
    if factors is not None:
        inv = inv / factors.astype(np.float64)
    extrap = pos[:, None] * inv[None, :]  # (T, half)
    ang = freq_scale * extrap
    if ext:  # YaRN: the unscaled angle mixed back in below the correction dimensions, and a magnitude factor
        ramp = 1.0 - np.clip((np.arange(half) - corr[0]) / max(0.001, corr[1] - corr[0]), 0.0, 1.0)
        mix = ramp * ext
        ang = ang * (1.0 - mix) + extrap * mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    cos, sin = np.cos(ang)[:, None, :] * mscale, np.sin(ang)[:, None, :] * mscale
    a = np.arange(half) if neox else 2 * np.arange(half)
    b = a + half if neox else a + 1
    x0, x1 = x[:, :, a], x[:, :, b]
    out[:, :, a] = x0 * cos - x1 * sin
    out[:, :, b] = x0 * sin + x1 * cos
    return out


def _moe(cfg: ModelConfig, lw: LayerWeights, h: np.ndarray) -> np.ndarray:
    """The mixture-of-experts FFN (llama.cpp's build_moe_ffn): per token the n_expert_used most probable experts
    (earlier index first on ties), their probabilities normalized to sum 1 and scaled; gpt-oss's router and experts
    have biases and its SwiGLU is clamped."""
    assert lw.router is not None
    NE, F, E = cfg.n_expert, cfg.n_ff, cfg.n_embd
    logits = h @ _dense(lw.router).T
    if lw.b_router is not None:
        logits = logits + lw.b_router
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    gate = _dense(lw.w_gate).reshape(NE, F, E)
    up = _dense(lw.w_up).reshape(NE, F, E)
    down = _dense(lw.w_down).reshape(NE, E, F)
    zero_f, zero_e = np.zeros((NE, F)), np.zeros((NE, E))
    bg = zero_f if lw.b_gate is None else lw.b_gate.reshape(NE, F)
    bu = zero_f if lw.b_up is None else lw.b_up.reshape(NE, F)
    bd = zero_e if lw.b_down is None else lw.b_down.reshape(NE, E)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        sel = np.argsort(-p[t], kind="stable")[: cfg.n_expert_used]
        wts = p[t, sel] / max(p[t, sel].sum(), 6.103515625e-5)  # (= gpt-oss's softmax over the picked logits)
        if cfg.expert_weights_scale:
            wts = wts * cfg.expert_weights_scale
        for e, wt in zip(sel, wts, strict=True):
            g, u = gate[e] @ h[t] + bg[e], up[e] @ h[t] + bu[e]
            if cfg.swiglu_oai:
                g, u = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
                a = g / (1 + np.exp(-1.702 * g)) * (u + 1.0)
            else:
                a = g / (1 + np.exp(-g)) * u
            out[t] += wt * (down[e] @ a + bd[e])
    return out


def _uncovered(cfg: ModelConfig, w: ModelWeights) -> tuple[tuple[str, bool], ...]:
    """The forward-pass features this reference does not compute, each with whether ``cfg``/``w`` has it."""
    return (("per-layer shapes", bool(cfg.layer_n_head_kv or cfg.layer_n_ff or cfg.layer_head_dim
                                      or cfg.layer_rope_dim)),
            ("delta-net layers", any(map(cfg.is_recurrent, range(cfg.n_layers)))),
            ("per-layer embeddings", cfg.ple_dim > 0), ("V RMSNorm", cfg.v_norm),
            ("shared KV caches", cfg.kv_from_start > 0),
            ("RoPE factors on global layers only", cfg.rope_freqs_global_only),
            ("gated attention output", cfg.q_gate), ("a shared expert", cfg.n_ff_shexp > 0),
            ("layer output scales", any(lw.out_scale is not None for lw in w.layers)))


def reference_logits(cfg: ModelConfig, w: ModelWeights, tokens: list[int], n_ctx: int = 0,
                     trace: dict[str, list[np.ndarray]] | None = None) -> np.ndarray:
    """Logits (T, n_vocab) for ``tokens`` at positions 0..T-1, in float64. ``cfg`` and ``w`` are checked first
    (:func:`~quantscope.core.model.check_weights`), as the native engine checks them. ``n_ctx``: the context of
    the session to imitate (it picks Phi-3's long or short RoPE factors; 0: the short ones). ``trace``: a dict that
    receives what the probe shows (docs/probe.md): ``resid``, the residual stream (T, n_embd) entering each layer
    and leaving the last (n_layers + 1 arrays), and ``attn``, each layer's attention weights (T, n_head, T), NaN
    where a query does not see a key (the future, or outside a sliding window)."""
    check_weights(dataclasses.replace(w, config=cfg))
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if ids.size == 0 or ids.min() < 0 or ids.max() >= w.tok_embd.rows:
        raise ValueError(f"token ids must be given and lie in 0..{w.tok_embd.rows - 1}")
    lacking = [name for name, present in _uncovered(cfg, w) if present]
    if lacking:
        raise ValueError(f"the float64 reference covers uniform layers without {cfg.arch}'s extras "
                         f"({', '.join(lacking)}); llama.cpp's log-probabilities are the oracle there "
                         "(tests/test_arch_fidelity.py)")
    T = ids.size
    pos = np.arange(T, dtype=np.float64)
    emb = dequantize(w.tok_embd.data.reshape(w.tok_embd.rows, -1)[ids], w.tok_embd.type).astype(np.float64)
    x = emb * cfg.embed_scale
    H, KV, hd = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    scale = cfg.attn_scale or 1.0 / math.sqrt(hd)
    if trace is not None:
        trace["resid"], trace["attn"] = [x.copy()], []
    for li, lw in enumerate(w.layers):
        h = _rms(x, lw.attn_norm, cfg.rms_eps) if lw.attn_norm is not None else x
        q = h @ _dense(lw.wq).T
        k = h @ _dense(lw.wk).T
        v = h @ _dense(lw.wv).T
        if lw.bq is not None:
            q, k, v = q + lw.bq, k + lw.bk, v + lw.bv
        if lw.q_norm is not None and cfg.qk_norm_full:  # olmo2: over the whole projection
            q, k = _rms(q, lw.q_norm, cfg.rms_eps), _rms(k, lw.k_norm, cfg.rms_eps)
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        if lw.q_norm is not None and not cfg.qk_norm_full:
            q, k = _rms(q, lw.q_norm, cfg.rms_eps), _rms(k, lw.k_norm, cfg.rms_eps)
        base = cfg.layer_rope_base(li)
        if cfg.uses_rope(li):
            args = (w.rope_factors(n_ctx), cfg.layer_rope_freq_scale(li), cfg.rope_ext_factor,
                    cfg.yarn_corr_dims(li), cfg.rope_mscale)
            q = _rope(q, pos, base, cfg.rope_dim, cfg.rope_neox, *args)
            k = _rope(k, pos, base, cfg.rope_dim, cfg.rope_neox, *args)
        if cfg.attn_temp_scale:
            q = q * (np.log(np.floor(pos / cfg.original_ctx()) + 1.0) * cfg.attn_temp_scale + 1.0)[:, None, None]
        window = cfg.layer_window(li)
        att = np.zeros((T, H, hd))
        weights = np.full((T, H, T), np.nan)
        group = H // KV
        for t in range(T):
            lo = max(0, t - window + 1) if window > 0 else 0
            for hh in range(H):
                kk, vv = k[lo : t + 1, hh // group], v[lo : t + 1, hh // group]
                s = kk @ q[t, hh] * scale
                if cfg.attn_softcap:
                    s = cfg.attn_softcap * np.tanh(s / cfg.attn_softcap)
                m = s.max() if lw.sinks is None else max(s.max(), float(lw.sinks[hh]))
                p = np.exp(s - m)
                den = p.sum() + (0.0 if lw.sinks is None else math.exp(float(lw.sinks[hh]) - m))  # gpt-oss's sink
                weights[t, hh, lo : t + 1] = p / den
                att[t, hh] = (p / den) @ vv
        o = att.reshape(T, H * hd) @ _dense(lw.wo).T
        if lw.bo is not None:
            o = o + lw.bo
        if lw.post_attn_norm is not None:
            o = _rms(o, lw.post_attn_norm, cfg.rms_eps)
        x = x + o * cfg.residual_scale
        h = _rms(x, lw.ffn_norm, cfg.rms_eps) if lw.ffn_norm is not None else x
        if cfg.n_expert:
            d = _moe(cfg, lw, h)
        else:
            g, u = h @ _dense(lw.w_gate).T, h @ _dense(lw.w_up).T
            if cfg.gelu:
                a = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3))) * u
            else:
                a = g / (1 + np.exp(-g)) * u
            d = a @ _dense(lw.w_down).T
        if lw.post_ffn_norm is not None:
            d = _rms(d, lw.post_ffn_norm, cfg.rms_eps)
        x = x + d * cfg.residual_scale
        if trace is not None:
            trace["resid"].append(x.copy())
            trace["attn"].append(weights)
    x = _rms(x, w.output_norm, cfg.rms_eps)
    logits = x @ _dense(w.output).T / cfg.logit_scale
    if cfg.final_softcap:
        logits = cfg.final_softcap * np.tanh(logits / cfg.final_softcap)
    return logits
