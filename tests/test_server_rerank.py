"""quantscope serve with a reranker (core/server/embeddings.py): ``/v1/rerank`` and its aliases in llama-server's
shape, driven by plain HTTP (httpx) on a free loopback port with the BERT cross-encoder fixture behind it. The
scores are the encoder's (which tests/test_rerank.py holds to llama-embedding's), the best first; the API key is
required; hostile bodies are refused in one line in OpenAI's error shape; an embedding model does not rerank and a
reranker gives no vectors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from quantscope.core.engine.encoder import Encoder
from quantscope.core.server import EmbeddingServer, model_id_of
from quantscope.core.server.embeddings import MAX_DOCUMENTS

from .bert_fixtures import write_fixture

KEY = "rerank-key-7"
MAX_BODY = 256 * 1024
QUERY = "what is a panda?"
DOCS = ["hi", "The giant panda is a bear species endemic to China.", "Pandas eat bamboo; a red panda is not a bear."]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_fixture("bert-rank", tmp_path_factory.mktemp("rr") / "rerank-tiny.gguf")


@pytest.fixture(scope="module")
def want(model: Path) -> tuple[list[float], int]:
    """The encoder's scores of DOCS for QUERY and the tokens of the three pairs."""
    with Encoder(model) as enc:
        return enc.rerank(QUERY, DOCS), sum(len(enc.rerank_tokens(QUERY, d)) for d in DOCS)


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[EmbeddingServer]:
    with Encoder(model) as enc:
        srv = EmbeddingServer(enc, model_id_of(model), port=0, api_key=KEY, max_body=MAX_BODY)
        srv.start()
        try:
            yield srv
        finally:
            srv.stop()


@pytest.fixture
def http(server: EmbeddingServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        yield c


def _order(scores: list[float]) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -scores[i])


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v1/reranking", "/reranking"])
def test_rerank_in_llama_servers_shape(http, want, path):
    scores, n_tokens = want
    r = http.post(path, json={"model": "rerank-tiny", "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["model"] == "rerank-tiny" and d["object"] == "list"
    assert [x["index"] for x in d["results"]] == _order(scores)
    for x in d["results"]:
        assert set(x) == {"index", "relevance_score"}
        assert abs(x["relevance_score"] - scores[x["index"]]) < 1e-6
    assert d["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}


def test_top_n_documents_back_and_tei_shape(http, want):
    scores, _ = want
    best = _order(scores)
    r = http.post("/v1/rerank", json={"query": QUERY, "documents": [{"text": t} for t in DOCS], "top_n": 2,
                                      "return_documents": True})
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert [x["index"] for x in res] == best[:2]
    assert [x["document"] for x in res] == [{"text": DOCS[i]} for i in best[:2]]
    assert len(http.post("/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 99}).json()["results"]) == 3
    # Text Embeddings Inference's shape: "texts" in, a bare list of {index, score, text?} out
    r = http.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
    assert r.status_code == 200, r.text
    tei = r.json()
    assert [x["index"] for x in tei] == best
    assert all(x["text"] == DOCS[x["index"]] and abs(x["score"] - scores[x["index"]]) < 1e-6 for x in tei)


def test_api_key_and_model_name(server, http):
    body = {"query": QUERY, "documents": DOCS}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(server.url + "/v1/rerank", json=body, headers=headers, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = http.post("/v1/rerank", json={**body, "model": "gpt-4"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    models = http.get("/v1/models").json()
    assert models["data"][0]["id"] == "rerank-tiny" and models["data"][0]["meta"]["pooling"] == "rank"


@pytest.mark.parametrize(("body", "param", "what"), [
    ({"documents": DOCS}, "query", "'query' is required"),
    ({"query": 5, "documents": DOCS}, "query", "'query' must be a string"),
    ({"query": "  ", "documents": DOCS}, "query", "'query' is empty"),
    ({"query": QUERY}, "documents", "'documents' must be a non-empty array"),
    ({"query": QUERY, "documents": []}, "documents", "non-empty array"),
    ({"query": QUERY, "documents": "hi"}, "documents", "non-empty array"),
    ({"query": QUERY, "documents": ["a", 1]}, "documents", r"documents\[1\] must be a string"),
    ({"query": QUERY, "documents": [{"text": 1}]}, "documents", r"documents\[0\] must be a string"),
    ({"query": QUERY, "documents": [None]}, "documents", r"documents\[0\] must be a string"),
    ({"query": QUERY, "documents": ["x"] * (MAX_DOCUMENTS + 1)}, "documents", f"at most {MAX_DOCUMENTS}"),
    ({"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n", "positive integer"),
    ({"query": QUERY, "documents": DOCS, "top_n": "2"}, "top_n", "positive integer"),
    ({"query": QUERY, "documents": DOCS, "top_n": True}, "top_n", "positive integer"),
    ({"query": QUERY, "documents": DOCS, "return_documents": "yes"}, "return_documents", "true or false"),
    ({"query": QUERY, "documents": ["ok", "word " * 200]}, "documents",
     r"documents\[1\] with the query has \d+ tokens but the model's positions hold 128"),
    ({"query": "word " * 200, "texts": ["ok"]}, "texts", r"texts\[0\] with the query has \d+ tokens"),
    ({"query": QUERY, "documents": DOCS, "model": 7}, "model", "must be a string"),
])
def test_hostile_bodies_are_refused_in_one_line(http, body, param, what):
    r = http.post("/v1/rerank", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert "\n" not in err["message"] and re.search(what, err["message"]), err["message"]


def test_broken_bodies(http):
    for raw, status in ((b"{", 400), (b"[1]", 400), (b'{"query": NaN}', 400), (b"x" * (MAX_BODY + 1), 413)):
        r = http.post("/v1/rerank", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == status, (raw[:20], r.text)
        assert "message" in r.json()["error"]


def test_a_reranker_gives_no_vectors_and_does_not_chat(http):
    r = http.post("/v1/embeddings", json={"input": "hello"})
    assert r.status_code == 400 and "is a reranker (rank pooling)" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "does not generate text; ask POST /v1/rerank" in r.json()["error"]["message"]


def test_an_embedding_model_does_not_rerank(tmp_path):
    with Encoder(write_fixture("bert-mean", tmp_path / "bge-tiny.gguf")) as enc:
        srv = EmbeddingServer(enc, "bge-tiny", port=0)
        srv.start()
        try:
            r = httpx.post(srv.url + "/v1/rerank", json={"query": "q", "documents": ["d"]}, timeout=60)
            assert r.status_code == 400
            assert "not a reranker: it does not rerank" in r.json()["error"]["message"]
        finally:
            srv.stop()


def test_serve_a_reranker_until_interrupted(model, want):
    exe = os.path.join(os.path.dirname(sys.executable), "quantscope")
    proc = subprocess.Popen([exe, "serve", str(model), "--port", "0", "--api-key", "k3y"], stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None
        url = None
        for _ in range(20):
            m = re.search(r"\(bert reranker, rank pooling\) at (http://127\.0\.0\.1:\d+)/v1/rerank",
                          proc.stderr.readline())
            if m:
                url = m.group(1)
                break
        assert url, "the server did not say where it listens"
        r = httpx.post(url + "/v1/rerank", json={"query": QUERY, "documents": DOCS},
                       headers={"Authorization": "Bearer k3y"}, timeout=120)
        assert r.status_code == 200 and [x["index"] for x in r.json()["results"]] == _order(want[0])
    finally:
        proc.send_signal(signal.SIGINT)
        _out, rest = proc.communicate(timeout=120)
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest
