"""What running a model takes: weight bytes per layer and the memory for a context (weights, KV cache, recurrent
state), from the file's hyperparameters."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile
from ..gguf.checks import metadata_int
from ..quant import GGMLType, ggml_type

_BLOCK_RE = re.compile(r"^(blk\.\d+)\.")


def block_group(name: str) -> str:
    """The layer a tensor belongs to (``blk.7``), or ``""`` for tensors outside the repeated blocks."""
    m = _BLOCK_RE.match(name)
    return m.group(1) if m else ""


def group_sort_key(group: str) -> tuple[int, int]:
    """Sort key putting non-layer tensors first, then ``blk.0``, ``blk.1`` … numerically."""
    return (0, 0) if not group else (1, int(group.split(".")[1]))


def weights_by_layer(f: GGUFFile) -> list[tuple[str, int]]:
    """Tensor bytes per layer (``""`` = outside the blocks), in layer order."""
    acc: dict[str, int] = {}
    for t in f.tensors:
        g = block_group(t.name)
        acc[g] = acc.get(g, 0) + (t.n_bytes or 0)
    return sorted(acc.items(), key=lambda kv: group_sort_key(kv[0]))


KV_TYPES = ("F16", "BF16", "F32", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0")


@dataclass(frozen=True)
class MemoryPlan:
    """Memory to run a model: weights (as stored) plus the KV cache for ``context`` tokens.

    KV cache = layers × context × kv_heads × (key_length + value_length) elements of ``kv_type``; an upper
    bound for sliding-window models (``note`` says so)."""

    context: int
    kv_type: str
    weights_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int
    n_layers: int
    n_kv_heads: int
    key_length: int
    value_length: int
    note: str = ""
    state_bytes: int = 0  # recurrent layers (qwen35's gated delta-net): conv inputs + state matrices, float32
    n_recurrent: int = 0  # layers with a recurrent state instead of a KV cache (not in n_layers)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.state_bytes


def _int_key(f: GGUFFile, suffix: str) -> int | None:
    """A non-negative integer hyperparameter (the maximum of a per-layer array), else ``None``."""
    v = f.arch_get(suffix) if f.architecture else None
    if isinstance(v, np.ndarray):  # per-layer arrays (e.g. head_count_kv on some models): take the maximum
        v = v.max() if v.size and v.dtype.kind in "iu" else None
    n = metadata_int(v)
    return n if n is not None and n >= 0 else None


def memory_plan(f: GGUFFile, context: int | None = None, kv_type: str = "F16",
                v_type: str | None = None) -> MemoryPlan:
    """Weights plus KV cache for ``context`` tokens (default: the model's context length); keys of ``kv_type``,
    values of ``v_type`` (None: the same; llama.cpp's ``-ctk`` / ``-ctv``)."""
    weights = sum(t.n_bytes or 0 for t in f.tensors)
    n_layers = _int_key(f, "block_count") or len({block_group(t.name) for t in f.tensors} - {""})
    heads = _int_key(f, "attention.head_count") or 0
    kv_heads = _int_key(f, "attention.head_count_kv") or heads
    embed = _int_key(f, "embedding_length") or 0
    head_dim = embed // heads if heads else 0
    k_len = _int_key(f, "attention.key_length") or head_dim
    v_len = _int_key(f, "attention.value_length") or head_dim
    ctx = context if context is not None else (_int_key(f, "context_length") or 0)
    if ctx < 0:
        raise ValueError(f"context must be non-negative, got {ctx}")
    kt = ggml_type(kv_type)
    vt = ggml_type(v_type) if v_type is not None else kt
    n_rec, state = _recurrent_state(f)
    n_layers = max(0, n_layers - n_rec)
    per_row_k = _kv_row_bytes(kt, k_len)
    per_row_v = _kv_row_bytes(vt, v_len)
    per_token = n_layers * kv_heads * (per_row_k + per_row_v)
    note = ""
    window = _int_key(f, "attention.sliding_window")
    if window:
        note = (f"{f.architecture} uses sliding-window attention (window {window}) on some layers; llama.cpp "
                "keeps a smaller cache for those, so this is an upper bound")
    kv_name = kt.name if vt == kt else f"{kt.name}/{vt.name}"
    return MemoryPlan(ctx, kv_name, weights, per_token * ctx, per_token, n_layers, kv_heads, k_len, v_len, note,
                      state, n_rec)


def _recurrent_state(f: GGUFFile) -> tuple[int, int]:
    """(layers, bytes) of the recurrent state llama.cpp keeps per sequence (float32): layers with an
    ``ssm_conv1d`` tensor hold their last ``conv_kernel - 1`` conv inputs and, for the gated delta-net
    (``ssm.time_step_rank`` heads), a state_size x state_size matrix per head, else (Mamba) inner_size x
    state_size values. (0, 0) for models without such layers."""
    convs = [t for t in f.tensors if t.name.endswith(".ssm_conv1d.weight") and len(t.ne) == 2]
    if not convs:
        return 0, 0
    k = _int_key(f, "ssm.conv_kernel") or convs[0].ne[0]
    d_state = _int_key(f, "ssm.state_size") or 0
    heads = _int_key(f, "ssm.time_step_rank") or 0
    inner = _int_key(f, "ssm.inner_size") or 0
    per = max(0, k - 1) * convs[0].ne[1] + (heads * d_state * d_state if heads else inner * d_state)
    return len(convs), 4 * len(convs) * per


def _kv_row_bytes(t: GGMLType, n: int) -> int:
    if n % t.block_elems:  # ggml pads: whole blocks
        n = (n // t.block_elems + 1) * t.block_elems
    return t.row_bytes(n)


