"""Partial offload (core/engine/split.py): the first N layers by the device's forward (its host emulation here: no
GPU needed), the rest and the head on the CPU; the layer count ``--backend auto`` picks from a fake free-memory
figure; ``--gpu-layers`` on the CLI."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from quantscope.core.engine import Model, generate, split
from quantscope.core.engine import cuda_backend as cb
from quantscope.core.engine import cuda_fit as fit
from quantscope.core.engine import cuda_library as cl
from quantscope.core.engine.session import ForwardTrace
from quantscope.core.engine.split import SplitSession, split_allowed
from quantscope.core.gguf import GGUFFile

from . import test_cuda
from .arch_fixtures import write_fixture
from .test_cuda import GPU_KLD_LIMIT, GPU_TOP1, mean_kld_top1

cuda_lib, gpu = test_cuda.cuda_lib, test_cuda.gpu  # the fixtures: the built library, a usable GPU
arch_vocab = test_cuda.arch_vocab  # the architecture fixtures' stored vocabulary (no catalogue model needed)


@pytest.fixture(scope="module")
def fixture_model(tmp_path_factory, arch_vocab):
    made: dict[str, Model] = {}

    def get(arch: str) -> Model:
        if arch not in made:
            path = write_fixture(arch, tmp_path_factory.mktemp("split") / f"{arch}.gguf", "F32", vocab=arch_vocab)
            made[arch] = Model(GGUFFile(path), threads=2)
        return made[arch]

    return get


def _ids(model: Model, n: int, seed: int = 1) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, model.config.n_vocab, n)]


@pytest.mark.parametrize("arch", ["smollm3", "gemma3"])
def test_split_gives_the_cpu_and_device_logits(cuda_lib, fixture_model, arch):
    """N = 0: the CPU session's logits exactly; N = 1, L/2, L: the device's layers then the CPU's, within the
    tolerance the device forward has against the CPU (test_cuda.py), and not the CPU's bits (the device ran);
    N = L against the whole emulated device forward too. Prefill in chunks, decode steps and a rewind agree."""
    model = fixture_model(arch)
    L, n = model.config.n_layers, 48
    ids = _ids(model, n - 1)
    cpu = model.session(n).forward(ids, all_logits=True)
    with cb.CudaSession(model, n, host_emulation=True) as s:
        dev = s.forward(ids, all_logits=True)
    for n_gpu in sorted({0, 1, L // 2, L}):
        with SplitSession(model, n, n_gpu, max_batch=16, host_emulation=True) as s:
            got = s.forward(ids, all_logits=True)  # chunks of 16 on the device
            assert s.n_past == len(ids)
            assert s.kv_bytes == model.session(n).kv_bytes  # the two halves' caches: one whole model's
            if n_gpu == 0:
                assert np.array_equal(got, cpu)
            else:
                assert not np.array_equal(got, cpu)
                kl, top = mean_kld_top1(cpu, got)
                assert kl <= GPU_KLD_LIMIT and top >= GPU_TOP1, (n_gpu, kl, top)
            if n_gpu == L:
                kl, top = mean_kld_top1(dev, got)
                assert kl <= GPU_KLD_LIMIT and top >= GPU_TOP1, (kl, top)
            s.reset()
            half = len(ids) // 2
            s.forward(ids[:half], logits=False)
            steps = np.stack([s.forward([t]) for t in ids[half:]])
            assert np.allclose(steps, got[half:], rtol=1e-3, atol=1e-3)
            s.truncate(half)
            assert s.n_past == half
            again = s.forward(ids[half:], all_logits=True)
            assert np.allclose(again, steps, rtol=1e-3, atol=1e-3)


def test_split_recurrent_layers_rewind_to_the_checkpoint(cuda_lib, fixture_model):
    """qwen35's delta-net layers on both sides of the split: the checkpoint is taken by both halves and a rewind
    returns both to it (or both to 0)."""
    model = fixture_model("qwen35")
    L, n = model.config.n_layers, 40
    assert any(model.config.is_recurrent(li) for li in range(L // 2))
    assert any(model.config.is_recurrent(li) for li in range(L // 2, L))
    ids = _ids(model, n - 1, seed=2)
    cpu = model.session(n).forward(ids, all_logits=True)
    with SplitSession(model, n, L // 2, host_emulation=True) as s:
        assert s.kv_bytes == model.session(n).kv_bytes  # caches and states, split between the halves
        half = len(ids) // 2
        first = s.forward(ids[:half], all_logits=True)
        s.checkpoint()
        rest = s.forward(ids[half:], all_logits=True)
        kl, top = mean_kld_top1(cpu, np.concatenate([first, rest]))
        assert kl <= GPU_KLD_LIMIT and top >= GPU_TOP1, (kl, top)
        s.truncate(half + 3)  # past the checkpoint: back to it
        assert s.n_past == half
        assert np.allclose(s.forward(ids[half:], all_logits=True), rest, rtol=1e-4, atol=1e-4)
        s.truncate(half - 1)  # before it: from the start
        assert s.n_past == 0
        assert np.allclose(s.forward(ids, all_logits=True)[half:], rest, rtol=1e-4, atol=1e-4)


def test_split_with_shared_caches_and_per_layer_inputs(cuda_lib, fixture_model):
    """gemma4: layers that read an earlier layer's KV cache cannot be split from it; where it can be split, the
    per-layer inputs reach both halves."""
    model = fixture_model("gemma4")
    c = model.config
    L = c.n_layers
    shared = [li for li in range(L) if c.kv_source(li) != li]
    assert shared and c.ple_dim
    cut = min(c.kv_source(li) for li in shared) + 1
    assert not split_allowed(c, cut)
    with pytest.raises(ValueError, match="cannot be split after layer"):
        SplitSession(model, 16, cut, host_emulation=True)
    ok = max(n for n in range(1, L) if split_allowed(c, n))
    ids = _ids(model, 31, seed=3)
    cpu = model.session(32).forward(ids, all_logits=True)
    with SplitSession(model, 32, ok, host_emulation=True) as s:
        kl, top = mean_kld_top1(cpu, s.forward(ids, all_logits=True))
    assert kl <= GPU_KLD_LIMIT and top >= GPU_TOP1, (ok, kl, top)


def test_split_refuses_bad_layer_counts_and_traces(cuda_lib, fixture_model):
    model = fixture_model("smollm3")
    L = model.config.n_layers
    for bad in (-1, L + 1, True, 1.5):
        with pytest.raises(ValueError, match="GPU layers must be an integer"):
            SplitSession(model, 16, bad, host_emulation=True)  # type: ignore[arg-type]
    with SplitSession(model, 16, 1, host_emulation=True) as s:
        with pytest.raises(ValueError, match="one backend"):
            s.forward([5, 6], trace=ForwardTrace())
        with pytest.raises(ValueError, match="one backend"):
            s.set_activation_stats([{} for _ in range(L)])
        s.forward([5, 6, 7])
        q = np.zeros((1, model.config.n_head, model.config.head_dim), np.float32)
        assert s.attention_weights(0, q, np.array([2], np.int32)).shape == (1, model.config.n_head, 3)
        assert s.attention_weights(L - 1, q, np.array([2], np.int32)).shape == (1, model.config.n_head, 3)


# ------------------------------------------------------------------------------------------- the layer count
def _fake_gpu(monkeypatch, free: int) -> None:
    monkeypatch.setattr(cb, "cuda_status", lambda: (True, "fake GPU"))
    monkeypatch.setattr(cl, "device_properties", lambda: {"free_mem": free, "total_mem": free})


def test_choose_layers_takes_the_most_that_fit(cuda_lib, fixture_model):
    model = fixture_model("smollm3")
    L, n_ctx = model.config.n_layers, 4096
    full = fit.device_estimate(model, n_ctx)
    parts = [fit.partial_estimate(model, n_ctx, k).total for k in range(L + 1)]
    assert parts[L] == full.total and all(a < b for a, b in itertools.pairwise(parts))
    assert fit.choose_layers(model, n_ctx, full.total) == (L, fit.choose_gpu(full, full.total)[1])
    for k in range(1, L):
        n, why = fit.choose_layers(model, n_ctx, parts[k])
        assert n == k, (k, n)
        assert why.startswith(f"{k} of {L} layers on the GPU (does not fit in GPU memory: weights ")
        assert why.endswith("the rest on the CPU") and "\n" not in why
        assert fit.choose_layers(model, n_ctx, parts[k + 1] - 1)[0] == k
    n, why = fit.choose_layers(model, n_ctx, parts[1] - 1)
    assert n == 0 and why.startswith("does not fit in GPU memory")


def test_auto_backend_offloads_the_layers_that_fit(cuda_lib, fixture_model, monkeypatch):
    """--backend auto with room for some layers only: a split session with that many, and the reason says so; an
    explicit count is taken as asked; 0 layers is the CPU; GPU layers with the CPU backend are refused."""
    model = fixture_model("smollm3")
    path = model.file.path
    L = model.config.n_layers
    made: list[int] = []

    class FakeSplit:
        def __init__(self, model, n_ctx, n_gpu):
            made.append(n_gpu)
            self.n_ctx = n_ctx

        def close(self):
            pass

    def no_session(*_a, **_k):
        raise AssertionError("a whole-model GPU session must not be created")

    monkeypatch.setattr(split, "SplitSession", FakeSplit)
    monkeypatch.setattr(cb, "CudaSession", no_session)
    n_ctx = min(512, model.config.n_ctx_train)  # (as the engine takes it)
    _fake_gpu(monkeypatch, fit.partial_estimate(model, n_ctx, 2).total)
    eng = generate.Engine(path, n_ctx=512, backend="auto", repack=False)
    try:
        assert eng.backend == "cuda" and eng.gpu_layers == 2 and made == [2], eng.backend_reason
        assert eng.backend_reason.startswith(f"fake GPU; 2 of {L} layers on the GPU (does not fit in GPU memory")
        assert isinstance(eng.new_session(64), FakeSplit) and made == [2, 2]
    finally:
        eng.close()
    eng = generate.Engine(path, n_ctx=512, backend="cuda", repack=False, gpu_layers=1)
    try:
        assert eng.gpu_layers == 1 and made[-1] == 1
        assert eng.backend_reason == f"fake GPU; 1 of {L} layers on the GPU (asked for), the rest on the CPU"
    finally:
        eng.close()
    eng = generate.Engine(path, n_ctx=512, backend="auto", repack=False, gpu_layers=0)
    try:
        assert eng.backend == "cpu" and eng.gpu_layers == 0 and len(made) == 3
    finally:
        eng.close()
    for bad, backend in ((-1, "auto"), (True, "cuda"), (2, "cpu")):
        with pytest.raises(ValueError, match="GPU layers"):
            generate.Engine(path, n_ctx=64, backend=backend, repack=False, gpu_layers=bad)


@pytest.mark.parametrize("argv, message", [
    (["--gpu-layers", "-1"], "argument -ngl/--gpu-layers: -1 is out of range (at least 0)"),
    (["-ngl", "x"], "'x' is not an integer"),
    (["--backend", "cpu", "--gpu-layers", "2"], "--gpu-layers 2: GPU layers need the cuda or auto backend"),
])
def test_cli_gpu_layers_is_validated(capsys, fixture_model, argv, message):
    from quantscope.cli.main import main

    model = fixture_model("smollm3")
    rc = main(["generate", str(model.file.path), "-p", "hi", "-n", "1", *argv])
    _, err = capsys.readouterr()
    assert rc == 2 and message in err and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("quantscope: error: ")


@pytest.mark.parametrize("verb", [["chat"], ["perplexity", "-f", "{text}"], ["bench", "model"], ["serve"]])
def test_every_verb_with_a_backend_takes_gpu_layers(capsys, fixture_model, tmp_path, verb):
    from quantscope.cli.main import main

    if verb == ["serve"]:  # the server's own dependencies (a bare device machine may lack them: tests/run_gpu.sh)
        pytest.importorskip("starlette", reason="serve needs starlette")
        pytest.importorskip("uvicorn", reason="serve needs uvicorn")

    text = tmp_path / "t.txt"
    text.write_text("some text to score", encoding="utf-8")
    argv = [a.format(text=text) for a in verb]
    rc = main([*argv[:2 if verb[0] == "bench" else 1], str(fixture_model("smollm3").file.path),
               *argv[2 if verb[0] == "bench" else 1 :], "--backend", "cpu", "-ngl", "3"])
    _, err = capsys.readouterr()
    assert rc == 2 and err == "quantscope: error: --gpu-layers 3: GPU layers need the cuda or auto backend\n"


def test_gpu_split_follows_the_cpu_and_its_host_emulation(gpu, fixture_model):
    """On a GPU: the device's half through the kernels (qsc_forward_resid's copy back, one-token steps uncaptured)
    gives the CPU's logits within the device tolerance and its host emulation's closely; prefill = decode steps."""
    model = fixture_model("smollm3")
    L, n = model.config.n_layers, 48
    ids = _ids(model, n - 1)
    cpu = model.session(n).forward(ids, all_logits=True)
    for n_gpu in (1, L // 2, L):
        with SplitSession(model, n, n_gpu) as s, SplitSession(model, n, n_gpu, host_emulation=True) as h:
            got = s.forward(ids, all_logits=True)
            kl, top = mean_kld_top1(cpu, got)
            assert kl <= GPU_KLD_LIMIT and top >= GPU_TOP1, (n_gpu, kl, top)
            kl, top = mean_kld_top1(h.forward(ids, all_logits=True), got)
            assert kl <= GPU_KLD_LIMIT and top >= GPU_TOP1, (n_gpu, kl, top)
            s.reset()
            steps = np.stack([s.forward([t]) for t in ids])
            assert np.allclose(steps, got, rtol=1e-3, atol=1e-3)


def test_gpu_split_steps_replay_a_graph_without_the_head(gpu, fixture_model):
    """On a GPU: the device half's one-token steps replay their own CUDA graph (no head; the stream copied back
    through a pinned buffer) and give the uncaptured steps' logits bit for bit, rewinds included."""
    model = fixture_model("smollm3")
    L, n = model.config.n_layers, 40
    ids = _ids(model, n - 1, seed=4)
    for n_gpu in (1, L):
        runs = []
        for graphs in (False, True):
            with SplitSession(model, n, n_gpu, graphs=graphs) as s:
                first = np.stack([s.forward([t]) for t in ids[:20]])
                s.truncate(12)
                rest = np.stack([s.forward([t]) for t in ids[12:]])
                runs.append(np.concatenate([first, rest]))
        np.testing.assert_array_equal(runs[1], runs[0])


@pytest.mark.parametrize("arch", ["smollm3", "gemma4", "qwen35"])
def test_partial_estimate_covers_the_device_half(cuda_lib, fixture_model, arch):
    """cuda_fit.partial_estimate (margin left out) is at least what the split's device half holds after a full
    forward (host-emulated: the same allocations), for every split the model allows, at contexts below and above
    one chunk; the device half runs no head, so it never holds the all-token logits."""
    model = fixture_model(arch)
    c = model.config
    for n_ctx in (64, 600):
        ids = _ids(model, min(n_ctx, 520), seed=2)
        for n_gpu in range(1, c.n_layers + 1):
            if not split_allowed(c, n_gpu):
                continue
            est = fit.partial_estimate(model, n_ctx, n_gpu)
            with SplitSession(model, n_ctx, n_gpu, host_emulation=True) as s:
                s.forward(ids, all_logits=True)
                assert s.dev is not None
                held = int(s.dev._lib.qsc_model_device_bytes(s.dev.live()))
            assert est.weights + est.kv + est.scratch >= held, (n_ctx, n_gpu, est, held)
