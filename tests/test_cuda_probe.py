"""The probes and token alternatives on the GPU (csrc/cuda/qsc_probe.cuh, CudaSession's probe members): residuals,
queries and attention weights copied back only when a trace asks for them, the logit lens through the forward
pass's own head, activation statistics for the importance matrix; against the CPU session on the same model.

Host part (no GPU): the statistics' per-column sums by the device's own code. The rest needs a GPU (skipped
without one; tests/run_gpu.sh runs this file)."""

from __future__ import annotations

import numpy as np
import pytest

from quantscope.core.chat import SamplerParams
from quantscope.core.engine import cuda_backend as cb
from quantscope.core.engine import probe as P
from quantscope.core.engine.generate import Engine
from quantscope.core.engine.session import ForwardTrace

from .test_cuda import cuda_lib, gpu, synthetic_tiny  # noqa: F401 (fixtures)

IDS = [int(t) for t in np.random.default_rng(7).integers(10, 30000, 40)]


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


# ------------------------------------------------------------------------------------------------ host (no GPU)
def test_host_statistics_sums_are_the_cpu_blocks(cuda_lib):  # noqa: F811
    """acc[j] += x[t][j]^2 in row order, onto what acc holds (qs_block.c's acc_sq): equal to numpy's float32 sums
    done the same way, bit for bit."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((37, 96)) * rng.uniform(0.1, 30, 96)).astype(np.float32)
    acc = rng.uniform(0, 5, 96).astype(np.float32)
    want = acc.copy()
    for row in x:
        want = want + row * row
    lib = cb._library()
    got = acc.copy()
    assert lib.qsc_host_probe_sumsq(cb._p(got, "float *"), cb._p(x, "float *"), 37, 96) == 0
    assert np.array_equal(got, want)
    assert lib.qsc_host_probe_sumsq(cb._p(got, "float *"), cb._p(x, "float *"), -1, 96) != 0


# ------------------------------------------------------------------------------------------------ GPU
def _gpu_session(model, n: int, dtype: type = np.float16) -> cb.CudaSession:
    return cb.CudaSession(model, n, dtype)


def test_gpu_probe_follows_the_cpu(gpu, synthetic_tiny):  # noqa: F811
    """Residual stream, queries, attention weights and the logit lens of a 40-token prompt, GPU against CPU."""
    m = synthetic_tiny
    cpu = P.run_probe(m, IDS, kv_dtype=np.float32)
    done: list[float] = []
    got = P.run_probe(m, IDS, kv_dtype=np.float32, make_session=_gpu_session, progress=done.append)
    assert done == [(i + 1) / m.config.n_layers for i in range(m.config.n_layers)]
    assert len(got.resid) == len(cpu.resid) == m.config.n_layers + 1
    assert np.array_equal(got.resid[0], cpu.resid[0])  # the embeddings: no arithmetic yet
    for a, b in zip(got.resid[1:], cpu.resid[1:], strict=True):
        assert rel(a, b) < 3e-2
    assert got.queries.keys() == cpu.queries.keys()
    for li in cpu.queries:
        assert rel(got.queries[li], cpu.queries[li]) < 3e-2
        wa, wc = got.attention(li), cpu.attention(li)
        assert np.array_equal(np.isnan(wa), np.isnan(wc))
        assert np.nanmax(np.abs(wa - wc)) < 2e-2
    lg, lc = P.logit_lens(got, top=5), P.logit_lens(cpu, top=5)
    assert (lg.top_ids[-1, :, 0] == lc.top_ids[-1, :, 0]).mean() >= 0.9
    assert np.abs(lg.top_probs - lc.top_probs).max() < 5e-2


def test_gpu_lens_head_is_the_forward_head(gpu, synthetic_tiny):  # noqa: F811
    """The head of the last residual rows a traced forward leaves is that forward's own logits, bit for bit; a
    trace changes nothing of the forward, and a traced one-token step equals the graph-replayed one."""
    m = synthetic_tiny
    with cb.CudaSession(m, 64) as s, cb.CudaSession(m, 64) as plain:
        tr = ForwardTrace()
        full = s.forward(IDS, all_logits=True, trace=tr)
        assert np.array_equal(full, plain.forward(IDS, all_logits=True))
        assert np.array_equal(s.head(tr.resid[-1]), full)
        s.truncate(len(IDS) - 1)
        plain.truncate(len(IDS) - 1)
        for _ in range(3):  # warm: the plain session's one-token steps replay a CUDA graph
            step = plain.forward([IDS[-1]])
            tr1 = ForwardTrace()
            traced = s.forward([IDS[-1]], trace=tr1)
            assert np.array_equal(traced, step)
            assert np.array_equal(s.head(tr1.resid[-1])[0], traced)
            assert tr1.positions.tolist() == [len(IDS) - 1]
            s.truncate(len(IDS) - 1)
            plain.truncate(len(IDS) - 1)


def test_gpu_cache_rows_are_the_cpu_cache(gpu, synthetic_tiny):  # noqa: F811
    m = synthetic_tiny
    cpu = m.session(64, np.float32)
    cpu.forward(IDS)
    with cb.CudaSession(m, 64, np.float32) as s:
        s.forward(IDS)
        for li in range(m.config.n_layers):
            for which, ref in (("k", cpu.k_cache[li]), ("v", cpu.v_cache[li])):
                rows = s.cache_rows(li, which)
                assert rows.shape == (len(IDS), *ref.shape[1:]) and rows.dtype == np.float32
                assert rel(rows, ref[: len(IDS)]) < 3e-2
        with pytest.raises(ValueError):
            s.cache_rows(m.config.n_layers)


def test_gpu_activation_statistics_follow_the_cpu(gpu, synthetic_tiny):  # noqa: F811
    m = synthetic_tiny
    c = m.config
    sizes = {"attn": c.n_embd, "wo": c.n_head * c.head_dim, "ffn": c.n_embd, "down": c.n_ff}

    def stats() -> list[dict[str, np.ndarray]]:
        return [{k: np.zeros(n, np.float32) for k, n in sizes.items()} for _ in range(c.n_layers)]

    cs, gs = stats(), stats()
    cpu = m.session(64)
    cpu.set_activation_stats(cs)
    with cb.CudaSession(m, 64, max_batch=16) as s:  # chunks of 16: the sums carry over chunks
        s.set_activation_stats(gs)
        for sess in (cpu, s):
            sess.forward(IDS, logits=False)
            sess.forward([IDS[0]])  # one token: not a prompt, nothing added
            sess.reset()
            sess.forward(IDS[:20], logits=False)
        s.set_activation_stats(None)
        before = [{k: a.copy() for k, a in d.items()} for d in gs]
        s.reset()
        s.forward(IDS)  # stopped: nothing added
        assert all(np.array_equal(d[k], before[li][k]) for li, d in enumerate(gs) for k in d)
        with pytest.raises(ValueError, match="per-expert"):
            s.set_activation_stats([{"count": np.zeros(4, np.int64)} for _ in range(c.n_layers)])
        with pytest.raises(ValueError):
            s.set_activation_stats([{"attn": np.zeros(c.n_embd + 1, np.float32)} for _ in range(c.n_layers)])
    for li in range(c.n_layers):
        for k in sizes:
            assert rel(gs[li][k], cs[li][k]) < 3e-2, (li, k)


def test_gpu_token_alternatives_are_the_cpus(gpu, synthetic_tiny):  # noqa: F811
    """The chat's token alternatives (top 5 per step, from the logits) on either backend: the same tokens where the
    CPU's probabilities are apart, the same probabilities to 1e-2."""
    path = synthetic_tiny.file.path
    params = SamplerParams(temperature=0.0, max_tokens=12, alternatives=5)
    runs = {}
    for backend in ("cpu", "cuda"):
        eng = Engine(path, n_ctx=128, backend=backend)
        assert eng.backend == backend
        try:
            runs[backend] = [d.choice for d in eng.generate("Hello there", params) if d.choice is not None]
        finally:
            eng.close()
    assert len(runs["cpu"]) == len(runs["cuda"]) > 0
    for a, b in zip(runs["cpu"], runs["cuda"], strict=True):
        if a.token != b.token:
            break  # greedy paths part where the top two are close (test_cuda's greedy test bounds how often)
        assert abs(a.prob - b.prob) < 1e-2
        pa = [p for _, p, _ in a.alternatives]
        for i, ((ta, p, _), (tb, q, _)) in enumerate(zip(a.alternatives, b.alternatives, strict=True)):
            assert abs(p - q) < 1e-2
            apart = (i == 0 or pa[i - 1] - p > 2e-2) and (i + 1 == len(pa) or p - pa[i + 1] > 2e-2)
            if apart:
                assert ta == tb
