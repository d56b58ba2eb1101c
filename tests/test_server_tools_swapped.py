"""Each tool-call form through a real server on 127.0.0.1 and the real ``openai`` client: qwen2.5-coder 0.5B copied
with its chat template replaced by another model's (tests/data/tool_templates, set with core/gguf/edit.py), so the
server picks that template's form. A named and a required call (two tools) are forced in that form, streamed and
not, and come back as ``tool_calls``; the Anthropic dialect maps the same call to a ``tool_use`` block, and
Ollama's shows the tools capability and answers an automatic choice. Hostile ends: a forced call cut by
``max_tokens`` comes back as the text written with ``finish_reason`` "length"; an automatic choice over a form the
model does not know answers content or calls, never an error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest

from quantscope.core.gguf.edit import SetChatTemplate, save_edited
from quantscope.core.server import Server
from quantscope.core.server.tools import make_parser

from .server_helpers import serving

DATA = Path(__file__).parent / "data" / "tool_templates"
#: a template of each form (Hermes is qwen2.5-coder's own: tests/test_server_tools.py)
SWAPS = {
    "llama3": "meta-llama-Llama-3.1-8B-Instruct",
    "mistral": "mistralai-Mistral-Nemo-Instruct-2407",
    "mistral-args": "Mistral-Small-3.2-24B-Instruct-2506",
    "qwen3-coder": "Qwen3-Coder",
    "glm": "GLM-4.7-Flash",
    "harmony": "openai-gpt-oss-120b",
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
#: form -> what the prompt of a forced call ends with (named get_weather; required with two tools), the form's
#: opening in it, and what closes the call's block after the JSON
FORCED = {
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n",) * 3 + ("",),
    "mistral": ("[/INST][TOOL_CALLS][", "[/INST][TOOL_CALLS][", "[/INST]", "]"),
    "mistral-args": ("[/INST][TOOL_CALLS]get_weather[ARGS]", "[/INST][TOOL_CALLS]", "[/INST]", ""),
    "qwen3-coder": ("<|im_start|>assistant\n<tool_call>\n",) * 2 + ("<|im_start|>assistant\n", "\n</tool_call>"),
    "glm": ("<|assistant|><think></think><tool_call>",) * 2 + ("<|assistant|><think></think>", "</tool_call>"),
    "harmony": ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
                "<|start|>assistant<|channel|>commentary <|constrain|>json<|message|>", "<|start|>assistant", ""),
}


@pytest.fixture(scope="module", params=list(SWAPS))
def swapped(request: pytest.FixtureRequest, model_path: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Server]]:
    """(form, the server) for qwen2.5-coder with the form's template."""
    form = request.param
    src = (DATA / f"{SWAPS[form]}.jinja").read_text(encoding="utf-8")
    path = tmp_path_factory.mktemp(form) / "qwen.gguf"
    save_edited(model_path("qwen2.5-coder"), path, [SetChatTemplate(src)])
    try:
        with serving(path, n_ctx=2048) as srv:
            yield form, srv
    finally:
        path.unlink()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)


def streamed(c: openai.OpenAI, **kw: Any) -> tuple[str, list[Any], str | None]:
    """(content, the tool-call deltas, finish_reason) of a streamed reply."""
    text, deltas, finish = "", [], None
    for ch in c.chat.completions.create(stream=True, **kw):
        for choice in ch.choices:
            text += choice.delta.content or ""
            deltas.extend(choice.delta.tool_calls or [])
            finish = choice.finish_reason or finish
    return text, deltas, finish


@pytest.mark.parametrize("choice", ["named", "required"])
def test_a_forced_call_in_the_templates_form(swapped: tuple[str, Server], choice: str) -> None:
    form, srv = swapped
    c = client(srv.url)
    tool_choice: Any = ({"type": "function", "function": {"name": "get_weather"}} if choice == "named"
                        else "required")
    kw: dict[str, Any] = {"model": "qwen", "messages": ASK, "tools": [WEATHER, TIME], "tool_choice": tool_choice,
                          "max_tokens": 60, "temperature": 0}
    r = c.chat.completions.create(**kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None, (form, ch.message.content)
    (call,) = ch.message.tool_calls or []
    args = json.loads(call.function.arguments)
    if choice == "named":
        assert call.function.name == "get_weather"
    assert call.function.name in ("get_weather", "get_time") and set(args) <= {"city"}
    assert isinstance(args.get("city"), str)
    if form.startswith("mistral"):
        assert len(call.id) == 9 and call.id.isalnum()  # the ids Mistral's templates take back
    # it was written in the form: the prompt ends with the form's opening, and the opening, the reply and the
    # block's closing read as the form's text give the same call
    rec = srv.app.log.records()[-1]
    named, required, turn, close = FORCED[form]
    opening = named if choice == "named" else required
    assert rec.prompt_text.endswith(opening), rec.prompt_text[-200:]
    assert srv.app.tool_format is not None and srv.app.tool_format.name == form
    parser = make_parser(srv.app.tool_format, [WEATHER, TIME])
    text, calls = parser.push(opening.split(turn, 1)[1] + rec.text + close)
    more_text, more = parser.finish()
    assert text + more_text == "" and [(k["function"]["name"], json.loads(k["function"]["arguments"]))
                                       for k in calls + more] == [(call.function.name, args)]
    text, deltas, finish = streamed(c, **kw)
    assert finish == "tool_calls" and text == "" and [d.index for d in deltas] == [0]
    assert deltas[0].function.name == call.function.name and json.loads(deltas[0].function.arguments) == args
    # the conversation goes on through the template with the call and its result
    follow = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                         "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": "18 C, clear"}]
    r = c.chat.completions.create(model="qwen", messages=follow, tools=[WEATHER, TIME], tool_choice="none",
                                  max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and not r.choices[0].message.tool_calls


def test_a_forced_call_cut_short_is_the_text_written(swapped: tuple[str, Server]) -> None:
    url = swapped[1].url
    kw: dict[str, Any] = {"model": "qwen", "messages": ASK, "tools": [WEATHER], "tool_choice": "required",
                          "max_tokens": 3, "temperature": 0}
    r = client(url).chat.completions.create(**kw)
    ch = r.choices[0]
    assert ch.finish_reason == "length" and not ch.message.tool_calls and ch.message.content
    text, deltas, finish = streamed(client(url), **kw)
    assert (text, deltas, finish) == (ch.message.content, [], "length")


def test_an_automatic_choice_answers(swapped: tuple[str, Server]) -> None:
    """The model was not trained on these forms: whatever it writes comes back as content or parsed calls."""
    url = swapped[1].url
    r = client(url).chat.completions.create(model="qwen", messages=ASK, tools=[WEATHER, TIME], max_tokens=40,
                                            temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason in ("stop", "length", "tool_calls")
    assert ch.message.content or ch.message.tool_calls
    for call in ch.message.tool_calls or []:
        assert call.function.name in ("get_weather", "get_time") and isinstance(
            json.loads(call.function.arguments), dict)


def test_the_anthropic_dialect_gets_the_same_call(swapped: tuple[str, Server]) -> None:
    url = swapped[1].url
    c = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=300)
    tool = {"name": "get_weather", "description": "The current weather of a city",
            "input_schema": WEATHER["function"]["parameters"]}
    m = c.messages.create(model="qwen", max_tokens=60, messages=ASK, tools=[tool],  # type: ignore[list-item]
                          tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input, dict) and isinstance(use.input.get("city"), str)


def test_ollama_shows_the_tools_capability_and_maps_an_answer(swapped: tuple[str, Server]) -> None:
    srv = swapped[1]
    c = ollama.Client(host=srv.url, timeout=300)
    assert "tools" in (c.show("qwen").capabilities or [])
    r = c.chat(model="qwen", messages=ASK, tools=[WEATHER, TIME], options={"temperature": 0, "num_predict": 24})
    assert r.done and (r.message.content or r.message.tool_calls)
    for call in r.message.tool_calls or []:
        assert call.function.name in ("get_weather", "get_time") and isinstance(call.function.arguments, dict)


def test_an_ollama_conversation_goes_on_after_a_call_without_ids(swapped: tuple[str, Server]) -> None:
    """Ollama's clients send a call back without an id and the tool's reply without a ``tool_call_id``; Mistral's
    templates refuse that, so the server gives them ids (core/server/toolcall_formats.py ``with_ids``): every form
    renders the continued conversation and answers."""
    c = ollama.Client(host=swapped[1].url, timeout=300)
    msgs = [*ASK, {"role": "assistant", "content": "",
                   "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "Sunny, 21 °C", "tool_name": "get_weather"}]
    r = c.chat(model="qwen", messages=msgs, tools=[WEATHER, TIME], options={"temperature": 0, "num_predict": 8})
    assert r.done and r.done_reason in ("stop", "length")
