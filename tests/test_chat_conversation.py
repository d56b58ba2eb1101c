"""Turn dropping (core.chat.conversation.fit_messages) and the prompt a conversation becomes."""

from __future__ import annotations

import pytest

from quantscope.core.chat import ChatTemplate
from quantscope.core.chat.conversation import (
    encode_prompt,
    fit_messages,
    prompt_text,
    reply_reserve,
    token_counter,
    turn_groups,
)
from quantscope.core.gguf import GGUFFile
from quantscope.core.tokenizer import Tokenizer


def words(msgs):
    """A stand-in counter: one token per word, plus 2 per message (role markers)."""
    return sum(len(str(m["content"]).split()) + 2 for m in msgs)


def convo(n_turns, system="be brief"):
    out = [{"role": "system", "content": system}] if system else []
    for i in range(n_turns):
        out.append({"role": "user", "content": f"question {i} " + "w " * 8})
        out.append({"role": "assistant", "content": f"answer {i} " + "w " * 8})
    out.append({"role": "user", "content": "last question"})
    return out


def test_everything_fits_nothing_dropped():
    msgs = convo(3)
    r = fit_messages(msgs, words, n_ctx=1000, reserve=100)
    assert r.fits and r.dropped == 0 and r.turns_dropped == 0 and r.messages == msgs
    assert r.n_tokens == words(msgs) and r.budget == 900


def test_drops_oldest_turns_keeps_system_and_last():
    msgs = convo(5)  # system (4) + 5 turns x 2 x (10 + 2) + last (4) = 128 tokens
    assert words(msgs) == 128
    r = fit_messages(msgs, words, n_ctx=100, reserve=20)  # budget 80
    assert r.fits and r.n_tokens <= 80
    assert r.messages[0] == msgs[0]  # the system prompt stays
    assert r.messages[-1] == msgs[-1]  # the question being answered stays
    assert r.turns_dropped == 2 and r.dropped == 4  # 128 - 2*24 = 80: the fewest turns that fit
    assert r.messages == [msgs[0], *msgs[5:]]  # a prefix of the turns goes, in order
    assert r.messages[1]["role"] == "user"  # never starts with an orphan assistant reply


def test_minimal_drop_is_found_for_every_budget():
    msgs = convo(12)
    for budget in range(4 + 4, words(msgs) + 5):
        r = fit_messages(msgs, words, n_ctx=budget + 10, reserve=10)
        assert r.fits and r.n_tokens <= budget
        if r.turns_dropped:  # dropping one turn fewer would not fit
            _, turns = turn_groups(msgs)
            one_less = [m for i, m in enumerate(msgs)
                        if i not in {j for t in turns[: r.turns_dropped - 1] for j in t}]
            assert words(one_less) > budget


def test_last_turn_alone_too_long_reports_no_fit():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}, {"role": "user", "content": "x " * 500}]
    r = fit_messages(msgs, words, n_ctx=100, reserve=10)
    assert not r.fits and r.messages == [msgs[0], msgs[3]] and r.dropped == 2


def test_no_system_and_leading_assistant_and_reserve_clamp():
    msgs = [{"role": "assistant", "content": "hello there, how can I help " * 3},
            {"role": "user", "content": "a b c"}, {"role": "assistant", "content": "d e f"},
            {"role": "user", "content": "g"}]
    system, turns = turn_groups(msgs)
    assert system == [] and turns == [[0], [1, 2], [3]]
    r = fit_messages(msgs, words, n_ctx=20, reserve=5)
    assert r.fits and r.messages == msgs[1:] and r.dropped == 1
    r = fit_messages(msgs, words, n_ctx=20, reserve=10_000)  # reserve clamped to n_ctx - 1
    assert r.budget == 1 and not r.fits
    with pytest.raises(ValueError):
        fit_messages(msgs, words, n_ctx=0)


def test_only_system_message():
    r = fit_messages([{"role": "system", "content": "x"}], words, n_ctx=10)
    assert r.fits and r.dropped == 0


def test_counter_calls_are_logarithmic():
    msgs = convo(200)
    calls = []

    def counting(m):
        calls.append(1)
        return words(m)

    r = fit_messages(msgs, counting, n_ctx=500, reserve=50)
    assert r.fits and r.turns_dropped > 150
    assert len(calls) <= 12


def test_reply_reserve():
    assert reply_reserve(256, 4096) == 256
    assert reply_reserve(4000, 4096) == 2048
    assert reply_reserve(0, 4096) == 1


def test_prompt_matches_the_engine_and_real_turn_dropping(model_path):
    from quantscope.core.engine.generate import Engine

    path = model_path("smollm2")
    eng = Engine(path, n_ctx=256)
    with GGUFFile(path) as f:
        tok, tpl = Tokenizer(f), ChatTemplate.from_gguf(f)
        assert tpl is not None
        msgs = convo(6, system="You are a helpful assistant.")
        assert encode_prompt(tok, tpl, msgs) == eng.prompt_ids(msgs)
        text = prompt_text(tpl, msgs)
        assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")
        assert text.endswith("<|im_start|>assistant\n")
        # the engine itself is a counter; the tokenizer+template pair counts the same
        r = fit_messages(msgs, eng, n_ctx=eng.n_ctx, reserve=128)
        r2 = fit_messages(msgs, token_counter((tok, tpl)), n_ctx=eng.n_ctx, reserve=128)
        assert r == r2 and r.fits and r.turns_dropped > 0 and r.n_tokens <= 128
        assert len(eng.prompt_ids(list(r.messages))) == r.n_tokens
        assert r.messages[0]["role"] == "system" and r.messages[-1] == msgs[-1]
        # no template (a base model): contents joined by newlines, as the engine does
        assert prompt_text(None, msgs[:2]) == "You are a helpful assistant.\n" + msgs[1]["content"]
        assert encode_prompt(tok, None, msgs[:2]) == tok.encode(prompt_text(None, msgs[:2]))


# ---------------------------------------------------------------------------------------------- shared policy
def test_prepare_prompt_fits_or_says_how_many_tokens_the_last_message_needs():
    from quantscope.core.chat.conversation import ContextTooSmall, prepare_prompt

    class Counter:  # an engine stand-in: prompt_ids by words
        def prompt_ids(self, msgs):
            return [0] * words(msgs)

    msgs = convo(6)
    p = prepare_prompt(msgs, Counter(), n_ctx=60, reserve=10)
    assert p.dropped > 0 and p.n_tokens <= 50 and p.prompt[-1]["content"] == "last question"
    assert prepare_prompt("plain text", Counter(), 10, 5).prompt == "plain text"  # completions go as they are
    with pytest.raises(ContextTooSmall, match=r"needs \d+ tokens, but the context holds 8 and 4 are kept .* raise -c"):
        prepare_prompt([{"role": "user", "content": "w " * 20}], Counter(), 8, 4, hint="raise -c")


def test_chat_markdown_keeps_single_line_breaks_outside_code():
    from quantscope.core.chat.controller import chat_markdown

    haiku = "Waves fold into foam\nthe moon pulls the tide away\nsalt on the cold wind"
    assert chat_markdown(haiku) == "Waves fold into foam  \nthe moon pulls the tide away  \nsalt on the cold wind"
    code = "Run:\n```\na = 1\nb = 2\n```\nDone\nnow"
    assert chat_markdown(code) == "Run:\n```\na = 1\nb = 2\n```\nDone  \nnow"  # code lines untouched
    assert chat_markdown("one\n\ntwo") == "one\n\ntwo"  # paragraphs stay paragraphs


def test_stats_say_prompt_cached_instead_of_zeros():
    from quantscope.core.chat.controller import stats_numbers, stats_text

    fresh = {"n_generated": 5, "gen_tps": 10.0, "ttft_s": 0.25, "prompt_tps": 80.0, "n_prompt_new": 12}
    cached = dict(fresh, ttft_s=0.0, prompt_tps=0.0, n_prompt_new=0)
    assert stats_numbers(fresh) == {"ttft": "250 ms", "prompt": "80.0 t/s", "gen": "10.0 t/s"}
    assert stats_numbers(cached) == {"ttft": "prompt cached", "prompt": "cached", "gen": "10.0 t/s"}
    assert "prompt cached" in stats_text(cached) and "TTFT" not in stats_text(cached)
    assert "TTFT 250 ms" in stats_text(fresh)


# ---------------------------------------------------------------------------------------------- stop tokens
def test_every_eog_token_the_vocabulary_marks(model_path):
    from quantscope.core.engine.generate import eog_ids, marker_ids

    for name, expect in (("gemma3", {"<eos>", "<end_of_turn>"}), ("smollm2", {"<|im_end|>", "<|endoftext|>"}),
                         ("qwen2.5-coder", {"<|im_end|>", "<|endoftext|>"})):
        f = GGUFFile(model_path(name))
        tok = Tokenizer(f)
        got = {tok.pieces[i] for i in eog_ids(tok, f)}
        assert expect <= got, (name, got)
        assert all(tok.types[i] in (3, 4) for i in eog_ids(tok, f))
        if name == "gemma3":
            marks = {tok.pieces[i] for i in marker_ids(tok)}
            assert {"<start_of_image>", "<end_of_image>", "[multimodal]"} <= marks
            assert "<table>" not in marks and "  " not in marks  # user-defined text tokens are text


class _Script:
    """A sampler that returns scripted token ids (the engine's stop and print rules are what is tested)."""

    def __init__(self, ids):
        self.ids = list(ids)

    def __call__(self, _params):
        it = iter(self.ids)
        return type("S", (), {"sample": lambda _self, _logits, _hist: next(it)})()


def test_control_tokens_are_left_out_unless_asked_and_eog_stops(model_path, monkeypatch):
    """gemma3 (base): a scripted stream with <start_of_image> prints without it by default, with it when asked
    for, and <end_of_turn> ends the reply unprinted (the tokens after it are never reached)."""
    from quantscope.core.chat import SamplerParams
    from quantscope.core.engine import generate as gen

    eng = gen.Engine(model_path("gemma3"), n_ctx=256, backend="cpu")
    tok = eng.tokenizer
    hello, world = tok.encode("Hello", add_special=False), tok.encode(" world", add_special=False)
    script = [*hello, tok.vocab["<start_of_image>"], *world, tok.vocab["<end_of_turn>"], *hello]
    for special, want in ((False, "Hello world"), (True, "Hello<start_of_image> world")):
        monkeypatch.setattr(gen, "Sampler", _Script(script))
        deltas = list(eng.generate("The sea", SamplerParams(temperature=0, max_tokens=50, special=special)))
        assert "".join(d.text for d in deltas) == want
        assert deltas[-1].stop_reason == "end of generation"
        assert deltas[-1].n_generated == len(hello) + 1 + len(world)
    eng.close()


def test_controller_binds_a_conversation_to_its_model(tmp_path):
    """Qt-free: a conversation saved with one model is foreign to another; continuing it is a copy bound to the
    other model, the original keeps its own; a new file starts empty."""
    from quantscope.core.chat.controller import ChatController
    from quantscope.core.chat.store import ChatStore, ModelIdentity

    smol = ModelIdentity("smol.gguf", "MOSTLY_Q4_1", "/m/smol.gguf", 100)
    qwen = ModelIdentity("qwen.gguf", "MOSTLY_Q4_K_M", "/m/qwen.gguf", 200)
    settings = {"system_prompt": "", "mode": "chat", "params": {}}
    with ChatStore(tmp_path / "c.sqlite3") as store:
        ctl = ChatController()
        ctl.set_model(smol)
        ctl.add_user("hello")
        ctl.add_reply("hi", {"n_generated": 1})
        ctl.save(store, settings)
        first = ctl.conv_id
        assert store.get(first).identity == smol and not ctl.foreign
        ctl.set_model(qwen)  # another file
        assert ctl.conv_id is None and ctl.messages == [] and not ctl.foreign
        ctl.open(store, first)
        assert ctl.foreign and [m.content for m in ctl.messages] == ["hello", "hi"]
        assert ctl.prompt(ctl.messages, "chat", "be brief")[0] == {"role": "system", "content": "be brief"}
        copy = ctl.continue_with(store, settings)
        assert copy not in (None, first) and not ctl.foreign
        ctl.add_user("more")
        ctl.save(store, settings)
        assert store.get(first).identity == smol and len(store.get(first).messages) == 2
        assert store.get(copy).identity == qwen and [m.content for m in store.get(copy).messages] == [
            "hello", "hi", "more"]
        ctl.editing = 0  # an edit replaces the message and drops what followed
        ctl.add_user("edited")
        assert [m.content for m in ctl.messages] == ["edited"]


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_cli_special_flag_reaches_the_sampler(command):
    """`--special` is the command line's "Show control tokens": off by default, on when given."""
    from quantscope.cli import main as cli
    from quantscope.cli import model

    parser = cli.build_parser()
    assert model._params(parser.parse_args([command, "m.gguf"])).special is False
    assert model._params(parser.parse_args([command, "m.gguf", "--special"])).special is True
