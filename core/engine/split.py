"""Partial offload: the first ``n_gpu`` layers on the GPU, the others and the head on the CPU (llama.cpp's
``-ngl``), behind the one :class:`~.session.InferenceSession` protocol.

The device runs a model built from the first layers' forward descriptions (:func:`~.cuda_description.model_description`
with ``n_layers``; its head tied to the embedding, its logits unused) and hands the residual stream after its last
layer back (``qsc_forward_resid``); a CPU :class:`~.session.Session` with caches for the other layers only
(``first_layer``) runs them from that residual at the same positions, then the CPU head. Each half keeps its own
KV cache (and recurrent state); rewinding, resetting and checkpoints are applied to both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model import ModelConfig
from ..native import ffi as cpu_ffi
from ..native import kernels as K
from ..native import lib as cpu_lib
from .session import (
    ContextFull,
    ForwardTrace,
    Model,
    Session,
    attention_weights,
    check_attention_layer,
    ple_inputs,
)

__all__ = ["SplitSession", "split_allowed"]


def split_allowed(c: ModelConfig, n_gpu: int) -> bool:
    """Can the layers be split before layer ``n_gpu``? Not where a later layer reads an earlier one's KV cache
    across the split (gemma4's shared caches)."""
    return not any(c.kv_source(li) < n_gpu <= li for li in range(c.n_layers))


class _DeviceLayers:
    """The first ``n`` layers on the GPU (or their host emulation): tokens in, the residual stream after layer
    ``n - 1`` out."""

    def __init__(self, model: Model, n_ctx: int, n: int, kv_dtype: type, max_batch: int, host_emulation: bool,
                 graphs: bool = True) -> None:
        from . import cuda_description as cd
        from . import cuda_library as cl

        self.cl = cl
        ok, why = (True, "") if host_emulation else cl.cuda_status()
        if not ok:
            raise cl.CudaUnavailable(why)
        if not 0 < max_batch <= 4096:
            raise ValueError(f"max_batch {max_batch} out of range")
        cd.check_config(model.config)
        c = model.config
        desc, _ = cd.model_description(model, n_ctx, n_layers=n)
        cd.check_description(desc)
        self.model, self.config, self.n = model, c, n
        self.kv_dtype = kv_dtype
        self.recurrent = any(c.is_recurrent(li) for li in range(n))
        self.checkpoint_at: int | None = None
        self._lib = cl._library()
        err = cl._err()
        create = self._lib.qsc_host_model_create if host_emulation else self._lib.qsc_model_create
        mb = min(max_batch, n_ctx)  # chunks of max_batch tokens, never more than the context holds (as cuda_fit)
        ptr = create(desc.model, desc.layers, n_ctx, int(kv_dtype == np.float16), mb, err, cl._ERR_LEN)
        if ptr == cl.ffi.NULL:
            raise cl.CudaError(f"creating the GPU layers: {cl._msg(err)}")
        self._m: Any = ptr
        self._lib.qsc_set_graphs(ptr, int(graphs))  # one-token steps replay a graph (no head: the stream comes back)
        self.device_bytes = int(self._lib.qsc_model_device_bytes(ptr))

    def live(self) -> Any:
        if self._m is None:
            raise self.cl.CudaError("the session is closed")
        return self._m

    def forward(self, ids: np.ndarray, n_past: int, ple: np.ndarray | None) -> np.ndarray:
        """The residual stream after the device's layers, ``(T, n_embd)``, for ``ids`` at ``n_past…`` (the device
        runs no head for it; a one-token step replays a CUDA graph after the first)."""
        cl, c = self.cl, self.config
        i32 = np.ascontiguousarray(ids, dtype=np.int32)
        out = np.empty((i32.size, c.n_embd), np.float32)
        err = cl._err()
        p = cl.ffi.NULL if ple is None else cl._p(ple, "float *")
        cl._check(self._lib.qsc_forward_resid(self.live(), cl._p(i32, "int32_t *"), i32.size, n_past, p,
                                              0 if ple is None else ple.size, cl._p(out, "float *"), err,
                                              cl._ERR_LEN), err, "forward (GPU layers)")
        return out

    def state(self, op: int) -> None:
        err = self.cl._err()
        self.cl._check(self._lib.qsc_recurrent_state(self.live(), op, err, self.cl._ERR_LEN), err,
                       "qsc_recurrent_state")

    def keys(self, layer: int, n_rows: int) -> np.ndarray:
        """Layer ``layer``'s cached K rows ``(n_rows, n_head_kv, head_dim)``, copied back."""
        c, cl = self.config, self.cl
        rows = np.empty((n_rows, c.n_head_kv_at(layer), c.head_dim_at(layer)), self.kv_dtype)
        err = cl._err()
        out = cl.ffi.cast("void *", cl.ffi.from_buffer(rows))
        cl._check(self._lib.qsc_read_cache(self.live(), layer, 0, n_rows, out, rows.nbytes, err, cl._ERR_LEN), err,
                  "read cache")
        return rows

    def close(self) -> None:
        if getattr(self, "_m", None) is not None:
            self._lib.qsc_model_free(self._m)
            self._m = None


class SplitSession:
    """One conversation with layers ``0..n_gpu-1`` on the GPU and the rest (and the head) on the CPU.

    ``n_gpu`` may be 0 (everything on the CPU) or ``n_layers`` (only the head on the CPU). ``host_emulation``: the
    device's layers run by their host twins (tests, no GPU). ``graphs``: the device's one-token steps replay a CUDA
    graph (default) or launch every kernel each time."""

    def __init__(self, model: Model, n_ctx: int, n_gpu: int, kv_dtype: type = np.float16, max_batch: int = 512,
                 host_emulation: bool = False, graphs: bool = True) -> None:
        c = model.config
        if isinstance(n_gpu, bool) or not isinstance(n_gpu, int | np.integer) or not 0 <= n_gpu <= c.n_layers:
            raise ValueError(f"GPU layers must be an integer in 0..{c.n_layers}, not {n_gpu!r}")
        n_gpu = int(n_gpu)
        if not split_allowed(c, n_gpu):
            raise ValueError(f"the layers cannot be split after layer {n_gpu - 1}: a later layer reads the KV cache "
                             "of an earlier one across it")
        self.model, self.config, self.n_gpu = model, c, n_gpu
        self.cpu = Session(model, n_ctx, kv_dtype, first_layer=n_gpu)
        self.n_ctx = self.cpu.n_ctx
        self.dev = (_DeviceLayers(model, self.n_ctx, n_gpu, kv_dtype, max_batch, host_emulation, graphs)
                    if n_gpu else None)
        self.n_past = 0

    # ------------------------------------------------------------------------------------------------ state
    @property
    def kv_bytes(self) -> int:
        """Both halves' KV caches and recurrent states."""
        c = self.config
        item = np.dtype(self.cpu.k_cache[-1].dtype).itemsize
        dev = sum(2 * self.n_ctx * c.n_head_kv_at(li) * c.head_dim_at(li) * item for li in range(self.n_gpu)
                  if c.kv_source(li) == li and not c.is_recurrent(li))
        host = sum(self.cpu.k_cache[i].nbytes + self.cpu.v_cache[i].nbytes for i in range(self.n_gpu, c.n_layers)
                   if c.kv_source(i) == i and not c.is_recurrent(i))
        states = sum(a.nbytes for a in (*self.cpu.conv_state.values(), *self.cpu.ssm_state.values()))
        if self.dev is not None and self.dev.recurrent:
            n_rec = sum(c.is_recurrent(li) for li in range(c.n_layers)) or 1
            states += c.recurrent_state_bytes() * sum(c.is_recurrent(li) for li in range(self.n_gpu)) // n_rec
        return int(dev + host + states)

    @property
    def recurrent(self) -> bool:
        return self.cpu.recurrent or (self.dev is not None and self.dev.recurrent)

    def reset(self) -> None:
        self.cpu.reset()
        if self.dev is not None:
            self.dev.checkpoint_at = None
        self.n_past = 0

    def checkpoint(self) -> None:
        """Save both halves' recurrent states at the current position (a no-op for attention alone)."""
        self.cpu.checkpoint()
        if self.dev is not None and self.dev.recurrent:
            self.dev.state(1)
            self.dev.checkpoint_at = self.n_past

    def truncate(self, n: int) -> None:
        """Forget positions from ``n`` on, in both halves; with recurrent layers ``n_past`` goes back to the
        checkpoint at or before ``n``, else to 0 (as :meth:`Session.truncate`): read ``n_past`` after."""
        n = max(0, min(self.n_past, n))
        if n == self.n_past:
            return
        if self.recurrent:
            ck = self.cpu._checkpoint[0] if self.cpu.recurrent and self.cpu._checkpoint is not None else None
            dck = self.dev.checkpoint_at if self.dev is not None and self.dev.recurrent else None
            cks = [k for k, rec in ((ck, self.cpu.recurrent), (dck, self.dev is not None and self.dev.recurrent))
                   if rec]
            if any(k is None or k > n for k in cks) or len(set(cks)) != 1:
                self.reset()
                return
            n = int(cks[0])  # type: ignore[arg-type]
            if self.dev is not None and self.dev.recurrent:
                self.dev.state(2)
        self.cpu.truncate(n)
        self.n_past = n

    def close(self) -> None:
        """Free the GPU layers' memory now (also when garbage-collected)."""
        if getattr(self, "dev", None) is not None:
            self.dev.close()

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> SplitSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------- forward
    def forward(self, tokens: list[int] | np.ndarray, all_logits: bool = False, logits: bool = True,
                trace: ForwardTrace | None = None) -> np.ndarray:
        """Run ``tokens`` at positions ``n_past…``: the GPU layers, then the CPU's; logits of the last token (or of
        every token), or an empty array with ``logits=False``. ``trace`` (as :meth:`Session.forward`'s) only with no
        GPU layers (the device's stream is not copied back layer by layer here)."""
        m, c, cpu = self.model, self.config, self.cpu
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        T = ids.size
        if T == 0:
            raise ValueError("forward needs at least one token")
        if self.n_past + T > self.n_ctx:
            raise ContextFull(f"context full: {self.n_past} + {T} tokens > {self.n_ctx}")
        if ids.min() < 0 or ids.max() >= c.n_vocab:
            raise ValueError(f"token ids must lie in 0..{c.n_vocab - 1}")
        if trace is not None and self.dev is not None:
            raise ValueError("a traced forward needs every layer on one backend: use all GPU layers or none")
        if self.n_past == 0 and cpu.recurrent:
            cpu._zero_state()
        ple = None
        x0 = None
        if c.ple_dim or self.dev is None or trace is not None:
            x0 = cpu._embed(ids)
            if c.embed_scale != 1.0:
                x0 *= np.float32(c.embed_scale)
            ple = ple_inputs(m, ids, x0) if c.ple_dim else None
        if trace is not None:
            assert x0 is not None
            trace.resid, trace.queries = [x0.copy()], {}
            trace.positions = np.arange(self.n_past, self.n_past + T, dtype=np.int32)
        if self.dev is not None:
            dple = None if ple is None else np.ascontiguousarray(ple[: self.n_gpu].transpose(1, 0, 2))
            x = self.dev.forward(ids, self.n_past, dple)
        else:
            assert x0 is not None
            x = x0
        x = np.ascontiguousarray(x, dtype=np.float32)
        pos = np.arange(self.n_past, self.n_past + T, dtype=np.int32)
        xp = cpu_ffi.cast("float *", cpu_ffi.from_buffer(x))
        posp = cpu_ffi.cast("int32_t *", cpu_ffi.from_buffer(pos))
        for li in range(self.n_gpu, c.n_layers):
            b: Any = cpu._block_structs[li]
            if ple is not None:
                b.ple.inputs, b.ple.inputs_len = cpu_ffi.cast("float *", cpu_ffi.from_buffer(ple[li])), ple[li].size
            q = None if trace is None or c.is_recurrent(li) else np.empty((T, c.n_head, c.head_dim_at(li)),
                                                                           np.float32)
            if q is not None:
                b.probe.q, b.probe.q_len = cpu_ffi.cast("float *", cpu_ffi.from_buffer(q)), q.size
            try:
                K.check(cpu_lib.qs_block_forward(b, xp, T, posp, self.n_past, m.threads), "transformer block")
            finally:
                if q is not None:
                    b.probe.q, b.probe.q_len = cpu_ffi.NULL, 0
            if trace is not None:
                trace.resid.append(x.copy())
                if q is not None:
                    trace.queries[li] = q
        if trace is not None and trace.after_layer is not None:
            for li in range(c.n_layers):
                trace.after_layer(li)
        self.n_past += T
        cpu.n_past = self.n_past
        if not logits:
            return np.empty(0, np.float32)
        out = cpu.head(x if all_logits else x[-1:])
        return out if all_logits else out[0]

    # ------------------------------------------------------------------------------------------- the probes
    def head(self, x: np.ndarray) -> np.ndarray:
        """Logits of residual rows ``x`` by the CPU's final norm and head (the one the forward uses)."""
        return self.cpu.head(x)

    def attention_weights(self, layer: int, queries: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Layer ``layer``'s attention weights ``(T, n_head, n_past)`` against its cached keys (copied back from
        the device for a GPU layer), by the CPU's native attention code."""
        check_attention_layer(self.config, layer)
        if layer >= self.n_gpu:
            return self.cpu.attention_weights(layer, queries, positions)
        assert self.dev is not None
        return attention_weights(self.model, layer, queries, positions, self.dev.keys(layer, self.n_past), self.n_past)

    def set_activation_stats(self, stats: list[dict[str, np.ndarray]] | None) -> None:
        """Activation statistics need every layer on one backend: only ``None`` (off) is taken."""
        if stats is not None:
            raise ValueError("activation statistics need every layer on one backend: use all GPU layers or none")
        self.cpu.set_activation_stats(None)
