"""A :class:`~.session.Model` in the CUDA library's terms: the configuration check, the forward description
(``qsc_model_desc`` and the CPU block's own ``qs_block`` s) and the weights as they are uploaded (types without GPU
kernels dequantized to F32; :func:`packed_bytes`, their size on the device). The library checks a description
(:func:`check_description`); Python keeps no list of the device's features.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base.ggml_types import GGMLType, ggml_type
from ..model import ARCHITECTURES, ModelConfig, UnsupportedModel, Weight
from ..native import ffi as cpu_ffi
from ..native import kernels as K
from .cuda_library import (
    _ERR_LEN,
    CudaError,
    _err,
    _floats,
    _gpu_type,
    _library,
    _matrix,
    _msg,
    _p,
    ffi,
    gpu_types,
)
from .session import Model, _Bound, _layer_matrices, layer_description

__all__ = ["Description", "check_config", "check_description", "device_weight", "model_description", "packed_bytes"]

#: The largest head size the GPU attention takes (the CPU block's limit too).
MAX_HEAD = 1024


def check_config(cfg: ModelConfig) -> None:
    """Refuse, with the reason, a model whose features or shapes the GPU kernels do not handle."""
    if cfg.arch not in ARCHITECTURES:
        raise UnsupportedModel(f"architecture {cfg.arch!r} is not supported by the engine")
    sizes = (cfg.n_layers, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff, cfg.n_vocab)
    if min(sizes) <= 0:
        raise UnsupportedModel(f"non-positive model size in {sizes}")
    if cfg.n_embd % 32:
        raise UnsupportedModel(f"n_embd {cfg.n_embd} must be a multiple of 32 on the GPU")
    for li in range(cfg.n_layers):  # every layer its own heads, head size, FFN width and rotated size
        kv, hd, ff, rd = cfg.n_head_kv_at(li), cfg.head_dim_at(li), cfg.n_ff_at(li), cfg.rope_dim_at(li)
        where = f"layer {li}: " if cfg.n_layers > 1 else ""
        if kv <= 0 or cfg.n_head % kv:
            raise UnsupportedModel(f"{where}n_head {cfg.n_head} is not a multiple of n_head_kv {kv}")
        if not 0 < hd <= MAX_HEAD or cfg.n_head * hd % 32:
            raise UnsupportedModel(f"{where}head size {hd} has no CUDA path (at most {MAX_HEAD}, n_head x head size "
                                   "a multiple of 32)")
        if cfg.uses_rope(li) and (rd <= 0 or rd % 2 or rd > hd):
            raise UnsupportedModel(f"{where}rope_dim {rd} invalid for head_dim {hd}")
        if ff <= 0 or ff % 32:
            raise UnsupportedModel(f"{where}n_ff {ff} must be a positive multiple of 32 on the GPU")
    if max(sizes) >= 2**31:
        raise UnsupportedModel("model size does not fit in int32")


class Description:
    """A model's forward description in the CUDA library's types: ``model`` (``qsc_model_desc *``) and
    ``layers`` (``qs_block[]``, the CPU block's own descriptions, :func:`~.session.layer_description`, copied),
    with the host arrays their pointers reach kept alive (``keep``) and ``matrices``, every matrix's (type, rows,
    k) as it is uploaded. Built by :func:`model_description`."""

    def __init__(self, model: Any, layers: Any, n_layers: int, keep: list[Any],
                 matrices: list[tuple[GGMLType, int, int]]) -> None:
        self.model, self.layers, self.n_layers, self.keep, self.matrices = model, layers, n_layers, keep, matrices


def _bound(w: Weight, keep: list[Any], matrices: list[tuple[GGMLType, int, int]], padded: bool = False) -> _Bound:
    t, data = device_weight(w)
    raw = _matrix(data, t, w.rows, w.k, padded)
    keep.append(raw)
    matrices.append((t, w.rows, -(-w.k // 32) * 32 if padded else w.k))
    return _Bound(t.id, cpu_ffi.cast("uint8_t *", cpu_ffi.from_buffer(raw)), w.rows, w.k, int(raw.nbytes))


def model_description(model: Model, n_ctx: int, n_layers: int | None = None) -> tuple[Description, list[Any]]:
    """``model``'s forward description for the GPU, its weights as they are uploaded (:func:`device_weight`: types
    without GPU kernels dequantized to F32), and its layers' ``qs_block`` s as the CPU describes them. The library
    names what it refuses (:func:`check_description`); Python keeps no list of the device's features.
    ``n_layers``: only the first layers (partial offload, core/engine/split.py), head tied (its logits unused)."""
    c, mw = model.config, model.weights
    n = c.n_layers if n_layers is None else n_layers
    keep: list[Any] = []
    matrices: list[tuple[GGMLType, int, int]] = []
    rope_factors = mw.rope_factors(n_ctx)
    cpu_blocks = []
    for li, lw in enumerate(mw.layers[:n]):
        lb = {key: _bound(w, keep, matrices, padded=key in ("ple_proj", "wsd")) for key, w in _layer_matrices(lw)}
        if lw.wv is lw.wk and "wk" in lb:
            lb["wv"] = lb["wk"]
        cpu_blocks.append(layer_description(c, li, lw, lb, rope_factors))
    size = ffi.sizeof("qs_block")
    if size != cpu_ffi.sizeof("qs_block"):
        raise CudaError(f"qs_block is {size} bytes here and {cpu_ffi.sizeof('qs_block')} in the CPU library")
    layers = ffi.new("qs_block[]", max(1, len(cpu_blocks)))
    for i, b in enumerate(cpu_blocks):
        ffi.memmove(layers + i, cpu_ffi.buffer(b), size)
    md = ffi.new("qsc_model_desc *")
    md.n_layers, md.n_vocab, md.eps, md.embed_scale = n, c.n_vocab, c.rms_eps, c.embed_scale
    md.final_softcap, md.logit_scale = c.final_softcap, c.logit_scale
    tied = mw.tied or n_layers is not None
    for field, w in (("tok_embd", mw.tok_embd), ("output", None if tied else mw.output)):
        if w is not None:
            bw = _bound(w, keep, matrices)
            d = getattr(md, field)
            d.ptr, d.type, d.bytes, d.rows, d.k = ffi.cast("uint8_t *", cpu_ffi.cast("uintptr_t", bw.ptr)), \
                bw.type_id, bw.nbytes, bw.rows, bw.k
    if tied:
        matrices.append(matrices[-1])  # the head reads the embedding's copy
    norm = _floats(mw.output_norm, "output_norm").reshape(-1)
    keep.append(norm)
    md.output_norm.ptr, md.output_norm.len = _p(norm, "float *"), norm.size
    kv_source = np.array([c.kv_source(li) for li in range(n)], np.int32)
    keep.append(kv_source)
    md.kv_source = _p(kv_source, "int32_t *")
    keep += cpu_blocks
    return Description(md, layers, len(cpu_blocks), keep, matrices), cpu_blocks


def check_description(desc: Description) -> None:
    """The C side's whole check of a description (host only, no device call): :class:`CudaError` with its
    reason (a feature the device lacks, a missing group, a size, type or byte count that does not add up)."""
    err = _err()
    if _library().qsc_check_model(desc.model, desc.layers, err, _ERR_LEN) != 0:
        raise CudaError(f"qsc_check_model: {_msg(err)}")


def packed_bytes(qtype: GGMLType | int | str, rows: int, k: int) -> int:
    """Device bytes of a ``rows`` x ``k`` matrix after repacking (for F32/F16/quantized GPU types)."""
    t = _gpu_type(qtype)
    n = int(_library().qsc_packed_bytes(t.id, rows, k))
    if n < 0:
        raise ValueError(f"{rows} x {k} {t.name} cannot be packed")
    return n


def device_weight(w: Weight) -> tuple[GGMLType, np.ndarray]:
    """The type and raw bytes a weight is uploaded as: as stored for GPU types, else dequantized to F32."""
    t = w.type
    if t.id in gpu_types():
        return t, w.data
    if not K.can_dequantize(t):
        raise UnsupportedModel(f"{w.name} is {t.name}: neither a GPU kernel nor a dequantizer handles it")
    dense = K.dequantize(w.data.reshape(w.rows, -1), t).reshape(-1)
    return ggml_type("F32"), dense.view(np.uint8)
