"""``bench model -d`` on the CUDA backend (issue 48): the depth's untimed fill and every repetition's rewind, then the
timed forwards at positions d.., through a CudaSession: its host emulation everywhere the library is built, the
device where there is one (tests/run_gpu.sh runs this file). Nothing timed: the rows, the positions, and that the
first timed decode at depth d gives the logits a fresh session gives after the same d tokens."""

from __future__ import annotations

from typing import Any

import numpy as np

from quantscope.core.engine import Model
from quantscope.core.engine import cuda_backend as cb
from quantscope.core.engine.tools import bench_model
from quantscope.core.gguf import GGUFFile

from . import test_cuda
from .arch_fixtures import write_fixture

cuda_lib, gpu = test_cuda.cuda_lib, test_cuda.gpu  # the session fixtures, shared
VOCAB = {"tokens": [f"t{i}" for i in range(1024)], "types": [1] * 1024, "merges": []}


class Recording:
    """A real session that records each forward's (n_past, tokens, logits)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[int, np.ndarray, np.ndarray]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def n_past(self) -> int:
        return self.inner.n_past

    def forward(self, tokens: Any, **kw: Any) -> np.ndarray:
        n = self.inner.n_past
        out = self.inner.forward(tokens, **kw)
        self.calls.append((n, np.asarray(tokens).copy(), out.copy()))
        return out


def run_at_depth(tmp_path, host: bool) -> None:
    model = Model(GGUFFile(write_fixture("llama", tmp_path / "llama.gguf", "F32", vocab=VOCAB)))
    depth = 40
    rec: list[Recording] = []

    def make(n_ctx: int) -> Recording:
        rec.append(Recording(cb.CudaSession(model, n_ctx, host_emulation=host)))
        return rec[-1]

    rows = bench_model(model, 16, 3, repetitions=1, make_session=make, depths=[0, depth])
    assert [(r["test"], r["n_depth"]) for r in rows] == [("pp16", 0), ("tg3", 0), (f"pp16 @ d{depth}", depth),
                                                        (f"tg3 @ d{depth}", depth)]
    (s,) = rec
    pos = [(n, len(t)) for n, t, _ in s.calls]
    at0 = [(0, 16)] * 2 + [(i, 1) for i in range(3)] * 2
    atd = [(0, depth)] + [(depth, 16)] * 2 + [(depth + i, 1) for i in range(3)] * 2
    assert pos == at0 + atd
    fill = s.calls[len(at0)][1]
    first_decode = s.calls[len(at0) + 3]  # after the fill and the two prefills at depth
    with cb.CudaSession(model, depth + 8, host_emulation=host) as fresh:
        fresh.forward(fill)
        want = fresh.forward(first_decode[1])
    np.testing.assert_allclose(first_decode[2], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    s.inner.close()


def test_emulated_cuda_session_benches_at_depth(cuda_lib, tmp_path):
    run_at_depth(tmp_path, host=True)


def test_gpu_benches_at_depth(gpu, tmp_path):
    run_at_depth(tmp_path, host=False)
