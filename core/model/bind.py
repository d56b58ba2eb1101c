"""Bind a GGUF file's tensors to :class:`ModelWeights` for a checked :class:`ModelConfig`: which optional tensors
are looked for comes from the config's switches and the architecture description's flags, never its name."""

from __future__ import annotations

import re

import numpy as np

from ..gguf import GGUFFile, TensorInfo
from .arch import Architecture, description
from .checks import check_weights
from .config import EmbeddingModel, ModelConfig, ModelError, UnsupportedModel, gguf_keys
from .read import read_config
from .weights import GDNWeights, LayerWeights, ModelWeights, Weight


def _weight(f: GGUFFile, name: str, ndim: int = 2) -> Weight:
    if not f.has_tensor(name):
        raise UnsupportedModel(f"missing tensor {name}")
    t: TensorInfo = f.tensor(name)
    if t.type is None:
        raise UnsupportedModel(f"tensor {name} has {t.type_name}")
    if len(t.ne) != ndim and not (ndim == 1 and len(t.ne) > 1 and t.n_rows == 1):
        raise ModelError(f"{name}: expected {ndim} dimension(s), found shape {list(t.ne)}")
    return Weight(name, t.type, f.tensor_bytes(t), t.n_rows, t.row_len)


def _vector(f: GGUFFile, name: str, optional: bool = False, ndim: int = 1) -> np.ndarray | None:
    """A float32 copy of a vector (``ndim`` 2: of a matrix's values in order: the experts' biases)."""
    if optional and not f.has_tensor(name):
        return None
    w = _weight(f, name, ndim=ndim)
    from ..native.kernels import copy_mapped  # a guarded copy: a truncated file raises instead of SIGBUS
    from ..quant import dequantize

    try:
        v = dequantize(copy_mapped(w.data, name).reshape(1, -1), w.type).reshape(-1)
    except (ValueError, NotImplementedError, KeyError) as exc:
        raise ModelError(f"{name}: a {w.type.name} vector the engine cannot read ({exc})") from None
    return np.ascontiguousarray(v, dtype=np.float32)


def _rows(w: Weight, parts: list[tuple[str, int]], rows_from: str) -> list[Weight]:
    """A fused matrix split into consecutive row blocks (zero-copy views): ``parts`` = (suffix, rows) each."""
    want = sum(n for _, n in parts)
    if w.rows != want:
        raise ModelError(f"{rows_from}: expected {w.name} to have {want} rows "
                         f"({' + '.join(f'{n} {s}' for s, n in parts)}), found {w.rows}")
    rb = w.type.row_bytes(w.k)
    out, r = [], 0
    for suffix, n in parts:
        out.append(Weight(f"{w.name}[{suffix}]", w.type, w.data[r * rb : (r + n) * rb], n, w.k))
        r += n
    return out


def _experts_weight(f: GGUFFile, name: str, shape: tuple[int, int, int], keys: dict[str, str]) -> Weight:
    """A 3-D expert tensor of ggml shape ``shape`` (row length, rows per expert, experts), viewed as one matrix of
    every expert's rows back to back."""
    if not f.has_tensor(name):
        raise UnsupportedModel(f"missing tensor {name}")
    t: TensorInfo = f.tensor(name)
    if t.type is None:
        raise UnsupportedModel(f"tensor {name} has {t.type_name}")
    if tuple(t.ne) != shape:
        raise ModelError(f"{name}: expected shape {list(shape)} ({keys['n_embd']}, {keys['n_ff']}, "
                         f"{keys['n_expert']}), found {list(t.ne)}")
    return Weight(name, t.type, f.tensor_bytes(t), t.n_rows, t.row_len)


def _attn_and_ffn(f: GGUFFile, cfg: ModelConfig, d: Architecture, i: int) -> tuple[Weight | None, ...]:
    """q, k, v, gate and up of layer ``i``: separate tensors, or a fused attn_qkv and (``d.fused_gate_up``)
    gate+up; layers that read an earlier layer's cache have no k and v, and with ``d.v_from_k`` a missing attn_v
    means V is K's projection."""
    b = f"blk.{i}."
    keys = gguf_keys(cfg.arch)
    heads = f"{keys['n_head']}, {keys['n_head_kv']}, {keys['head_dim']}"
    hd, kvh, n_ff = cfg.head_dim_at(i), cfg.n_head_kv_at(i), cfg.n_ff_at(i)
    wk: Weight | None
    wv: Weight | None
    if f.has_tensor(b + "attn_qkv.weight"):
        q_rows, kv_rows = cfg.n_head * hd, kvh * hd
        wq, wk, wv = _rows(_weight(f, b + "attn_qkv.weight"), [("q", q_rows), ("k", kv_rows), ("v", kv_rows)],
                           heads)
    elif cfg.kv_source(i) != i:
        wq, wk, wv = _weight(f, b + "attn_q.weight"), None, None
    else:
        wq, wk = _weight(f, b + "attn_q.weight"), _weight(f, b + "attn_k.weight")
        wv = wk if d.v_from_k and not f.has_tensor(b + "attn_v.weight") else _weight(f, b + "attn_v.weight")
    if cfg.n_expert:
        ne, E = cfg.n_expert, cfg.n_embd
        gate = _experts_weight(f, b + "ffn_gate_exps.weight", (E, n_ff, ne), keys)
        up = _experts_weight(f, b + "ffn_up_exps.weight", (E, n_ff, ne), keys)
    elif d.fused_gate_up and not f.has_tensor(b + "ffn_gate.weight"):
        gate, up = _rows(_weight(f, b + "ffn_up.weight"), [("gate", n_ff), ("up", n_ff)], keys["n_ff"])
    else:
        gate, up = _weight(f, b + "ffn_gate.weight"), _weight(f, b + "ffn_up.weight")
    return wq, wk, wv, gate, up


#: Tensors a file may hold that llama.cpp ignores too (precomputed rotary tables of old conversions).
_IGNORABLE = re.compile(r"^blk\.\d+\.attn_rot_embd$")
#: LayerWeights vector field -> tensor name suffix.
_VECTOR_TENSORS = {"attn_norm": "attn_norm.weight", "ffn_norm": "ffn_norm.weight", "bq": "attn_q.bias",
                   "bk": "attn_k.bias", "bv": "attn_v.bias", "q_norm": "attn_q_norm.weight",
                   "k_norm": "attn_k_norm.weight", "post_attn_norm": "post_attention_norm.weight",
                   "post_ffn_norm": "post_ffw_norm.weight", "ple_post_norm": "post_norm.weight",
                   "out_scale": "layer_output_scale.weight", "bo": "attn_output.bias", "sinks": "attn_sinks.weight",
                   "b_router": "ffn_gate_inp.bias", "b_gate": "ffn_gate_exps.bias", "b_up": "ffn_up_exps.bias",
                   "b_down": "ffn_down_exps.bias", "sh_gate_inp": "ffn_gate_inp_shexp.weight"}


def _check_all_bound(f: GGUFFile, cfg: ModelConfig, used: set[str]) -> None:
    """Refuse a file with tensors the engine would silently ignore (their absence would change the results)."""
    extra = sorted(t.name for t in f.tensors if t.name not in used and not _IGNORABLE.match(t.name))
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        raise UnsupportedModel(f"{cfg.arch}: the engine does not use the tensor(s) {', '.join(extra[:3])}{more}; "
                               "running without them would give wrong results")


def bind_weights(f: GGUFFile, config: ModelConfig | None = None, pooled: frozenset[str] | None = None) -> ModelWeights:
    """Bind every tensor the architecture uses; matrices stay quantized views of the file (zero copy). Every
    shape, length and type is checked against the config (:func:`check_weights`); a tensor left over is an
    error (:class:`UnsupportedModel`). ``pooled``: an embedding model's decoder layers are bound for the encoder,
    which pools the rows and reads these tensors (its head) itself; otherwise an embedding model is refused."""
    cfg = config or read_config(f)
    if cfg.is_embedding and pooled is None:
        raise EmbeddingModel(f"{cfg.arch} is an embedding model ({cfg.pooling} pooling): it does not generate "
                               "text; run it with `quantscope embed` or the server's /v1/embeddings")
    layers = []
    ple = cfg.ple_dim > 0
    d = description(cfg.arch)
    ffn_norm, oai = d.ffn_norm, d.expert_biases
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        if cfg.is_recurrent(i):
            layers.append(_recurrent_layer(f, cfg, i, ffn_norm))
            continue
        wq, wk, wv, gate, up = _attn_and_ffn(f, cfg, d, i)
        shared = wk is None
        layers.append(LayerWeights(
            attn_norm=_vector(f, b + "attn_norm.weight", not cfg.pre_norms),
            wq=wq, wk=wk, wv=wv, wo=_weight(f, b + "attn_output.weight"),
            ffn_norm=_vector(f, b + ffn_norm, not cfg.pre_norms),
            w_gate=gate, w_up=up,
            w_down=_experts_weight(f, b + "ffn_down_exps.weight", (cfg.n_ff_at(i), cfg.n_embd, cfg.n_expert),
                                   gguf_keys(cfg.arch)) if cfg.n_expert else _weight(f, b + "ffn_down.weight"),
            router=_weight(f, b + "ffn_gate_inp.weight") if cfg.n_expert else None,
            bq=_vector(f, b + "attn_q.bias", True), bk=_vector(f, b + "attn_k.bias", True),
            bv=_vector(f, b + "attn_v.bias", True),
            # q/k norms only where the architecture has them: elsewhere a file's norms are left unbound, so
            # _check_all_bound refuses the file (llama.cpp refuses the tensor count) instead of applying them
            q_norm=_vector(f, b + "attn_q_norm.weight") if cfg.qk_norm else None,
            k_norm=None if shared or not cfg.qk_norm else _vector(f, b + "attn_k_norm.weight"),
            post_attn_norm=None if ffn_norm == "post_attention_norm.weight" else  # (gpt-oss: the FFN's norm)
            _vector(f, b + "post_attention_norm.weight", not cfg.post_norms),
            post_ffn_norm=_vector(f, b + "post_ffw_norm.weight", not cfg.post_norms),
            ple_gate=_weight(f, b + "inp_gate.weight") if ple else None,
            ple_proj=_weight(f, b + "proj.weight") if ple else None,
            ple_post_norm=_vector(f, b + "post_norm.weight") if ple else None,
            out_scale=_vector(f, b + "layer_output_scale.weight", True) if d.layer_output_scale else None,
            bo=_vector(f, b + "attn_output.bias", True) if oai else None,
            sinks=_vector(f, b + "attn_sinks.weight") if cfg.attn_sinks else None,
            b_router=_vector(f, b + "ffn_gate_inp.bias", True) if oai else None,
            b_gate=_vector(f, b + "ffn_gate_exps.bias", True, 2) if oai else None,
            b_up=_vector(f, b + "ffn_up_exps.bias", True, 2) if oai else None,
            b_down=_vector(f, b + "ffn_down_exps.bias", True, 2) if oai else None,
        ))
    if cfg.n_ff_shexp:
        for i, lw in enumerate(layers):
            b = f"blk.{i}."
            lw.sh_gate, lw.sh_up = _weight(f, b + "ffn_gate_shexp.weight"), _weight(f, b + "ffn_up_shexp.weight")
            lw.sh_down = _weight(f, b + "ffn_down_shexp.weight")
            lw.sh_gate_inp = _vector(f, b + "ffn_gate_inp_shexp.weight")
    emb = _weight(f, "token_embd.weight")
    tied = not f.has_tensor("output.weight")
    out = emb if tied else _weight(f, "output.weight")
    freqs = _vector(f, "rope_freqs.weight", True) if d.rope_freqs else None
    long = _vector(f, "rope_factors_long.weight", True) if d.longrope else None
    short = _vector(f, "rope_factors_short.weight", True) if d.longrope else None
    w = ModelWeights(cfg, emb, out, _vector(f, "output_norm.weight"), layers, tied,  # type: ignore[arg-type]
                     rope_freqs=freqs, rope_long=long, rope_short=short,
                     ple_tok_embd=_weight(f, "per_layer_token_embd.weight") if ple else None,
                     ple_model_proj=_weight(f, "per_layer_model_proj.weight") if ple else None,
                     ple_proj_norm=_vector(f, "per_layer_proj_norm.weight") if ple else None)
    check_weights(w, gguf_keys(cfg.arch, derived_head_dim=f"{cfg.arch}.attention.key_length" not in f.metadata))
    used = {"token_embd.weight", "output.weight", "output_norm.weight"}
    used |= {n for n, v in (("rope_freqs.weight", freqs), ("rope_factors_long.weight", long),
                            ("rope_factors_short.weight", short)) if v is not None}
    if ple:
        used |= {"per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight"}
    for i, lw in enumerate(layers):
        for x in lw.matrices():
            used.add(x.name.split("[", 1)[0])
        used |= {f"blk.{i}.{ffn_norm if fld == 'ffn_norm' else name}" for fld, name in _VECTOR_TENSORS.items()
                 if getattr(lw, fld) is not None}
        if lw.gdn is not None:
            used |= {f"blk.{i}.{n}" for n in ("ssm_conv1d.weight", "ssm_dt.bias", "ssm_a", "ssm_norm.weight")}
        elif lw.wk is None:  # llama.cpp loads and ignores a shared layer's own k/v (they are optional there)
            used |= {f"blk.{i}.{n}.weight" for n in ("attn_k", "attn_v", "attn_k_norm")}
    _check_all_bound(f, cfg, used | (pooled or frozenset()))
    return w


def _recurrent_layer(f: GGUFFile, cfg: ModelConfig, i: int, ffn_norm: str) -> LayerWeights:
    """A gated delta-net layer (qwen35): its mixer's tensors, then the FFN as the attention layers have it."""
    b = f"blk.{i}."
    conv_name = b + "ssm_conv1d.weight"
    if f.has_tensor(conv_name) and tuple(f.tensor(conv_name).ne) != (cfg.ssm_conv, cfg.ssm_channels):
        raise ModelError(f"{cfg.arch}.ssm.conv_kernel, ssm.state_size, ssm.group_count, ssm.time_step_rank: "
                         f"expected {conv_name} of shape {[cfg.ssm_conv, cfg.ssm_channels]}, found "
                         f"{list(f.tensor(conv_name).ne)}")
    gdn = GDNWeights(z=_weight(f, b + "attn_gate.weight"), beta=_weight(f, b + "ssm_beta.weight"),
                     alpha=_weight(f, b + "ssm_alpha.weight"), conv=_vector(f, conv_name, ndim=2),  # type: ignore[arg-type]
                     dt_bias=_vector(f, b + "ssm_dt.bias"), a=_vector(f, b + "ssm_a"),  # type: ignore[arg-type]
                     norm=_vector(f, b + "ssm_norm.weight"))  # type: ignore[arg-type]
    if cfg.n_expert:
        keys, E, F, NE = gguf_keys(cfg.arch), cfg.n_embd, cfg.n_ff, cfg.n_expert
        ffn = dict(w_gate=_experts_weight(f, b + "ffn_gate_exps.weight", (E, F, NE), keys),
                   w_up=_experts_weight(f, b + "ffn_up_exps.weight", (E, F, NE), keys),
                   w_down=_experts_weight(f, b + "ffn_down_exps.weight", (F, E, NE), keys),
                   router=_weight(f, b + "ffn_gate_inp.weight"))
    else:
        ffn = dict(w_gate=_weight(f, b + "ffn_gate.weight"), w_up=_weight(f, b + "ffn_up.weight"),
                   w_down=_weight(f, b + "ffn_down.weight"))
    return LayerWeights(attn_norm=_vector(f, b + "attn_norm.weight"), wq=_weight(f, b + "attn_qkv.weight"), wk=None,
                        wv=None, wo=_weight(f, b + "ssm_out.weight"), ffn_norm=_vector(f, b + ffn_norm), gdn=gdn,
                        **ffn)  # type: ignore[arg-type]

