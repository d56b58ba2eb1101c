"""Optional CUDA backend: the whole forward pass on an NVIDIA GPU, behind the CPU :class:`Session` API
(:class:`CudaSession`). The library it drives is :mod:`.cuda_library`; the model it uploads is described by
:mod:`.cuda_description`; single kernels and their host twins are :mod:`.cuda_kernels`. Weights are uploaded once,
repacked but still quantized; types without GPU kernels are dequantized to F32 on upload. Every size is validated
before a pointer reaches C.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model import ModelConfig
from ..native import kernels as K
from .cuda_description import check_config, check_description, model_description, packed_bytes
from .cuda_library import (
    _ERR_LEN,
    CudaError,
    CudaUnavailable,
    _check,
    _err,
    _library,
    _msg,
    _p,
    cuda_status,
    ffi,
)
from .session import (
    ContextFull,
    ForwardTrace,
    Model,
    attention_weights,
    check_activation_stats,
    check_attention_layer,
    head_scales,
    ple_inputs,
)

__all__ = ["CudaSession"]


class CudaSession:
    """One conversation on the GPU, with the CPU :class:`~quantscope.core.engine.session.Session`'s API.

    The weights of ``model`` are uploaded when the session is created (one copy per session) and the KV cache
    lives on the device; :meth:`forward` returns the logits on the host. ``host_emulation``: the device's forward
    pass run on the CPU instead (every kernel replaced by its host twin, csrc/cuda/qsc_emul.cuh; no GPU needed,
    slow): what tests use to check the device code's whole forward on machines without a GPU.
    """

    def __init__(self, model: Model, n_ctx: int = 2048, kv_dtype: type = np.float16, max_batch: int = 512,
                 graphs: bool = True, host_emulation: bool = False) -> None:
        ok, why = (True, "") if host_emulation else cuda_status()
        if not ok:
            raise CudaUnavailable(why)
        if not 0 < n_ctx < 2**31 or not 0 < max_batch <= 4096:
            raise ValueError(f"n_ctx {n_ctx} / max_batch {max_batch} out of range")
        if isinstance(kv_dtype, str) or kv_dtype not in (np.float16, np.float32):
            raise ValueError(f"the CUDA backend holds an F16 or F32 KV cache only, not {kv_dtype!r} "
                             "(quantized and BF16 caches run on the CPU)")
        check_config(model.config)
        c = model.config
        desc, _ = model_description(model, n_ctx)
        check_description(desc)
        self.model = model
        self.config: ModelConfig = c
        self.n_ctx = n_ctx
        self.kv_dtype = kv_dtype
        self.n_past = 0
        self._checkpoint: int | None = None  # the position whose recurrent state the device saved
        self.weight_bytes_per_token = sum(packed_bytes(t, rows, k) for t, rows, k in desc.matrices)
        self._lib = _library()
        err = _err()
        create = self._lib.qsc_host_model_create if host_emulation else self._lib.qsc_model_create
        # scratch for chunks of max_batch tokens, and never more than the context holds (cuda_fit counts the same)
        ptr = create(desc.model, desc.layers, n_ctx, int(kv_dtype == np.float16), min(max_batch, n_ctx), err,
                     _ERR_LEN)
        if ptr == ffi.NULL:
            raise CudaError(f"{'qsc_host_model_create' if host_emulation else 'qsc_model_create'}: {_msg(err)}")
        self._m: Any = ptr
        self._stats: list[dict[str, np.ndarray]] | None = None
        try:
            self._lib.qsc_set_graphs(self._m, int(graphs))
        except BaseException:
            self.close()
            raise

    @property
    def kv_bytes(self) -> int:
        c = self.config
        per_pos = sum(c.n_head_kv_at(li) * c.head_dim_at(li) for li in range(c.n_layers) if c.kv_source(li) == li)
        return 2 * self.n_ctx * per_pos * np.dtype(self.kv_dtype).itemsize

    @property
    def device_bytes(self) -> int:
        """Device memory held: weights, KV cache and scratch."""
        return int(self._lib.qsc_model_device_bytes(self._m)) if self._m is not None else 0

    @property
    def debug(self) -> bool:
        """Does this session run in the debug mode (``QUANTSCOPE_CUDA_DEBUG=1`` when it was made: every launch
        synchronized and checked, a fault named by its kernel and shapes; docs/engine.md §10)?"""
        return bool(self._lib.qsc_model_debug(self._live()))

    def set_graphs(self, enabled: bool) -> None:
        """Replay one-token steps from a CUDA graph (default) or launch every kernel each time."""
        self._lib.qsc_set_graphs(self._live(), int(enabled))

    def _live(self) -> Any:
        if self._m is None:
            raise CudaError("the session is closed")
        return self._m

    def reset(self) -> None:
        self.n_past = 0
        self._checkpoint = None

    def _state(self, op: int) -> None:
        err = _err()
        _check(self._lib.qsc_recurrent_state(self._live(), op, err, _ERR_LEN), err, "qsc_recurrent_state")

    def truncate(self, n: int) -> None:
        """Forget cached positions from ``n`` on (e.g. to rewind a turn). With delta-net layers, as the CPU
        session: ``n_past`` goes back to the checkpoint (:meth:`checkpoint`) if it is at or before ``n``, else to
        0 (the forward zeroes the state at position 0): read ``n_past`` after."""
        n = max(0, min(self.n_past, n))
        if not self.recurrent or n == self.n_past:
            self.n_past = n
            return
        ck = self._checkpoint
        if ck is not None and ck <= n:
            self._state(2)
            self.n_past = ck
        else:
            self.reset()

    def checkpoint(self) -> None:
        """Save the recurrent state at the current position (on the device), so that :meth:`truncate` can return
        to it; a no-op for attention-only models, whose cache rewinds to any position."""
        if self.recurrent:
            self._state(1)
            self._checkpoint = self.n_past

    @property
    def recurrent(self) -> bool:
        """Has the model gated delta-net layers, whose state cannot be rewound position by position?"""
        c = self.config
        return any(c.is_recurrent(li) for li in range(c.n_layers))

    def forward(self, tokens: list[int] | np.ndarray, all_logits: bool = False, logits: bool = True,
                trace: ForwardTrace | None = None) -> np.ndarray:
        """Run ``tokens`` at positions ``n_past…``; returns logits of the last token (or of every token).
        ``logits=False`` is accepted for the CPU session's interface; the head is computed anyway (cheap on a GPU).
        ``trace``: copy this call's residual stream and queries back from the device (:class:`ForwardTrace`, as
        the CPU's; ``after_layer`` is called for each layer once the device pass is done); off, nothing is
        copied."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        T = ids.size
        if T == 0:
            raise ValueError("forward needs at least one token")
        if self.n_past + T > self.n_ctx:
            raise ContextFull(f"context full: {self.n_past} + {T} tokens > {self.n_ctx}")
        V = self.config.n_vocab
        if ids.min() < 0 or ids.max() >= V:
            raise ValueError(f"token ids must lie in 0..{V - 1}")
        i32 = ids.astype(np.int32)
        out = np.empty((T, V) if all_logits else (V,), np.float32)
        c, m = self.config, self._live()
        err = _err()
        ple = None
        if self.config.ple_dim:  # gemma4: the per-layer inputs of these tokens, [T][n_layers][ple_dim]
            e = self.model.tok_embd
            x = K.get_rows(e.type, e.data, e.rows, e.k, ids, threads=self.model.threads)
            if self.config.embed_scale != 1.0:
                x *= np.float32(self.config.embed_scale)
            ple = np.ascontiguousarray(ple_inputs(self.model, ids, x).transpose(1, 0, 2))

        def run() -> None:
            if ple is not None:
                _check(self._lib.qsc_forward_ple(m, _p(i32, "int32_t *"), T, self.n_past, int(all_logits),
                                                 _p(out, "float *"), _p(ple, "float *"), ple.size, err, _ERR_LEN),
                       err, "forward")
            else:
                _check(self._lib.qsc_forward(m, _p(i32, "int32_t *"), T, self.n_past, int(all_logits),
                                             _p(out, "float *"), err, _ERR_LEN), err, "forward")

        if trace is None:
            run()
        else:
            resid = np.empty((c.n_layers + 1, T, c.n_embd), np.float32)
            queries = np.empty((c.n_layers, T, c.n_head, c.head_dim), np.float32)
            _check(self._lib.qsc_probe_trace(m, _p(resid, "float *"), _p(queries, "float *"), T, err, _ERR_LEN),
                   err, "probe trace")
            try:
                run()
            finally:
                self._lib.qsc_probe_trace(m, ffi.NULL, ffi.NULL, 0, ffi.NULL, 0)
            trace.resid, trace.positions = list(resid), np.arange(self.n_past, self.n_past + T, dtype=np.int32)
            trace.queries = {li: q for li, q in enumerate(queries) if not c.is_recurrent(li)}  # as the CPU's
            if trace.after_layer is not None:
                for li in range(c.n_layers):
                    trace.after_layer(li)
        if self._stats is not None and T > 1:
            self._add_stats()
        self.n_past += T
        return out

    # ---------------------------------------------------------------------------------------------- the probes
    def head(self, x: np.ndarray) -> np.ndarray:
        """Logits of residual-stream rows ``x`` (n, n_embd) on the device, by the forward pass's own final norm
        and output head (kernels and int8 activations: the last row of the stream a traced forward leaves gives
        that forward's logits); granite's scale and gemma2's soft-cap as the CPU's head applies them."""
        c = self.config
        xa = np.ascontiguousarray(x, dtype=np.float32)
        if xa.ndim != 2 or xa.shape[1] != c.n_embd or not 0 < xa.shape[0] < 2**31:
            raise ValueError(f"rows of {c.n_embd} values are needed, not {xa.shape}")
        out = np.empty((xa.shape[0], c.n_vocab), np.float32)
        err = _err()
        _check(self._lib.qsc_head(self._live(), _p(xa, "float *"), xa.shape[0], _p(out, "float *"), err, _ERR_LEN),
               err, "head")
        return head_scales(c, out)

    def cache_rows(self, layer: int, which: str = "k") -> np.ndarray:
        """Layer ``layer``'s cached K (``k``) or V (``v``) rows ``(n_past, n_head_kv, head_dim)`` copied back from
        the device, in the cache's type."""
        c = self.config
        if (isinstance(layer, bool) or not 0 <= layer < c.n_layers or which not in ("k", "v")
                or c.is_recurrent(layer)):  # a delta-net layer has a recurrent state instead
            raise ValueError(f"no {which!r} cache for layer {layer!r}")
        rows = np.empty((self.n_past, c.n_head_kv, c.head_dim), self.kv_dtype)
        err = _err()
        _check(self._lib.qsc_read_cache(self._live(), layer, int(which == "v"), self.n_past,
                                        ffi.cast("void *", ffi.from_buffer(rows)), rows.nbytes, err, _ERR_LEN),
               err, "read cache")
        return rows

    def attention_weights(self, layer: int, queries: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Layer ``layer``'s attention weights ``(T, n_head, n_past)`` for ``queries`` (a :class:`ForwardTrace`'s)
        at ``positions``: the layer's cached keys are copied back from the device and the CPU's native attention
        code computes the weights against them (as :meth:`Session.attention_weights`)."""
        check_attention_layer(self.config, layer)
        return attention_weights(self.model, layer, queries, positions, self.cache_rows(layer, "k"), self.n_past)

    def set_activation_stats(self, stats: list[dict[str, np.ndarray]] | None) -> None:
        """As :meth:`Session.set_activation_stats`: the device adds each product's squared inputs on prompts onto
        ``stats``' values (uploaded here), in the CPU block's order, and each prompt's forward copies the sums back
        into ``stats`` (per-expert statistics have no CUDA path)."""
        c = self.config
        init = None
        if stats is not None:
            check_activation_stats(stats, c.n_layers)
            sizes = {"attn": c.n_embd, "wo": c.n_head * c.head_dim, "ffn": c.n_embd, "down": c.n_ff}
            for li, d in enumerate(stats):
                if "count" in d:
                    raise ValueError("per-expert statistics have no CUDA path")
                for key, a in d.items():
                    if key in sizes and a.size != sizes[key]:
                        raise ValueError(f"layer {li} {key}: {a.size} values, not {sizes[key]}")
            init = np.zeros((c.n_layers, sum(sizes.values())), np.float32)
            for d, row in zip(stats, init, strict=True):
                for key, part in self._stats_parts():
                    if key in d:
                        row[part] = d[key]
        err = _err()
        _check(self._lib.qsc_stats_enable(self._live(), ffi.NULL if init is None else _p(init, "float *"),
                                          0 if init is None else init.size, err, _ERR_LEN), err, "statistics")
        self._stats = stats

    def _stats_parts(self) -> list[tuple[str, slice]]:
        """Where each product's sums lie in a layer's row of the device's statistics (qsc_probe.cuh)."""
        c = self.config
        E, QD, F = c.n_embd, c.n_head * c.head_dim, c.n_ff
        return [("attn", slice(0, E)), ("wo", slice(E, E + QD)), ("ffn", slice(E + QD, 2 * E + QD)),
                ("down", slice(2 * E + QD, 2 * E + QD + F))]

    def _add_stats(self) -> None:
        c = self.config
        parts = self._stats_parts()
        sums = np.empty((c.n_layers, parts[-1][1].stop), np.float32)
        err = _err()
        _check(self._lib.qsc_stats_read(self._live(), _p(sums, "float *"), sums.size, err, _ERR_LEN), err,
               "statistics")
        assert self._stats is not None
        for d, row in zip(self._stats, sums, strict=True):
            for key, part in parts:
                if key in d:
                    d[key][...] = row[part]

    def close(self) -> None:
        """Free the device memory now (also done when the session is garbage-collected)."""
        if getattr(self, "_m", None) is not None:
            self._lib.qsc_model_free(self._m)
            self._m = None

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> CudaSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

