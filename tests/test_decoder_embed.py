"""Decoder-body embedding models (issue 51) against llama.cpp: Qwen3-Embedding (qwen3 with last-token pooling) and
EmbeddingGemma (gemma-embedding: bidirectional Gemma 3 layers with a symmetric sliding window, mean pooling, the
dense head). The fixtures of tests/decoder_embed_fixtures.py, written here, must be the bytes recorded in
tests/data/decoder_embed/meta.json, tokenize as llama-embedding did and embed within cosine 0.9999 of its vectors
per input, with the file's pooling and with an override; a qwen3 file without a pooling still generates text, and
``quantscope embed`` and the embedding server take both."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import openai
import pytest

from quantscope.cli.main import main
from quantscope.core.engine.encoder import EmbedError, Encoder
from quantscope.core.engine.generate import Engine, SamplerParams
from quantscope.core.gguf import GGUFFile
from quantscope.core.model import EmbeddingModel, ModelError, UnsupportedModel, bind_weights, read_config
from quantscope.core.server import EmbeddingServer, model_id_of

from .arch_fixtures import write_fixture as write_arch
from .decoder_embed_fixtures import TEXTS, VARIANTS, write_fixture

META = json.loads((Path(__file__).parent / "data" / "decoder_embed" / "meta.json").read_text())
MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("decoder_embed")
    return {name: write_fixture(name, d / f"{name}.gguf") for name in VARIANTS}


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("name", sorted(META))
def test_fixture_bytes_are_the_recorded_ones(fixtures, name):
    assert hashlib.sha256(fixtures[name].read_bytes()).hexdigest() == META[name]["sha256"]


@pytest.mark.parametrize("name", sorted(META))
def test_tokens_match_llama_embedding(fixtures, name):
    with Encoder(fixtures[name]) as enc:
        assert [enc.tokenize(t) for t in META[name]["texts"]] == META[name]["tokens"]


CASES = [(name, run) for name in sorted(META) for run in META[name]["runs"]]


@pytest.mark.parametrize(("name", "run"), CASES)
def test_embeddings_match_llama_embedding(fixtures, name, run):
    """Every vector within cosine 0.9999 of llama-embedding's (``--embd-normalize 2``), unit length as its are."""
    want = np.asarray(META[name]["runs"][run], dtype=np.float64)
    with Encoder(fixtures[name], pooling=None if run == "file" else run) as enc:
        got = enc.embed(list(TEXTS))
    if run == "none":  # one row per token of every text, in order (EmbeddingGemma's head on every row)
        got = [row for g in got for row in g]
    assert len(got) == len(want)
    worst = min(_cos(g, w) for g, w in zip(got, want, strict=True))
    assert worst >= MIN_COSINE, f"{name} {run}: worst cosine {worst:.7f}"
    assert np.allclose([np.linalg.norm(g) for g in got], 1.0, atol=1e-5)


def test_the_descriptions_read_pooling_attention_and_window(fixtures):
    with GGUFFile(fixtures["qwen3-embed"]) as f:
        q = read_config(f)
    assert q.pooling == "last" and q.causal and q.is_embedding
    with GGUFFile(fixtures["gemma-embed"]) as f:
        g = read_config(f)
    assert g.pooling == "mean" and not g.causal and g.sliding_window == 6
    assert [g.is_sliding(i) for i in range(6)] == [True] * 5 + [False]
    with Encoder(fixtures["gemma-embed"]) as enc:
        assert [m.shape for m in enc.head] == [(128, 64), (64, 128)]


def test_a_qwen3_file_without_pooling_still_generates(tmp_path):
    path = write_arch("qwen3", tmp_path / "qwen3.gguf")
    with GGUFFile(path) as f:
        assert not read_config(f).is_embedding
    eng = Engine(path, n_ctx=64, threads=1, backend="cpu")
    try:
        pieces = list(eng.generate("hello", SamplerParams(max_tokens=3, temperature=0.0)))
    finally:
        eng.close()
    assert pieces
    with pytest.raises(UnsupportedModel, match="text generation model, not an embedding model"):
        Encoder(path)


def test_the_generation_engine_refuses_the_embedding_files(fixtures):
    for name in VARIANTS:
        with GGUFFile(fixtures[name]) as f, pytest.raises(EmbeddingModel, match="is an embedding model"):
            bind_weights(f)


def test_batches_give_what_single_inputs_give(fixtures):
    """Inputs evaluated together attend within themselves only (and the session's cache grows to the longest)."""
    for name in VARIANTS:
        with Encoder(fixtures[name]) as enc:
            together = enc.embed(list(TEXTS))
            alone = [enc.embed([t])[0] for t in reversed(TEXTS)][::-1]
        for a, b in zip(together, alone, strict=True):
            assert np.allclose(a, b, atol=1e-6)


def test_inputs_beyond_the_trained_context_or_vocabulary_are_refused_in_one_line(fixtures):
    with Encoder(fixtures["qwen3-embed"]) as enc:
        assert enc.n_ctx == 256
        with pytest.raises(EmbedError, match="input 0 has 257 tokens but the model's positions hold 256"):
            enc.embed([[5] * 257])
        with pytest.raises(EmbedError, match=r"token id 1024 is not in 0\.\.1023"):
            enc.embed([[5, 1024]])
        v, = enc.embed([[5] * 256])  # the longest input fits (the session's cache grows to it)
        assert v.shape == (64,) and enc.decoder is not None and enc.decoder._session.n_ctx == 256


def test_a_head_that_does_not_end_at_the_width_is_refused(tmp_path):
    """dense_2 (64 -> 128) without dense_3 would give vectors of 128, not the model's 64: one line, before any
    arithmetic (llama.cpp asserts)."""
    bad = write_fixture("gemma-embed", tmp_path / "bad.gguf", omit=("dense_3.weight",))
    with pytest.raises(ModelError, match=r"dense_2\.weight: 128 outputs without a dense_3\.weight"):
        Encoder(bad)
    bad = write_fixture("gemma-embed", tmp_path / "bad2.gguf", dense_in=32)
    with pytest.raises(ModelError, match=r"gemma-embedding\.dense_2_feat_in: expected 64 .* found 32"):
        Encoder(bad)


def test_embed_cli_and_the_server_take_both(fixtures, capsys):
    for name in VARIANTS:
        with Encoder(fixtures[name]) as enc:
            want = enc.embed(list(TEXTS[:2]))
            assert main(["embed", str(fixtures[name]), "-p", *TEXTS[:2], "--json"]) == 0
            d = json.loads(capsys.readouterr().out)
            assert d["pooling"] == enc.pooling
            for x, w in zip(d["data"], want, strict=True):
                assert np.allclose(x["embedding"], w, atol=1e-6)
            srv = EmbeddingServer(enc, model_id_of(fixtures[name]), port=0)
            srv.start()
            try:
                client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
                r = client.embeddings.create(model=model_id_of(fixtures[name]), input=list(TEXTS[:2]))
            finally:
                srv.stop()
            for x, w in zip(r.data, want, strict=True):
                assert np.allclose(x.embedding, w, atol=1e-6)
