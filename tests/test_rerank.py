"""Rank pooling (issue 51): a BERT cross-encoder's classification head against llama.cpp. The reranker fixture of
tests/bert_fixtures.py, written here, must be the bytes recorded in tests/data/bert/rank.json, build each
query/document pair's token ids as llama-embedding did (``[CLS] q [SEP] d [SEP]``) and score the pairs in
llama-embedding's order (``--pooling rank``), within llama.cpp's own float16 rounding (docs/embeddings.md); then
``quantscope embed --rerank``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantscope.cli.main import main
from quantscope.core.engine.encoder import EmbedError, Encoder
from quantscope.core.model import ModelError, UnsupportedModel

from .bert_fixtures import PAIRS, write_fixture

RANK = json.loads((Path(__file__).parent / "data" / "bert" / "rank.json").read_text())["bert-rank"]
#: llama.cpp's CPU GELU is a float16 table and its flash attention rounds K/V to float16: its own scores of this
#: fixture move by 9.3e-4 of the score scale (the largest |score|) between flash attention on and off; ours
#: (float32 throughout) lie within 8.7e-4 (on) and 1.1e-3 (off) of it
SCALE_TOL = 2.5e-3


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_fixture("bert-rank", tmp_path_factory.mktemp("rank") / "rerank-tiny.gguf")


@pytest.fixture(scope="module")
def enc(model: Path) -> Any:
    with Encoder(model) as e:
        yield e


def test_fixture_bytes_are_the_recorded_ones(model):
    assert hashlib.sha256(model.read_bytes()).hexdigest() == RANK["sha256"]
    assert [tuple(p) for p in RANK["pairs"]] == list(PAIRS)


def test_pairs_tokenize_as_llama_embedding(enc):
    got = [enc.rerank_tokens(q, d) for q, d in PAIRS]
    assert got == RANK["tokens"]
    assert all(t[0] == 101 and t[-1] == 102 and t.count(102) == 2 for t in got)  # [CLS] q [SEP] d [SEP]
    # the texts' special-token spellings are text, as llama-server tokenizes them (no forged separators)
    assert enc.rerank_tokens("a [SEP] b", "[CLS] c").count(102) == 2
    assert enc.rerank_tokens("a [SEP] b", "[CLS] c").count(101) == 1


@pytest.mark.parametrize("run", ["file", "fa-off"])
def test_scores_match_llama_embedding(enc, run):
    want = np.asarray(RANK["runs"][run], dtype=np.float64)
    got = np.asarray([enc.rerank(q, [d])[0] for q, d in PAIRS], dtype=np.float64)
    assert list(np.argsort(-got)) == list(np.argsort(-want))
    worst = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    assert worst <= SCALE_TOL, f"{run}: worst difference {worst:.2e} of the score scale"


def test_the_head_and_the_forward_paths_agree(enc):
    """The native layers and the numpy reference give the same scores; batches give what single pairs give;
    rerank() is the head's first score in the documents' order."""
    head = enc.rank_head
    assert enc.pooling == "rank" and head is not None and head.pool == "cls" and head.n_out == 1
    seqs = [enc.rerank_tokens(q, d) for q, d in PAIRS]
    native = np.concatenate(enc.rank_ids(seqs))
    small = np.concatenate(enc.rank_ids(seqs, batch_tokens=25))
    numpy_ = np.asarray([head.scores(r)[0] for r in enc.forward_numpy(seqs)])
    # (K, V and GELU's inputs rounded to F16 on both paths, as ggml's: a ~1e-7 difference upstream moves an F16
    # step now and then, so the paths agree to ~2e-4 of the scale, not to float precision)
    assert np.allclose(native, numpy_, rtol=0, atol=5e-4 * np.abs(native).max())
    assert np.allclose(native, small, rtol=0, atol=1e-6)
    q = PAIRS[0][0]
    docs = [d for p, d in PAIRS if p == q]
    assert np.allclose(enc.rerank(q, docs), native[:len(docs)], atol=1e-6)


def test_a_reranker_gives_scores_not_vectors(enc):
    with pytest.raises(EmbedError, match=r"relevance scores .* not vectors"):
        enc.embed(["hello"])
    body, = enc.embed(["hello"], pooling="cls")  # its body's vectors, as --pooling cls asks
    assert body.shape == (64,)
    with pytest.raises(EmbedError, match=r"document 0 has \d+ tokens but the model's positions hold 128"):
        enc.rerank("q", ["word " * 200])


def test_files_without_a_head_and_bad_heads_are_refused(tmp_path):
    mean = write_fixture("bert-mean", tmp_path / "mean.gguf")
    with pytest.raises(UnsupportedModel, match="needs a classification head") as exc:
        Encoder(mean, pooling="rank")
    assert "\n" not in str(exc.value)
    with Encoder(mean) as e, pytest.raises(EmbedError, match="reranking needs rank pooling"):
        e.rank_ids([[101, 102]])
    two = write_fixture("bert-rank", tmp_path / "two.gguf", extra={"bert.classifier.output_labels": ["yes", "no"]})
    with pytest.raises(ModelError, match=r"cls.output.weight: expected shape \[64, 2\]"):
        Encoder(two)


def test_classifier_pooling_mean_and_a_rerank_template(tmp_path, enc):
    """``classifier.pooling_type`` mean pools before the head (ModernBERT's way); a ``tokenizer.chat_template.rerank``
    is filled in and tokenized without added specials, as llama-server does."""
    template = "[CLS] query: {query} [SEP] doc: {document}"
    path = write_fixture("bert-rank", tmp_path / "mean-head.gguf", extra={
        "bert.classifier.pooling_type": 1, "tokenizer.chat_template.rerank": template})
    with Encoder(path) as e:
        assert e.rank_head is not None and e.rank_head.pool == "mean"
        ids = e.rerank_tokens("what?", "this")
        assert ids == e.tokenizer.encode("[CLS] query: what? [SEP] doc: this", add_special=False)
        assert ids[0] == 101 and ids[-1] != 102
        rows, = e.forward([ids])
        x = np.tanh(e.rank_head.dense @ rows.mean(axis=0) + e.rank_head.dense_b)
        assert np.isclose(e.rank_ids([ids])[0][0], e.rank_head.out @ x + e.rank_head.out_b, atol=1e-5).all()
        assert e.rank_ids([ids])[0][0] != enc.rank_ids([ids])[0][0]


def test_a_cross_encoder_without_pooling_in_the_file_reranks_with_pooling_rank(tmp_path, enc):
    """convert_hf_to_gguf.py writes no pooling_type for a plain BertForSequenceClassification: --pooling rank (as
    llama-server's --reranking) runs its head; the fixture has bert-rank's weights, so the same scores."""
    path = write_fixture("bert-xenc", tmp_path / "xenc.gguf")
    with Encoder(path) as plain:
        assert plain.pooling == "none" and plain.rank_head is None
    with Encoder(path, pooling="rank") as e:
        q, d = PAIRS[1]
        assert e.rerank(q, [d]) == enc.rerank(q, [d])


# ---------------------------------------------------------------------------------------------- the command
def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_embed_rerank_prints_the_scores(capsys, model, enc, tmp_path):
    q = PAIRS[0][0]
    docs = [d for p, d in PAIRS if p == q]
    want = enc.rerank(q, docs)
    rc, out, _ = run(capsys, "embed", str(model), "--rerank", q, "-p", *docs)
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 3
    for i, (line, w) in enumerate(zip(lines, want, strict=True)):
        assert line.startswith(f"rerank score {i}: ") and abs(float(line.split()[3]) - w) < 1e-6
    f = tmp_path / "docs.txt"
    f.write_text("\n".join(docs) + "\n\n")
    rc, out, _ = run(capsys, "embed", str(model), "--rerank", q, "-f", str(f), "--json")
    d = json.loads(out)
    assert rc == 0 and [r["index"] for r in d["results"]] == sorted(range(3), key=lambda i: -want[i])
    assert all(abs(r["relevance_score"] - want[r["index"]]) < 1e-6 and r["document"]["text"] == docs[r["index"]]
               for r in d["results"])
    n = sum(len(enc.rerank_tokens(q, x)) for x in docs)
    assert d["usage"] == {"prompt_tokens": n, "total_tokens": n}


@pytest.mark.parametrize(("args", "message"), [
    (["-p", "hello"], "is a reranker (rank pooling): it scores documents for a query"),
    (["--rerank", "q", "-p", "x", "--pooling", "mean"], "not --pooling mean"),
    (["--rerank", "q", "-p", "x", "--normalize", "2"], "no --normalize or --npy"),
    (["--rerank", "q", "-p", "x", "--npy", "a.npy"], "no --normalize or --npy"),
    (["--rerank", " ", "-p", "x"], "the query is empty"),
    (["--rerank", "q", "-p", "word " * 200], "document 1 with the query has"),
])
def test_embed_rerank_errors_are_one_line(capsys, model, args, message):
    rc, _, err = run(capsys, "embed", str(model), *args)
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_embed_rerank_runs_a_file_without_pooling(capsys, tmp_path, enc):
    path = write_fixture("bert-xenc", tmp_path / "xenc.gguf")
    rc, out, _ = run(capsys, "embed", str(path), "--rerank", PAIRS[0][0], "-p", PAIRS[0][1])
    assert rc == 0 and abs(float(out.split()[3]) - enc.rerank(PAIRS[0][0], [PAIRS[0][1]])[0]) < 1e-6


def test_embed_rerank_on_an_embedding_model_is_one_line(capsys, tmp_path):
    mean = write_fixture("bert-mean", tmp_path / "mean.gguf")
    rc, _, err = run(capsys, "embed", str(mean), "--rerank", "q", "-p", "x")
    assert rc == 2 and "needs a classification head" in err and err.count("\n") == 1
