"""Does a model fit on the GPU? The device memory a :class:`~.cuda_backend.CudaSession` will hold, computed before
anything is uploaded, and the ``--backend auto`` decision made from it.

The figure is what ``qsc_model_create`` allocates (csrc/cuda/qsc_device.cu): every matrix as it is stored on the
device (repacked, still quantized for the GPU types; F32 for the types dequantized on upload), every vector, the KV
cache at the requested context, the scratch of one ``max_batch`` chunk (activations, their int8 copies, the
all-token logits, the experts' routing buffers), each allocation rounded to 256 bytes, plus a margin for the
allocator and the CUDA runtime's own buffers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..model import ModelConfig, Weight
from .session import Model, _layer_matrices

__all__ = ["MARGIN_BYTES", "DeviceEstimate", "choose_gpu", "choose_layers", "device_estimate", "gpu_fit",
           "gpu_layers_fit", "partial_estimate"]

#: kept free beyond the estimate: the allocator's granularity, the runtime's and the driver's own allocations
MARGIN_BYTES = 256 << 20
_ALIGN = 256
#: flash-decoding's partials per head (csrc/cuda/qsc_decode.cuh: FD_MAX_PARTS, tokens x splits)
FLASHDEC_PARTS = 128


def _round(n: int) -> int:
    return max(_ALIGN, (n + _ALIGN - 1) // _ALIGN * _ALIGN)


@dataclass(frozen=True)
class DeviceEstimate:
    """Device bytes of one session, by part (``total`` includes :data:`MARGIN_BYTES`)."""

    weights: int
    kv: int
    scratch: int
    n_ctx: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.scratch + MARGIN_BYTES


def _matrix_bytes(w: Weight, k: int | None = None) -> int:
    """``w`` as the device stores it: its repacked layout (the library's own figure) for a GPU type, F32 rows for a
    type dequantized on upload; ``k``: its rows padded to that many columns (gemma4's per-layer projection)."""
    from . import cuda_description as cd
    from . import cuda_library as cl

    k = w.k if k is None else k
    f32 = w.rows * k * 4
    if w.type.id not in cl.gpu_types():
        return _round(f32)
    try:
        return _round(cd.packed_bytes(w.type, w.rows, k))
    except (cl.CudaError, ValueError):  # no library (a test without one) or a shape it refuses: the file's bytes
        return _round(int(w.data.nbytes) * k // w.k)


def _ple_pad(c: ModelConfig) -> int:
    """gemma4's per-layer embedding width as the device pads it (32-element units; 0 without one)."""
    return (c.ple_dim + 31) // 32 * 32


def _layer_extra_bytes(model: Model, li: int, n_ctx: int) -> int:
    """What layer ``li`` uploads beyond its matrices and vectors as :func:`_layer_matrices` lists them: its own copy
    of the RoPE frequency factors (every layer that rotates gets one; counted for all), and gemma4's per-layer
    projection padded to 32-column units."""
    c, lw = model.config, model.weights.layers[li]
    factors = model.weights.rope_factors(n_ctx)
    n = _round(int(np.asarray(factors).size) * 4) if factors is not None else 0
    if lw.ple_proj is not None and _ple_pad(c) != lw.ple_proj.k:
        n += _matrix_bytes(lw.ple_proj, _ple_pad(c)) - _matrix_bytes(lw.ple_proj)
    return n


def device_estimate(model: Model, n_ctx: int, kv_dtype: type = np.float16, max_batch: int = 512) -> DeviceEstimate:
    """The device memory a session of ``model`` at ``n_ctx`` positions will hold; reads sizes only (nothing is
    dequantized or uploaded)."""
    c, mw = model.config, model.weights
    weights = 0
    for li, lw in enumerate(mw.layers):
        weights += _layer_extra_bytes(model, li, n_ctx)
        for _key, w in _layer_matrices(lw):
            weights += _matrix_bytes(w)
        if lw.wv is not None and lw.wv is lw.wk:  # bound twice, uploaded twice
            weights += _matrix_bytes(lw.wv)
        for part in (lw, lw.gdn) if lw.gdn is not None else (lw,):  # the delta-net's conv kernel and vectors
            for f in dataclasses.fields(part):
                v = getattr(part, f.name)
                if isinstance(v, np.ndarray):
                    weights += _round(int(v.size) * 4)
    weights += _matrix_bytes(mw.tok_embd)
    if not mw.tied:
        weights += _matrix_bytes(mw.output)
    weights += _round(int(np.asarray(mw.output_norm).size) * 4)
    kv_item = np.dtype(kv_dtype).itemsize
    kv = 2 * sum(_round(n_ctx * c.n_head_kv_at(li) * c.head_dim_at(li) * kv_item) for li in range(c.n_layers))
    T = min(max_batch, n_ctx)  # the sessions make their chunks no longer than the context
    E, V = c.n_embd, c.n_vocab
    QD = max(c.n_head * c.head_dim_at(li) for li in range(c.n_layers))
    KD = max(c.n_head_kv_at(li) * c.head_dim_at(li) for li in range(c.n_layers))
    F = max(c.n_ff_at(li) for li in range(c.n_layers))
    recurrent = any(c.is_recurrent(li) for li in range(c.n_layers))
    Vd = c.ssm_v_heads * c.ssm_state if recurrent else 0  # the delta-net's ssm_out input
    P, Pp = c.ple_dim, _ple_pad(c)
    kmax = max(E, QD, F, c.n_ff_shexp, Vd, Pp)
    f4 = [3 * T * E, 2 * T * QD, 2 * T * KD, 3 * T * F,  # x h o, q att, k v, g u a
          2 * T * kmax // 32, T * kmax // 256 + 1, T * kmax // 16, 2 * T + 1, V,  # scales, params, last logits
          T * V,  # the all-token logits (allocated by the first forward that asks for them, one chunk's)
          c.n_layers * (2 * E + QD + F)]  # the activation statistics' sums (allocated when they are collected)
    if P:  # gemma4's per-layer embedding: pg, pa (padded) and the call's per-layer inputs
        f4 += [T * Pp, T * Pp, T * c.n_layers * P]
    scratch = sum(_round(n * 4) for n in f4) + 2 * _round(T * kmax)  # + the int8 activations
    if c.n_expert:  # qsc_moe.cuh's moe_finalize: per sorted (token, pick) row, the grouping, the shared expert
        P, NE = T * c.n_expert_used, c.n_expert
        FS = -(-c.n_ff_shexp // 32) * 32  # (run padded to 32)
        km = max(E, F, FS)
        f4 = [T * NE, P, P, P, P, NE + 1, 3 * P, 1,  # logits, weights, picks, pairs, trow, off, tiles, count
              P * E, P * E, P * F, P * F, P * F,  # hb ob, g u a
              P * km // 32, P * km // 32, P * km // 256 + 1, P * km // 16]  # the int8 copies' scales
        if FS:
            f4 += [T * FS, T * FS, T * FS, T * E]
        scratch += sum(_round(n * 4) for n in f4) + 2 * _round(P * km)
    if recurrent:  # qsc_gdn.cuh's gdn_finalize: the state and its checkpoint, the mixer's scratch
        kv += 2 * _round(c.recurrent_state_bytes())
        scratch += sum(_round(n * 4) for n in (2 * T * c.ssm_channels, 2 * T * Vd, 2 * T * c.ssm_v_heads))
    # flash-decoding's partials (csrc/cuda/qsc_decode.cuh, fd_scratch_floats): FD_MAX_PARTS per head of the widest layer
    hw = max(c.n_head * (c.head_dim_at(li) + 2) for li in range(c.n_layers))
    scratch += _round(FLASHDEC_PARTS * hw * 4)
    if c.q_gate:  # gated attention: wq's output and the gates
        scratch += _round(2 * T * QD * 4) + _round(T * QD * 4)
    return DeviceEstimate(weights, kv, scratch, n_ctx)


def _mib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def choose_gpu(est: DeviceEstimate, free_bytes: int) -> tuple[bool, str]:
    """(use the GPU?, the reason in one line with the numbers): the GPU when the session fits in ``free_bytes``."""
    parts = (f"weights {_mib(est.weights)} + KV cache {_mib(est.kv)} at {est.n_ctx} positions + scratch "
             f"{_mib(est.scratch)} + margin {_mib(MARGIN_BYTES)} = {_mib(est.total)}")
    if est.total <= free_bytes:
        return True, f"fits in GPU memory: {parts} of {_mib(free_bytes)} free"
    return False, f"does not fit in GPU memory: {parts} needed, {_mib(free_bytes)} free"


def gpu_fit(model: Model, n_ctx: int) -> tuple[bool, str]:
    """``--backend auto``'s memory check: does a session of ``model`` at ``n_ctx`` fit in the device's free memory
    now (and the one-line reason)? True with no reason when the free figure cannot be read (the session's own
    allocation then decides)."""
    from . import cuda_library as cl

    try:
        free = int(cl.device_properties()["free_mem"])
    except cl.CudaError:
        return True, ""
    return choose_gpu(device_estimate(model, n_ctx), free)


# ------------------------------------------------------------------------------------------ partial offload
def _layer_weight_bytes(model: Model, li: int, n_ctx: int) -> int:
    """Device bytes of layer ``li``'s matrices and vectors (as :func:`device_estimate` counts them)."""
    lw = model.weights.layers[li]
    n = _layer_extra_bytes(model, li, n_ctx) + sum(_matrix_bytes(w) for _key, w in _layer_matrices(lw))
    if lw.wv is not None and lw.wv is lw.wk:
        n += _matrix_bytes(lw.wv)
    for part in (lw, lw.gdn) if lw.gdn is not None else (lw,):
        for f in dataclasses.fields(part):
            v = getattr(part, f.name)
            if isinstance(v, np.ndarray):
                n += _round(int(v.size) * 4)
    return n


def _layer_kv_bytes(model: Model, li: int, n_ctx: int, kv_dtype: type = np.float16) -> int:
    c = model.config
    return 2 * _round(n_ctx * c.n_head_kv_at(li) * c.head_dim_at(li) * np.dtype(kv_dtype).itemsize)


def partial_estimate(model: Model, n_ctx: int, n_layers: int, full: DeviceEstimate | None = None) -> DeviceEstimate:
    """The device bytes of a split session (core/engine/split.py) with the first ``n_layers`` layers on the GPU:
    the whole model's estimate less the other layers' weights and KV cache and the output matrix (the device's
    head is tied to the embedding there and never run, so no all-token logits either). The scratch is otherwise
    the whole model's (its widest layer may be on the GPU; an overestimate otherwise)."""
    c, mw = model.config, model.weights
    if isinstance(n_layers, bool) or not 0 <= n_layers <= c.n_layers:
        raise ValueError(f"{n_layers!r} GPU layers: the model has {c.n_layers}")
    est = full or device_estimate(model, n_ctx)
    if n_layers == c.n_layers:
        return est
    rest = range(n_layers, c.n_layers)
    weights = est.weights - sum(_layer_weight_bytes(model, li, n_ctx) for li in rest)
    if not mw.tied:
        weights -= _matrix_bytes(mw.output)
    kv = est.kv - sum(_layer_kv_bytes(model, li, n_ctx) for li in rest)
    if any(c.is_recurrent(li) for li in rest) and not any(c.is_recurrent(li) for li in range(n_layers)):
        kv -= 2 * _round(c.recurrent_state_bytes())
    T = min(512, n_ctx)  # device_estimate's chunk: the split's device half never allocates the all-token logits
    return DeviceEstimate(weights, kv, est.scratch - _round(T * c.n_vocab * 4), n_ctx)


def choose_layers(model: Model, n_ctx: int, free_bytes: int) -> tuple[int, str]:
    """``--backend auto``'s partial offload: (layers on the GPU, the reason in one line with the numbers): every
    layer when the whole session fits in ``free_bytes``, else the most leading layers whose weights and KV cache
    fit with the embedding, the scratch and the margin (0: not even one layer fits). A split is never made
    between a layer and an earlier one whose KV cache it reads (core/engine/split.py)."""
    c = model.config
    L = c.n_layers
    full = device_estimate(model, n_ctx)
    ok, why = choose_gpu(full, free_bytes)
    if ok:
        return L, why
    from .split import split_allowed

    best = 0
    for n in range(L - 1, 0, -1):
        if split_allowed(c, n) and partial_estimate(model, n_ctx, n, full).total <= free_bytes:
            best = n
            break
    if best == 0:
        return 0, why
    est = partial_estimate(model, n_ctx, best, full)
    return best, (f"{best} of {L} layers on the GPU ({why}; the first {best}: {_mib(est.total)} with KV cache "
                  f"{_mib(est.kv)} and scratch {_mib(est.scratch)}), the rest on the CPU")


def gpu_layers_fit(model: Model, n_ctx: int) -> tuple[int, str]:
    """:func:`choose_layers` against the device's free memory now; every layer with no reason when the free
    figure cannot be read (the session's own allocation then decides)."""
    from . import cuda_library as cl

    try:
        free = int(cl.device_properties()["free_mem"])
    except cl.CudaError:
        return model.config.n_layers, ""
    return choose_layers(model, n_ctx, free)
