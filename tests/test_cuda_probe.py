"""The probes and token alternatives on the GPU (csrc/cuda/qsc_probe.cuh, CudaSession's probe members): residuals,
queries and attention weights copied back only when a trace asks for them, the logit lens through the forward
pass's own head, activation statistics for the importance matrix; against the CPU session on the same model.

Host part (no GPU): the statistics' per-column sums by the device's own code, and the host-emulated forward traced
layer by layer against the CPU block (the probe's host twins). The rest needs a GPU (skipped
without one; tests/run_gpu.sh runs this file)."""

from __future__ import annotations

import numpy as np
import pytest

from quantscope.core.chat import SamplerParams
from quantscope.core.engine import cuda_backend as cb
from quantscope.core.engine import cuda_library as cl
from quantscope.core.engine import probe as P
from quantscope.core.engine.generate import Engine
from quantscope.core.engine.session import ForwardTrace, Model

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
    lib = cl._library()
    got = acc.copy()
    assert lib.qsc_host_probe_sumsq(cl._p(got, "float *"), cl._p(x, "float *"), 37, 96) == 0
    assert np.array_equal(got, want)
    assert lib.qsc_host_probe_sumsq(cl._p(got, "float *"), cl._p(x, "float *"), -1, 96) != 0


class CpuDevice:
    """The probe calls of the CUDA library (qsc_probe_trace, qsc_forward, qsc_head, qsc_read_cache, qsc_stats_*)
    answered by a CPU session, with the library's buffer layouts: runs CudaSession's host half without a GPU."""

    def __init__(self, model: Model) -> None:
        self.cpu = model.session(64, np.float32)
        self.c = model.config
        self.trace: tuple[object, object, int] | None = None
        self.sums: list[dict[str, np.ndarray]] | None = None
        self.calls: list[str] = []

    def _view(self, ptr: object, n: int, dtype: type = np.float32) -> np.ndarray:
        return np.frombuffer(cl.ffi.buffer(ptr, n * np.dtype(dtype).itemsize), dtype)

    def qsc_probe_trace(self, m, resid, queries, n, err, err_len):
        self.calls.append("trace")
        self.trace = (resid, queries, int(n)) if n else None
        return 0

    def qsc_forward(self, m, tokens, n, n_past, all_logits, out, err, err_len):
        self.calls.append("forward")
        c = self.c
        ids = [int(t) for t in cl.ffi.unpack(tokens, n)]
        assert n_past == self.cpu.n_past
        tr = ForwardTrace() if self.trace is not None and self.trace[2] == n else None
        logits = self.cpu.forward(ids, all_logits=bool(all_logits), trace=tr)
        self._view(out, logits.size)[:] = logits.reshape(-1)
        if tr is not None:
            assert self.trace is not None
            self._view(self.trace[0], (c.n_layers + 1) * n * c.n_embd)[:] = np.stack(tr.resid).reshape(-1)
            self._view(self.trace[1], c.n_layers * n * c.n_head * c.head_dim)[:] = \
                np.stack([tr.queries[li] for li in range(c.n_layers)]).reshape(-1)
        return 0

    def qsc_head(self, m, x, n, out, err, err_len):
        c, s = self.c, self.cpu
        h = s._rmsnorm(self._view(x, n * c.n_embd).reshape(n, c.n_embd).copy(), s.model.weights.output_norm,
                       c.n_embd)
        self._view(out, n * c.n_vocab)[:] = s._mm(s.model.output, h).reshape(-1)
        return 0

    def qsc_read_cache(self, m, layer, which, n_rows, out, nbytes, err, err_len):
        src = (self.cpu.v_cache if which else self.cpu.k_cache)[layer][:n_rows]
        assert nbytes == src.nbytes
        self._view(out, src.size, src.dtype)[:] = src.reshape(-1)
        return 0

    def qsc_stats_enable(self, m, init, n, err, err_len):
        c = self.c
        sizes = {"attn": c.n_embd, "wo": c.n_head * c.head_dim, "ffn": c.n_embd, "down": c.n_ff}
        self.sums = None
        if init != cl.ffi.NULL:
            flat = self._view(init, n).reshape(c.n_layers, -1)
            self.sums = [dict(zip(sizes, np.split(row.copy(), np.cumsum(list(sizes.values()))[:-1]), strict=True))
                         for row in flat]
        self.cpu.set_activation_stats(self.sums)
        return 0

    def qsc_stats_read(self, m, out, n, err, err_len):
        assert self.sums is not None
        flat = np.concatenate([np.concatenate([d[k] for k in ("attn", "wo", "ffn", "down")]) for d in self.sums])
        assert flat.size == n
        self._view(out, n)[:] = flat
        return 0

    def qsc_model_free(self, m):
        return None


def _emulated(model: Model) -> tuple[cb.CudaSession, CpuDevice]:
    """A CudaSession whose library is :class:`CpuDevice` (constructed without the upload, which needs a GPU)."""
    dev = CpuDevice(model)
    s = cb.CudaSession.__new__(cb.CudaSession)
    s.model, s.config, s.n_ctx, s.kv_dtype, s.n_past = model, model.config, 64, np.float32, 0
    s._lib, s._m, s._stats = dev, object(), None
    return s, dev


@pytest.fixture(scope="module")
def fixture_model(tmp_path_factory):
    from .arch_fixtures import vocabulary, write_fixture

    vocab = vocabulary()
    root = tmp_path_factory.mktemp("cuda_probe")
    return lambda name: Model.load(str(write_fixture(name, root / f"{name}.gguf", vocab=vocab)), threads=2)


@pytest.mark.parametrize("name", ["gemma2", "gpt-oss"])
def test_host_half_of_the_gpu_probe_is_the_cpus(fixture_model, name):
    """CudaSession's host half (the trace's layouts, positions and after_layer, the attention weights' scale,
    window, soft-cap and sinks, the head's scale and soft-cap) over a CPU-emulated library gives the CPU probe's
    values exactly; the decode path without a trace never asks for one."""
    m = fixture_model(name)
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 1024, 20)]
    cpu = P.run_probe(m, ids, kv_dtype=np.float32)
    made: list[CpuDevice] = []

    def make(n: int, dtype: type) -> cb.CudaSession:
        s, dev = _emulated(m)
        made.append(dev)
        return s

    seen: list[float] = []
    got = P.run_probe(m, ids, kv_dtype=np.float32, make_session=make, progress=seen.append)
    assert seen == [(i + 1) / m.config.n_layers for i in range(m.config.n_layers)]
    assert made[0].calls == ["trace", "forward", "trace"]  # set, run, cleared
    assert all(np.array_equal(a, b) for a, b in zip(got.resid, cpu.resid, strict=True))
    assert np.array_equal(got.positions, cpu.positions) and got.queries.keys() == cpu.queries.keys()
    for li in cpu.queries:
        assert np.array_equal(got.queries[li], cpu.queries[li])
        assert np.array_equal(got.attention(li), cpu.attention(li), equal_nan=True)
    lg, lc = P.logit_lens(got), P.logit_lens(cpu)
    assert np.array_equal(lg.top_ids, lc.top_ids) and np.array_equal(lg.top_probs, lc.top_probs)
    s, dev = _emulated(m)
    s.forward(ids[:4])
    s.forward([ids[4]])
    assert dev.calls == ["forward", "forward"] and s.n_past == 5


def test_host_half_of_the_gpu_statistics(fixture_model):
    """set_activation_stats over a CPU-emulated library: the caller's sums go up, the prompts' are added onto them
    and come back into the caller's arrays under their keys (the library's per-layer layout attn | wo | ffn |
    down), one-token steps add nothing, absent keys stay absent; per-expert statistics and wrong sizes are refused
    before the library is asked."""
    m = fixture_model("llama")
    c = m.config
    ids = [int(t) for t in np.random.default_rng(5).integers(0, 1024, 16)]
    sizes = {"attn": c.n_embd, "wo": c.n_head * c.head_dim, "ffn": c.n_embd, "down": c.n_ff}
    start = np.random.default_rng(6)  # sums from an earlier run: the device adds onto them
    want = [{k: start.uniform(0, 9, v).astype(np.float32) for k, v in sizes.items()} for _ in range(c.n_layers)]
    got = [{k: a.copy() for k, a in d.items() if k != "wo"} for d in want]
    ref = m.session(64, np.float32)
    ref.set_activation_stats(want)
    s, dev = _emulated(m)
    s.set_activation_stats(got)
    for sess in (ref, s):
        sess.forward(ids, logits=False)
        sess.forward([ids[0]])
        sess.forward(ids[:8])
    for li in range(c.n_layers):
        assert "wo" not in got[li]
        for k in ("attn", "ffn", "down"):
            assert np.array_equal(got[li][k], want[li][k]), (li, k)
    s.set_activation_stats(None)
    assert dev.sums is None
    with pytest.raises(ValueError, match="per-expert"):
        s.set_activation_stats([{"count": np.zeros(4, np.int64)} for _ in range(c.n_layers)])
    with pytest.raises(ValueError, match="values, not"):
        s.set_activation_stats([{"down": np.zeros(c.n_ff + 1, np.float32)} for _ in range(c.n_layers)])
    with pytest.raises(ValueError, match="layers"):
        s.set_activation_stats([{}])
    assert dev.sums is None


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
    assert (lg.top_ids[-1, :, 0] == lc.top_ids[-1, :, 0]).mean() >= 0.9  # the model's own predictions
    assert np.abs(lg.top_probs[-1] - lc.top_probs[-1]).max() < 5e-2
    assert np.abs(lg.entropy - lc.entropy).max() < 0.1  # every layer's lens, in nats


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


def test_cli_probe_on_the_gpu_or_its_one_line_reason(cuda_lib, synthetic_tiny):  # noqa: F811
    """``quantscope probe --backend cuda``: on a GPU, the probe of the engine's own GPU session, whose final lens
    row is the model's prediction as on the CPU; without one, the reason in one line."""
    import json
    import subprocess
    import sys

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "quantscope.cli", "probe", str(synthetic_tiny.file.path),
                               "-p", "The lighthouse keeper climbed the stairs", "--json", *argv],
                              capture_output=True, text=True, timeout=300)

    gpu_ok, _ = cl.cuda_status()
    r = cli("--backend", "cuda")
    if not gpu_ok:
        assert r.returncode != 0
        assert r.stderr.strip().splitlines()[-1].startswith("quantscope: error: --backend cuda: "), r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert "backend: cuda" in r.stderr
    ref = cli("--backend", "cpu")
    assert ref.returncode == 0, ref.stderr
    got, want = json.loads(r.stdout), json.loads(ref.stdout)
    assert got["tokens"] == want["tokens"]
    lg, lc = got["logit_lens"], want["logit_lens"]
    assert lg["rows"] == lc["rows"]
    assert lg["top_ids"][-1][-1][0] == lc["top_ids"][-1][-1][0]  # the prediction after the prompt
    assert abs(lg["top_probs"][-1][-1][0] - lc["top_probs"][-1][-1][0]) < 2e-2


DENSE_F32 = ["gemma2", "gemma3", "gemma4", "granite", "llama", "llama3", "mistral3", "olmo2", "phi3", "qwen2",
             "qwen3", "qwen35", "seed_oss", "smollm3"]


@pytest.mark.parametrize("name", DENSE_F32)
def test_host_emulated_device_layers_follow_the_cpu_step_by_step(cuda_lib, fixture_model, name):  # noqa: F811
    """Both backends walk the same plan (csrc/qs_plan.h); through the probe hooks both have, every layer's output
    (the residual stream) and every attention layer's queries of the device's host-emulated forward (its kernels'
    host twins) follow the CPU block's, layer by layer, so a step that diverges is found at its layer rather than only
    in the logits. F32 fixtures: relative error below 1e-4 per layer (measured: 1.5e-7 (gemma2) .. 2.5e-6 (gemma4))."""
    m = fixture_model(name)
    ids = [int(t) for t in np.random.default_rng(11).integers(0, 1024, 24)]
    cpu_trace, dev_trace = ForwardTrace(), ForwardTrace()
    m.session(64, kv_dtype=np.float32).forward(ids, trace=cpu_trace)
    with cb.CudaSession(m, 64, kv_dtype=np.float32, host_emulation=True) as s:
        s.forward(ids, trace=dev_trace)
    assert len(dev_trace.resid) == len(cpu_trace.resid) == m.config.n_layers + 1
    errs = [rel(d, c) for d, c in zip(dev_trace.resid, cpu_trace.resid, strict=True)]
    assert max(errs) < 1e-4 and np.abs(cpu_trace.resid[-1]).mean() > 1.0, errs
    assert np.array_equal(dev_trace.positions, cpu_trace.positions)
    widest = m.config.n_head * m.config.head_dim
    for li, q in cpu_trace.queries.items():
        if q.size // len(ids) == widest:  # (the device copies the queries of the widest layers)
            assert rel(dev_trace.queries[li], q) < 1e-4, (li, rel(dev_trace.queries[li], q))
