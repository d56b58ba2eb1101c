"""Bind a model's weights from a BUMPWGT3 file + its config.json (the C-Kernel-Engine layout), zero-copy."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from ..bump.reader import open_bump
from ..quant.types import ggml_type
from . import LayerWeights, ModelConfig, ModelWeights, UnsupportedModel, Weight


def read_bump_config(path: str | os.PathLike[str]) -> dict[str, object]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UnsupportedModel(f"cannot read {path}: {exc}") from None


def bind_bump(bump_path: str | os.PathLike[str], config_path: str | os.PathLike[str]) -> ModelWeights:
    """ModelWeights whose matrices are views into the mapped bump file; the lm_head is tok_emb (BUMPWGT3 has no
    separate head)."""
    b = open_bump(bump_path)
    cfg = read_bump_config(config_path)
    arch = str(cfg.get("model_type", "llama"))
    if arch not in ("llama", "qwen2"):
        raise UnsupportedModel(f"bump files hold llama-style models; config.json says {arch!r}")
    h = b.header
    kv = int(cfg.get("num_key_value_heads", b.kv_heads or h.num_heads))  # type: ignore[arg-type]
    ffn = int(cfg.get("intermediate_size", b.ffn or 0))  # type: ignore[arg-type]
    if b.kv_heads not in (None, kv) or b.ffn not in (None, ffn):
        raise UnsupportedModel(f"config.json ({kv} kv heads, ffn {ffn}) disagrees with the bump layout "
                               f"({b.kv_heads}, {b.ffn})")
    config = ModelConfig(
        arch=arch, n_layers=h.num_layers, n_embd=h.embed_dim, n_head=h.num_heads, n_head_kv=kv,
        head_dim=h.head_dim, n_ff=ffn, n_vocab=h.vocab_size, n_ctx_train=h.context_len,
        rms_eps=float(cfg.get("rms_norm_eps", 1e-5)),  # type: ignore[arg-type]
        rope_base=float(cfg.get("rope_theta", 10000.0)),  # type: ignore[arg-type]
        rope_neox=arch == "qwen2", rope_dim=h.head_dim,
    )
    mm = np.memmap(b.path, dtype=np.uint8, mode="r")
    sec = {s.name: s for s in b.sections}

    def raw(name: str) -> np.ndarray:
        s = sec[name]
        return mm[s.offset : s.offset + s.size]

    def weight(name: str, rows: int, k: int) -> Weight:
        s = sec[name]
        t = ggml_type(s.type_name)
        return Weight(name, t, raw(name), rows, k)

    def vec(name: str, optional: bool = False) -> np.ndarray | None:
        v = np.ascontiguousarray(raw(name).view("<f4"), dtype=np.float32)
        return None if optional and not v.any() else v

    E, H, hd, F = config.n_embd, config.n_head, config.head_dim, config.n_ff
    layers = []
    for i in range(config.n_layers):
        p = f"layer.{i}."
        w1 = sec[p + "w1"]
        t1 = ggml_type(w1.type_name)
        half = w1.size // 2
        gate = Weight(p + "w1.gate", t1, raw(p + "w1")[:half], F, E)
        up = Weight(p + "w1.up", t1, raw(p + "w1")[half:], F, E)
        layers.append(LayerWeights(
            attn_norm=vec(p + "ln1_gamma"),  # type: ignore[arg-type]
            wq=weight(p + "wq", H * hd, E), wk=weight(p + "wk", kv * hd, E), wv=weight(p + "wv", kv * hd, E),
            wo=weight(p + "wo", E, H * hd),
            ffn_norm=vec(p + "ln2_gamma"),  # type: ignore[arg-type]
            w_gate=gate, w_up=up, w_down=weight(p + "w2", E, F),
            bq=vec(p + "bq", True), bk=vec(p + "bk", True), bv=vec(p + "bv", True),
        ))
    emb = weight("token_emb", h.vocab_size, E)
    assert math.isfinite(config.rms_eps)
    return ModelWeights(config, emb, emb, vec("final_ln_gamma"), layers, True)  # type: ignore[arg-type]
