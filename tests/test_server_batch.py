"""The batched decode step of the server's slots (core/engine/batch.py, csrc qs_block_forward_seqs): several
sessions' next tokens in one forward pass give each session what its own forward gives."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from quantscope.core.engine.batch import can_batch, forward_batch
from quantscope.core.engine.generate import Engine
from quantscope.core.engine.session import ContextFull
from quantscope.core.native import ffi, lib


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def engine(request: Any, model_path: Any) -> Any:
    eng = Engine(model_path(request.param), n_ctx=64, threads=1, backend="cpu")
    yield eng
    eng.close()


def test_batched_step_equals_each_sessions_own(engine: Engine) -> None:
    """Four sessions at different positions (gemma3: sliding-window layers too), three steps batched against the
    same steps run one session at a time: the same cache updates and logits."""
    texts = ["Hello there", "The capital of France is", "1 2 3 4 5 6 7", "Once upon a time, in a land far"]
    prompts = [engine.tokenizer.encode(t) for t in texts]
    batched = [engine.new_session(64) for _ in prompts]
    alone = [engine.new_session(64) for _ in prompts]
    for b, a, p in zip(batched, alone, prompts, strict=True):
        b.forward(p)
        a.forward(p)
    toks = [100, 200, 300, 400]
    for _ in range(3):
        got = forward_batch(batched, toks)
        want = np.stack([a.forward([t]) for a, t in zip(alone, toks, strict=True)])
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * float(np.abs(want).max()))
        assert (got.argmax(1) == want.argmax(1)).all()
        assert [b.n_past for b in batched] == [a.n_past for a in alone]
        toks = [int(t) for t in want.argmax(1)]
    for b, a in zip(batched, alone, strict=True):
        n = a.n_past
        for li in range(engine.model.config.n_layers):
            np.testing.assert_allclose(b.k_cache[li][:n].astype(np.float32), a.k_cache[li][:n].astype(np.float32),
                                       atol=2e-2)


def test_batch_refusals(engine: Engine) -> None:
    s1, s2 = engine.new_session(8), engine.new_session(8)
    s1.forward([1])
    s2.forward([1])
    with pytest.raises(ValueError, match="twice"):
        forward_batch([s1, s1], [5, 6])
    with pytest.raises(ValueError, match="token ids"):
        forward_batch([s1, s2], [5, engine.tokenizer.n_vocab])
    with pytest.raises(ValueError):
        forward_batch([s1, s2], [5])
    assert not can_batch([]) and not can_batch([s1, object()])
    s2.forward([2] * 7)
    with pytest.raises(ContextFull):
        forward_batch([s1, s2], [5, 6])
    assert s1.n_past == 1 and s2.n_past == 8  # nothing evaluated


def test_native_refuses_rows_sharing_a_cache(engine: Engine) -> None:
    """Two rows writing the same cache would clobber each other: the native side refuses before writing."""
    s = engine.new_session(8)
    c = engine.model.config
    seqs = ffi.new("const qs_block *[]", 2)
    seqs[0] = seqs[1] = s._block_structs[0]
    x = np.zeros((2, c.n_embd), np.float32)
    pos = np.zeros(2, np.int32)
    n_past = np.zeros(2, np.int64)
    before = x.copy()
    rc = lib.qs_block_forward_seqs(seqs, ffi.cast("float *", ffi.from_buffer(x)), 2,
                                   ffi.cast("int32_t *", ffi.from_buffer(pos)),
                                   ffi.cast("int64_t *", ffi.from_buffer(n_past)), 1)
    assert rc != 0 and (x == before).all()
    other = engine.new_session(8)
    seqs[1] = other._block_structs[0]
    n_past[1] = 8  # no room in the second cache
    rc = lib.qs_block_forward_seqs(seqs, ffi.cast("float *", ffi.from_buffer(x)), 2,
                                   ffi.cast("int32_t *", ffi.from_buffer(pos)),
                                   ffi.cast("int64_t *", ffi.from_buffer(n_past)), 1)
    assert rc != 0 and (x == before).all()
