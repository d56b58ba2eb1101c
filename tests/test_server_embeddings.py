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

from quantscope.core.engine.encoder import Encoder, normalize
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
    ({"input": "x", "dimensions": 65}, "dimensions", "integer in 1..64"),
    ({"input": "x", "dimensions": 0}, "dimensions", "integer in 1..64"),
    ({"input": "x", "dimensions": 8.0}, "dimensions", "integer in 1..64"),
    ({"input": "x", "dimensions": True}, "dimensions", "integer in 1..64"),
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
            with pytest.raises(ollama.ResponseError, match="no pooling"):
                ollama.Client(host=srv.url, timeout=60).embed(model="rows", input="hello")
        finally:
            srv.stop()


def test_dimensions_cut_and_renormalise(client, encoder):
    """OpenAI's ``dimensions`` (Matryoshka): the first N components of the vector, a unit vector again."""
    full = encoder.embed(["The quick brown fox."])[0]
    for n in (1, 16, 64):
        r = client.embeddings.create(model="bge-tiny", input="The quick brown fox.", dimensions=n,
                                     encoding_format="float")
        v = np.asarray(r.data[0].embedding)
        assert v.shape == (n,)
        assert abs(np.linalg.norm(v) - 1.0) < 1e-6
        assert np.allclose(v, full[:n] / np.linalg.norm(full[:n]), atol=1e-6)
    with pytest.raises(openai.BadRequestError, match=r"integer in 1\.\.64"):
        client.embeddings.create(model="bge-tiny", input="x", dimensions=65)


@pytest.fixture
def oc(server: EmbeddingServer) -> ollama.Client:
    return ollama.Client(host=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)


def test_ollama_embed(oc, encoder):
    """The real ollama client's ``embed``: Ollama's answer shape, unit vectors equal to the encoder's, the token
    count, ``dimensions``, a ``:latest`` tag, and an empty input giving no vectors."""
    texts = ["The quick brown fox.", "hello"]
    r = oc.embed(model="bge-tiny", input=texts, keep_alive="5m", truncate=True)
    assert r.model == "bge-tiny"
    want = encoder.embed(texts)
    assert len(r.embeddings) == 2
    for got, w in zip(r.embeddings, want, strict=True):
        assert np.allclose(got, w, atol=1e-6)
    assert r.prompt_eval_count == sum(len(encoder.tokenize(t)) for t in texts)
    assert r.total_duration >= r.load_duration > 0
    one = oc.embed(model="bge-tiny:latest", input="hello", dimensions=8)
    assert np.allclose(one.embeddings[0], want[1][:8] / np.linalg.norm(want[1][:8]), atol=1e-6)
    assert oc.embed(model="bge-tiny", input="", dimensions=0).embeddings == []
    assert oc.embed(model="bge-tiny", input=[]).embeddings == []


def test_ollama_truncate(oc, encoder):
    """A text longer than the positions is cut (its special tokens kept) unless ``truncate`` is false; the cut
    follows ``options.num_ctx`` when it is smaller."""
    long = "word " * 500
    ids = encoder.tokenize(long)
    cut_ids = ids[:127] + ids[-1:]
    r = oc.embed(model="bge-tiny", input=long)
    assert r.prompt_eval_count == 128
    assert np.allclose(r.embeddings[0], encoder.embed([cut_ids])[0], atol=1e-6)
    small = oc.embed(model="bge-tiny", input=long, options={"num_ctx": 10})
    assert small.prompt_eval_count == 10
    assert np.allclose(small.embeddings[0], encoder.embed([ids[:9] + ids[-1:]])[0], atol=1e-6)
    with pytest.raises(ollama.ResponseError, match="input exceeds maximum context length") as e:
        oc.embed(model="bge-tiny", input=long, truncate=False)
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError, match="after truncation"):
        oc.embed(model="bge-tiny", input=long, options={"num_ctx": 2})


def test_ollama_legacy_embeddings(oc, encoder):
    """``/api/embeddings``: the pooled vector without normalisation, as Ollama's legacy endpoint."""
    r = oc.embeddings(model="bge-tiny", prompt="hello")
    raw = encoder.embed(["hello"], normalize_mode=-1)[0]
    assert np.allclose(r.embedding, raw, atol=1e-5)
    assert not np.isclose(np.linalg.norm(r.embedding), 1.0)
    assert np.allclose(normalize(np.asarray(r.embedding)), encoder.embed(["hello"])[0], atol=1e-6)
    assert oc.embeddings(model="bge-tiny", prompt="").embedding == []


@pytest.mark.parametrize(("path", "body", "what"), [
    ("/api/embed", {"input": "x"}, "model is required"),
    ("/api/embed", {"model": "bge-tiny", "input": 5}, "invalid input type"),
    ("/api/embed", {"model": "bge-tiny", "input": ["a", 1]}, "invalid input type"),
    ("/api/embed", {"model": "bge-tiny", "input": "x", "truncate": "yes"}, "truncate must be a boolean"),
    ("/api/embed", {"model": "bge-tiny", "input": "x", "dimensions": 65}, r"integer in 1\.\.64"),
    ("/api/embed", {"model": "bge-tiny", "input": "x", "dimensions": -1}, r"integer in 1\.\.64"),
    ("/api/embed", {"model": "bge-tiny", "input": "x", "keep_alive": [1]}, "keep_alive must be"),
    ("/api/embed", {"model": "bge-tiny", "input": "x", "options": 3}, "options must be an object"),
    ("/api/embed", {"model": "bge-tiny", "input": "x", "options": {"num_ctx": 0}}, "num_ctx must be"),
    ("/api/embed", {"model": "bge-tiny", "input": ["x"] * 2049}, "at most 2048"),
    ("/api/embeddings", {"model": "bge-tiny", "prompt": ["x"]}, "prompt must be a string"),
])
def test_ollama_hostile_bodies(http, path, body, what):
    import re

    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"error"} and re.search(what, r.json()["error"]), r.text


def test_ollama_errors_in_ollamas_shape(server, oc):
    with pytest.raises(ollama.ResponseError, match="does not exist") as e:
        oc.embed(model="llama3", input="x")
    assert e.value.status_code == 404
    bad = ollama.Client(host=server.url, headers={"Authorization": "Bearer wrong"}, timeout=60)
    with pytest.raises(ollama.ResponseError) as e:
        bad.embed(model="bge-tiny", input="x")
    assert e.value.status_code == 401


def test_ollama_discovery(oc, server):
    """What Ollama's clients ask before embedding: the version, the model in /api/tags and /api/ps, and
    /api/show with the ``embedding`` capability."""
    assert oc.list().models[0].model == "bge-tiny"
    assert oc.ps().models[0].model == "bge-tiny"
    s = oc.show("bge-tiny")
    assert s.capabilities == ["embedding"]
    assert s.modelinfo["bert.embedding_length"] == 64 and s.modelinfo["bert.pooling_type"] == "mean"
    assert s.details.family == "bert"
    with pytest.raises(ollama.ResponseError, match="does not exist"):
        oc.show("llama3")
    http = Http(server, KEY)  # type: ignore[arg-type]
    r = http.get("/api/version")
    assert r.status_code == 200 and "version" in r.json()
