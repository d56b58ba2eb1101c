"""Bind a model's weights from a BUMPWGT3 file + its config.json (the C-Kernel-Engine layout), zero-copy.

config.json's values are checked like GGUF metadata (type, range, agreement with the bump header and layout), and
the bound weights go through the same :func:`~quantscope.core.model.check_weights` as a GGUF model's."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from ..base.ggml_types import ggml_type
from ..bump.reader import open_bump
from . import (
    ARCHITECTURES,
    MAX_CTX,
    MAX_EMBD,
    MAX_FF,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_VOCAB,
    LayerWeights,
    ModelConfig,
    ModelError,
    ModelWeights,
    UnsupportedModel,
    Weight,
    check_config,
    check_weights,
)
from .arch import BUMP_DEFAULT

#: ModelConfig field -> where its value comes from (what error messages name).
BUMP_KEYS = {
    "n_layers": "config.json num_hidden_layers", "n_embd": "config.json hidden_size",
    "n_head": "config.json num_attention_heads", "n_head_kv": "config.json num_key_value_heads",
    "head_dim": "bump header head_dim", "n_ff": "config.json intermediate_size", "n_vocab": "config.json vocab_size",
    "n_ctx_train": "config.json max_position_embeddings", "rms_eps": "config.json rms_norm_eps",
    "rope_base": "config.json rope_theta", "rope_dim": "bump header head_dim", "sliding_window": "sliding_window",
    "rope_base_swa": "config.json rope_theta",
}


def read_bump_config(path: str | os.PathLike[str]) -> dict[str, object]:
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UnsupportedModel(f"cannot read {path}: {exc}") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{path}: expected a JSON object, found {type(cfg).__name__}")
    return cfg


def _cfg_int(cfg: dict[str, object], key: str, header: int | None, hi: int) -> int:
    """Integer ``key`` of config.json in 1..hi, equal to the bump header's value when it has one."""
    v = cfg.get(key, header)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ModelError(f"config.json {key}: expected an integer, found {v!r}")
    if not 0 < v <= hi:
        raise ModelError(f"config.json {key}: expected an integer in 1..{hi}, found {v}")
    if header is not None and v != header:
        raise ModelError(f"config.json {key}: expected {header} (the bump file's value), found {v}")
    return v


def _cfg_float(cfg: dict[str, object], key: str, default: float, hi: float) -> float:
    v = cfg.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and 0 < v <= hi):
        raise ModelError(f"config.json {key}: expected a finite number in (0, {hi:g}], found {v!r}")
    return float(v)


def bind_bump(bump_path: str | os.PathLike[str], config_path: str | os.PathLike[str]) -> ModelWeights:
    """ModelWeights whose matrices are views into the mapped bump file; the lm_head is tok_emb (BUMPWGT3 has no
    separate head)."""
    b = open_bump(bump_path)
    cfg = read_bump_config(config_path)
    arch = cfg.get("model_type", BUMP_DEFAULT)
    desc = ARCHITECTURES.get(arch) if isinstance(arch, str) else None
    if desc is None or not desc.bump:
        raise UnsupportedModel(f"bump files hold llama-style models; config.json says {arch!r}")
    h = b.header
    n_head = _cfg_int(cfg, "num_attention_heads", h.num_heads, MAX_HEADS)
    kv = _cfg_int(cfg, "num_key_value_heads", b.kv_heads or n_head, MAX_HEADS)
    ffn = _cfg_int(cfg, "intermediate_size", b.ffn, MAX_FF)
    config = ModelConfig(
        arch=str(arch), n_layers=_cfg_int(cfg, "num_hidden_layers", h.num_layers, MAX_LAYERS),
        n_embd=_cfg_int(cfg, "hidden_size", h.embed_dim, MAX_EMBD), n_head=n_head, n_head_kv=kv,
        head_dim=h.head_dim, n_ff=ffn, n_vocab=_cfg_int(cfg, "vocab_size", h.vocab_size, MAX_VOCAB),
        n_ctx_train=_cfg_int(cfg, "max_position_embeddings", h.context_len, MAX_CTX),
        rms_eps=_cfg_float(cfg, "rms_norm_eps", 1e-5, 1.0),
        rope_base=_cfg_float(cfg, "rope_theta", 10000.0, 1e30),
        rope_neox=desc.rope_neox, rope_dim=h.head_dim,
    )
    check_config(config, BUMP_KEYS)
    if b.profile is None or not b.sections:
        raise ModelError(f"{bump_path}: expected a section layout, found none")
    mm = np.memmap(b.path, dtype=np.uint8, mode="r")
    sec = {s.name: s for s in b.sections}

    def raw(name: str) -> np.ndarray:
        if name not in sec:
            raise ModelError(f"{bump_path}: expected a section {name}, found none")
        s = sec[name]
        if s.offset < 0 or s.size < 0 or s.offset + s.size > mm.size:
            raise ModelError(f"{name}: expected bytes {s.offset}..{s.offset + s.size} inside the file, found "
                             f"{mm.size} bytes")
        return mm[s.offset : s.offset + s.size]

    def weight(name: str, rows: int, k: int) -> Weight:
        return Weight(name, ggml_type(sec[name].type_name) if name in sec else ggml_type("F32"), raw(name), rows, k)

    def vec(name: str, optional: bool = False) -> np.ndarray | None:
        data = raw(name)
        if sec[name].type_name != "F32" or data.size % 4:
            raise ModelError(f"{name}: expected an F32 vector, found {sec[name].type_name} of {data.size} bytes")
        v = np.ascontiguousarray(data.view("<f4"), dtype=np.float32)
        return None if optional and not v.any() else v

    E, H, hd, F = config.n_embd, config.n_head, config.head_dim, config.n_ff
    layers = []
    for i in range(config.n_layers):
        p = f"layer.{i}."
        w1 = raw(p + "w1")
        t1 = ggml_type(sec[p + "w1"].type_name)
        if w1.size % 2:
            raise ModelError(f"{p}w1: expected gate and up halves of equal size, found {w1.size} bytes")
        half = w1.size // 2
        gate = Weight(p + "w1.gate", t1, w1[:half], F, E)
        up = Weight(p + "w1.up", t1, w1[half:], F, E)
        bq, bk, bv = vec(p + "bq", True), vec(p + "bk", True), vec(p + "bv", True)
        if bq is None and bk is None and bv is None:
            pass
        elif bq is None or bk is None or bv is None:  # an all-zero bias is as good as none: keep all three
            bq = bq if bq is not None else np.zeros(H * hd, np.float32)
            bk = bk if bk is not None else np.zeros(kv * hd, np.float32)
            bv = bv if bv is not None else np.zeros(kv * hd, np.float32)
        layers.append(LayerWeights(
            attn_norm=vec(p + "ln1_gamma"),  # type: ignore[arg-type]
            wq=weight(p + "wq", H * hd, E), wk=weight(p + "wk", kv * hd, E), wv=weight(p + "wv", kv * hd, E),
            wo=weight(p + "wo", E, H * hd),
            ffn_norm=vec(p + "ln2_gamma"),  # type: ignore[arg-type]
            w_gate=gate, w_up=up, w_down=weight(p + "w2", E, F),
            bq=bq, bk=bk, bv=bv,
        ))
    emb = weight("token_emb", config.n_vocab, E)
    w = ModelWeights(config, emb, emb, vec("final_ln_gamma"), layers, True)  # type: ignore[arg-type]
    check_weights(w, BUMP_KEYS)
    return w
