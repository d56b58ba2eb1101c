"""gpt-oss's "harmony" replies: the thinking (analysis channel) apart from the answer, token by token, in the engine,
the command line and the conversation store; the end-of-generation set of a harmony vocabulary.

The model is the gpt-oss fixture with the framing tokens in its vocabulary and the real template
(``openai-gpt-oss-120b.jinja`` from the llama-cpp-python sdist); its random weights would not write harmony, so
the sampler is scripted with a reply as gpt-oss writes one.
"""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from quantscope.core import catalog
from quantscope.core.chat.channels import HarmonySplitter, HarmonyTokens, split_harmony
from quantscope.core.chat.store import ChatStore, StoredMessage, to_markdown
from quantscope.core.engine import generate as gen

from .arch_fixtures import vocabulary, write_fixture

#: the framing tokens, placed over SmolLM2's first control tokens in the fixture's vocabulary
FRAMING = {1: "<|start|>", 2: "<|end|>", 3: "<|message|>", 4: "<|channel|>", 5: "<|return|>", 6: "<|call|>",
           7: "<|constrain|>"}
T = HarmonyTokens(start=1, channel=4, message=3, end=2, constrain=7)


def harmony_model(tmp_path: Path) -> Path:
    tpl = catalog.data_dir() / "templates" / "openai-gpt-oss-120b.jinja"
    if not tpl.is_file():
        pytest.fail(f"llama.cpp's templates are missing from {catalog.data_dir()}: run `quantscope models fetch`",
                    pytrace=False)
    v = vocabulary()
    tokens = list(v["tokens"])  # type: ignore[call-overload]
    for i, piece in FRAMING.items():
        tokens[i] = piece
    v = {**v, "tokens": tokens, "eos": 5}
    return write_fixture("gpt-oss", tmp_path / "harmony.gguf", vocab=v, chat_template=tpl.read_text())


def test_the_splitter_follows_the_framing():
    text = {10: "analysis", 11: "I should greet.", 12: "assistant", 13: "final", 14: "Hello", 15: "!",
            16: "commentary", 17: " json", 18: "{}"}
    stream = [4, 10, 3, 11, 2, 1, 12, 4, 13, 3, 14, 15]
    s = HarmonySplitter(T)
    out = [s.push(t, text.get(t, "")) for t in stream]
    assert [o for o in out if o] == [("analysis", "I should greet."), ("", "Hello"), ("", "!")]
    assert split_harmony([(t, text.get(t, "")) for t in stream], T) == ("I should greet.", "Hello!")
    # a tool call's preamble (commentary, with a constrained format) is not the answer
    call = [4, 16, 7, 17, 3, 18]
    assert split_harmony([(t, text.get(t, "")) for t in call], T) == ("{}", "")
    # a model that ignores the format: all of it is the answer
    assert split_harmony([(14, "Hello"), (15, "!")], T) == ("", "Hello!")
    assert HarmonyTokens.find({"<|start|>": 1, "<|channel|>": 4, "<|message|>": 3}) is None


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = harmony_model(tmp_path_factory.mktemp("harmony"))
    eng = gen.Engine(path, n_ctx=256, threads=1, repack=False)
    yield eng
    eng.file.close()


def scripted(eng, reply: str):
    """A sampler that writes ``reply`` (harmony text with its framing tokens) token by token."""
    ids: list[int] = []
    rest = reply
    while rest:
        hit = min(((rest.find(p), p) for p in FRAMING.values() if p in rest), default=(-1, ""))
        if hit[0] < 0:
            ids += eng.tokenizer.encode(rest, add_special=False, parse_special=False)
            break
        if hit[0]:
            ids += eng.tokenizer.encode(rest[: hit[0]], add_special=False, parse_special=False)
        ids.append(eng.tokenizer.vocab[hit[1]])
        rest = rest[hit[0] + len(hit[1]):]

    class Scripted:
        def __init__(self, _params, prompt_len: int = 0):
            self.it = iter(ids)

        def sample(self, _logits, _history):
            return next(self.it)

    return Scripted


REPLY = ("<|channel|>analysis<|message|>The user says hi. I should greet back.<|end|>"
         "<|start|>assistant<|channel|>final<|message|>Hello there!<|return|>")


def test_end_of_generation_without_end(engine):
    """<|end|> closes the thinking and the answer follows: only <|return|> and <|call|> stop (as llama.cpp)."""
    assert {engine.tokenizer.vocab[p] for p in ("<|return|>", "<|call|>")} <= engine.eog
    assert engine.tokenizer.vocab["<|end|>"] not in engine.eog
    assert engine.harmony == T


def test_the_engine_streams_thinking_apart(engine, monkeypatch):
    monkeypatch.setattr(gen, "Sampler", scripted(engine, REPLY))
    prompt = engine.prompt_ids([{"role": "user", "content": "hi"}])
    assert engine.tokenizer.decode(prompt, special=True).endswith("<|start|>assistant")
    deltas = list(engine.generate([{"role": "user", "content": "hi"}]))
    thinking = "".join(d.text for d in deltas if d.channel == "analysis")
    answer = "".join(d.text for d in deltas if not d.channel)
    assert thinking == "The user says hi. I should greet back."
    assert answer == "Hello there!"
    assert deltas[-1].finished and deltas[-1].stop_reason == "end of generation"
    # a plain completion prompt is not a harmony reply: the text stays whole
    monkeypatch.setattr(gen, "Sampler", scripted(engine, "plain text<|return|>"))
    deltas = list(engine.generate("a prompt"))
    assert "".join(d.text for d in deltas) == "plain text" and not any(d.channel for d in deltas)


def test_the_command_line_prints_thinking_on_stderr(engine, monkeypatch, capsys):
    from quantscope.cli import main as cli
    from quantscope.cli import model

    monkeypatch.setattr(gen, "Sampler", scripted(engine, REPLY))
    monkeypatch.setattr(model, "load_engine", lambda *_a, **_k: engine)
    lines = iter(["hi"])

    def fake_input(_prompt: str = "") -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr(builtins, "input", fake_input)
    assert cli.main(["chat", str(engine.file.path), "-n", "64"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "Hello there!", err
    assert "[thinking] The user says hi. I should greet back." in err


def test_the_store_keeps_thinking(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    cid = store.create("t", model="m")
    store.set_messages(cid, [StoredMessage("user", "hi"), StoredMessage("assistant", "Hello", {}, 1.0, "Greet.")])
    conv = store.get(cid)
    assert conv.messages[1].thinking == "Greet." and conv.messages[0].thinking == ""
    assert conv.messages[1].as_chat() == {"role": "assistant", "content": "Hello"}  # never sent back
    md = to_markdown(conv)
    assert "<details><summary>Thinking</summary>" in md and "Greet." in md
    store.close()
