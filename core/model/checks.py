"""Every hyperparameter and every bound tensor checked before anything reaches native code: ranges, agreement
between fields, shapes, lengths and types; errors name the GGUF key that disagrees."""

from __future__ import annotations

import math

import numpy as np

from ..base.ggml_types import GGMLType
from .arch import SUPPORTED_ARCHS
from .config import (
    MAX_CTX,
    MAX_EMBD,
    MAX_EXPERTS,
    MAX_FF,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_VOCAB,
    ModelConfig,
    ModelError,
    UnsupportedModel,
    gguf_keys,
)
from .weights import LayerWeights, ModelWeights, Weight


def check_config(cfg: ModelConfig, keys: dict[str, str] | None = None) -> None:
    """Every hyperparameter in range and consistent with the others; :class:`ModelError` naming the key."""
    k = keys or gguf_keys(cfg.arch)
    if cfg.arch not in SUPPORTED_ARCHS:
        raise UnsupportedModel(f"architecture {cfg.arch!r} is not supported by the engine")
    limits = {"n_layers": MAX_LAYERS, "n_embd": MAX_EMBD, "n_head": MAX_HEADS, "n_head_kv": MAX_HEADS,
              "head_dim": MAX_HEAD_DIM, "n_ff": MAX_FF, "n_vocab": MAX_VOCAB, "n_ctx_train": MAX_CTX,
              "rope_dim": MAX_HEAD_DIM}
    for name, hi in limits.items():
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= hi:
            raise ModelError(f"{k[name]}: expected an integer in 1..{hi}, found {v!r}")
    for name in ("rms_eps", "rope_base", "rope_base_swa"):
        v = getattr(cfg, name)
        hi = 1.0 if name == "rms_eps" else 1e30
        if not (isinstance(v, int | float) and math.isfinite(v) and 0.0 < v <= hi):
            raise ModelError(f"{k[name]}: expected a finite number in (0, {hi:g}], found {v!r}")
    if cfg.n_head % cfg.n_head_kv:
        raise ModelError(f"{k['n_head_kv']}: expected a divisor of {k['n_head']} = {cfg.n_head}, "
                         f"found {cfg.n_head_kv}")
    if cfg.head_dim % 2:
        raise ModelError(f"{k['head_dim']}: expected an even head dimension, found {cfg.head_dim}")
    if cfg.rope_dim % 2 or cfg.rope_dim > cfg.head_dim:
        raise ModelError(f"{k['rope_dim']}: expected an even number at most the head dimension {cfg.head_dim} "
                         f"({k['head_dim']}), found {cfg.rope_dim}")
    if cfg.n_head * cfg.head_dim > MAX_FF:
        raise ModelError(f"{k['n_head']}: {cfg.n_head} heads of {cfg.head_dim} exceed {MAX_FF} values")
    if not 0 <= cfg.sliding_window <= MAX_CTX or not 0 <= cfg.swa_pattern <= MAX_LAYERS:
        raise ModelError(f"{k.get('sliding_window', 'sliding_window')}: expected 0..{MAX_CTX}, "
                         f"found {cfg.sliding_window}")
    for name in ("residual_scale", "logit_scale", "rope_mscale", "rope_freq_scale", "rope_beta_fast",
                 "rope_beta_slow"):
        v = getattr(cfg, name)
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise ModelError(f"{cfg.arch} {name.replace('_', ' ')}: expected a finite number > 0, found {v!r}")
    if cfg.attn_temp_scale and not cfg.original_ctx():
        raise ModelError(f"{cfg.arch}.attention.temperature_scale needs a positive original context length")
    for name in ("attn_softcap", "final_softcap", "attn_temp_scale", "rope_ext_factor"):
        v = getattr(cfg, name)
        if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
            raise ModelError(f"{cfg.arch} {name.replace('_', ' ')}: expected a finite number >= 0, found {v!r}")
    if not 0 <= cfg.rope_orig_ctx <= MAX_CTX:
        raise ModelError(f"{cfg.arch}.rope.scaling.original_context_length: expected 0..{MAX_CTX}, "
                         f"found {cfg.rope_orig_ctx}")
    if not 0 <= cfg.no_rope_step <= MAX_LAYERS:
        raise ModelError(f"no-RoPE layer step: expected 0..{MAX_LAYERS}, found {cfg.no_rope_step}")
    if not (math.isfinite(cfg.embed_scale) and math.isfinite(cfg.attn_scale) and cfg.attn_scale >= 0):
        raise ModelError(f"{k['n_embd']}: derived scales are not finite")
    if isinstance(cfg.n_expert, bool) or not isinstance(cfg.n_expert, int) or not 0 <= cfg.n_expert <= MAX_EXPERTS:
        raise ModelError(f"{k['n_expert']}: expected an integer in 0..{MAX_EXPERTS}, found {cfg.n_expert!r}")
    if cfg.n_expert:
        if isinstance(cfg.n_expert_used, bool) or not isinstance(cfg.n_expert_used, int) \
                or not 1 <= cfg.n_expert_used <= cfg.n_expert:
            raise ModelError(f"{k['n_expert_used']}: expected an integer in 1..{cfg.n_expert} ({k['n_expert']}), "
                             f"found {cfg.n_expert_used!r}")
        v = cfg.expert_weights_scale
        if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
            raise ModelError(f"{cfg.arch}.expert_weights_scale: expected a finite number >= 0, found {v!r}")
        if cfg.gelu:
            raise UnsupportedModel(f"{cfg.arch}: experts with a GELU FFN are not supported by the engine")
    _check_layers(cfg, k)
    _check_recurrent(cfg)
    _check_shared_expert(cfg)


def _check_shared_expert(cfg: ModelConfig) -> None:
    v = cfg.n_ff_shexp
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_FF or (v and not cfg.n_expert):
        raise ModelError(f"{cfg.arch}.expert_shared_feed_forward_length: expected 0..{MAX_FF} with experts, "
                         f"found {v!r}")


def _check_recurrent(cfg: ModelConfig) -> None:
    """The gated delta-net hyperparameters (qwen35), each in range and against the others."""
    a = cfg.arch
    if not cfg.recurrent_layers:
        if cfg.ssm_conv or cfg.ssm_state or cfg.ssm_k_heads or cfg.ssm_v_heads:
            raise ModelError(f"{a}: delta-net sizes given without recurrent layers")
        return
    if len(cfg.recurrent_layers) != cfg.n_layers:
        raise ModelError(f"{a}.full_attention_interval: expected {cfg.n_layers} layer kinds, "
                         f"found {len(cfg.recurrent_layers)}")
    for name, key, hi in (("ssm_conv", "ssm.conv_kernel", 64), ("ssm_state", "ssm.state_size", MAX_HEAD_DIM),
                          ("ssm_k_heads", "ssm.group_count", MAX_HEADS),
                          ("ssm_v_heads", "ssm.time_step_rank", MAX_HEADS)):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= hi:
            raise ModelError(f"{a}.{key}: expected an integer in 1..{hi}, found {v!r}")
    if cfg.ssm_v_heads % cfg.ssm_k_heads:
        raise ModelError(f"{a}.ssm.group_count: expected a divisor of {a}.ssm.time_step_rank = {cfg.ssm_v_heads}, "
                         f"found {cfg.ssm_k_heads}")
    if cfg.ssm_channels > MAX_FF:
        raise ModelError(f"{a}.ssm.*: {cfg.ssm_channels} conv channels exceed {MAX_FF}")


def _check_layers(cfg: ModelConfig, k: dict[str, str]) -> None:
    """The per-layer shapes (gemma4), the sliding-layer list and the KV sharing, each against the others."""
    L = cfg.n_layers
    for name in ("layer_n_head_kv", "layer_head_dim", "layer_n_ff", "layer_rope_dim", "swa_layers"):
        v = getattr(cfg, name)
        if v and len(v) != L:
            raise ModelError(f"{k.get(name, name)}: expected {L} values (one per layer), found {len(v)}")
    for i in range(L):
        kv, hd, ff, rd = cfg.n_head_kv_at(i), cfg.head_dim_at(i), cfg.n_ff_at(i), cfg.rope_dim_at(i)
        for name, v, hi in (("n_head_kv", kv, MAX_HEADS), ("head_dim", hd, MAX_HEAD_DIM), ("n_ff", ff, MAX_FF),
                            ("rope_dim", rd, MAX_HEAD_DIM)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= hi:
                raise ModelError(f"{k.get('layer_' + name, k[name])}: expected an integer in 1..{hi} for layer {i}, "
                                 f"found {v!r}")
        if cfg.n_head % kv:
            raise ModelError(f"{k.get('layer_n_head_kv', k['n_head_kv'])}: expected a divisor of {k['n_head']} = "
                             f"{cfg.n_head} for layer {i}, found {kv}")
        if hd % 2 or rd % 2 or rd > hd:
            raise ModelError(f"{k.get('layer_rope_dim', k['rope_dim'])}: expected an even number at most the head "
                             f"dimension {hd} for layer {i}, found {rd}")
        if cfg.n_head * hd > MAX_FF:
            raise ModelError(f"{k['n_head']}: {cfg.n_head} heads of {hd} exceed {MAX_FF} values (layer {i})")
    if not 0 <= cfg.ple_dim <= MAX_EMBD:
        raise ModelError(f"{k.get('ple_dim', 'ple_dim')}: expected 0..{MAX_EMBD}, found {cfg.ple_dim}")
    if cfg.kv_from_start:
        if not 2 <= cfg.kv_from_start <= L:
            raise ModelError(f"{k.get('kv_from_start', 'kv_from_start')}: expected the layers with their own KV "
                             f"cache to number 2..{L}, found {cfg.kv_from_start}")
        for i in range(cfg.kv_from_start, L):
            j = cfg.kv_source(i)
            if (cfg.is_sliding(j) != cfg.is_sliding(i) or cfg.head_dim_at(j) != cfg.head_dim_at(i)
                    or cfg.n_head_kv_at(j) != cfg.n_head_kv_at(i)):
                raise ModelError(f"{k.get('kv_from_start', 'kv_from_start')}: layer {i} would read layer {j}'s KV "
                                 "cache, which has another kind or shape")



def _check_recurrent_layer(c: ModelConfig, i: int, lw: LayerWeights, k: dict[str, str]) -> None:
    """A gated delta-net layer's matrices and vectors against the delta-net sizes (the FFN is checked as usual)."""
    b, a, E = f"blk.{i}.", c.arch, c.n_embd
    g = lw.gdn
    if g is None or lw.wk is not None or lw.wv is not None:
        raise ModelError(f"{b}: expected a gated delta-net layer ({a}.full_attention_interval), found attention")
    S, Hv, C = c.ssm_state, c.ssm_v_heads, c.ssm_channels
    sizes = f"{a}.ssm.state_size = {S}, ssm.group_count = {c.ssm_k_heads}, ssm.time_step_rank = {Hv}"
    _check_matrix(lw.wq, C, E, sizes, k["n_embd"])
    _check_matrix(lw.wo, E, Hv * S, k["n_embd"], sizes)
    _check_matrix(g.z, Hv * S, E, sizes, k["n_embd"])
    _check_matrix(g.beta, Hv, E, f"{a}.ssm.time_step_rank", k["n_embd"])
    _check_matrix(g.alpha, Hv, E, f"{a}.ssm.time_step_rank", k["n_embd"])
    _check_vector(b + "ssm_conv1d.weight", g.conv, C * c.ssm_conv, f"{a}.ssm.conv_kernel x channels ({sizes})")
    _check_vector(b + "ssm_dt.bias", g.dt_bias, Hv, f"{a}.ssm.time_step_rank")
    _check_vector(b + "ssm_a", g.a, Hv, f"{a}.ssm.time_step_rank")
    _check_vector(b + "ssm_norm.weight", g.norm, S, f"{a}.ssm.state_size")
    for name, v in (("ssm_conv1d.weight", g.conv), ("ssm_dt.bias", g.dt_bias), ("ssm_a", g.a),
                    ("ssm_norm.weight", g.norm)):
        if not np.isfinite(v).all():
            raise ModelError(f"{b}{name}: expected finite values")
    extra = [n for n, v in (("attn_q/k/v.bias", lw.bq), ("attn_q_norm", lw.q_norm), ("attn_k_norm", lw.k_norm),
                            ("attn_output.bias", lw.bo), ("attn_sinks", lw.sinks))
             if v is not None]
    if extra:
        raise ModelError(f"{b}{extra[0]}: not part of a gated delta-net layer")


def _native_kernel(t: GGMLType) -> bool:
    from ..native import lib

    return bool(lib.qs_can_dequantize(t.id))


def _check_matrix(w: Weight, rows: int, k: int, rows_from: str, k_from: str) -> None:
    if not _native_kernel(w.type):
        raise UnsupportedModel(f"{w.name} is {w.type.name}: the engine has no kernel for it")
    if (w.rows, w.k) != (rows, k):
        which = rows_from if w.rows != rows else k_from
        raise ModelError(f"{which}: expected {w.name} to be {rows} x {k} (rows x row length), found "
                         f"{w.rows} x {w.k}")
    if w.data.dtype != np.uint8 or w.data.ndim != 1 or not w.data.flags.c_contiguous:
        raise ModelError(f"{w.name}: expected contiguous raw bytes, found a {w.data.dtype} array of {w.data.shape}")
    if w.k % w.type.block_elems or w.data.size != w.rows * w.type.row_bytes(w.k):
        raise ModelError(f"{w.name}: expected {w.rows} rows of {w.k} {w.type.name} values in whole blocks of "
                         f"{w.type.block_elems}, found {w.data.size} bytes")


def _check_vector(name: str, v: np.ndarray | None, n: int, n_from: str, required: bool = True) -> None:
    if v is None:
        if required:
            raise ModelError(f"{name}: expected a vector of {n} values, found none")
        return
    if v.dtype != np.float32 or v.ndim != 1 or not v.flags.c_contiguous:
        raise ModelError(f"{name}: expected a contiguous float32 vector, found a {v.dtype} array of {v.shape}")
    if v.size != n:
        raise ModelError(f"{n_from}: expected {name} to hold {n} values, found {v.size}")


def check_weights(w: ModelWeights, keys: dict[str, str] | None = None) -> None:
    """Every matrix's shape and type and every vector's length against the (checked) config, so that nothing the
    native block is given can be indexed out of bounds; :class:`ModelError` names the key that disagrees."""
    c = w.config
    k = keys or gguf_keys(c.arch)
    check_config(c, k)
    E, H = c.n_embd, c.n_head
    if len(w.layers) != c.n_layers:
        raise ModelError(f"{k['n_layers']}: expected {len(w.layers)} (the layers bound), found {c.n_layers}")
    _check_matrix(w.tok_embd, c.n_vocab, E, k["n_vocab"], k["n_embd"])
    _check_matrix(w.output, c.n_vocab, E, k["n_vocab"], k["n_embd"])
    _check_vector("output_norm.weight", w.output_norm, E, k["n_embd"])
    if (w.rope_long is None) != (w.rope_short is None):
        raise ModelError("rope_factors_long/rope_factors_short.weight: expected both or neither, found one")
    # rope_freqs: rope_dim/2 divisors (gemma4: of its global layers, whose rotated size is rope_dim too)
    for name, v in (("rope_freqs", w.rope_freqs), ("rope_factors_long", w.rope_long),
                    ("rope_factors_short", w.rope_short)):
        _check_vector(f"{name}.weight", v, c.rope_dim // 2, k["rope_dim"] + " / 2", False)
        if v is not None and not (np.isfinite(v).all() and (v > 0).all()):
            raise ModelError(f"{name}.weight: expected finite positive frequency factors")
    P = c.ple_dim
    if P:
        _check_matrix(w.ple_tok_embd, c.n_vocab, c.n_layers * P, k["n_vocab"],  # type: ignore[arg-type]
                      f"{k['n_layers']} x {k['ple_dim']}")
        _check_matrix(w.ple_model_proj, c.n_layers * P, E, f"{k['n_layers']} x {k['ple_dim']}",  # type: ignore[arg-type]
                      k["n_embd"])
        _check_vector("per_layer_proj_norm.weight", w.ple_proj_norm, P, k["ple_dim"])
    elif w.ple_tok_embd is not None or w.ple_model_proj is not None:
        raise ModelError(f"{k['ple_dim']}: 0, but the file has per-layer token embeddings")
    for i, lw in enumerate(w.layers):
        b = f"blk.{i}."
        KV, hd, F = c.n_head_kv_at(i), c.head_dim_at(i), c.n_ff_at(i)
        heads = kv_heads = f"{k['n_head']} = {H}, {k['n_head_kv']} = {KV}, head dimension {k['head_dim']} = {hd}"
        if c.is_recurrent(i):
            _check_recurrent_layer(c, i, lw, k)
        elif lw.gdn is not None:
            raise ModelError(f"{b}: delta-net tensors bound to an attention layer")
        else:
            _check_matrix(lw.wq, (2 if c.q_gate else 1) * H * hd, E, heads + (" (query and gate)" if c.q_gate else ""),
                          k["n_embd"])
        if c.is_recurrent(i):
            pass
        elif (lw.wk is None) != (c.kv_source(i) != i) or (lw.wv is None) != (lw.wk is None):
            raise ModelError(f"{b}attn_k/attn_v.weight: expected {'none' if c.kv_source(i) != i else 'both'} "
                             f"({k['kv_from_start']})")
        if lw.wk is not None and lw.wv is not None:
            _check_matrix(lw.wk, KV * hd, E, kv_heads, k["n_embd"])
            _check_matrix(lw.wv, KV * hd, E, kv_heads, k["n_embd"])
        if not c.is_recurrent(i):
            _check_matrix(lw.wo, E, H * hd, k["n_embd"], heads)
        NE = c.n_expert or 1  # expert matrices hold n_expert matrices' rows back to back
        per = f" x {k['n_expert']} = {c.n_expert}" if c.n_expert else ""
        _check_matrix(lw.w_gate, NE * F, E, k["n_ff"] + per, k["n_embd"])
        _check_matrix(lw.w_up, NE * F, E, k["n_ff"] + per, k["n_embd"])
        _check_matrix(lw.w_down, NE * E, F, k["n_embd"] + per, k["n_ff"])
        if c.n_expert:
            if lw.router is None:
                raise ModelError(f"{b}ffn_gate_inp.weight: expected the expert router ({k['n_expert']}), found none")
            _check_matrix(lw.router, c.n_expert, E, k["n_expert"], k["n_embd"])
        elif lw.router is not None:
            raise ModelError(f"{k['n_expert']}: 0, but {b}ffn_gate_inp.weight is bound")
        if P:
            _check_matrix(lw.ple_gate, P, E, k["ple_dim"], k["n_embd"])  # type: ignore[arg-type]
            _check_matrix(lw.ple_proj, E, P, k["n_embd"], k["ple_dim"])  # type: ignore[arg-type]
            _check_vector(b + "post_norm.weight", lw.ple_post_norm, E, k["n_embd"])
        elif lw.ple_gate is not None or lw.ple_proj is not None:
            raise ModelError(f"{k['ple_dim']}: 0, but {b}inp_gate/proj.weight are bound")
        _check_vector(b + "layer_output_scale.weight", lw.out_scale, 1, "one value", False)
        if lw.out_scale is not None and not np.isfinite(lw.out_scale).all():
            raise ModelError(f"{b}layer_output_scale.weight: expected a finite value")
        _check_vector(b + "attn_norm.weight", lw.attn_norm, E, k["n_embd"], c.pre_norms)
        _check_vector(b + "ffn_norm.weight", lw.ffn_norm, E, k["n_embd"], c.pre_norms)
        if (lw.attn_norm is None) != (lw.ffn_norm is None):
            raise ModelError(f"{b}attn_norm/ffn_norm.weight: expected both or neither, found one")
        biases = (lw.bq, lw.bk, lw.bv)
        if any(x is not None for x in biases) and any(x is None for x in biases):
            raise ModelError(f"{b}attn_q/k/v.bias: expected all three biases or none, found "
                             f"{sum(x is not None for x in biases)}")
        _check_vector(b + "attn_q.bias", lw.bq, H * hd, heads, False)
        _check_vector(b + "attn_k.bias", lw.bk, KV * hd, kv_heads, False)
        _check_vector(b + "attn_v.bias", lw.bv, KV * hd, kv_heads, False)
        if (lw.q_norm is None) != (lw.k_norm is None) and lw.wk is not None:
            raise ModelError(f"{b}attn_q_norm/attn_k_norm.weight: expected both or neither, found one")
        qn, kn = (H * hd, KV * hd) if c.qk_norm_full else (hd, hd)
        attn = not c.is_recurrent(i)
        _check_vector(b + "attn_q_norm.weight", lw.q_norm, qn, heads if c.qk_norm_full else k["head_dim"],
                      c.qk_norm and attn)
        _check_vector(b + "attn_k_norm.weight", lw.k_norm, kn, kv_heads if c.qk_norm_full else k["head_dim"],
                      c.qk_norm and lw.wk is not None and attn)
        _check_vector(b + "post_attention_norm.weight", lw.post_attn_norm, E, k["n_embd"], c.post_norms)
        _check_vector(b + "attn_output.bias", lw.bo, E, k["n_embd"], False)
        _check_vector(b + "attn_sinks.weight", lw.sinks, H, k["n_head"], c.attn_sinks and attn)
        if lw.sinks is not None and not np.isfinite(lw.sinks).all():
            raise ModelError(f"{b}attn_sinks.weight: expected finite values")
        nx = k.get("n_expert", "expert_count")  # (a bump file's keys have none)
        exp = f" x {nx} = {c.n_expert}"
        for name, vec, n, what in (("ffn_gate_inp.bias", lw.b_router, c.n_expert, nx),
                                   ("ffn_gate_exps.bias", lw.b_gate, c.n_expert * F, k["n_ff"] + exp),
                                   ("ffn_up_exps.bias", lw.b_up, c.n_expert * F, k["n_ff"] + exp),
                                   ("ffn_down_exps.bias", lw.b_down, c.n_expert * E, k["n_embd"] + exp)):
            if vec is not None and not c.n_expert:
                raise ModelError(f"{nx}: 0, but {b}{name} is bound")
            _check_vector(b + name, vec, n, what, False)
        _check_vector(b + "post_ffw_norm.weight", lw.post_ffn_norm, E, k["n_embd"], c.post_norms)
        shared = (lw.sh_gate, lw.sh_up, lw.sh_down, lw.sh_gate_inp)
        if c.n_ff_shexp:
            FS, what = c.n_ff_shexp, f"{c.arch}.expert_shared_feed_forward_length"
            if any(x is None for x in shared):
                raise ModelError(f"{b}ffn_*_shexp: expected the shared expert ({what}), found none")
            _check_matrix(lw.sh_gate, FS, E, what, k["n_embd"])  # type: ignore[arg-type]
            _check_matrix(lw.sh_up, FS, E, what, k["n_embd"])  # type: ignore[arg-type]
            _check_matrix(lw.sh_down, E, FS, k["n_embd"], what)  # type: ignore[arg-type]
            _check_vector(b + "ffn_gate_inp_shexp.weight", lw.sh_gate_inp, E, k["n_embd"])
        elif any(x is not None for x in shared):
            raise ModelError(f"{b}ffn_*_shexp: a shared expert without {c.arch}.expert_shared_feed_forward_length")
