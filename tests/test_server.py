"""quantscope serve: the OpenAI-compatible server, driven by the real ``openai`` client and raw HTTP on a free
loopback port, with SmolLM2 behind it (4 slots, no queue: the fifth request at once is refused)."""

from __future__ import annotations

import http.client as httplib
import json
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import openai
import pytest

from quantscope.core.server import Server
from quantscope.core.server.scheduler import held_back

from .server_helpers import serving

KEY = "test-key-123"
SLOTS = 4
MAX_BODY = 64 * 1024
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server(model_path: Any) -> Iterator[Server]:
    path = model_path("smollm2")
    with serving(path, parallel=SLOTS, api_key=KEY, max_queue=0, max_body=MAX_BODY) as srv:
        yield srv


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


class Reply:
    """A finished raw HTTP exchange."""

    def __init__(self, r: httplib.HTTPResponse) -> None:
        self.status_code = r.status
        self.headers = {k.lower(): v for k, v in r.getheaders()}
        self.text = r.read().decode()

    def json(self) -> Any:
        return json.loads(self.text)


class Http:
    """Raw HTTP on the server (the standard library's client: bodies the openai client would not send)."""

    def __init__(self, server: Server, key: str | None = KEY) -> None:
        self.host, self.port = server.host, server.port
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def open(self, method: str, path: str, body: bytes | Iterable[bytes] | None = None,
             json_body: Any = None) -> tuple[httplib.HTTPConnection, httplib.HTTPResponse]:
        conn = httplib.HTTPConnection(self.host, self.port, timeout=60)
        headers = dict(self.headers)
        if json_body is not None:
            body = json.dumps(json_body).encode()
        if body is not None:
            headers["Content-Type"] = "application/json"
        chunked = body is not None and not isinstance(body, bytes)
        if chunked:
            headers["Transfer-Encoding"] = "chunked"
        conn.request(method, path, body=body, headers=headers, encode_chunked=chunked)
        return conn, conn.getresponse()

    def request(self, method: str, path: str, **kw: Any) -> Reply:
        conn, r = self.open(method, path, **kw)
        try:
            return Reply(r)
        finally:
            conn.close()

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def post(self, path: str, content: bytes | Iterable[bytes] | None = None, json: Any = None) -> Reply:
        return self.request("POST", path, body=content, json_body=json)


@pytest.fixture
def http(server: Server) -> Http:
    return Http(server)


def idle(server: Server, timeout: float = 120.0) -> None:
    """Wait until no slot is busy (a closed stream frees its slot at the scheduler's next step)."""
    end = time.monotonic() + timeout
    while server.scheduler.busy_slots or server.scheduler.queued:
        assert time.monotonic() < end, "the slots did not become free"
        time.sleep(0.01)


def test_models_health_and_api_key(server: Server, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct.Q4_1"]
    anon = Http(server, key=None)
    assert anon.get("/health").json()["status"] == "ok"  # open without the key
    for key in ("wrong", ""):
        bad = openai.OpenAI(base_url=server.url + "/v1", api_key=key or "x", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as exc:
            bad.models.list()
        assert exc.value.status_code == 401
    r = anon.post("/v1/chat/completions", json={"messages": CHAT})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert anon.get("/metrics").status_code == 401


def test_chat_streamed_and_not_give_the_same_text(server: Server, client: openai.OpenAI) -> None:
    idle(server)
    whole = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=CHAT, max_tokens=24,
                                           temperature=0)
    text = whole.choices[0].message.content
    assert text and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason in ("stop", "length")
    u = whole.usage
    assert u.prompt_tokens > 10 and 0 < u.completion_tokens <= 24
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    parts, finish, usage = [], None, None
    for chunk in client.chat.completions.create(messages=CHAT, model="SmolLM2-135M-Instruct.Q4_1", max_tokens=24,
                                                temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(parts) == text
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == u.completion_tokens
    # the same prompt again: every prompt token came from the slot's cache
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens == u.prompt_tokens


def test_completion_streamed_and_not(server: Server, client: openai.OpenAI) -> None:
    idle(server)
    prompt = "The capital of France is"
    whole = client.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=prompt, max_tokens=8,
                                      temperature=0)
    text = whole.choices[0].text
    assert "Paris" in text
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 8
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", prompt=prompt, max_tokens=8, temperature=0, stream=True) if c.choices)
    assert streamed == text
    # a stop string ends the text before it, and is not part of it
    cut = client.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=prompt, max_tokens=8,
                                    temperature=0, stop=["aris"])
    assert cut.choices[0].text == text[: text.index("aris")] and cut.choices[0].finish_reason == "stop"
    # one that spans tokens, streamed: none of it is sent, not even its first tokens
    stop = text[2:9]
    parts = [c.choices[0].text for c in client.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", prompt=prompt, max_tokens=8, temperature=0, stop=[stop, "zzz"],
        stream=True) if c.choices]
    assert "".join(parts) == text[: text.index(stop)]


def test_json_schema_and_json_object_outputs_parse(server: Server, client: openai.OpenAI) -> None:
    """response_format by constrained sampling: the reply parses and follows the schema, and ends (finish_reason
    stop) as soon as the object closes; a schema the server cannot enforce is a 400."""
    idle(server)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "likes_red": {"type": "boolean"}},
              "required": ["name", "age", "likes_red"], "additionalProperties": False}
    r = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=60, temperature=0, response_format={"type": "json_schema",
                                                       "json_schema": {"name": "person", "schema": schema}})
    data = json.loads(r.choices[0].message.content)
    assert set(data) == {"name", "age", "likes_red"} and r.choices[0].finish_reason == "stop"
    assert isinstance(data["name"], str) and type(data["age"]) is int and isinstance(data["likes_red"], bool)
    parts = [ch.delta.content or "" for c in client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", stream=True, max_tokens=60, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format={"type": "json_object"}) for ch in c.choices]
    assert isinstance(json.loads("".join(parts)), dict)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model="SmolLM2-135M-Instruct.Q4_1", messages=CHAT, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}})
    assert "uniqueItems" in exc.value.message


def test_ignore_eos_runs_to_max_tokens(server: Server, client: openai.OpenAI) -> None:
    idle(server)
    hi = [{"role": "user", "content": "Say hi."}]
    short = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=hi, max_tokens=40,
                                           temperature=0)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 40
    full = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=hi, max_tokens=40,
                                          temperature=0, extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 40
    assert full.choices[0].message.content.startswith(short.choices[0].message.content)


def test_held_back_text_is_what_could_start_a_stop_string() -> None:
    assert held_back("Hello wor", ["world"], 0) == 3
    assert held_back("Hello wor", ["world", "or"], 0) == 3
    assert held_back("Hello wo", ["xyz", "o"], 0) == 0  # a whole stop string is found, not held back
    assert held_back("Hello w", ["world"], 7) == 0  # only unsent text can be held back
    assert held_back("", ["world"], 0) == 0 and held_back("abc", [], 0) == 0


def test_logprobs(server: Server, client: openai.OpenAI) -> None:
    idle(server)
    r = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=CHAT, max_tokens=12,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].message.content
    toks = r.choices[0].logprobs.content
    assert "".join(t.token for t in toks) == content
    assert len(toks) == r.usage.completion_tokens
    for t in toks:
        assert t.logprob <= 0
        tops = [a.logprob for a in t.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and all(x <= 0 for x in tops)
        assert t.logprob == pytest.approx(tops[0])  # greedy: the picked token is the most likely one
        assert bytes(t.bytes).decode("utf-8", "replace")
    # streamed: the same tokens, chunk by chunk
    streamed = [t for c in client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", messages=CHAT, max_tokens=12, temperature=0, logprobs=True,
        top_logprobs=3, stream=True) for ch in c.choices if ch.logprobs for t in ch.logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in toks]


def test_a_continued_conversation_reuses_the_slot_cache(server: Server, client: openai.OpenAI) -> None:
    idle(server)
    first = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=CHAT, max_tokens=8,
                                           temperature=0)
    more = [*CHAT, {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And three animals?"}]
    second = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=more, max_tokens=4,
                                            temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens < cached < second.usage.prompt_tokens


def run_alone(client: openai.OpenAI, seed: int) -> str:
    parts = []
    for c in client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=CHAT, max_tokens=8,
                                            temperature=1.0, top_p=1.0, seed=seed, stream=True,
                                            extra_body={"top_k": 0, "min_p": 0.0}):
        parts.extend(ch.delta.content or "" for ch in c.choices)
    return "".join(parts)


def test_parallel_streams_with_seeds_match_each_alone(server: Server, client: openai.OpenAI) -> None:
    idle(server)
    seeds = [11, 22, 33, 44]
    alone = [run_alone(client, s) for s in seeds]
    assert len(set(alone)) > 1  # the seeds matter
    together: list[str | None] = [None] * len(seeds)
    batched = server.scheduler.metrics.batched_steps
    sched = server.scheduler
    peak = [0]

    def gather() -> None:  # on the scheduler's thread: hold the loop until all four requests are in, once
        end = time.monotonic() + 120  # a hang guard
        while not peak[0] and sched.busy_slots + sched.queued < len(seeds) and time.monotonic() < end:
            time.sleep(0.005)
        peak[0] = max(peak[0], sched.busy_slots)

    def one(i: int) -> None:
        together[i] = run_alone(client, seeds[i])

    # the four requests run side by side however the client threads are scheduled: the loop waits for them all
    sched.before_step.append(gather)
    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(seeds))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    finally:
        sched.before_step.remove(gather)
    assert together == alone
    assert peak[0] >= 2  # they did run side by side, their tokens in one forward pass
    assert server.scheduler.metrics.batched_steps > batched


def test_closing_a_stream_frees_its_slot_and_a_full_server_answers_503(server: Server, http: Http) -> None:
    idle(server)
    body = {"messages": CHAT, "max_tokens": 400, "temperature": 1.0, "seed": 1, "stream": True,
            "extra": "ignored", "logit_bias": {"0": -100, "2": -100}}  # no end of generation: each runs until closed
    streams = []
    for _ in range(SLOTS):
        conn, r = http.open("POST", "/v1/chat/completions", json_body=body)
        assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
        data = 0
        while data < 2:  # the role, then the first token: the request has its slot
            data += r.readline().startswith(b"data:")
        streams.append(conn)
    assert server.scheduler.busy_slots == SLOTS
    full = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2})
    assert full.status_code == 503 and full.headers["retry-after"] == "1"
    assert full.json()["error"]["type"] == "unavailable_error"
    generated = server.scheduler.metrics.generated_tokens
    for conn in streams:
        conn.close()
    idle(server)
    assert server.scheduler.metrics.finished.get("cancelled", 0) >= SLOTS
    assert server.scheduler.metrics.generated_tokens - generated < SLOTS * 400  # none ran to its end
    ok = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2


def test_a_client_gone_before_a_whole_reply_frees_the_slot(server: Server, http: Http) -> None:
    """Not streamed: the server notices the closed connection while generating and stops at the next step."""
    idle(server)
    cancelled = server.scheduler.metrics.finished.get("cancelled", 0)
    conn = httplib.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "Once", "max_tokens": 400,
                                                             "ignore_eos": True}).encode(),
                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    end = time.monotonic() + 120  # a hang guard
    while not server.scheduler.busy_slots:
        assert time.monotonic() < end
        time.sleep(0.01)
    conn.close()
    idle(server)
    assert server.scheduler.metrics.finished.get("cancelled", 0) == cancelled + 1


def test_refusals_are_openai_shaped_and_never_reach_the_engine(server: Server, http: Http) -> None:
    idle(server)
    before = server.scheduler.metrics.requests

    def refused(status: int, path: str, content: bytes | None = None, body: Any = None,
                param: str | None = None, code: str | None = None) -> dict[str, Any]:
        r = http.post(path, content=content) if content is not None else http.post(path, json=body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
        if param is not None:
            assert err["param"] == param
        if code is not None:
            assert err["code"] == code
        return err

    chat = "/v1/chat/completions"
    refused(400, chat, content=b"{not json")
    refused(400, chat, content=b"\xff\xfe")
    refused(400, chat, content=b"[1, 2]")
    refused(400, chat, content=b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}')
    refused(400, chat, content=b"[" * 60_000)  # nested too deeply
    refused(413, chat, content=b'{"a": "' + b"x" * MAX_BODY + b'"}', code="request_too_large")
    r = http.post(chat, content=iter([b'{"a": "', b"x" * MAX_BODY, b'"}']))  # chunked: no Content-Length
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    refused(404, chat, body={"model": "gpt-4", "messages": CHAT}, code="model_not_found")
    refused(400, chat, body={"messages": []}, param="messages")
    refused(400, chat, body={"messages": [{"role": "wizard", "content": "x"}]}, param="messages[0].role")
    refused(400, chat, body={"messages": CHAT, "temperature": -1}, param="temperature")
    refused(400, chat, body={"messages": CHAT, "max_tokens": "ten"}, param="max_tokens")
    refused(400, chat, body={"messages": CHAT, "top_logprobs": 3}, param="top_logprobs")
    refused(400, chat, body={"messages": CHAT, "n": 17}, param="n")
    refused(400, chat, body={"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"anyOf": []}}}}, param="response_format", code="unsupported_schema")
    refused(400, chat, body={"messages": CHAT, "response_format": {"type": "yaml"}}, param="response_format")
    # SmolLM2's template has no tool calls
    refused(400, chat, body={"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]},
            param="tools", code="unsupported_parameter")
    refused(400, chat, body={"messages": CHAT, "tools": [{"type": "function", "function": {"name": "no spaces"}}]},
            param="tools")
    refused(400, chat, body={"messages": CHAT, "tool_choice": "required"}, param="tool_choice")
    refused(400, chat, body={"messages": [{"role": "user", "content": "word " * 600}]},
            code="context_length_exceeded")
    refused(400, "/v1/completions", body={"prompt": [1, 2, 10**9]}, param="prompt")
    refused(400, "/v1/embeddings", body={"input": "hello"})
    refused(400, "/detokenize", body={"tokens": [-1]}, param="tokens")
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    assert server.scheduler.metrics.requests == before


def test_tokenize_detokenize_and_metrics(server: Server, http: Http) -> None:
    ids = http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert ids and all(isinstance(t, int) for t in ids)
    assert http.post("/detokenize", json={"tokens": ids}).json() == {"content": "Hello world"}
    pieces = http.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids and "".join(p["piece"] for p in pieces) == "Hello world"
    # a request of its own to count (not one an earlier test happened to make)
    done = http.post("/v1/completions", json={"prompt": "Once", "max_tokens": 2})
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] > 0
    text = http.get("/metrics").text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}
    assert values["quantscope_requests_total"] == server.scheduler.metrics.requests > 0
    assert values["quantscope_tokens_predicted_total"] > 0 and values["quantscope_slots"] == SLOTS
    assert json.loads(http.get("/health").text)["slots_idle"] <= SLOTS


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the bug, re-raised on its thread
def test_a_bug_in_the_scheduler_answers_the_request_with_an_error(model_path: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that raises while it is put in a slot ends the scheduler (a bug), but the request it was answering gets
    the error, as queued ones do, instead of waiting for a reply that never comes."""
    from quantscope.core.server import scheduler

    class Broken:
        def __init__(self, *_a: Any, **_k: Any) -> None:
            raise RuntimeError("broken sampler")

    with serving(model_path("smollm2")) as srv:
        monkeypatch.setattr(scheduler, "Sampler", Broken)
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
        with pytest.raises(openai.InternalServerError) as e:
            c.completions.create(model=srv.app.config.model_id, prompt="Hello", max_tokens=4)
        assert "broken sampler" in str(e.value)
        assert srv.scheduler.failure is not None
