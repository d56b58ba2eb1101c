"""quantscope serve with an embedding model (core/server/embeddings.py): ``/v1/embeddings`` driven by the real
``openai`` client and raw HTTP on a free loopback port, the BERT fixture behind it; the vectors are the encoder's
(which tests/test_bert.py holds to llama-embedding's), the key is required, hostile bodies are refused in one
line, and the generation endpoints of every dialect say the model does not chat."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import anthropic
import numpy as np
import ollama
import openai
import pytest

from quantscope.core.engine.encoder import Encoder
from quantscope.core.server import EmbeddingServer, model_id_of

from .bert_fixtures import write_fixture
from .test_server import Http

KEY = "embed-key-42"
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_fixture("bert-mean", tmp_path_factory.mktemp("emb") / "bge-tiny.gguf")


@pytest.fixture(scope="module")
def encoder(model: Path) -> Iterator[Encoder]:
    with Encoder(model) as enc:
        yield enc


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
def client(server: EmbeddingServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture
def http(server: EmbeddingServer) -> Http:
    return Http(server, KEY)  # type: ignore[arg-type]


def test_openai_client_gets_the_encoders_vectors(client, encoder):
    texts = ["The quick brown fox.", "hello", "Embeddings for search"]
    r = client.embeddings.create(model="bge-tiny", input=texts)
    want = encoder.embed(texts)
    assert [d.index for d in r.data] == [0, 1, 2]
    for d, w in zip(r.data, want, strict=True):
        assert len(d.embedding) == 64
        assert np.allclose(d.embedding, w, atol=1e-6)
    n = sum(len(encoder.tokenize(t)) for t in texts)
    assert r.usage.prompt_tokens == n and r.usage.total_tokens == n
    assert r.model == "bge-tiny"
    one = client.embeddings.create(model="bge-tiny", input="hello", encoding_format="float")
    assert np.allclose(one.data[0].embedding, want[1], atol=1e-6)


def test_base64_and_token_inputs(client, http, encoder):
    """The openai client asks for base64 by default when numpy is present and decodes it; raw HTTP sees the
    little-endian float32 bytes. Token arrays (one, or a batch) give the same vectors as their text."""
    ids = encoder.tokenize("hello")
    r = http.post("/v1/embeddings", json={"input": "hello", "encoding_format": "base64"})
    assert r.status_code == 200
    raw = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(raw, encoder.embed(["hello"])[0], atol=1e-7)
    a = client.embeddings.create(model="bge-tiny", input=ids)
    b = client.embeddings.create(model="bge-tiny", input=[ids, encoder.tokenize("x y")])
    assert np.allclose(a.data[0].embedding, raw, atol=1e-6)
    assert np.allclose(b.data[0].embedding, raw, atol=1e-6) and len(b.data) == 2
    assert b.usage.prompt_tokens == len(ids) + len(encoder.tokenize("x y"))


def test_api_key_and_model_name(server, client):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.embeddings.create(model="bge-tiny", input="x")
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.embeddings.create(model="gpt-4", input="x")
    models = client.models.list()
    assert [m.id for m in models.data] == ["bge-tiny"]
    assert models.data[0].model_extra["meta"]["pooling"] == "mean"


@pytest.mark.parametrize(("body", "param", "what"), [
    ({}, "input", "'input' is required"),
    ({"input": []}, "input", "non-empty array"),
    ({"input": [[]]}, "input", "is empty"),
    ({"input": 5}, "input", "string or a non-empty array"),
    ({"input": [1, "a"]}, "input", "input\\[0\\] must be"),
    ({"input": [[1, 2.5]]}, "input", "input\\[0\\] must be"),
    ({"input": [True]}, "input", "input\\[0\\] must be"),
    ({"input": [[1, 10**12]]}, "input", "not in 0..30521"),
    ({"input": [-1]}, "input", "not in 0..30521"),
    ({"input": "word " * 500}, "input", "positions hold 128"),
    ({"input": ["x"] * 2049}, "input", "at most 2048"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
    ({"input": "x", "dimensions": 32}, "dimensions", "vectors of 64 only"),
    ({"input": "x", "model": 7}, "model", "must be a string"),
])
def test_hostile_bodies_are_refused_in_one_line(http, body, param, what):
    r = http.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert "\n" not in err["message"]
    import re

    assert re.search(what, err["message"]), err["message"]


def test_broken_bodies(http):
    for raw, status in ((b"{", 400), (b"[1]", 400), (b'{"input": NaN}', 400), (b"x" * (MAX_BODY + 1), 413)):
        r = http.post("/v1/embeddings", content=raw)
        assert r.status_code == status, (raw[:20], r.text)
        assert "error" in r.json()


def test_generation_endpoints_say_the_model_does_not_chat(server, client, http):
    with pytest.raises(openai.BadRequestError, match=r"is an embedding model .* does not generate text"):
        client.chat.completions.create(model="bge-tiny", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="does not generate text"):
        client.completions.create(model="bge-tiny", prompt="hi")
    oc = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    with pytest.raises(ollama.ResponseError, match="does not generate text"):
        oc.chat(model="bge-tiny", messages=[{"role": "user", "content": "hi"}])
    ac = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="does not generate text"):
        ac.messages.create(model="bge-tiny", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and "/v1/embeddings" in r.json()["error"]["message"]
    assert http.post("/tokenize", json={"content": "hello"}).json()["tokens"] == [7592]


def test_pooling_none_is_refused_by_the_embeddings_endpoint(model):
    with Encoder(model, pooling="none") as enc:
        srv = EmbeddingServer(enc, "rows", port=0)
        srv.start()
        try:
            c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
            with pytest.raises(openai.BadRequestError, match="no pooling"):
                c.embeddings.create(model="rows", input="hello")
        finally:
            srv.stop()
