"""quantscope serve speaking Ollama's API (core/server/ollama.py), driven by the real ``ollama`` client and raw
HTTP on a free loopback port: SmolLM2 behind a key for the listing, chat, generate, streaming, options, JSON
format, stop strings and refusals; qwen2.5-coder (whose template lists tools) for a tool call round trip."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import pytest

from quantscope.core.server import Server

from .server_helpers import serving

KEY = "ollama-key-1"
ASK = [{"role": "user", "content": "Name three colours."}]
T0 = {"temperature": 0, "num_predict": 24}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def server(model_path: Any) -> Iterator[Server]:
    with serving(model_path("smollm2"), parallel=2, api_key=KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def name(server: Server) -> str:
    return server.app.config.model_id


@pytest.fixture
def client(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def raw(server: Server, method: str, path: str, body: Any = None, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, server.url + path, headers=headers, timeout=120,
                         content=None if body is None else json.dumps(body).encode())


def test_the_listing_endpoints(server: Server, client: ollama.Client, name: str) -> None:
    (m,) = client.list().models
    assert m.model == name and m.size == server.app.engine.file.path.stat().st_size and len(m.digest or "") == 64
    assert m.details is not None and m.details.family == "llama" and m.details.format == "gguf"
    assert m.details.quantization_level == "Q4_1" and m.details.parameter_size == "135M"
    shown = client.show(name)
    assert "completion" in (shown.capabilities or []) and shown.details.family == "llama"
    assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "llama"
    (p,) = client.ps().models
    assert p.model == name and p.size_vram == 0
    assert raw(server, "GET", "/api/version").json()["version"]
    # the probes clients send first, without a key
    r = raw(server, "GET", "/", key=None)
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert raw(server, "HEAD", "/", key=None).status_code == 200
    with pytest.raises(ollama.ResponseError) as e:
        client.show("other-model")
    assert e.value.status_code == 404


def test_chat_streamed_and_not(client: ollama.Client, name: str) -> None:
    r = client.chat(model=name, messages=ASK, options=T0, stream=False, keep_alive="5m")
    assert r.done and r.done_reason in ("stop", "length") and r.message.role == "assistant" and r.message.content
    assert r.prompt_eval_count and r.eval_count and 0 < r.eval_count <= 24
    assert r.total_duration and r.eval_duration and r.prompt_eval_duration and r.total_duration > r.eval_duration
    parts = list(client.chat(model=name, messages=ASK, options=T0, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].eval_count == r.eval_count
    assert len(parts) > 2 and "".join(p.message.content or "" for p in parts) == r.message.content
    # a conversation that continues, with the model's name as Ollama writes it
    follow = [*ASK, {"role": "assistant", "content": r.message.content}, {"role": "user", "content": "One more."}]
    r2 = client.chat(model=name + ":latest", messages=follow, options=T0)
    assert r2.prompt_eval_count and r2.prompt_eval_count > r.prompt_eval_count


def test_generate(client: ollama.Client, name: str) -> None:
    r = client.generate(model=name, prompt="Name three colours.", system="Answer briefly.", options=T0)
    assert r.done and r.response and r.eval_count
    parts = list(client.generate(model=name, prompt="Name three colours.", system="Answer briefly.", options=T0,
                                 stream=True))
    assert parts[-1].done and "".join(p.response for p in parts) == r.response
    rr = client.generate(model=name, prompt="The capital of France is", raw=True, options=T0)
    assert rr.response and rr.prompt_eval_count is not None and rr.prompt_eval_count < 10
    loaded = client.generate(model=name, prompt="")  # nothing to generate: Ollama's "load the model"
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


def test_options_max_tokens_and_stop(client: ollama.Client, name: str) -> None:
    r = client.chat(model=name, messages=ASK, options={"temperature": 0, "num_predict": 5})
    assert r.done_reason == "length" and r.eval_count == 5
    full = client.chat(model=name, messages=ASK, options=T0).message.content or ""
    words = full.split()
    stop = words[len(words) // 2]
    cut = client.chat(model=name, messages=ASK, options=T0 | {"stop": [stop]})
    assert cut.done_reason == "stop" and cut.message.content == full[: full.index(stop)]
    # sampling options change the reply the way they do on the OpenAI path: the same seed, the same reply
    hot = {"temperature": 1.5, "top_k": 50, "top_p": 0.95, "min_p": 0.01, "seed": 7, "num_predict": 12,
           "repeat_penalty": 1.1, "num_ctx": 256}
    a, b = (client.chat(model=name, messages=ASK, options=hot).message.content for _ in range(2))
    assert a == b


def test_json_format(client: ollama.Client, name: str) -> None:
    r = client.chat(model=name, messages=[{"role": "user", "content": "A JSON object about a cat."}],
                    format="json", options={"temperature": 0, "num_predict": 40})
    text = r.message.content or ""
    assert text.lstrip().startswith("{")  # held to JSON from its first character
    if r.done_reason == "stop":
        assert isinstance(json.loads(text), dict)
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                               "age": {"type": "integer"}},
              "required": ["colour", "age"], "additionalProperties": False}
    r = client.generate(model=name, prompt="Describe a cat as JSON.", format=schema,
                        options={"temperature": 0, "num_predict": 60})
    assert r.done_reason == "stop"
    data = json.loads(r.response)
    assert set(data) == {"colour", "age"} and isinstance(data["age"], int)


def test_api_key(server: Server, name: str) -> None:
    for headers in ({"Authorization": "Bearer wrong"}, {}):
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=server.url, headers=headers).chat(model=name, messages=ASK)
        assert e.value.status_code == 401
    r = raw(server, "POST", "/api/chat", {"model": name, "messages": ASK}, key=None)
    assert r.status_code == 401 and set(r.json()) == {"error"} and "API key" in r.json()["error"]
    r = raw(server, "GET", "/api/tags", key="wrong")
    assert r.status_code == 401


def test_host_and_origin_refusals_come_in_ollama_s_shape(server: Server, name: str) -> None:
    """The Host/Origin rules run before any route (core/server/policy.py); their refusal is still Ollama's error
    body, so the client reads its message."""
    auth = {"Authorization": f"Bearer {KEY}"}
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=server.url, headers={**auth, "Origin": "http://evil.example"}).chat(model=name,
                                                                                            messages=ASK)
    assert e.value.status_code == 403 and "cross-origin" in e.value.error
    r = httpx.get(server.url + "/api/tags", headers={**auth, "Host": "evil.example"}, timeout=60)
    assert r.status_code == 421 and set(r.json()) == {"error"} and "Host header" in r.json()["error"]


@pytest.mark.parametrize(("body", "field"), [
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": "hi"}, "messages"),
    ({"messages": ASK, "options": {"temperature": "hot"}}, "options.temperature"),
    ({"messages": ASK, "options": {"num_predict": 10**30}}, "options.num_predict"),
    ({"messages": ASK, "options": {"top_k": -1}}, "options.top_k"),
    ({"messages": ASK, "options": {"seed": 1.5}}, "options.seed"),
    ({"messages": ASK, "options": {"num_ctx": "big"}}, "options.num_ctx"),
    ({"messages": ASK, "options": {"num_thread": "all"}}, "options.num_thread"),
    ({"messages": ASK, "options": {"presence_penalty": 3.5}}, "options.presence_penalty"),
    ({"messages": ASK, "options": []}, "options"),
    ({"messages": ASK, "format": "xml"}, "format"),
    ({"messages": ASK, "format": {"type": "object", "properties": {"x": {"type": "array", "uniqueItems": True}}}},
     "format"),
    ({"messages": ASK, "keep_alive": [5]}, "keep_alive"),
    ({"messages": ASK, "stream": "yes"}, "stream"),
    ({"messages": ASK, "tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "messages[0].images"),
    ({"messages": ASK, "options": {"num_ctx": 4}}, "num_ctx"),
])
def test_hostile_chat_bodies_are_refused_before_the_engine(server: Server, name: str, body: dict[str, Any],
                                                           field: str) -> None:
    before = server.scheduler.metrics.requests
    r = raw(server, "POST", "/api/chat", {"model": name} | body)
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"error"} and field in r.json()["error"]
    assert server.scheduler.metrics.requests == before


def test_other_refusals(server: Server, name: str) -> None:
    r = raw(server, "POST", "/api/chat", {"model": "nope", "messages": ASK})
    assert r.status_code == 404 and "nope" in r.json()["error"]
    r = raw(server, "POST", "/api/generate", {"model": name, "prompt": "x", "suffix": "y"})
    assert r.status_code == 400 and "suffix" in r.json()["error"]
    r = raw(server, "POST", "/api/generate", {"model": name, "prompt": 5})
    assert r.status_code == 400 and "prompt" in r.json()["error"]
    r = raw(server, "POST", "/api/embed", {"model": name, "input": "hello"})
    assert r.status_code == 501 and "embedding" in r.json()["error"]
    r = httpx.post(server.url + "/api/chat", content=b"{not json", timeout=30,
                   headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and set(r.json()) == {"error"}
    r = raw(server, "GET", "/api/nothing")
    assert r.status_code == 404 and set(r.json()) == {"error"}
    r = raw(server, "GET", "/api/chat")
    assert r.status_code == 405 and set(r.json()) == {"error"}
    r = raw(server, "POST", "/api/generate", {"model": name, "prompt": "x", "options": {"temperature": [1]}})
    assert r.status_code == 400 and "options.temperature" in r.json()["error"]
    # a body sent as `curl -d` sends it (a form's type) is read as JSON on Ollama's paths, and only there
    form = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/x-www-form-urlencoded"}
    body = json.dumps({"model": name, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}})
    r = httpx.post(server.url + "/api/generate", content=body, headers=form, timeout=120)
    assert r.status_code == 200 and r.json()["eval_count"] == 2
    r = httpx.post(server.url + "/v1/completions", content=body, headers=form, timeout=120)
    assert r.status_code == 415
    # the request log names the dialect of each request
    recs = server.app.log.records()
    assert {r.endpoint for r in recs} >= {"/api/chat", "/api/generate"}
    assert {r.dialect for r in recs if r.endpoint.startswith("/api/")} == {"ollama"}


@pytest.fixture(scope="module")
def qwen(model_path: Any) -> Iterator[ollama.Client]:
    with serving(model_path("qwen2.5-coder"), n_ctx=1024, parallel=1) as srv:
        yield ollama.Client(host=srv.url, timeout=120)


def test_tool_call_round_trip(qwen: ollama.Client) -> None:
    model = "qwen2.5-coder-0.5b-instruct-q4_k_m"
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = qwen.chat(model=model, messages=ask, tools=[WEATHER], options={"temperature": 0, "num_predict": 40})
    (call,) = r.message.tool_calls or []
    assert call.function.name == "get_weather" and dict(call.function.arguments) == {"city": "Paris"}
    assert not r.message.content and r.done_reason == "stop"
    streamed = [c for p in qwen.chat(model=model, messages=ask, tools=[WEATHER], stream=True,
                                     options={"temperature": 0, "num_predict": 40})
                for c in (p.message.tool_calls or [])]
    assert [c.function.name for c in streamed] == ["get_weather"]
    follow = [*ask, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": '{"temperature_c": 18, "sky": "clear"}'}]
    r2 = qwen.chat(model=model, messages=follow, options={"temperature": 0, "num_predict": 30})
    assert r2.message.content and not r2.message.tool_calls
