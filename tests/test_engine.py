"""The chat engine on the three real models: native forward vs the numpy reference, tokenizers, templates,
sampling, generation quality and perplexity."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from quantscope.core.chat import ChatTemplate, ChatTemplateError, Sampler, SamplerParams
from quantscope.core.engine import ContextFull
from quantscope.core.engine.generate import Engine
from quantscope.core.engine.reference import reference_logits
from quantscope.core.engine.tools import bench_model, perplexity
from quantscope.core.native import kernels as K
from quantscope.core.tokenizer import StreamDecoder

from .conftest import MODEL_NAMES

TEXT = (Path(__file__).parent / "data" / "english.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def engine(model_path):
    """One engine per catalogue model for this module, closed when the module ends (a module-level dict kept
    every model's repacked weights alive for the rest of the suite)."""
    engines: dict[str, Engine] = {}

    def get(name: str) -> Engine:
        if name not in engines:
            engines[name] = Engine(model_path(name), n_ctx=1024, threads=2)
        return engines[name]

    yield get
    for e in engines.values():
        e.close()
    engines.clear()


def greedy(e: Engine, prompt, n: int) -> str:
    e.session.reset()
    e.cached = []
    return "".join(d.text for d in e.generate(prompt, SamplerParams(temperature=0, max_tokens=n)))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_native_forward_matches_numpy_reference(name, engine):
    e = engine(name)
    ids = e.tokenizer.encode("The lighthouse keeper climbed the stairs at night")[:12]
    s = e.model.session(64)
    native = s.forward(ids, all_logits=True).astype(np.float64)
    ref = reference_logits(e.model.config, e.model.weights, ids)
    cos = (native * ref).sum(1) / np.linalg.norm(native, axis=1) / np.linalg.norm(ref, axis=1)
    rel = np.linalg.norm(native - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() > 0.995, cos
    assert np.median(rel) < 0.06, rel
    assert (native.argmax(1) == ref.argmax(1)).mean() >= 0.75


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_prefill_equals_token_by_token_decode(name, engine):
    """Batching, positions and the KV cache: with the row-by-row kernels prefill equals decode to float noise."""
    e = engine(name)
    ids = e.tokenizer.encode("Paris is the capital and largest city of France.")
    a = e.model.session(64)
    with K.prefill_gemm(False):
        batch = a.forward(ids, all_logits=True)
    b = e.model.session(64)
    steps = np.stack([b.forward([t]) for t in ids])
    assert np.allclose(batch, steps, rtol=1e-4, atol=1e-3)
    assert a.n_past == b.n_past == len(ids)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_prefill_gemm_stays_within_quantization_noise(name, engine):
    """The tiled GEMM reorders float sums; requantized activations then round differently now and then, so prefill
    and decode part by about the activation-quantization error (a few %), never by a wrong-position-sized amount."""
    e = engine(name)
    ids = e.tokenizer.encode("Paris is the capital and largest city of France.")
    with K.prefill_gemm(True):
        batch = e.model.session(64).forward(ids, all_logits=True).astype(np.float64)
    b = e.model.session(64)
    steps = np.stack([b.forward([t]) for t in ids]).astype(np.float64)
    rel = np.linalg.norm(batch - steps, axis=1) / np.linalg.norm(steps, axis=1)
    assert rel.max() < 0.15 and np.median(rel) < 0.06, rel
    assert (batch.argmax(1) == steps.argmax(1)).mean() >= 0.8


def test_context_full_is_reported(engine):
    e = engine("smollm2")
    s = e.model.session(8)
    s.forward(list(range(100, 108)))
    with pytest.raises(ContextFull):
        s.forward([5])


HARD = ["Hello world", "  two  spaces\n\n\tand tabs", "digits 1234567 and 3.14159", "日本語のテキスト",
        "emoji 🚀🔥 mix", "don't won't it's", "<|im_start|>user\nhi<|im_end|>", "ends with space "]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tokenizer_round_trips(name, engine):
    tok = engine(name).tokenizer
    for s in HARD:
        ids = tok.encode(s, add_special=False)
        assert tok.decode(ids) == s, (name, s)


def test_tokenizer_fixed_ids(engine):
    qwen = engine("qwen2.5-coder").tokenizer
    assert qwen.encode("Hello world") == [9707, 1879]
    assert qwen.encode("<|im_start|>user") == [151644, 872]
    assert qwen.encode("12345", add_special=False) == [16, 17, 18, 19, 20]  # qwen2 splits digits one by one
    smol = engine("smollm2").tokenizer
    assert smol.encode("<|im_start|>x<|im_end|>")[0] == 1 and smol.encode("<|im_end|>") == [2]
    assert smol.encode(" 2024", add_special=False) == [216, 34, 32, 34, 36]  # smollm: digits split first
    gem = engine("gemma3").tokenizer
    ids = gem.encode("Hello world")
    assert ids[0] == 2 and gem.pieces[ids[1]] == "Hello"  # BOS added per metadata
    assert gem.encode("<start_of_turn>user", add_special=False)[0] == 105
    assert gem.is_eog(gem.eos_id) and gem.is_eog(106)


def test_stream_decoder_holds_back_partial_utf8(engine):
    tok = engine("qwen2.5-coder").tokenizer
    ids = tok.encode(" 🚀", add_special=False)
    assert len(ids) == 3  # ' \xf0\x9f' + '\x9a' + '\x80': the emoji is split across byte tokens
    dec = StreamDecoder(tok)
    parts = [dec.push(i) for i in ids]
    assert parts == [" ", "", "🚀"]
    assert "\ufffd" not in "".join(parts) and dec.flush() == ""


def test_chat_template_sandbox_and_helpers():
    t = ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.content | tojson }}\n{% endfor %}"
                     "{% if add_generation_prompt %}assistant:{% endif %}")
    assert t.render([{"role": "user", "content": 'é "q"'}]) == 'user:' + '"é \\"q\\""' + '\nassistant:'
    evil = ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        evil.render([])
    mutate = ChatTemplate("{% set _ = messages.append({'role': 'x'}) %}ok")
    with pytest.raises(ChatTemplateError):
        mutate.render([])
    boom = ChatTemplate("{{ raise_exception('no system role') }}")
    with pytest.raises(ChatTemplateError, match="no system role"):
        boom.render([])
    loops = ChatTemplate("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}")
    assert loops.render([]) == "012"


def test_sampler_seed_and_filters():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    a = Sampler(SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7))
    b = Sampler(SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7))
    sa = [a.sample(logits, []) for _ in range(50)]
    assert sa == [b.sample(logits, []) for _ in range(50)] and len(set(sa)) > 1
    assert {Sampler(SamplerParams(temperature=1.0, top_k=1, seed=i)).sample(logits, []) for i in range(20)} == {0}
    top_p = Sampler(SamplerParams(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0, seed=1))
    assert {top_p.sample(logits, []) for _ in range(100)} == {0, 1}
    min_p = Sampler(SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5, seed=1))
    assert {min_p.sample(logits, []) for _ in range(100)} == {0, 1}
    assert Sampler(SamplerParams(temperature=0)).sample(logits, []) == 0
    pen = Sampler(SamplerParams(temperature=0, repeat_penalty=10.0))
    assert pen.sample(np.array([2.0, 1.5, 0.1]), [0]) == 1


def test_qwen_answers_the_capital_question(engine):
    out = greedy(engine("qwen2.5-coder"), [{"role": "user", "content": "What is the capital of France?"}], 24)
    assert "Paris" in out


def test_smollm_completes_the_capital_of_france(engine):
    out = greedy(engine("smollm2"), "The capital of France is", 8)
    assert out.strip().startswith("Paris")


def test_long_reply_does_not_collapse(engine):
    e = engine("qwen2.5-coder")
    e.cached = []
    prompt = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a "
                                          "bottle."}]
    out = "".join(d.text for d in e.generate(prompt, SamplerParams(seed=1, max_tokens=200)))
    ids = e.tokenizer.encode(out, add_special=False)
    assert len(ids) > 150
    assert len(set(ids)) / len(ids) > 0.3  # not one token over and over
    grams = [tuple(ids[i : i + 4]) for i in range(len(ids) - 3)]
    assert max(grams.count(g) for g in set(grams)) <= 4  # no phrase loop
    assert "lighthouse" in out.lower() and "bottle" in out.lower()


def test_stop_strings_and_seeded_sampling(engine):
    e = engine("smollm2")
    p = SamplerParams(temperature=0.9, seed=123, max_tokens=30)
    e.session.reset()
    e.cached = []
    first = "".join(d.text for d in e.generate("Once upon a time", p))
    second = "".join(d.text for d in e.generate("Once upon a time", p))
    assert first == second and first
    e.cached = []
    stopped = list(e.generate("The capital of France is", SamplerParams(temperature=0, max_tokens=30, stop=["."])))
    assert stopped[-1].finished and "stop string" in stopped[-1].stop_reason
    assert "." not in "".join(d.text for d in stopped)


@pytest.mark.parametrize("name", ["smollm2", "qwen2.5-coder"])
def test_perplexity_is_sane(name, engine):
    e = engine(name)
    r = perplexity(e.model, e.tokenizer, TEXT, 128, max_chunks=2)
    assert r.n_chunks == 2 and r.n_tokens_scored == 2 * 63
    assert 3.0 < r.ppl < 80.0, r.ppl
    shuffled = " ".join(sorted(TEXT.split()))
    assert perplexity(e.model, e.tokenizer, shuffled, 128, max_chunks=2).ppl > 2 * r.ppl


def test_bench_model_reports_rates(engine):
    rows = bench_model(engine("smollm2").model, 16, 8, repetitions=1)
    assert [r["test"] for r in rows] == ["pp16", "tg8"] and all(r["tokens_per_s"] > 0 for r in rows)


def test_bump_file_gives_the_same_logits_as_its_gguf(model_path, tmp_path):
    from quantscope.core.bump import ConvertJob
    from quantscope.core.engine import Model

    src = model_path("qwen2.5-coder")
    ConvertJob(src, tmp_path / "w.bump", context=256, config_path=tmp_path / "config.json").run()
    from_bump = Model.load_bump(str(tmp_path / "w.bump"), str(tmp_path / "config.json"), threads=2)
    tied = Model.load(str(src), threads=2, tie_output=True)  # the bump's lm_head is token_embd
    ids = [9707, 1879, 11, 1246, 525, 498, 30]
    a = from_bump.session(32).forward(ids, all_logits=True)
    b = tied.session(32).forward(ids, all_logits=True)
    assert np.array_equal(a, b)
    assert from_bump.config.n_head_kv == 2 and from_bump.config.rope_neox
    untied = Model.load(str(src), threads=2).session(32).forward(ids, all_logits=True)
    cos = (a * untied).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(untied, axis=1)
    assert cos.min() > 0.99  # the dropped output.weight was a requantized copy


def test_cli_generate_tokenize_perplexity_bench(model_path, capsys, tmp_path):
    import json

    from quantscope.cli.main import main

    smol = str(model_path("smollm2"))
    assert main(["generate", smol, "-p", "The capital of France is", "-n", "6", "--temp", "0"]) == 0
    out, err = capsys.readouterr()
    assert out.strip().startswith("Paris") and "generated at" in err
    assert main(["tokenize", smol, "Hello world", "--ids"]) == 0
    assert capsys.readouterr().out.split() == ["19556", "905"]
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert main(["perplexity", smol, "-f", str(text), "-c", "128", "--chunks", "1"]) == 0
    assert "perplexity" in capsys.readouterr().out
    assert main(["bench", smol, "-p", "8", "-n", "4", "-r", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["pp8", "tg4"] and all(r["tokens_per_s"] > 0 for r in rows)
    assert main(["generate", str(model_path("gemma3")) + ".missing", "-p", "x"]) == 2


def test_backend_selection(model_path):
    from quantscope.core.engine.cuda_backend import CudaUnavailable, cuda_status

    path = model_path("smollm2")
    with pytest.raises(ValueError, match="backend"):
        Engine(path, n_ctx=64, backend="tpu")
    cpu = Engine(path, n_ctx=64, backend="cpu")
    assert cpu.backend == "cpu" and "CPU kernels" in cpu.backend_reason
    ok, why = cuda_status()
    auto = Engine(path, n_ctx=64, backend="auto")
    if ok:
        assert auto.backend == "cuda"
    else:
        assert auto.backend == "cpu" and why in auto.backend_reason
        with pytest.raises(CudaUnavailable):
            Engine(path, n_ctx=64, backend="cuda")


def test_long_prompt_is_evaluated_in_chunks_with_progress_and_cancel(engine):
    """A prompt longer than PREFILL_CHUNK reports progress per chunk, gives the same first token as one big
    forward pass, and a cancel between chunks stops with the evaluated part kept in the cache."""
    from quantscope.core.engine.generate import PREFILL_CHUNK

    e = engine("smollm2")
    text = " ".join(TEXT.split()[:600])
    ids = e.prompt_ids(text)
    assert PREFILL_CHUNK < len(ids) < 1000
    e.session.reset()
    e.cached = []
    seen: list[tuple[int, int]] = []
    out = list(e.generate(text, SamplerParams(temperature=0, max_tokens=1), on_prompt=lambda d, t: seen.append((d, t))))
    assert seen == [(PREFILL_CHUNK, len(ids)), (len(ids), len(ids))]
    whole = e.model.session(1024).forward(ids)
    assert out[0].token == int(np.argmax(whole))

    e.session.reset()
    e.cached = []
    cancel = threading.Event()
    out = list(e.generate(text, SamplerParams(temperature=0, max_tokens=5), cancel=cancel,
                          on_prompt=lambda d, t: cancel.set()))
    assert out[-1].finished and out[-1].stop_reason == "cancelled" and out[-1].n_generated == 0
    assert e.session.n_past == PREFILL_CHUNK and e.cached == ids[:PREFILL_CHUNK]
    # the next call reuses the evaluated chunk and finishes the prompt
    seen.clear()
    out = list(e.generate(text, SamplerParams(temperature=0, max_tokens=1), on_prompt=lambda d, t: seen.append((d, t))))
    assert seen == [(len(ids) - PREFILL_CHUNK, len(ids) - PREFILL_CHUNK)]
    assert out[0].token == int(np.argmax(whole))


def test_cpu_and_gpu_sessions_share_one_protocol(model_path):
    """The generator, perplexity and benchmarks use a session only through InferenceSession; the CPU session is
    one, and the GPU session class has every member (instances need a GPU: tests/test_cuda.py)."""
    import inspect

    from quantscope.core.engine import InferenceSession, Model
    from quantscope.core.engine.cuda_backend import CudaSession
    from quantscope.core.gguf import GGUFFile

    m = Model(GGUFFile(model_path("smollm2")), threads=2)
    assert isinstance(m.session(16), InferenceSession)
    assert not isinstance(object(), InferenceSession)
    assert {"kv_bytes", "reset", "truncate", "forward"} <= set(dir(CudaSession))
    src = inspect.getsource(CudaSession.__init__)
    assert "self.n_ctx = " in src and "self.n_past = " in src


def test_close_frees_the_session_and_unmaps_the_file(model_path):
    """Engine.close() closes its file too (the GUI no longer reaches into ``eng.file``); twice is harmless."""
    eng = Engine(model_path("smollm2"), n_ctx=64, backend="cpu", repack=False)
    assert eng.file._mmap is not None
    eng.close()
    assert eng.file._mmap is None and eng.file._buf == b""
    eng.close()


def test_load_failures_are_explained_once_for_every_caller(tmp_path):
    from quantscope.core.engine.generate import LoadFailure, load_failure
    from quantscope.core.gguf import GGUFError
    from quantscope.core.model import UnsupportedModel
    from quantscope.core.tokenizer import TokenizerError

    assert load_failure(UnsupportedModel("arch 'x'")) == LoadFailure(
        "This model cannot run on Quantscope's engine.", "arch 'x'")
    assert load_failure(TokenizerError("no vocab")).headline == "This model's tokenizer is not supported."
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope" + bytes(40))
    with pytest.raises(GGUFError) as info:
        Engine(bad, n_ctx=64, backend="cpu")
    why = load_failure(info.value)
    assert why is not None and why.line() == f"The file is not a readable GGUF model: {info.value}"
    assert load_failure(MemoryError()).line() == ("The model is too large for the memory available: allocating the "
                                                  "weights or the KV cache failed")
    assert load_failure(RuntimeError("a bug")) is None  # shown with its traceback
