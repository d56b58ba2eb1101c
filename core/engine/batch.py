"""One decode step of several sequences in one forward pass: a server's parallel slots, each its own
:class:`~.session.Session` of the same model, their next tokens as the rows of one matrix product per weight
(csrc ``qs_block_forward_seqs``: each row stores its K/V in, and attends to, its own session's cache)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..native import ffi, lib
from ..native import kernels as K
from .session import ContextFull, Session

#: at most this many sequences per batched step (the native side's bound)
MAX_BATCH = 4096


def can_batch(sessions: Sequence[object]) -> bool:
    """Whether :func:`forward_batch` can run these sessions together: CPU sessions of one model without recurrent
    layers (their state is per sequence and not batched) and without activation statistics."""
    if not sessions or len(sessions) > MAX_BATCH:
        return False
    first = sessions[0]
    return all(type(s) is Session and s.model is getattr(first, "model", None) and not s.recurrent
               and getattr(s, "_stats", None) is None for s in sessions)


def forward_batch(sessions: Sequence[Session], tokens: Sequence[int]) -> np.ndarray:
    """Logits ``(len(sessions), n_vocab)``: ``tokens[i]`` evaluated at the end of ``sessions[i]`` (whose
    ``n_past`` grows by one), all in one pass per layer. The same as each session's ``forward([token])`` up to
    the rounding of a batched product. ``ValueError`` when :func:`can_batch` says no, for repeated sessions or
    tokens outside the vocabulary; :class:`ContextFull` when a session has no room."""
    n = len(sessions)
    if n != len(tokens) or not can_batch(sessions):
        raise ValueError("forward_batch needs one token for each of several CPU sessions of one model without "
                         "recurrent layers")
    if len({id(s) for s in sessions}) != n:
        raise ValueError("a session appears twice in the batch")
    m = sessions[0].model
    c = m.config
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if ids.min() < 0 or ids.max() >= c.n_vocab:
        raise ValueError(f"token ids must lie in 0..{c.n_vocab - 1}")
    full = next((s for s in sessions if s.n_past >= s.n_ctx), None)
    if full is not None:
        raise ContextFull(f"context full: {full.n_past} + 1 tokens > {full.n_ctx}")
    pos = np.array([s.n_past for s in sessions], dtype=np.int32)
    n_pasts = np.array([s.n_past for s in sessions], dtype=np.int64)
    first = sessions[0]
    x = first._embed(ids)
    if c.embed_scale != 1.0:
        x *= np.float32(c.embed_scale)
    ple = first._ple_inputs(ids, x) if c.ple_dim else None
    xp = ffi.cast("float *", ffi.from_buffer(x))
    posp = ffi.cast("int32_t *", ffi.from_buffer(pos))
    npp = ffi.cast("int64_t *", ffi.from_buffer(n_pasts))
    seqs = ffi.new("const qs_block *[]", n)
    for li in range(c.n_layers):
        for i, s in enumerate(sessions):
            seqs[i] = s._block_structs[li]
        if ple is not None:
            b = first._block_structs[li]
            b.ple.inputs, b.ple.inputs_len = ffi.cast("float *", ffi.from_buffer(ple[li])), ple[li].size
        K.check(lib.qs_block_forward_seqs(seqs, xp, n, posp, npp, m.threads), "transformer block (batched)")
    for s in sessions:
        s.n_past += 1
    return first.head(x)
