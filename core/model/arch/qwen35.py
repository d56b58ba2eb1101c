"""qwen35: Qwen3.5. Gated delta-net layers (every layer but each full_attention_interval-th, or those flagged by
``attention.recurrent_layers``) and gated attention layers with q/k RMSNorm and interleaved multi-section RoPE
(text positions are the same in every section, so it is NeoX RoPE over rope.dimension_count values). Its pre-FFN
norm is called post_attention_norm."""

from __future__ import annotations

from ...gguf import GGUFFile
from ..config import MAX_FF, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, ModelError, UnsupportedModel
from ..metadata import read_bools, read_int, read_ints
from .base import Architecture, Common


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    a, n = c["arch"], c["n_layers"]
    if f.get(f"{a}.nextn_predict_layers"):
        raise UnsupportedModel(f"{a}.nextn_predict_layers: multi-token-prediction layers are not supported by the "
                               "engine")
    if f"{a}.attention.recurrent_layers" in f.metadata:
        rec = read_bools(f, f"{a}.attention.recurrent_layers", n)  # type: ignore[arg-type]
    else:
        step = read_int(f, f"{a}.full_attention_interval", 4, hi=MAX_LAYERS)
        rec = [(i + 1) % step != 0 for i in range(n)]  # type: ignore[arg-type]
    half = c["rope_dim"] // 2  # type: ignore[operator]
    sec_key = f"{a}.rope.dimension_sections"
    sec = read_ints(f, sec_key, 4, lo=0, hi=MAX_HEAD_DIM) if sec_key in f.metadata else [half, 0, 0, 0]
    total = sum(sec)
    # a rotated pair whose section is the fourth (or none) would not rotate for text: llama.cpp gives it position 0
    if total <= 0 or any(not ((s % 3 == 0 and s < 3 * sec[0]) or (s % 3 == 1 and s < 3 * sec[1]) or
                              (s % 3 == 2 and s < 3 * sec[2])) for s in (i % total for i in range(half))):
        raise UnsupportedModel(f"{a}.rope.dimension_sections = {sec}: sections that leave rotated pairs to the "
                               "fourth (vision) section are not supported by the engine")
    inner = read_int(f, f"{a}.ssm.inner_size", hi=MAX_FF)
    state = read_int(f, f"{a}.ssm.state_size", hi=MAX_HEAD_DIM)
    v_heads = read_int(f, f"{a}.ssm.time_step_rank", hi=MAX_HEADS)
    k_heads = read_int(f, f"{a}.ssm.group_count", hi=MAX_HEADS)
    if inner != v_heads * state:  # type: ignore[operator]
        raise ModelError(f"{a}.ssm.inner_size: expected {a}.ssm.time_step_rank x {a}.ssm.state_size = "
                         f"{v_heads * state}, found {inner}")  # type: ignore[operator]
    if v_heads % k_heads:  # type: ignore[operator]
        raise ModelError(f"{a}.ssm.group_count: expected a divisor of {a}.ssm.time_step_rank = {v_heads}, "
                         f"found {k_heads}")
    return {"qk_norm": True, "q_gate": True, "recurrent_layers": tuple(rec),
            "ssm_conv": read_int(f, f"{a}.ssm.conv_kernel", hi=64), "ssm_state": state, "ssm_k_heads": k_heads,
            "ssm_v_heads": v_heads}


DESCRIPTION = Architecture("qwen35", configure, ffn_norm="post_attention_norm.weight")
