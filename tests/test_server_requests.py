"""The server's request log (core/server/requests.py): every generation request recorded with its endpoint,
client, state, counts and reply; with ``trace`` the reply's token records as the chat keeps them; bounded."""

from __future__ import annotations

import http.client as httplib
import json
import math
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from quantscope.core.chat import SamplerParams
from quantscope.core.chat.tokens import TokenRecord, answer_text
from quantscope.core.server import RequestLog, Server, model_id_of
from quantscope.core.server.requests import trim_records
from quantscope.core.server.scheduler import Event, Job, Usage

from .server_helpers import serving

CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server(model_path: Any) -> Iterator[Server]:
    path = model_path("smollm2")
    with serving(path, parallel=2, trace=True) as srv:
        yield srv


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def wait_done(server: Server, n: int, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not (len(server.app.log) >= n and all(r.done for r in server.app.log.records())):
        assert time.monotonic() < end, "the requests did not end"
        time.sleep(0.01)


def test_a_chat_reply_is_logged_with_its_tokens(server: Server, client: openai.OpenAI) -> None:
    n0 = len(server.app.log)
    r = client.chat.completions.create(model=model_id_of(server.app.config.model_id), messages=CHAT,
                                       max_tokens=16, temperature=0)
    wait_done(server, n0 + 1)
    rec = server.app.log.records()[-1]
    assert rec.endpoint == "/v1/chat/completions" and rec.client.startswith("127.0.0.1:")
    assert rec.status == r.choices[0].finish_reason and rec.http_status == 200 and not rec.stream
    assert rec.prompt_tokens == r.usage.prompt_tokens and rec.completion_tokens == r.usage.completion_tokens
    assert rec.text == r.choices[0].message.content
    assert "Name three colours." in rec.prompt_text and len(rec.prompt_ids) == rec.prompt_tokens
    recs = rec.records
    assert answer_text(recs) == rec.text
    assert len([x for x in recs if x.token >= 0]) == rec.completion_tokens
    for x in recs:  # greedy: each picked token is the likeliest, with the chat's 10 alternatives
        assert x.known and 0 < x.prob <= 1 and len(x.alternatives) == 10
        assert x.token == x.alternatives[0].token
    assert rec.duration > 0 and rec.tokens_per_second > 0


def test_a_stop_string_is_cut_from_the_logged_tokens(server: Server, client: openai.OpenAI) -> None:
    whole = client.completions.create(model=server.app.config.model_id, prompt="One, two, three, four,",
                                      max_tokens=12, temperature=0).choices[0].text
    assert len(whole) > 4
    stop = whole[3:6]
    n0 = len(server.app.log)
    r = client.completions.create(model=server.app.config.model_id, prompt="One, two, three, four,",
                                  max_tokens=12, temperature=0, stop=[stop], stream=True)
    text = "".join(c.choices[0].text for c in r if c.choices)
    wait_done(server, n0 + 1)
    rec = server.app.log.records()[-1]
    assert rec.endpoint == "/v1/completions" and rec.stream and rec.status == "stop"
    assert text == rec.text == whole[:3]
    assert answer_text(rec.records) == text


def test_live_states_then_finished(server: Server, client: openai.OpenAI) -> None:
    n0 = len(server.app.log)
    seen: list[str] = []  # every state the request passes through, observed as it changes (not sampled)
    listen = lambda rec: seen.append(rec.status)  # noqa: E731
    server.app.log.listeners.append(listen)
    try:
        s = client.completions.create(model=server.app.config.model_id, prompt="Once upon a time", max_tokens=48,
                                      temperature=0, stream=True, extra_body={"ignore_eos": True})
        got = "".join(c.choices[0].text for c in s if c.choices)
    finally:
        server.app.log.listeners.remove(listen)
    wait_done(server, n0 + 1)
    rec = server.app.log.records()[n0]
    assert seen[0] == "queued" and "generating" in seen and seen[-1] == "length"
    assert rec.status == "length" and rec.completion_tokens == 48
    assert answer_text(rec.records) == got == rec.text


def test_refused_requests_are_logged(server: Server) -> None:
    def status(method: str, path: str, body: bytes | None = None) -> int:
        c = httplib.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            c.request(method, path, body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            return r.status
        finally:
            c.close()

    n0 = len(server.app.log)
    assert status("POST", "/v1/chat/completions", json.dumps({"model": "nope", "messages": CHAT}).encode()) == 404
    assert status("POST", "/v1/completions", b"{not json") == 400
    assert status("GET", "/health") == 200  # not a generation: not logged
    recs = server.app.log.records()[n0:]
    assert [(x.endpoint, x.status, x.http_status) for x in recs] == [
        ("/v1/chat/completions", "refused", 404), ("/v1/completions", "refused", 400)]
    assert "nope" in recs[0].error and recs[0].done and not recs[0].records


def _job() -> Job:
    return Job([1, 2, 3], SamplerParams(), lambda e: None)


def _rec(text: str, channel: str = "") -> TokenRecord:
    nan = math.nan
    return TokenRecord(7, text, text, nan, nan, nan, (), channel)


def test_the_log_is_bounded_and_drops_old_traces_first() -> None:
    log = RequestLog(lambda t: f"<{t}>", trace=True, limit=3, max_traced=5)
    recs = []
    for _ in range(5):
        job = _job()
        rec = log.open("/v1/completions", "c", job, "abc", False)
        assert job.params.alternatives == 10  # the trace wants the alternatives
        assert rec.status == "queued"
        job.slot = 0
        assert rec.status == "prompt"
        for _ in range(2):
            log.token(rec, 5, "x", "", None)
        assert rec.status == "generating" and rec.completion_tokens == 2
        log.event(rec, Event(text="xx"))
        log.event(rec, Event(done=True, finish_reason="length", usage=Usage(3, 0, 2, 1.0, 2.0)))
        recs.append(rec)
    kept = log.records()
    assert [r.seq for r in kept] == [3, 4, 5] and len(log) == 3
    # 5 records at most: the two newest traces (2 each) stay, older ones are dropped
    assert [len(r.records) for r in kept] == [0, 2, 2]
    assert kept[-1].records[0].piece == "<5>" and kept[-1].tokens_per_second == pytest.approx(1000.0)
    v = log.version
    log.refused("/v1/completions", "c", 400, "bad")
    assert log.version > v and log.records()[-1].status == "refused" and len(log) == 3
    untraced = RequestLog(lambda t: "", trace=False)
    job = _job()
    assert untraced.open("/v1/completions", "c", job, "", False).trace is None
    assert job.params.alternatives == 0  # no cost without the trace
    with pytest.raises(ValueError):
        RequestLog(lambda t: "", limit=0)


def test_trim_records_keeps_the_sent_text_only() -> None:
    recs = [_rec("Hel"), _rec("think", "analysis"), _rec("lo, "), _rec("wor"), _rec("ld")]
    out = trim_records(recs, "Hello, w")
    assert answer_text(out) == "Hello, w"
    assert [r.text for r in out] == ["Hel", "think", "lo, ", "w"]
    assert trim_records(recs, "") == [recs[1]]
    assert answer_text(trim_records(recs, "Hello, world")) == "Hello, world"


def test_token_choice_of_masked_logits_has_a_finite_entropy() -> None:
    """A JSON mask or an ``ignore_eos`` bias leaves -inf logits: the trace's entropy must stay a number."""
    import warnings

    import numpy as np

    from quantscope.core.chat import token_choice

    x = np.array([2.0, 1.0, -np.inf, 0.0, -np.inf])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = token_choice(x, 0, 1.0, 3)
    p = np.exp(np.array([2.0, 1.0, 0.0]))
    p /= p.sum()
    assert c.entropy == pytest.approx(float(-(p * np.log(p)).sum()))
    assert [a[0] for a in c.alternatives] == [0, 1, 3] and c.prob == pytest.approx(p[0])
