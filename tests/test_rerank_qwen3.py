"""Qwen3-Reranker (issue 51): a ``qwen3`` file with rank pooling, run on the generation engine's layers, against
llama.cpp. The ``qwen3-rank`` fixture of tests/decoder_embed_fixtures.py must be the bytes recorded in
tests/data/decoder_embed/rank.json, fill each query/document pair into its rerank template as llama-embedding did
(identical ids), and give llama-embedding's P(yes), P(no) (the last token's normed row, the two-row head, a
softmax) within 1e-4 and in its order; then ``quantscope embed --rerank`` and ``quantscope serve`` over HTTP."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from quantscope.cli.main import main
from quantscope.core.engine.encoder import EmbedError, Encoder
from quantscope.core.model import ModelError, UnsupportedModel
from quantscope.core.server import EmbeddingServer, model_id_of

from .decoder_embed_fixtures import PAIRS, RERANK_TEMPLATE, write_fixture

RANK = json.loads((Path(__file__).parent / "data" / "decoder_embed" / "rank.json").read_text())["qwen3-rank"]
#: llama.cpp's own two runs (flash attention on, its default, and off) differ by 4.5e-5 in P(yes); ours lies within
#: 1.2e-6 of the first and 4.6e-5 of the second
TOL = 1e-4


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_fixture("qwen3-rank", tmp_path_factory.mktemp("qrank") / "qwen3-reranker-tiny.gguf")


@pytest.fixture(scope="module")
def enc(model: Path) -> Iterator[Encoder]:
    with Encoder(model) as e:
        yield e


def test_fixture_bytes_are_the_recorded_ones(model):
    assert hashlib.sha256(model.read_bytes()).hexdigest() == RANK["sha256"]
    assert [tuple(p) for p in RANK["pairs"]] == list(PAIRS)


def test_pairs_fill_the_rerank_template_as_llama_embedding(enc):
    got = [enc.rerank_tokens(q, d) for q, d in PAIRS]
    assert got == RANK["tokens"]
    q, d = PAIRS[1]
    prompt = RERANK_TEMPLATE.replace("{query}", q).replace("{document}", d)
    assert got[1] == enc.tokenizer.encode(prompt, add_special=False, parse_special=True)
    assert got[1][0] == 1 and got[1].count(1) == 3  # <|im_start|> parsed as the special token, three times


@pytest.mark.parametrize("run", ["file", "fa-off"])
def test_scores_match_llama_embedding(enc, run):
    want = np.asarray(RANK["runs"][run], dtype=np.float64)
    got = np.asarray(enc.rank_ids([enc.rerank_tokens(q, d) for q, d in PAIRS]), dtype=np.float64)
    assert got.shape == want.shape == (len(PAIRS), 2)
    assert np.allclose(got.sum(axis=1), 1.0, atol=1e-6)  # P(yes) + P(no)
    assert list(np.argsort(-got[:, 0])) == list(np.argsort(-want[:, 0]))
    worst = float(np.max(np.abs(got - want)))
    assert worst <= TOL, f"{run}: worst difference {worst:.2e}"


def test_the_head_is_the_last_rows_softmax(enc):
    """rerank() is P(yes): the softmax of the two-row head on the last token's row after the final norm; a batch
    gives what single pairs give."""
    head = enc.rank_head
    assert enc.pooling == "rank" and head is not None
    assert (head.pool, head.softmax, head.labels, head.dense, head.out_b) == ("last", True, ("yes", "no"), None, None)
    seqs = [enc.rerank_tokens(q, d) for q, d in PAIRS]
    rows = enc.forward(seqs[:2])
    for r, s in zip(rows, enc.rank_ids(seqs[:2]), strict=True):
        logits = head.out.astype(np.float64) @ r[-1]
        p = np.exp(logits - logits.max())
        assert np.allclose(s, p / p.sum(), atol=1e-6)
    q = PAIRS[0][0]
    docs = [d for p, d in PAIRS if p == q]
    assert np.allclose(enc.rerank(q, docs), [s[0] for s in enc.rank_ids(seqs[:len(docs)])], atol=1e-7)


def test_other_poolings_give_the_bodys_vectors(model, enc):
    """--pooling last (or mean) runs the file as an embedding model: cls.output.weight is loaded and left unused,
    as llama.cpp's qwen3 does."""
    with pytest.raises(EmbedError, match=r"relevance scores .* not vectors"):
        enc.embed(["hello"])
    with Encoder(model, pooling="last") as e:
        assert e.rank_head is None
        v, = e.embed([[5, 6, 7]], normalize_mode=-1)
        assert np.allclose(v, enc.forward([[5, 6, 7]])[0][-1], atol=1e-6)


def test_bad_heads_and_heads_elsewhere_are_refused(tmp_path):
    bare = write_fixture("qwen3-rank", tmp_path / "bare.gguf", omit=("cls.output.weight",))
    with pytest.raises(UnsupportedModel, match=r"needs a classification head \(cls\.output\.weight\)") as exc:
        Encoder(bare)
    assert "\n" not in str(exc.value)
    dense = write_fixture("qwen3-rank", tmp_path / "dense.gguf", extra={"cls.weight": np.eye(64, dtype=np.float32)})
    with pytest.raises(UnsupportedModel, match=r"cls\.weight"):  # llama.cpp's qwen3 loads no cls.weight
        Encoder(dense)
    gemma = write_fixture("gemma-embed", tmp_path / "gemma.gguf")
    with pytest.raises(UnsupportedModel, match="which gemma-embedding does not have"):
        Encoder(gemma, pooling="rank")
    three = write_fixture("qwen3-rank", tmp_path / "three.gguf", labels=("yes", "no", "maybe"))
    for pooling in (None, "last"):  # a head of the wrong shape refuses the file either way, as llama.cpp's loader
        with pytest.raises(ModelError, match=r"cls\.output\.weight: expected shape \[64, 3\], found \[64, 2\]"):
            Encoder(three, pooling=pooling)


# ---------------------------------------------------------------------------------------------- the interfaces
def test_embed_rerank_prints_p_yes(capsys, model, enc):
    q = PAIRS[0][0]
    docs = [d for p, d in PAIRS if p == q]
    want = enc.rank_ids([enc.rerank_tokens(q, d) for d in docs])
    assert main(["embed", str(model), "--rerank", q, "-p", *docs]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    for i, (line, w) in enumerate(zip(lines, want, strict=True)):
        assert line.startswith(f"rerank score {i}: ") and abs(float(line.split()[3]) - w[0]) < 1e-6
        assert f"[yes {w[0]:.6f}, no {w[1]:.6f}]" in line
    assert main(["embed", str(model), "--rerank", q, "-p", *docs, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["index"] for r in d["results"]] == sorted(range(3), key=lambda i: -want[i][0])
    for r in d["results"]:
        assert set(r["scores"]) == {"yes", "no"} and abs(r["scores"]["no"] - want[r["index"]][1]) < 1e-6


def test_serve_reranks_over_http(model, enc):
    q = PAIRS[3][0]
    docs = [d for p, d in PAIRS if p == q]
    want = enc.rerank(q, docs)
    srv = EmbeddingServer(enc, model_id_of(model), port=0, api_key="qk")
    srv.start()
    try:
        with httpx.Client(base_url=srv.url, headers={"Authorization": "Bearer qk"}, timeout=120) as http:
            r = http.post("/v1/rerank", json={"query": q, "documents": docs, "return_documents": True})
            assert r.status_code == 200, r.text
            d: dict[str, Any] = r.json()
            assert [x["index"] for x in d["results"]] == sorted(range(len(docs)), key=lambda i: -want[i])
            assert all(abs(x["relevance_score"] - want[x["index"]]) < 1e-6 and 0 < x["relevance_score"] < 1
                       and x["document"]["text"] == docs[x["index"]] for x in d["results"])
            n = sum(len(enc.rerank_tokens(q, x)) for x in docs)
            assert d["usage"] == {"prompt_tokens": n, "total_tokens": n}
            assert http.get("/v1/models").json()["data"][0]["meta"]["pooling"] == "rank"
            r = http.post("/v1/embeddings", json={"input": "hello"})
            assert r.status_code == 400 and "is a reranker (rank pooling)" in r.json()["error"]["message"]
            r = http.post("/v1/rerank", json={"query": q, "documents": ["word " * 300]})
            assert r.status_code == 400 and "positions hold 256" in r.json()["error"]["message"]
            assert httpx.post(srv.url + "/v1/rerank", json={"query": q, "documents": docs}).status_code == 401
    finally:
        srv.stop()
