"""llama.cpp's 70 real chat templates (``models/templates/*.jinja`` of the llama-cpp-python sdist, kept by
``quantscope models fetch``) rendered by :class:`ChatTemplate` exactly as Hugging Face's reference renderer
(``transformers``' ``render_jinja_template``, a test-only dependency) renders them, for a standard set of
conversations: system + user, user alone, several turns, an assistant prefill and a tool call with its result,
each with and without the generation prompt. Where the reference refuses a conversation (a template that raises on
a system message, or iterates ``tools`` that are not given), ours must refuse it too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from quantscope.core import catalog
from quantscope.core.chat import ChatTemplate

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"]}}}]
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "system+user": ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}], {}),
    "user": ([{"role": "user", "content": "Hello"}], {}),
    "multi-turn": ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Tell me a joke"}], {}),
    "prefill": ([{"role": "user", "content": "Write a haiku"}, {"role": "assistant", "content": "Autumn moon"}], {}),
    "tools": ([{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "call_1", "function": {
                   "name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1", "name": "get_weather"}],
              {"tools": TOOLS}),
}


def templates() -> list[Path]:
    if not catalog.data_present():
        pytest.fail(f"llama.cpp's test data is missing from {catalog.data_dir()}: run `quantscope models fetch`",
                    pytrace=False)
    return sorted((catalog.data_dir() / "templates").glob("*.jinja"))


def reference(source: str, messages: list[dict[str, Any]], agp: bool, extra: dict[str, Any]) -> str | None:
    """Hugging Face's rendering, or None where it raises."""
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        out = render_jinja_template([messages], chat_template=source, add_generation_prompt=agp, bos_token="<s>",
                                    eos_token="</s>", **extra)
    except Exception:
        return None
    rendered = out[0] if isinstance(out, tuple) else out
    return rendered[0] if isinstance(rendered, list) else rendered


def ours(source: str, messages: list[dict[str, Any]], agp: bool, extra: dict[str, Any]) -> str | None:
    try:
        return ChatTemplate(source, "<s>", "</s>").render(messages, add_generation_prompt=agp, **extra)
    except Exception:
        return None


def test_all_templates_render_as_hugging_face_does():
    logging.getLogger("transformers").setLevel(logging.ERROR)
    paths = templates()
    assert len(paths) == 70
    differ, refused = [], 0
    for p in paths:
        source = p.read_text(encoding="utf-8")
        for name, (messages, extra) in CONVERSATIONS.items():
            for agp in (True, False):
                want, got = reference(source, messages, agp, extra), ours(source, messages, agp, extra)
                refused += want is None
                if want != got:
                    differ.append((p.name, name, agp, want, got))
    assert not differ, f"{len(differ)} of {len(paths) * 10} renderings differ, first: {differ[0]!r}"
    assert refused < 100  # most conversations render: the comparison is not between two refusals
