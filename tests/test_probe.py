"""The probe (core/engine/probe.py, docs/probe.md): every quantity against the float64 reference forward on each
architecture's fixture, and against numpy on the engine's own numbers where the reference stops (gemma4's
per-layer shapes, qwen35's delta-net layers); the native hooks' size checks; ``quantscope probe``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from quantscope.core.engine import probe as P
from quantscope.core.engine.reference import reference_logits
from quantscope.core.engine.session import ForwardTrace, Model
from quantscope.core.native import ffi, lib, nn
from quantscope.core.native.kernels import KernelError

from .arch_fixtures import SPECS, vocabulary, write_fixture

IDS = [int(t) for t in np.random.default_rng(1).integers(0, 1024, 24)]  # past gemma's window of 16
NO_REFERENCE = {"gemma4", "qwen35", "qwen35moe"}


@pytest.fixture(scope="module")
def arch_model(tmp_path_factory):
    vocab = vocabulary()
    root = tmp_path_factory.mktemp("probe")
    models: dict[str, tuple[Path, Model]] = {}

    def get(name: str) -> Model:
        if name not in models:
            path = write_fixture(name, root / f"{name}.gguf", vocab=vocab)
            models[name] = (path, Model.load(str(path), threads=2))
        return models[name][1]

    yield get
    models.clear()


def _ref_lens(model: Model, resid: np.ndarray) -> np.ndarray:
    """Probabilities of float64 residual rows through the final norm and the head, written out in numpy."""
    from quantscope.core.quant import dequantize

    c, w = model.config, model.weights
    x = resid / np.sqrt((resid * resid).mean(axis=-1, keepdims=True) + c.rms_eps) * w.output_norm
    out = dequantize(w.output.data.reshape(w.output.rows, -1), w.output.type).astype(np.float64)
    logits = x @ out.T / c.logit_scale
    if c.final_softcap:
        logits = c.final_softcap * np.tanh(logits / c.final_softcap)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("name", sorted(set(SPECS) - NO_REFERENCE))
def test_probe_matches_the_float64_reference(name, arch_model):
    """Residual stream, attention weights (with sliding windows, soft-caps, sinks), logit lens and activations."""
    m = arch_model(name)
    pr = P.run_probe(m, IDS, kv_dtype=np.float32)
    tr: dict[str, list[np.ndarray]] = {}
    reference_logits(m.config, m.weights, IDS, trace=tr)
    assert len(pr.resid) == len(tr["resid"]) == m.config.n_layers + 1
    for i, (a, b) in enumerate(zip(pr.resid, tr["resid"], strict=True)):
        assert np.linalg.norm(a - b) / np.linalg.norm(b) < 1e-5, (name, i)
    for layer in range(m.config.n_layers):
        got, want = pr.attention(layer), tr["attn"][layer].transpose(1, 0, 2)
        assert np.array_equal(np.isnan(got), np.isnan(want)), (name, layer)  # the same keys hidden
        assert np.nanmax(np.abs(got - want)) < 5e-5, (name, layer)
    lens = P.logit_lens(pr, top=5)
    ref = np.stack([_ref_lens(m, r) for r in tr["resid"]])  # (L + 1, T, V)
    assert np.array_equal(lens.targets, ref[-1].argmax(-1))
    want_p = np.take_along_axis(ref, lens.targets[None, :, None].repeat(len(ref), 0), 2)[..., 0]
    assert np.allclose(lens.target_prob, want_p, atol=2e-5)
    want_rank = (ref > want_p[..., None]).sum(-1)
    assert (np.abs(lens.target_rank - want_rank) <= 1).all()  # a tie within float noise may swap one place
    assert np.allclose(lens.top_probs, -np.sort(-ref, axis=-1)[..., :5], atol=2e-5)
    assert np.allclose(lens.entropy, -(ref * np.log(np.maximum(ref, 1e-300))).sum(-1), atol=1e-4)
    act = P.activations(pr)
    rr = np.stack(tr["resid"])
    assert np.allclose(act.rms, np.sqrt((rr * rr).mean(-1)), rtol=1e-5)
    assert np.allclose(act.channel_rms, np.sqrt((rr * rr).mean(1)), rtol=1e-5)
    assert np.allclose(act.channel_max, np.abs(rr).max(1), rtol=1e-5)
    assert np.allclose(act.layer_rms(), np.sqrt((rr * rr).mean((1, 2))), rtol=1e-5)  # over every position


@pytest.mark.parametrize("name", sorted(NO_REFERENCE))
def test_probe_agrees_with_the_engine_where_the_reference_stops(name, arch_model):
    """The lens of the last row is the engine's own output distribution; attention weights equal numpy's softmax
    of the kept queries against the cache and sum to 1 over the visible keys; delta-net layers have none."""
    m = arch_model(name)
    c = m.config
    pr = P.run_probe(m, IDS, kv_dtype=np.float32)
    logits = m.session(len(IDS), np.float32).forward(IDS, all_logits=True).astype(np.float64)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    lens = P.logit_lens(pr, top=3)
    assert np.array_equal(lens.targets, p.argmax(-1))
    assert np.allclose(lens.target_prob[-1], p.max(-1), atol=1e-6)
    recurrent = [li for li in range(c.n_layers) if c.is_recurrent(li)]
    assert bool(recurrent) == name.startswith("qwen35")
    for layer in range(c.n_layers):
        if layer in recurrent:
            assert not pr.has_attention(layer)
            with pytest.raises(P.ProbeError, match="recurrent"):
                pr.attention(layer)
            continue
        w = pr.attention(layer)
        q = pr.queries[layer].astype(np.float64)
        k = pr.session.k_cache[layer][: len(IDS)].astype(np.float64)
        group = c.n_head // k.shape[1]
        s = np.einsum("thd,phd->htp", q, np.repeat(k, group, axis=1)) * pr.session._block_structs[layer].attn.scale
        s = np.where(P.visible_mask(len(IDS), pr.window(layer))[None], s, -np.inf)
        ref = np.exp(s - s.max(-1, keepdims=True))
        ref /= ref.sum(-1, keepdims=True)
        assert np.nanmax(np.abs(w - ref)) < 1e-5, layer
        assert np.allclose(np.nansum(w, -1), 1.0, atol=1e-5)
        if pr.window(layer):
            assert np.isnan(w[:, -1, 0]).all()  # the last query does not see the first key


def test_hooks_change_nothing_and_cost_nothing_when_off(arch_model):
    """A traced forward gives bit-identical logits and cache; without a trace no query buffer is attached."""
    m = arch_model("gemma3")
    a, b = m.session(32), m.session(32)
    plain = a.forward(IDS, all_logits=True)
    tr = ForwardTrace()
    traced = b.forward(IDS, all_logits=True, trace=tr)
    assert np.array_equal(plain, traced)
    assert all(np.array_equal(x, y) for x, y in zip(a.k_cache, b.k_cache, strict=True))
    assert all(s.probe.q == ffi.NULL and s.probe.q_len == 0 for s in b._block_structs)
    assert len(tr.resid) == m.config.n_layers + 1 and sorted(tr.queries) == list(range(m.config.n_layers))


def test_native_probe_buffers_are_size_checked(arch_model):
    m = arch_model("llama")
    s = m.session(32)
    b = s._block_structs[0]
    short = np.zeros(len(IDS) * m.config.n_head * m.config.head_dim - 1, np.float32)
    b.probe.q, b.probe.q_len = ffi.cast("float *", ffi.from_buffer(short)), short.size
    x = np.zeros((len(IDS), m.config.n_embd), np.float32)
    pos = np.arange(len(IDS), dtype=np.int32)
    rc = lib.qs_block_forward(b, ffi.cast("float *", ffi.from_buffer(x)), len(IDS),
                              ffi.cast("int32_t *", ffi.from_buffer(pos)), 0, 1)
    assert rc == lib.QS_ERR_SIZE
    b.probe.q, b.probe.q_len = ffi.NULL, 0
    q = np.zeros((4, 4, 16), np.float32)
    k = np.zeros((8, 2, 16), np.float16)
    out = np.zeros(4 * 4 * 8, np.float32)
    args = (ffi.cast("float *", ffi.from_buffer(q)), 4, ffi.cast("int32_t *", ffi.from_buffer(pos)), 4, 16,
            ffi.from_buffer(k))
    tail = (1, 2, 8, 8, 0, 0.25, 0.0, ffi.NULL, ffi.cast("float *", ffi.from_buffer(out)))
    assert lib.qs_attention_probs(*args, k.nbytes, *tail, out.size, 1) == 0
    assert lib.qs_attention_probs(*args, k.nbytes, *tail, out.size - 1, 1) == lib.QS_ERR_SIZE
    assert lib.qs_attention_probs(*args, k.nbytes - 2, *tail, out.size, 1) == lib.QS_ERR_CACHE
    with pytest.raises(ValueError, match="outside"):
        nn.attention_probs(q, pos[:4], k, 9, scale=0.25)
    with pytest.raises(KernelError):
        nn.attention_probs(q, -pos[:4] - 1, k, 8, scale=0.25)


def test_probe_refuses_what_it_cannot_take(arch_model):
    m = arch_model("llama")
    with pytest.raises(P.ProbeError, match="no tokens"):
        P.run_probe(m, [])
    with pytest.raises(P.ProbeError, match="at most 1024"):
        P.run_probe(m, [1] * 1025)
    with pytest.raises(P.ProbeError, match="token ids"):
        P.run_probe(m, [1, m.config.n_vocab])
    pr = P.run_probe(m, IDS[:4])
    with pytest.raises(P.ProbeError, match="outside"):
        pr.attention(m.config.n_layers)
    with pytest.raises(P.ProbeError, match="target"):
        P.logit_lens(pr, target="first")


def test_probe_is_cancellable_between_layers(arch_model):
    from quantscope.core.jobs import Cancelled, CancelToken

    m = arch_model("smollm3")
    tok = CancelToken()
    seen: list[float] = []

    def progress(f: float) -> None:
        seen.append(f)
        tok.cancel()

    with pytest.raises(Cancelled):
        P.run_probe(m, IDS, cancel=tok, progress=progress)
    assert seen == [1 / m.config.n_layers]


def test_next_token_target_follows_the_prompt(arch_model):
    m = arch_model("qwen2")
    pr = P.run_probe(m, IDS)
    final, nxt = P.logit_lens(pr, target="final"), P.logit_lens(pr, target="next")
    assert list(nxt.targets[:-1]) == IDS[1:] and nxt.targets[-1] == final.targets[-1]
    assert (final.target_rank[-1] == 0).all()
    for t in range(len(IDS) - 1):
        assert nxt.target_rank[-1, t] == 0 or nxt.targets[t] != final.targets[t]


def test_channel_links_name_the_readers_and_writers(model_path):
    from quantscope.core.gguf import GGUFFile

    with GGUFFile(model_path("qwen2.5-coder")) as f:
        names = [t.name for t in f.tensors]
    assert P.channel_links(names, 24, 0)[0] == ("token_embd.weight", "column")
    links = dict(P.channel_links(names, 24, 5))
    assert links == {"blk.4.attn_output.weight": "row", "blk.4.ffn_down.weight": "row",
                     "blk.5.attn_q.weight": "column", "blk.5.attn_k.weight": "column",
                     "blk.5.attn_v.weight": "column", "blk.5.ffn_gate.weight": "column",
                     "blk.5.ffn_up.weight": "column"}
    assert P.channel_links(names, 24, 24)[-1] == ("output.weight", "column")
    tied = [n for n in names if n != "output.weight"]
    assert P.channel_links(tied, 24, 24)[-1] == ("token_embd.weight", "column")  # tied: the head is the table


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quantscope.cli", *argv], capture_output=True, text=True,
                          timeout=300)


def test_cli_probe_text_and_json(model_path):
    path = str(model_path("smollm2"))
    text = "The capital of France is Paris, and the capital of Italy is"
    r = cli("probe", path, "-p", text, "--logit-lens", "--attention", "3:1", "--activations")
    assert r.returncode == 0, r.stderr
    assert "-> target ' Rome'" in r.stdout
    assert "attention of layer 3, head 1" in r.stdout and "largest channels" in r.stdout
    r = cli("probe", path, "-p", text, "--json", "--logit-lens", "--attention", "2", "--activations")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    n = len(d["tokens"])
    assert d["logit_lens"]["rows"][0] == "emb" and len(d["logit_lens"]["rows"]) == 31
    assert np.array(d["logit_lens"]["top_ids"]).shape == (31, n, 5)
    w = np.array([[np.nan if x is None else x for x in row] for row in d["attention"]["weights"]])
    assert w.shape == (n, n) and np.isnan(w[0, 1:]).all() and np.allclose(np.nansum(w, 1), 1.0, atol=1e-4)
    assert len(d["activations"]["top_channels"]) == 31


@pytest.mark.parametrize("argv, message", [
    (["--attention", "99"], "the model has layers 0..29"),
    (["--attention", "1:9"], "heads 0..8"),
    (["--attention", "x"], "LAYER or LAYER:HEAD"),
    (["--positions", "40:50"], "no position"),
    (["-p", "x " * 1100], "at most 1024"),
])
def test_cli_probe_errors_are_one_line(model_path, argv, message):
    path = str(model_path("smollm2"))
    argv = argv if "-p" in argv else ["-p", "Hello there", *argv]
    r = cli("probe", path, *argv)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("quantscope: error:") and message in last, r.stderr
    assert "Traceback" not in r.stderr


def test_cli_probe_refuses_a_huge_stdin_prompt_before_tokenizing(model_path):
    r = subprocess.run([sys.executable, "-m", "quantscope.cli", "probe", str(model_path("smollm2"))],
                       input="x" * 10_000_000, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == (
        "quantscope: error: the prompt is over 262,144 characters; the probe takes at most 1024 tokens")
