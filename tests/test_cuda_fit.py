"""``--backend auto``'s memory check (core/engine/cuda_fit.py): the device memory a GPU session will hold, computed
before uploading, and the decision made from it, with a fake device-memory figure (no GPU needed)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from quantscope.core.engine import Model, generate
from quantscope.core.engine import cuda_backend as cb
from quantscope.core.engine import cuda_description as cd
from quantscope.core.engine import cuda_fit as fit
from quantscope.core.engine import cuda_library as cl
from quantscope.core.gguf import GGUFFile
from quantscope.core.quant import ggml_type

from . import test_cuda
from .conftest import require_model

cuda_lib, gpu = test_cuda.cuda_lib, test_cuda.gpu  # the fixtures: the built library, a usable GPU
arch_vocab = test_cuda.arch_vocab  # the architecture fixtures' stored vocabulary


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from quantscope.core.synthetic import write_synthetic

    vocab = os.environ.get("QUANTSCOPE_VOCAB_SOURCE") or require_model("smollm2")
    return write_synthetic(tmp_path_factory.mktemp("fit") / "tiny.gguf", "tiny", vocab, seed=3)


@pytest.fixture(scope="module")
def tiny(tiny_path) -> Model:
    return Model(GGUFFile(tiny_path))


def test_estimate_counts_the_uploaded_matrices_kv_and_scratch(cuda_lib, tiny):
    """Weights: every matrix the description uploads, repacked as the library lays it out, plus the vectors; KV: two
    caches of n_ctx x n_head_kv x head_dim per layer in the cache's type; scratch: grows with the chunk, not n_ctx."""
    c = tiny.config
    est = fit.device_estimate(tiny, 1024)
    desc, _ = cd.model_description(tiny, 1024)
    mats = desc.matrices[:-1] if tiny.weights.tied else desc.matrices  # (a tied head reads the embedding's copy)
    packed = sum(cd.packed_bytes(t, r, k) for t, r, k in mats)
    vectors = sum(int(v.size) * 4 for lw in tiny.weights.layers for v in vars(lw).values()
                  if isinstance(v, np.ndarray)) + c.n_embd * 4
    assert packed + vectors <= est.weights <= packed + vectors + 256 * (len(mats) + 8 * c.n_layers + 1)
    assert est.kv == 2 * c.n_layers * 1024 * c.n_head_kv * c.head_dim * 2
    assert fit.device_estimate(tiny, 1024, kv_dtype=np.float32).kv == 2 * est.kv
    longer = fit.device_estimate(tiny, 4096)
    assert (longer.weights, longer.kv, longer.scratch) == (est.weights, 4 * est.kv, est.scratch)
    small_batch = fit.device_estimate(tiny, 1024, max_batch=64)
    assert small_batch.scratch < est.scratch
    assert est.total == est.weights + est.kv + est.scratch + fit.MARGIN_BYTES


def test_estimate_stores_unsupported_types_as_f32(cuda_lib, tiny, monkeypatch):
    """A type without GPU kernels is dequantized on upload: counted at 4 bytes per value, not its file size."""
    before = fit.device_estimate(tiny, 256).weights
    types = cl.gpu_types()
    monkeypatch.setattr(cl, "gpu_types", lambda: types - {ggml_type("Q4_K").id})
    after = fit.device_estimate(tiny, 256).weights
    q4k = [w for lw in tiny.weights.layers for _, w in fit._layer_matrices(lw) if w.type.name == "Q4_K"]
    assert q4k
    assert after - before >= sum(w.rows * w.k * 4 - int(w.data.nbytes) * 1.05 for w in q4k)


def test_choose_gpu_by_the_free_memory(tiny):
    est = fit.device_estimate(tiny, 2048)
    ok, why = fit.choose_gpu(est, est.total)
    assert ok and why.startswith("fits in GPU memory: weights ")
    ok, why = fit.choose_gpu(est, est.total - 1)
    assert not ok and why.startswith("does not fit in GPU memory: weights ")
    assert "KV cache" in why and "at 2048 positions" in why and "free" in why and "\n" not in why
    ok, why = fit.choose_gpu(est, 10 << 30)
    assert ok and why.endswith("of 10.0 GiB free")


def _fake_gpu(monkeypatch, free: int) -> None:
    monkeypatch.setattr(cb, "cuda_status", lambda: (True, "fake GPU"))
    monkeypatch.setattr(cl, "device_properties", lambda: {"free_mem": free, "total_mem": free})


def test_auto_backend_uses_the_cpu_when_the_model_does_not_fit(tiny_path, monkeypatch):
    """--backend auto with too little free device memory: the CPU, the reason with the numbers, and no attempt to
    upload (CudaSession is never created)."""
    _fake_gpu(monkeypatch, 64 << 20)

    def no_session(*_a, **_k):
        raise AssertionError("a session must not be created when the model does not fit")

    monkeypatch.setattr(cb, "CudaSession", no_session)
    eng = generate.Engine(tiny_path, n_ctx=512, backend="auto", repack=False)
    try:
        assert eng.backend == "cpu"
        assert eng.backend_reason.startswith("CUDA not used: the model does not fit in GPU memory: weights ")
        assert "64 MiB free; using the CPU" in eng.backend_reason
    finally:
        eng.close()


def test_auto_backend_tries_the_gpu_when_the_model_fits(tiny_path, monkeypatch):
    _fake_gpu(monkeypatch, 80 << 30)
    made = []

    class FakeSession:
        def __init__(self, model, n_ctx):
            made.append(n_ctx)
            self.n_ctx = n_ctx

        def close(self):
            pass

    monkeypatch.setattr(cb, "CudaSession", FakeSession)
    eng = generate.Engine(tiny_path, n_ctx=512, backend="auto", repack=False)
    try:
        assert eng.backend == "cuda" and made == [512] and eng.backend_reason == "fake GPU"
    finally:
        eng.close()


def test_explicit_cuda_backend_is_not_second_guessed(tiny_path, monkeypatch):
    """--backend cuda asks for the GPU whatever the estimate says (the allocation then decides)."""
    _fake_gpu(monkeypatch, 1 << 20)
    made = []

    class FakeSession:
        def __init__(self, model, n_ctx):
            made.append(n_ctx)
            self.n_ctx = n_ctx

        def close(self):
            pass

    monkeypatch.setattr(cb, "CudaSession", FakeSession)
    eng = generate.Engine(tiny_path, n_ctx=256, backend="cuda", repack=False)
    try:
        assert eng.backend == "cuda" and made == [256]
    finally:
        eng.close()


def test_gpu_estimate_covers_the_session(gpu, tiny):
    """On a GPU: the estimate (margin left out) is at least what the session allocates, and not far above it."""
    est = fit.device_estimate(tiny, 1024)
    with cb.CudaSession(tiny, 1024) as s:
        s.forward([10 + i % 900 for i in range(512)], all_logits=True)  # a full chunk: every buffer allocated
        held = s.device_bytes
    assert held <= est.weights + est.kv + est.scratch <= 1.2 * held


def _fixture_model(key: str, tmp_path, vocab) -> Model:
    from quantscope.core.model import UnsupportedModel

    from .test_arch_fidelity import load

    model = load(key, tmp_path, vocab)[0]
    try:
        cd.check_config(model.config)
        cd.model_description(model, 64)
    except (UnsupportedModel, ValueError) as e:
        pytest.skip(f"{key}: {e}")
    return model


def _held_after_a_full_forward(model: Model, n_ctx: int, host: bool) -> int:
    """The library's own byte count (qsc_model_device_bytes) once a forward of every buffer's size has run: a full
    chunk (or the whole context) with all-token logits, so that the lazily allocated logits buffer is at its size."""
    n = min(n_ctx, 520)  # past one chunk of 512 where the context allows
    ids = [3 + (7 * i) % (model.config.n_vocab - 3) for i in range(n)]
    with cb.CudaSession(model, n_ctx, host_emulation=host) as s:
        s.forward(ids, all_logits=True)
        return s.device_bytes


def _check_estimate(model: Model, n_ctx: int, held: int) -> None:
    est = fit.device_estimate(model, n_ctx)
    counted = est.weights + est.kv + est.scratch
    assert counted >= held, (n_ctx, counted, held, est)
    assert counted <= 1.25 * held + (256 << 10), (n_ctx, counted, held, est)  # and not far above it


@pytest.mark.parametrize("key", sorted(test_cuda.ARCH_META))
def test_estimate_covers_every_fixture_emulated(cuda_lib, arch_vocab, key, tmp_path):
    """For each architecture fixture (tests/arch_fixtures.py), at a context below one chunk (64) and above it
    (600): the estimate (margin left out) is at least what the library holds after a full forward with all-token
    logits, and not far above it. Dense fixtures through the host-emulated model (qsc_host_model_create: the same
    model_create / finalize / dalloc calls as qsc_model_create, with calloc for cudaMalloc, and the same lazily
    allocated logits buffer); the experts' fixtures, which have no host emulation, on a GPU
    (test_gpu_estimate_covers_every_fixture)."""
    model = _fixture_model(key, tmp_path, arch_vocab)
    if model.config.n_expert:
        pytest.skip(f"{key}: experts have no host emulation of the whole forward (checked on a GPU)")
    for n_ctx in (64, 600):
        _check_estimate(model, n_ctx, _held_after_a_full_forward(model, n_ctx, host=True))


@pytest.mark.parametrize("key", sorted(test_cuda.ARCH_META))
def test_gpu_estimate_covers_every_fixture(gpu, arch_vocab, key, tmp_path):
    """As test_estimate_covers_every_fixture_emulated, on the device, the experts' fixtures included."""
    model = _fixture_model(key, tmp_path, arch_vocab)
    for n_ctx in (64, 600):
        _check_estimate(model, n_ctx, _held_after_a_full_forward(model, n_ctx, host=False))
