"""gpt-oss tool calls with the framing as real control tokens, through a real server and the ``openai`` client: the
gpt-oss fixture of tests/test_harmony.py (the framing tokens in its vocabulary, the real template). Its random
weights would not write harmony, so, as there, the sampler is scripted with a reply as gpt-oss writes one; all
the rest is the server's: with tools the framing tokens are written as text and read by the harmony form's parser
(thinking to ``reasoning_content``, a message to ``functions.NAME`` a call, ``<|call|>`` ending generation).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from quantscope.core.gguf import ValueType
from quantscope.core.gguf.edit import SetValue, TypedValue, save_edited
from quantscope.core.server import scheduler

from .server_helpers import serving
from .test_harmony import harmony_model, scripted

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')
TWO = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|end|>'
       '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>')
ANSWER = ("<|channel|>analysis<|message|>Just answer.<|end|><|start|>assistant<|channel|>final<|message|>Sunny."
          "<|return|>")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("harmony")
    # the fixture is made with 256 tokens of context; the template's tool prompt needs more
    path = save_edited(harmony_model(tmp), tmp / "gpt-oss.gguf",
                       [SetValue("gpt-oss.context_length", TypedValue(ValueType.UINT32, 1024))]).path
    with serving(Path(path), n_ctx=1024) as srv:
        yield srv


def ask(server: Any, monkeypatch: pytest.MonkeyPatch, reply: str, **kw: Any) -> Any:
    monkeypatch.setattr(scheduler, "Sampler", scripted(server.app.engine, reply))
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    return c.chat.completions.create(model=server.app.config.model_id, messages=ASK, **{"max_tokens": 128, **kw})


def test_a_call_written_with_control_tokens(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert server.app.tool_format.name == "harmony"
    r = ask(server, monkeypatch, CALL, tools=[WEATHER])
    m = r.choices[0]
    assert m.finish_reason == "tool_calls" and m.message.content is None
    assert m.message.model_extra.get("reasoning_content") == "Need the weather."
    (call,) = m.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    # streamed: the thinking as reasoning deltas, the call as one index-keyed delta
    reasoning, deltas, finish = "", [], None
    for ch in ask(server, monkeypatch, CALL, tools=[WEATHER], stream=True):
        for c in ch.choices:
            reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
            assert not c.delta.content
            deltas.extend(c.delta.tool_calls or [])
            finish = c.finish_reason or finish
    assert (reasoning, finish, [d.index for d in deltas]) == ("Need the weather.", "tool_calls", [0])
    assert json.loads(deltas[0].function.arguments) == {"city": "Paris"}


def test_two_calls_one_after_the_other(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """(<|call|> ends generation, so gpt-oss makes one call a turn; a first call ended by <|end|> carries on.)"""
    r = ask(server, monkeypatch, TWO, tools=[WEATHER])
    calls = r.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Oslo"]
    assert len({c.id for c in calls}) == 2 and r.choices[0].message.content is None
    # cut by max_tokens inside the second: the first is a call, the rest the text written
    cut = ask(server, monkeypatch, TWO, tools=[WEATHER], max_tokens=40).choices[0]
    assert cut.finish_reason == "length" and len(cut.message.tool_calls) == 1
    assert cut.message.content and cut.message.content.startswith("<|start|>assistant to")


def test_an_answer_with_tools_and_without(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for kw in ({"tools": [WEATHER]}, {}):
        m = ask(server, monkeypatch, ANSWER, **kw).choices[0]
        assert (m.finish_reason, m.message.content, m.message.tool_calls) == ("stop", "Sunny.", None), kw
        assert m.message.model_extra.get("reasoning_content") == "Just answer."



@pytest.mark.parametrize("choice", ["named", "required"])
def test_a_forced_call_ends_the_prompt_with_the_framing_tokens(server: Any, monkeypatch: pytest.MonkeyPatch,
                                                               choice: str) -> None:
    tool_choice: Any = {"type": "function", "function": {"name": "get_weather"}} if choice == "named" else "required"
    TIME = {"type": "function", "function": {"name": "get_time", "description": "The local time of a city",
                                             "parameters": WEATHER["function"]["parameters"]}}
    reply = '{"city": "Paris"}' if choice == "named" else '{"name": "get_time", "arguments": {"city": "Paris"}}'
    r = ask(server, monkeypatch, reply, tools=[WEATHER, TIME], tool_choice=tool_choice)
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather" if choice == "named" else "get_time", {"city": "Paris"})
    vocab = server.app.engine.tokenizer.vocab
    rec = server.app.log.records()[-1]
    channel, constrain, message = vocab["<|channel|>"], vocab["<|constrain|>"], vocab["<|message|>"]
    tail = rec.prompt_ids[-24:]
    assert tail[-1] == message and constrain in tail and channel in tail  # control tokens, not their text
    assert rec.prompt_text.endswith("<|start|>assistant<|channel|>commentary" + (
        " to=functions.get_weather" if choice == "named" else "") + " <|constrain|>json<|message|>")
