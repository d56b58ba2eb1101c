"""quantscope serve speaking Anthropic's Messages API (core/server/anthropic.py), driven by the real ``anthropic``
client and raw HTTP on a free loopback port: SmolLM2 behind a key for messages, streaming, stop sequences,
max_tokens, count_tokens and refusals; qwen2.5-coder (whose template lists tools) for a tool_use round trip."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from quantscope.core.server import Server

from .server_helpers import serving

KEY = "anthropic-key-1"
ASK = [{"role": "user", "content": "Name three colours."}]
#: sampling fields (the client of this version has no arguments for them: they go in the body as they are)
T0 = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "The current weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def server(model_path: Any) -> Iterator[Server]:
    with serving(model_path("smollm2"), parallel=2, api_key=KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def name(server: Server) -> str:
    return server.app.config.model_id


@pytest.fixture
def client(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


def raw(server: Server, body: Any, path: str = "/v1/messages", key: str | None = KEY) -> httpx.Response:
    headers = {"x-api-key": key} if key else {}
    return httpx.post(server.url + path, headers=headers, json=body, timeout=120)


def test_message(client: anthropic.Anthropic, name: str) -> None:
    m = client.messages.create(model=name, max_tokens=24, messages=ASK, extra_body=T0,
                               system="You are a helpful assistant.")
    assert m.type == "message" and m.role == "assistant" and m.model == name and m.id.startswith("msg_")
    (block,) = m.content
    assert block.type == "text" and block.text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert m.usage.input_tokens > 5 and 0 < m.usage.output_tokens <= 24
    # system as text blocks, and a conversation that continues
    follow = [*ASK, {"role": "assistant", "content": block.text},
              {"role": "user", "content": [{"type": "text", "text": "One more."}]}]
    m2 = client.messages.create(model=name, max_tokens=8, messages=follow, extra_body=T0 | {"top_k": 40, "top_p": 0.9},
                                system=[{"type": "text", "text": "You are a helpful assistant."}])
    assert m2.content[0].type == "text" and m2.usage.input_tokens > m.usage.input_tokens


def test_streamed_message_and_its_events(server: Server, client: anthropic.Anthropic, name: str) -> None:
    whole = client.messages.create(model=name, max_tokens=24, messages=ASK, extra_body=T0)
    kinds: list[str] = []
    text = ""
    with client.messages.stream(model=name, max_tokens=24, messages=ASK, extra_body=T0) as s:
        for ev in s:
            kinds.append(ev.type)
            if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                text += ev.delta.text
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert text == whole.content[0].text == final.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    # on the wire (the client hides the pings): each event named, its data's type the same
    with httpx.stream("POST", server.url + "/v1/messages", headers={"x-api-key": KEY}, timeout=120,
                      json={"model": name, "max_tokens": 8, "messages": ASK, "stream": True, **T0}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    names = [ln.removeprefix("event: ") for ln in lines[0::2]]
    data = [json.loads(ln.removeprefix("data: ")) for ln in lines[1::2]]
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-2:] == ["message_delta",
                                                                                          "message_stop"]
    assert [d["type"] for d in data] == names
    assert data[0]["message"]["usage"]["input_tokens"] == whole.usage.input_tokens
    assert data[-2]["usage"]["output_tokens"] == 8 and data[-2]["delta"]["stop_reason"] == "max_tokens"


def test_max_tokens_and_stop_sequences(client: anthropic.Anthropic, name: str) -> None:
    m = client.messages.create(model=name, max_tokens=5, messages=ASK, extra_body=T0)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 5
    full = client.messages.create(model=name, max_tokens=24, messages=ASK, extra_body=T0).content[0].text  # type: ignore[union-attr]
    words = full.split()
    stop = words[len(words) // 2]
    cut = client.messages.create(model=name, max_tokens=24, messages=ASK, extra_body=T0,
                                 stop_sequences=["@@never@@", stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == full[: full.index(stop)]  # type: ignore[union-attr]
    with client.messages.stream(model=name, max_tokens=24, messages=ASK, extra_body=T0,
                                stop_sequences=[stop]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_count_tokens(client: anthropic.Anthropic, name: str) -> None:
    n = client.messages.count_tokens(model=name, messages=ASK).input_tokens
    m = client.messages.create(model=name, max_tokens=1, messages=ASK)
    assert n == m.usage.input_tokens
    sys = "You are a careful assistant."
    with_sys = client.messages.count_tokens(model=name, messages=ASK, system=sys).input_tokens
    assert with_sys == client.messages.create(model=name, max_tokens=1, messages=ASK, system=sys).usage.input_tokens
    longer = [{"role": "user", "content": "Name three colours and three animals, please."}]
    assert client.messages.count_tokens(model=name, messages=longer).input_tokens > n


def test_api_key(server: Server, name: str) -> None:
    c = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        c.messages.create(model=name, max_tokens=4, messages=ASK)
    assert e.value.status_code == 401
    r = raw(server, {"model": name, "max_tokens": 4, "messages": ASK}, key=None)
    assert r.status_code == 401 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "authentication_error"
    # x-api-key is taken on every path, a wrong one refused alike
    assert httpx.get(server.url + "/v1/models", headers={"x-api-key": KEY}, timeout=30).status_code == 200
    assert httpx.get(server.url + "/v1/models", headers={"x-api-key": "wrong"}, timeout=30).status_code == 401
    # the Bearer form is taken too (the client's auth_token)
    c = anthropic.Anthropic(base_url=server.url, auth_token=KEY, api_key=None, max_retries=0)
    assert c.messages.count_tokens(model=name, messages=ASK).input_tokens > 0


@pytest.mark.parametrize(("body", "field"), [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": "many", "messages": ASK}, "max_tokens"),
    ({"max_tokens": 10**30, "messages": ASK}, "max_tokens"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "hi"}]}, "messages[0].role"),
    ({"max_tokens": 8, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"max_tokens": 8, "messages": []}, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0]"),
    ({"max_tokens": 8, "messages": ASK, "temperature": 2.5}, "temperature"),
    ({"max_tokens": 8, "messages": ASK, "temperature": "warm"}, "temperature"),
    ({"max_tokens": 8, "messages": ASK, "top_k": -3}, "top_k"),
    ({"max_tokens": 8, "messages": ASK, "stop_sequences": "END"}, "stop_sequences"),
    ({"max_tokens": 8, "messages": ASK, "stop_sequences": [1, 2]}, "stop_sequences"),
    ({"max_tokens": 8, "messages": ASK, "system": 7}, "system"),
    ({"max_tokens": 8, "messages": ASK, "stream": "yes"}, "stream"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"name": "f"}]}, "input_schema"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "client tools"),
    ({"max_tokens": 8, "messages": ASK, "tool_choice": {"type": "sometimes"}}, "tool_choice"),
])
def test_hostile_bodies_are_refused_before_the_engine(server: Server, name: str, body: dict[str, Any],
                                                      field: str) -> None:
    before = server.scheduler.metrics.requests
    r = raw(server, {"model": name} | body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert field in err["error"]["message"]
    assert server.scheduler.metrics.requests == before


def test_other_refusals(server: Server, client: anthropic.Anthropic, name: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-nope", max_tokens=4, messages=ASK)
    assert "claude-nope" in str(e.value)
    r = httpx.post(server.url + "/v1/messages", content=b"{oops", timeout=30,
                   headers={"x-api-key": KEY, "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = raw(server, {"model": name, "messages": ASK}, path="/v1/messages/count_tokens")
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    r = raw(server, {"model": name, "messages": "hi"}, path="/v1/messages/count_tokens")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(server.url + "/v1/messages", headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    recs = [r for r in server.app.log.records() if r.endpoint == "/v1/messages"]
    assert recs and {r.dialect for r in recs} == {"anthropic"}


@pytest.fixture(scope="module")
def qwen(model_path: Any) -> Iterator[anthropic.Anthropic]:
    with serving(model_path("qwen2.5-coder"), n_ctx=1024, parallel=1) as srv:
        yield anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=120)


def test_tool_use_round_trip(qwen: anthropic.Anthropic) -> None:
    model = "qwen2.5-coder-0.5b-instruct-q4_k_m"
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = qwen.messages.create(model=model, max_tokens=40, messages=ask, tools=[WEATHER], extra_body=T0)
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
    # streamed: the call as a tool_use block with its input as input_json_delta
    deltas: list[str] = []
    with qwen.messages.stream(model=model, max_tokens=40, messages=ask, tools=[WEATHER], extra_body=T0,
                              tool_choice={"type": "tool", "name": "get_weather"}) as s:
        for ev in s:
            if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                deltas.append(ev.delta.partial_json)
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and json.loads("".join(deltas)) == {"city": "Paris"}
    assert [b.type for b in final.content] == ["tool_use"]
    # the tool's result goes back as a tool_result block
    follow = [*ask, {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                       "input": use.input}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                            "content": [{"type": "text", "text": '{"temperature_c": 18}'}]}]}]
    m2 = qwen.messages.create(model=model, max_tokens=30, messages=follow, tools=[WEATHER],
                              tool_choice={"type": "none"}, extra_body=T0)
    assert m2.stop_reason in ("end_turn", "max_tokens") and m2.content[0].type == "text" and m2.content[0].text


def test_host_and_origin_refusals_come_in_anthropic_s_shape(server: Server, name: str) -> None:
    """The Host/Origin rules run before any route (core/server/policy.py); their refusal is still Anthropic's error
    body, so the client raises its own error class with the message."""
    c = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=60,
                            default_headers={"Origin": "http://evil.example"})
    with pytest.raises(anthropic.PermissionDeniedError) as e:
        c.messages.create(model=name, max_tokens=4, messages=ASK)
    assert e.value.status_code == 403 and "cross-origin" in e.value.message
    assert e.value.body == {"type": "error", "error": {"type": "permission_error", "message": e.value.body[
        "error"]["message"]}}  # type: ignore[index]
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": KEY, "Host": "evil.example"}, timeout=60,
                   json={"model": name, "max_tokens": 4, "messages": ASK})
    assert r.status_code == 421 and r.json()["type"] == "error" and "Host header" in r.json()["error"]["message"]
