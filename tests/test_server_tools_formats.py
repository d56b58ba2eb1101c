"""The tool-call forms (core/server/toolcall_formats.py, core/server/tools.py) checked against the chat templates'
own writing: each template (tests/data/tool_templates, llama.cpp's test copies) renders an assistant turn that
carries tool calls (one, and two in parallel where the template writes several; arguments with nested objects and
strings with quotes, newlines, unicode, markup and JSON brackets) with our renderer, and the form's parser must
recover exactly those calls from the reply's text, whole and fed in random pieces, the content outside the calls
kept. Then what a model may write that the templates do not (Llama's ``;``-separated and ``<|python_tag|>``
calls, harmony's ``to=`` in the channel, preambles and final answers), the forced forms, and hostile replies:
arguments that are not JSON, tools that were not given, blocks never closed, and every cut of a rendered reply.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from quantscope.core.chat import ChatTemplate
from quantscope.core.server.jsonmode import SchemaError, feed, initial
from quantscope.core.server.toolcall_formats import FORMATS, tool_format
from quantscope.core.server.tools import HarmonyParser, ToolCallParser, make_parser, supports_tools

DATA = Path(__file__).parent / "data" / "tool_templates"
#: template -> (its form, whether it writes several calls in one turn)
TEMPLATES: dict[str, tuple[str, bool]] = {
    "meta-llama-Llama-3.1-8B-Instruct": ("llama3", False),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama3", False),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistral", True),
    "Mistral-Small-3.2-24B-Instruct-2506": ("mistral-args", True),
    "unsloth-mistral-Devstral-Small-2507": ("mistral-args", True),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("mistral-args", True),
    "Qwen3-Coder": ("qwen3-coder", True),
    "GLM-4.6": ("glm", True),
    "GLM-4.7-Flash": ("glm", True),
    "openai-gpt-oss-120b": ("harmony", False),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("hermes", True),
    "Qwen-Qwen2.5-7B-Instruct": ("hermes", True),
}
#: the end of an assistant turn as templates write it: a control token the model ends generation with
TURN_ENDS = ("<|eot_id|>", "<|eom_id|>", "</s>", "<|im_end|>\n", "<|im_end|>", "<|call|>", "<|end|>", "<|return|>")

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"},
                                         "opts": {"type": "object"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"},
                                         "filters": {"type": "array"}}, "required": ["query"]}}},
]
CALLS = [
    {"id": "a1b2c3d4e", "type": "function", "function": {"name": "get_weather", "arguments": {
        "city": 'São "Paulo"\nBrasil 🌧 <b>&amp; \\n', "unit": "°C",
        "opts": {"nested": {"deep": [1, 2.5, None, True, {"k": "}]{["}]}, "empty": {}}}}},
    {"id": "f6g7h8i9j", "type": "function", "function": {"name": "search", "arguments": {
        "query": "tab\there, back\\slash", "limit": 3, "filters": ["a", {"b": [False]}]}}},
]
USER = [{"role": "user", "content": "What is the weather in São Paulo, and search the news?"}]


def template(name: str) -> ChatTemplate:
    return ChatTemplate((DATA / f"{name}.jinja").read_text(encoding="utf-8"), "<s>", "</s>")


def reply_of(name: str, calls: list[dict[str, Any]], content: str = "Let me check.") -> str:
    """The assistant turn's text as the template writes it: the conversation with the turn, less the prompt
    that asks for it (and less the control token that ends the turn)."""
    tpl = template(name)
    kw: dict[str, Any] = {"tools": TOOLS, "enable_thinking": False}
    prompt = tpl.render(USER, add_generation_prompt=True, **kw)
    whole = tpl.render([*USER, {"role": "assistant", "content": content, "tool_calls": calls}],
                       add_generation_prompt=False, **kw)
    assert whole.startswith(prompt), name
    text = whole[len(prompt):]
    for end in TURN_ENDS:
        text = text.removesuffix(end)
    return text


def parse(parser: ToolCallParser | HarmonyParser, pieces: list[str]) -> tuple[str, str, list[dict[str, Any]]]:
    """(content, reasoning, calls) of a reply fed in ``pieces``."""
    text, reasoning, calls = "", "", []
    for p in pieces:
        t, c = parser.push(p)
        text, calls, reasoning = text + t, calls + c, reasoning + parser.take_reasoning()
    t, c = parser.finish()
    return text + t, reasoning + parser.take_reasoning(), calls + c


def chunked(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 40))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def pairs(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def expected(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


def fmt_of(name: str) -> Any:
    return tool_format((DATA / f"{name}.jinja").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_template_picks_its_form(name: str) -> None:
    fmt = fmt_of(name)
    assert fmt is not None and fmt.name == TEMPLATES[name][0]
    assert supports_tools((DATA / f"{name}.jinja").read_text(encoding="utf-8"))


def test_templates_without_a_form_this_server_reads() -> None:
    assert tool_format("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    # functionary v3.1 writes <function=name>{json}</function>, not Llama's JSON: not taken for it
    assert tool_format("<|start_header_id|>{{ tools }}<function=f>{\"parameters\": 1}</function>") is None
    assert [f.name for f in FORMATS] == ["harmony", "qwen3-coder", "glm", "mistral-args", "mistral", "hermes",
                                         "llama3"]


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("name", TEMPLATES)
def test_calls_come_back_from_the_templates_own_writing(name: str, n: int) -> None:
    form, parallel = TEMPLATES[name]
    if n == 2 and not parallel:
        pytest.skip("the template writes one call per turn")
    calls = CALLS[:n]
    reply = reply_of(name, calls)
    fmt = fmt_of(name)
    content, reasoning, got = parse(make_parser(fmt, TOOLS), [reply])
    assert pairs(got) == expected(calls), reply
    if "Let me check." in reply:  # the templates that keep an assistant's words beside its calls
        if form == "harmony":
            assert (content, reasoning) == ("", "Let me check.")
        else:
            assert content.strip() == "Let me check." or content.endswith("\nLet me check."), content
    else:
        assert content == ""
    if form in ("mistral", "mistral-args") and "a1b2c3d4e" in reply:
        assert [c["id"] for c in got] == [c["id"] for c in calls]  # the ids the template wrote
    for c in got:
        assert c["type"] == "function" and isinstance(c["function"]["arguments"], str)
        if fmt.short_ids:  # Mistral's templates refuse any other id when the conversation goes on
            assert len(c["id"]) == 9 and c["id"].isalnum()
    # the same reply in random pieces: the same calls and content
    rng = random.Random(name + str(n))
    for _ in range(25):
        again = parse(make_parser(fmt, TOOLS), chunked(reply, rng))
        assert (again[0], again[1], pairs(again[2])) == (content, reasoning, pairs(got))


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_cut_of_a_reply_is_read_without_failing(name: str) -> None:
    """A reply cut anywhere (max_tokens): content and whole calls only, never an exception; the text of a
    call cut short comes back as content, as written."""
    fmt = fmt_of(name)
    reply = reply_of(name, CALLS[: 2 if TEMPLATES[name][1] else 1])
    for cut in range(len(reply)):
        content, reasoning, got = parse(make_parser(fmt, TOOLS), [reply[:cut]])
        for c in got:
            assert (c["function"]["name"], json.loads(c["function"]["arguments"])) in expected(CALLS)
        assert len(content) + len(reasoning) <= cut


def test_hermes_and_the_bare_json_small_models_write() -> None:
    p = make_parser(fmt_of("Qwen-Qwen2.5-7B-Instruct"), TOOLS)
    assert parse(p, ['Sure.<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call> Done.'])[0] == (
        "Sure. Done.")
    text, _, got = parse(make_parser(fmt_of("Qwen-Qwen2.5-7B-Instruct"), TOOLS),
                         [' {"name": "get_weather", ', '"arguments": {"city": "Oslo"}}'])
    assert text == "" and pairs(got) == [("get_weather", {"city": "Oslo"})]
    # text is never held back longer than it could still be an opening
    p = make_parser(fmt_of("Qwen-Qwen2.5-7B-Instruct"), TOOLS)
    assert p.push("a <tool")[0] == "a" and p.push("s>")[0] == " <tools>"


def test_llama3_parallel_and_python_tag_calls() -> None:
    fmt = fmt_of("meta-llama-Llama-3.1-8B-Instruct")
    raw = '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "search", "arguments": {"query": "q"}}'
    for pieces in ([raw], list(raw)):
        text, _, got = parse(make_parser(fmt, TOOLS), pieces)
        assert text == "" and pairs(got) == [("get_weather", {"city": "Oslo"}), ("search", {"query": "q"})]
    text, _, got = parse(make_parser(fmt, TOOLS),
                         ['<|python_tag|>{"type": "function", "name": "search", "parameters": {"query": "q"}}'])
    assert text == "" and pairs(got) == [("search", {"query": "q"})]
    # JSON that is not a call of the tools given is the answer
    assert parse(make_parser(fmt, TOOLS), ['{"answer": 42} is the JSON'])[0] == '{"answer": 42} is the JSON'


def test_harmony_as_the_model_writes_it() -> None:
    fmt = fmt_of("openai-gpt-oss-120b")
    raw = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions."
           'get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>')
    for pieces in ([raw], list(raw)):
        content, reasoning, got = parse(make_parser(fmt, TOOLS), pieces)
        assert (content, reasoning, pairs(got)) == ("", "Need weather.", [("get_weather", {"city": "Oslo"})])
    # <|call|> ends generation, so the last call ends with the reply; two calls one after the other
    two = (' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "A"}<|call|>'
           '<|start|>assistant to=functions.search<|channel|>commentary json<|message|>{"query": "b"}')
    assert pairs(parse(make_parser(fmt, TOOLS), [two])[2]) == [("get_weather", {"city": "A"}), ("search",
                                                                                                   {"query": "b"})]
    # a final answer, a preamble on commentary, and a reply that ignores the format
    assert parse(make_parser(fmt, TOOLS), ["<|channel|>final<|message|>It is sunny.<|return|>"])[0] == "It is sunny."
    assert parse(make_parser(fmt, TOOLS), ["<|channel|>commentary<|message|>Checking…<|end|>"])[0] == "Checking…"
    assert parse(make_parser(fmt, TOOLS), ["too hot"])[0] == "too hot"


def test_arguments_that_are_not_json_stay_as_written() -> None:
    cases = {
        "Qwen-Qwen2.5-7B-Instruct": '<tool_call>\n{"name": "search", "arguments": {"query": }\n</tool_call>',
        "meta-llama-Llama-3.1-8B-Instruct": '{"name": "search", "parameters": {"query": nope}}',
        "mistralai-Mistral-Nemo-Instruct-2407": '[TOOL_CALLS][{"name": "search", "arguments": {query}}]',
        "unsloth-mistral-Devstral-Small-2507": "[TOOL_CALLS]search[ARGS]{query: 1}",
        "Qwen3-Coder": "<tool_call>\n<function=search>\nquery=1\n</function>\n</tool_call>",
        "GLM-4.6": "<tool_call>search\n<arg_key>query</arg_key>\n</tool_call>",
        "openai-gpt-oss-120b": "<|channel|>commentary to=functions.search <|constrain|>json<|message|>{query}",
    }
    for name, raw in cases.items():
        content, _, got = parse(make_parser(fmt_of(name), TOOLS), [raw])
        assert got == [] and content == raw, name
        content, _, got = parse(make_parser(fmt_of(name), TOOLS), list(raw))
        assert got == [] and content == raw, name


def test_a_tool_that_was_not_given_is_not_a_call() -> None:
    cases = {
        "Qwen-Qwen2.5-7B-Instruct": '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',
        "Mistral-Small-3.2-24B-Instruct-2506": '[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}',
        "Qwen3-Coder": "<tool_call>\n<function=rm_rf>\n<parameter=p>\n/\n</parameter>\n</function>\n</tool_call>",
        "GLM-4.7-Flash": "<tool_call>rm_rf<arg_key>p</arg_key><arg_value>/</arg_value></tool_call>",
        "openai-gpt-oss-120b": '<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{"p": 1}',
    }
    for name, raw in cases.items():
        content, _, got = parse(make_parser(fmt_of(name), TOOLS), [raw])
        assert got == [] and content == raw, name


def test_a_block_never_closed_is_content_unless_it_is_whole() -> None:
    fmt = fmt_of("Qwen3-Coder")
    cut = "Calling.<tool_call>\n<function=search>\n<parameter=query>\nx"
    assert parse(make_parser(fmt, TOOLS), [cut])[:3:2] == ("Calling." + cut[8:], [])
    whole = "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</function>\n"
    assert pairs(parse(make_parser(fmt, TOOLS), [whole])[2]) == [("search", {"query": "x"})]
    hermes = fmt_of("NousResearch-Hermes-3-Llama-3.1-8B-tool_use")
    assert pairs(parse(make_parser(hermes, TOOLS), ['<tool_call>{"name": "search", "arguments": {"query": "a"}}'])[2]
                 ) == [("search", {"query": "a"})]
    assert parse(make_parser(hermes, TOOLS), ['<tool_call>{"name": "sea'])[0] == '<tool_call>{"name": "sea'


def test_xml_values_are_read_by_the_parameters_types() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string"}, "n": {"type": "integer"}, "o": {"type": "object"},
        "sn": {"type": ["string", "null"]}}}}}]
    raw = ("<tool_call>\n<function=f>\n<parameter=s>\n123\n</parameter>\n<parameter=n>\n123\n</parameter>\n"
           '<parameter=o>\n{"a": 1}\n</parameter>\n<parameter=x>\nnot json\n</parameter>\n'
           "<parameter=sn>\n7\n</parameter>\n<parameter=y>\nnull\n</parameter>\n</function>\n</tool_call>")
    assert pairs(parse(make_parser(fmt_of("Qwen3-Coder"), tools), [raw])[2]) == [
        ("f", {"s": "123", "n": 123, "o": {"a": 1}, "x": "not json", "sn": "7", "y": None})]
    glm = "<tool_call>f<arg_key>sn</arg_key><arg_value>null</arg_value><arg_key>n</arg_key><arg_value>5</arg_value>"
    assert pairs(parse(make_parser(fmt_of("GLM-4.7-Flash"), tools), [glm + "</tool_call>"])[2]) == [
        ("f", {"sn": None, "n": 5})]


FORCED = {  # form -> (prefix named, prefix with several tools)
    "hermes": ("<tool_call>\n", "<tool_call>\n"),
    "qwen3-coder": ("<tool_call>\n", "<tool_call>\n"),
    "glm": ("<tool_call>", "<tool_call>"),
    "llama3": ("", ""),
    "mistral": ("[TOOL_CALLS][", "[TOOL_CALLS]["),
    "mistral-args": ("[TOOL_CALLS]search[ARGS]", "[TOOL_CALLS]"),
    "harmony": ("<|channel|>commentary to=functions.search <|constrain|>json<|message|>",
                "<|channel|>commentary <|constrain|>json<|message|>"),
}


@pytest.mark.parametrize("form", FORCED)
def test_forced_calls(form: str) -> None:
    fmt = next(f for f in FORMATS if f.name == form)
    named = fmt.force(TOOLS, "search")
    several = fmt.force(TOOLS, None)
    assert (named.prefix, several.prefix) == FORCED[form]
    args = {"query": "q", "limit": 2}
    body = json.dumps(args) if named.name else json.dumps({"name": "search", "arguments": args})
    assert feed(initial(named.schema()), body.encode()) is not None  # the schema lets the call through
    assert pairs([named.call(body)]) == [("search", args)]  # type: ignore[list-item]
    both = json.dumps({"name": "get_weather", "arguments": {"city": "x"}})
    assert feed(initial(several.schema()), both.encode()) is not None
    assert pairs([several.call(both)]) == [("get_weather", {"city": "x"})]  # type: ignore[list-item]
    assert named.call('{"query": ') is None and several.call("") is None  # cut short: no call
    # a template that opens a thinking block: the forced call closes it first
    assert named.opening("<|assistant|><think>\n") == "</think>" + named.prefix == "</think>" + named.opening("x")
    # one tool: its name is known, as when it is named
    assert fmt.force(TOOLS[:1], None).name == ("get_weather" if fmt.name_outside else None)
    # what the forced reply reads as when it is fed back as the form's own text
    text = named.prefix + body
    if form in ("hermes", "qwen3-coder", "glm"):
        text += "\n</tool_call>"
    if form == "mistral":
        text += "]"
    got = parse(make_parser(fmt, TOOLS), [text])
    assert pairs(got[2]) == [("search", args)], text


def test_forcing_refuses_what_cannot_be_enforced() -> None:
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"not": {"type": "string"}}}}}}]
    for fmt in FORMATS:
        with pytest.raises(SchemaError, match="not"):
            fmt.force(bad, "f").schema()


def test_harmony_json_on_commentary_names_its_function() -> None:
    fmt = fmt_of("openai-gpt-oss-120b")
    raw = '<|channel|>commentary <|constrain|>json<|message|>{"name": "search", "arguments": {"query": "q"}}'
    assert pairs(parse(make_parser(fmt, TOOLS), [raw])[2]) == [("search", {"query": "q"})]
    other = '<|channel|>commentary <|constrain|>json<|message|>{"name": "nope", "arguments": {}}'
    assert parse(make_parser(fmt, TOOLS), [other]) == (other, "", [])


def test_calls_and_replies_without_ids_get_them() -> None:
    from quantscope.core.server.toolcall_formats import with_ids

    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [{"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": [call, {**call, "id": "abcDEF123"}]},
            {"role": "tool", "content": "1"}, {"role": "tool", "content": "2", "tool_call_id": "given"}]
    out = with_ids(msgs, short=True)
    first, kept = out[1]["tool_calls"]
    assert len(first["id"]) == 9 and first["id"].isalnum() and kept["id"] == "abcDEF123"
    assert out[2]["tool_call_id"] == first["id"] and out[3]["tool_call_id"] == "given"
    assert "id" not in msgs[1]["tool_calls"][0] and "tool_call_id" not in msgs[2]  # the request is not modified
    assert with_ids(msgs, short=False)[1]["tool_calls"][0]["id"].startswith("call_")
