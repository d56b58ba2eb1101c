"""Tool calls (core/server/tools.py) with the server and qwen2.5-coder (whose template writes Hermes
<tool_call> blocks) through the real openai client: a named, a required and an automatic call, streamed as
index-keyed deltas, and a conversation that continues with the tool's result. The forms themselves:
tests/test_server_tools_formats.py; other forms through the server: tests/test_server_tools_swapped.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from quantscope.core.engine.generate import Engine
from quantscope.core.server import Server
from quantscope.core.server.jsonmode import SchemaError
from quantscope.core.server.tools import call_schema, supports_tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_call_schema() -> None:
    assert supports_tools('{% if tools %}<tool_call>{"name": …}{% endif %}') and not supports_tools("{{ messages }}")
    call_schema([WEATHER], "get_weather")
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "array", "uniqueItems": True}}}}}
    with pytest.raises(SchemaError, match="uniqueItems"):
        call_schema([bad], "f")
    with pytest.raises(SchemaError, match="uniqueItems"):  # several tools: each one's arguments held to its parameters
        call_schema([bad, WEATHER], None)
    rich = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "pattern": "a"}}}}}  # beyond the automaton's subset: the call is a grammar
    assert call_schema([rich], "f")[0] == call_schema([rich, WEATHER], None)[0] == "grammar"
    call_schema([WEATHER, {"type": "function", "function": {"name": "g"}}], None)


@pytest.fixture(scope="module")
def qwen(model_path: Any) -> Iterator[openai.OpenAI]:
    eng = Engine(model_path("qwen2.5-coder"), n_ctx=1024, threads=1, backend="cpu")
    srv = Server(eng, "qwen", port=0, parallel=2)
    srv.start()
    try:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    finally:
        srv.stop()
        eng.close()


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_calls(qwen: openai.OpenAI, choice: Any) -> None:
    r = qwen.chat.completions.create(model="qwen", messages=ASK, tools=[WEATHER], tool_choice=choice,
                                     max_tokens=40, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


def test_streamed_tool_call_and_the_conversation_after_it(qwen: openai.OpenAI) -> None:
    deltas, finish = [], None
    for ch in qwen.chat.completions.create(model="qwen", messages=ASK, tools=[WEATHER], max_tokens=40,
                                           temperature=0, stream=True, tool_choice="required"):
        for c in ch.choices:
            deltas.extend(c.delta.tool_calls or [])
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and [d.index for d in deltas] == [0]
    call = deltas[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    made = {"id": call.id, "type": "function",
            "function": {"name": "get_weather", "arguments": call.function.arguments}}
    follow = [*ASK, {"role": "assistant", "content": None, "tool_calls": [made]},
              {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "clear"}'}]
    r = qwen.chat.completions.create(model="qwen", messages=follow, tools=[WEATHER], tool_choice="none",
                                     max_tokens=24, temperature=0)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    with pytest.raises(openai.BadRequestError):  # tool_choice names a tool that is not given
        qwen.chat.completions.create(model="qwen", messages=ASK, tools=[WEATHER], max_tokens=4,
                                     tool_choice={"type": "function", "function": {"name": "nope"}})
