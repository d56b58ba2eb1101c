"""Read a GGUF file's hyperparameters into a checked :class:`ModelConfig`: the common keys here, the
architecture's own through its description (:mod:`.arch`)."""

from __future__ import annotations

import math
import re

from ..gguf import GGUFFile
from .arch import ARCHITECTURES, SUPPORTED_ARCHS, Common
from .checks import check_config
from .config import (
    MAX_EMBD,
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
from .metadata import read_float, read_int, read_ints, show


def rope_scaling(f: GGUFFile, arch: str, n_ctx_train: int) -> Common:
    """``{arch}.rope.scaling.*`` as llama.cpp reads them for every architecture: the type (none, linear, yarn or
    longrope; absent means linear), the factor (absent or 0 means none), the original context, YaRN's betas and
    log multiplier, and the attention factor; returned as ModelConfig fields (docs/engine.md, "RoPE scaling")."""
    p = f"{arch}.rope.scaling."
    kind_kv = f.metadata.get(p + "type")
    kind = "linear" if kind_kv is None else kind_kv.value
    if kind not in ("none", "linear", "yarn", "longrope"):
        raise UnsupportedModel(f"{p}type = {show(kind)}: RoPE scaling of this kind is not supported by the engine "
                               "(running without it would give wrong results)")
    for unsupported in ("yarn_ext_factor", "yarn_attn_factor"):
        if p + unsupported in f.metadata:
            raise UnsupportedModel(f"{p}{unsupported}: not supported by the engine")
    factor_key = p + "factor" if p + "factor" in f.metadata else f"{arch}.rope.scale_linear"  # the old name
    factor = read_float(f, factor_key, 0.0, zero_ok=True)
    freq_scale = 1.0 if kind == "none" or factor == 0.0 else 1.0 / factor
    ext = 1.0 if kind == "yarn" else 0.0
    if ext and factor and 1.0 + 0.1 * math.log(factor) <= 0.0:  # YaRN's magnitude term would be 0 or negative
        raise ModelError(f"{factor_key}: expected a YaRN factor above {math.exp(-10):.3g}, found {factor!r}")
    attn = 1.0
    if ext:
        scale = 1.0 / freq_scale

        def mscale(s: float, m: float) -> float:
            return 1.0 if s <= 1.0 else 0.1 * m * math.log(s) + 1.0

        log_mul = read_float(f, p + "yarn_log_multiplier", 0.0, zero_ok=True)
        attn = mscale(scale, 1.0) / mscale(scale, log_mul) if log_mul else mscale(scale, 1.0)
        attn *= 1.0 / (1.0 + 0.1 * math.log(scale))  # ggml's rope multiplies this back (yarn's magnitude)
    attn *= read_float(f, p + "attn_factor", 1.0, 1e3)
    return {"rope_freq_scale": freq_scale, "rope_ext_factor": ext, "rope_mscale": attn,
            "rope_orig_ctx": read_int(f, p + "original_context_length", n_ctx_train),
            "rope_beta_fast": read_float(f, p + "yarn_beta_fast", 32.0, 1e6),
            "rope_beta_slow": read_float(f, p + "yarn_beta_slow", 1.0, 1e6)}


def read_config(f: GGUFFile) -> ModelConfig:
    """Hyperparameters from metadata, each checked for type and range and against token_embd.weight; raises
    :class:`UnsupportedModel` naming the architecture, :class:`ModelError` naming a bad key."""
    arch = f.architecture or "?"
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModel(f"architecture {arch!r} is not supported by the engine (supported: "
                               f"{', '.join(SUPPORTED_ARCHS)})")
    keys = gguf_keys(arch, derived_head_dim=f"{arch}.attention.key_length" not in f.metadata)
    n_embd = read_int(f, keys["n_embd"], hi=MAX_EMBD)
    n_layers = read_int(f, keys["n_layers"], hi=MAX_LAYERS)
    n_head = read_int(f, keys["n_head"], hi=MAX_HEADS)
    kv_list = read_ints(f, keys["n_head_kv"], n_layers, n_head, hi=MAX_HEADS)  # llama.cpp takes one or one per layer
    ff_list = read_ints(f, keys["n_ff"], n_layers, hi=MAX_FF)
    n_head_kv, n_ff = kv_list[0], max(ff_list)
    n_ctx_train = read_int(f, keys["n_ctx_train"], 4096)
    if not f.has_tensor("token_embd.weight"):
        raise UnsupportedModel("missing tensor token_embd.weight")
    emb = f.tensor("token_embd.weight")
    if len(emb.ne) != 2:
        raise ModelError(f"token_embd.weight: expected 2 dimensions, found shape {list(emb.ne)}")
    if emb.ne[0] != n_embd:
        raise ModelError(f"{keys['n_embd']}: expected {emb.ne[0]} (the row length of token_embd.weight), "
                         f"found {n_embd}")
    n_vocab = emb.ne[1]
    if not 0 < n_vocab <= MAX_VOCAB:
        raise ModelError(f"token_embd.weight: expected 1..{MAX_VOCAB} rows, found {n_vocab}")
    if f"{arch}.attention.key_length" in f.metadata:
        head_dim = read_int(f, f"{arch}.attention.key_length", hi=MAX_HEAD_DIM)
    elif n_embd % n_head:
        raise ModelError(f"{keys['n_head']}: expected a divisor of {keys['n_embd']} = {n_embd} (no "
                         f"{arch}.attention.key_length given), found {n_head}")
    else:
        head_dim = n_embd // n_head
    vocab_key = f"{arch}.vocab_size"
    if vocab_key in f.metadata and read_int(f, vocab_key, hi=MAX_VOCAB) != n_vocab:
        raise ModelError(f"{vocab_key}: expected {n_vocab} (the rows of token_embd.weight), "
                         f"found {f.get(vocab_key)}")
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    if tokens is not None and tokens.count is not None and tokens.count > n_vocab:
        raise ModelError(f"tokenizer.ggml.tokens: expected at most {n_vocab} tokens (the rows of "
                         f"token_embd.weight), found {tokens.count}")
    common = dict(
        arch=arch, n_layers=n_layers, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        n_ff=n_ff, n_vocab=n_vocab, n_ctx_train=n_ctx_train,
        rms_eps=read_float(f, keys["rms_eps"], 1e-5, 1.0),
        rope_base=read_float(f, keys["rope_base"], 10000.0, 1e30),
        rope_dim=read_int(f, keys["rope_dim"], head_dim, hi=MAX_HEAD_DIM),
        layer_n_head_kv=tuple(kv_list) if len(set(kv_list)) > 1 else (),
        layer_n_ff=tuple(ff_list) if len(set(ff_list)) > 1 else (),
    )
    common.update(rope_scaling(f, arch, n_ctx_train))
    description = ARCHITECTURES[arch]
    common["rope_neox"] = description.rope_neox
    cfg = ModelConfig(**{**common, **description.configure(f, common, keys)})  # type: ignore[arg-type]
    check_config(cfg, keys)
    value_len = read_int(f, f"{arch}.attention.value_length", head_dim, hi=MAX_HEAD_DIM)
    if value_len != head_dim:
        raise ModelError(f"{arch}.attention.value_length: expected {head_dim} (= {keys['head_dim']}), "
                         f"found {value_len}")
    _check_layer_count(f, n_layers, keys["n_layers"])
    return cfg


def _check_layer_count(f: GGUFFile, n_layers: int, key: str) -> None:
    """``block_count`` must equal the number of ``blk.N`` present, numbered 0..N-1."""
    present = {int(m.group(1)) for m in (_BLK.match(t.name) for t in f.tensors) if m}
    n = max(present) + 1 if present else 0
    if n != n_layers:
        found = f"blk.0..blk.{n - 1}" if present else "no blk.N tensors"
        raise ModelError(f"{key}: expected {n} (the layers present: {found}), found {n_layers}")
    missing = sorted(set(range(n)) - present)
    if missing:
        raise ModelError(f"{key}: {n_layers} layers, but blk.{missing[0]} has no tensors")


_BLK = re.compile(r"blk\.(\d+)\.")

