"""BERT embedding models (issue 51) against llama.cpp: the fixtures of tests/bert_fixtures.py, written here, must
be the bytes recorded in tests/data/bert/meta.json, tokenize as llama-embedding did and embed within cosine
0.9999 of its vectors per input (per token with ``none`` pooling), with the file's pooling and with overrides."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from quantscope.core.engine.encoder import EmbedError, Encoder, normalize
from quantscope.core.engine.generate import Engine, load_failure
from quantscope.core.gguf import GGUFFile
from quantscope.core.model import EmbeddingModel, UnsupportedModel, read_config
from quantscope.core.native import ffi, lib

from .bert_fixtures import TEXTS, VARIANTS, write_fixture

META = json.loads((Path(__file__).parent / "data" / "bert" / "meta.json").read_text())
MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bert")
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
    if run == "none":  # one row per token of every text, in order
        got = [row for g in got for row in g]
    assert len(got) == len(want)
    worst = min(_cos(g, w) for g, w in zip(got, want, strict=True))
    assert worst >= MIN_COSINE, f"{name} {run}: worst cosine {worst:.6f}"
    assert np.allclose([np.linalg.norm(g) for g in got], 1.0, atol=1e-5)


def test_pooling_comes_from_the_file_and_the_override_wins(fixtures):
    with GGUFFile(fixtures["bert-cls"]) as f:
        assert read_config(f).pooling == "cls"
    with Encoder(fixtures["bert-cls"]) as enc:
        assert enc.pooling == "cls"
        cls, = enc.embed(["hello world"])
        rows, = enc.embed(["hello world"], pooling="none", normalize_mode=-1)
        last, = enc.embed(["hello world"], pooling="last")
        mean, = enc.embed(["hello world"], pooling="mean", normalize_mode=-1)
    assert np.allclose(cls, normalize(rows[0]), atol=1e-6)
    assert np.allclose(last, normalize(rows[-1]), atol=1e-6)
    assert np.allclose(mean, rows.mean(axis=0), atol=1e-5)


def test_batches_give_what_single_inputs_give(fixtures):
    """Inputs evaluated together attend within themselves only: the same vectors one by one."""
    with Encoder(fixtures["bert-mean"]) as enc:
        together = enc.embed(list(TEXTS))
        alone = [enc.embed([t])[0] for t in TEXTS]
        ids = enc.embed([enc.tokenize(TEXTS[0])])[0]
        ids_all = [enc.tokenize(t) for t in TEXTS]
        small = enc.embed_ids(ids_all, "mean", batch_tokens=20)  # batches of 1 or 2 inputs
    for a, b, c in zip(together, alone, small, strict=True):
        assert np.allclose(a, b, atol=1e-5) and np.allclose(a, c, atol=1e-5)
    assert np.allclose(ids, together[0], atol=1e-6)


def test_normalisations_as_llama_cpp():
    v = np.array([3.0, -4.0, 0.0], dtype=np.float32)
    assert np.allclose(normalize(v, 2), [0.6, -0.8, 0.0])
    assert np.allclose(normalize(v, -1), v)
    assert np.allclose(normalize(v, 1), v / 7.0)
    assert np.allclose(normalize(v, 0), v * 32760.0 / 4.0)
    assert np.allclose(normalize(np.zeros(3, np.float32)), 0.0)
    with pytest.raises(EmbedError):
        normalize(v, -3)


def test_hostile_inputs_are_refused_in_one_line(fixtures):
    with Encoder(fixtures["bert-mean"]) as enc:
        for bad, what in (([], "empty"), ([[]], "empty"), ([[1, 2, 99999999]], "not in 0..30521"),
                          ([[-1]], "not in"), ([[True]], "not in"), ([[0] * 129], "positions hold 128"),
                          (["word " * 200], "positions hold 128")):
            if not bad:
                assert enc.embed(bad) == []
                continue
            with pytest.raises(EmbedError, match=what) as exc:
                enc.embed(bad)
            assert "\n" not in str(exc.value)
        with pytest.raises(EmbedError, match="pooling must be one of"):
            enc.embed(["x"], pooling="max")
    with pytest.raises(EmbedError, match="pooling must be one of"):
        Encoder(fixtures["bert-mean"], pooling="sum")
    with pytest.raises(UnsupportedModel, match="rank pooling"):
        Encoder(fixtures["bert-mean"], pooling="rank")


def test_the_generative_engine_refuses_an_embedding_model_plainly(fixtures):
    """The chat, the probe and the GUI's server say what load_failure says: an embedding model does not chat."""
    with pytest.raises(EmbeddingModel, match=r"is an embedding model .*does not generate text") as exc:
        Engine(fixtures["bert-mean"], n_ctx=64, threads=1, backend="cpu")
    why = load_failure(exc.value)
    assert why is not None and why.headline == "This is an embedding model: it does not chat or generate text."
    assert "quantscope embed" in why.detail


def test_a_generative_model_is_not_an_encoder(tmp_path):
    from .arch_fixtures import write_fixture as write_arch

    path = write_arch("llama", tmp_path / "llama.gguf")
    with pytest.raises(UnsupportedModel, match="text generation model, not an embedding model"):
        Encoder(path)


def _with_tensors(src_path: Path, out: Path, extra: dict[str, np.ndarray]) -> Path:
    """``src_path``'s metadata and tensors with ``extra`` tensors added."""
    import gguf

    src = gguf.GGUFReader(str(src_path))
    w = gguf.GGUFWriter(str(out), "bert")
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        val = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(field.name, val, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(field.name, val, vtype)
    for t in src.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    for name, a in extra.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_embedding_summary_names_the_pooling_and_the_head(fixtures, tmp_path):
    """core.summary.embedding_summary (the Overview's facts): the pooling and its key, and the head: none, a
    rerank classifier (cls, cls.output: its outputs), or sentence-transformers' dense projections; None for a
    text generation model."""
    from quantscope.core.summary import embedding_summary

    with GGUFFile(fixtures["bert-cls"]) as f:
        s = embedding_summary(f)
    assert s == {"pooling": "cls", "pooling_key": "bert.pooling_type", "pooling_value": 2, "width": 64,
                 "head": "none (the pooled vector, 64 values)"}
    ranked = _with_tensors(fixtures["bert-mean"], tmp_path / "rank.gguf", {
        "cls.weight": np.zeros((64, 64), np.float32), "cls.bias": np.zeros(64, np.float32),
        "cls.output.weight": np.zeros((1, 64), np.float32), "cls.output.bias": np.zeros(1, np.float32)})
    with GGUFFile(ranked) as f:
        assert embedding_summary(f)["head"] == "classifier (cls, cls.output): 1 output; read by rank pooling only"
    dense = _with_tensors(fixtures["bert-mean"], tmp_path / "dense.gguf", {
        "dense_2.weight": np.zeros((128, 64), np.float32), "dense_3.weight": np.zeros((32, 128), np.float32)})
    with GGUFFile(dense) as f:
        assert embedding_summary(f)["head"] == "dense projection (dense_2, dense_3): 64 → 128 → 32"


def test_an_extra_tensor_is_refused(fixtures, tmp_path):
    """A tensor the encoder does not read (a head it does not know) refuses the file rather than ignoring it."""
    import gguf

    src = gguf.GGUFReader(str(fixtures["bert-mean"]))
    out = tmp_path / "extra.gguf"
    w = gguf.GGUFWriter(str(out), "bert")
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        val = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(field.name, val, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(field.name, val, vtype)
    for t in src.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.add_tensor("blk.0.attn_norm_2.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModel, match=r"blk\.0\.attn_norm_2\.weight is not used"):
        Encoder(out)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_native_layers_match_the_numpy_reference(fixtures, name):
    """The native block (the plan's post-LayerNorm residuals, ungated GELU FFN, non-causal attention) against the
    float32 numpy forward: float noise for F32 weights, activation quantization noise for Q8_0 ones."""
    with Encoder(fixtures[name], threads=2) as enc:
        assert enc.blocks is not None
        seqs = [enc.tokenize(t) for t in TEXTS]
        ref = enc.forward_numpy(seqs)
        for s, r in zip(seqs, ref, strict=True):
            got, = enc.forward_native([s])
            f32 = VARIANTS[name].quant == "F32"
            assert np.abs(got - r).max() < (1e-4 if f32 else 0.2)  # rows of LayerNorm outputs (values of ~1)
            assert min(_cos(g, w) for g, w in zip(got, r, strict=True)) > (0.99999 if f32 else 0.999)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_native_batch_is_the_inputs_one_by_one(fixtures, name):
    """Many inputs in one native call per layer (rows back to back, positions restarting, attention within each
    input by the layer's segments) give each input's rows as its own call does, within 1e-5."""
    with Encoder(fixtures[name], threads=2) as enc:
        seqs = [enc.tokenize(t) for t in TEXTS] + [[101, 102], enc.tokenize("x")]
        together = enc.forward_native(seqs)
        for s, got in zip(seqs, together, strict=True):
            alone, = enc.forward_native([s])
            assert got.shape == alone.shape
            assert np.abs(got - alone).max() < 1e-5
        b = enc.blocks[0].attn
        assert b.seg_len == ffi.NULL and b.n_seg == 0  # the call's segments are not left behind
        assert enc.forward([]) == []
        if enc.pooling != "rank":  # a reranker gives no vectors (refused, test_rerank.py)
            assert enc.embed([]) == []


def test_the_block_checks_the_segments(fixtures):
    """attn.seg_len: positive lengths summing to the rows, with non-causal attention and n_past 0 only; a bad
    one is refused before anything is written."""
    with Encoder(fixtures["bert-mean"], threads=1) as enc:
        b = enc.blocks[0]
        x = np.ones((4, 64), np.float32)
        pos = np.array([0, 1, 0, 1], np.int32)
        kv = np.zeros(4 * 64, np.float32)

        def forward(lens: list[int] | None, n_seg: int | None = None, n_past: int = 0, **attn) -> int:
            c = ffi.new("qs_block *", b[0])
            a = c.attn
            a.n_ctx, a.k_cache, a.v_cache = 4, ffi.from_buffer(kv), ffi.from_buffer(kv.copy())
            a.k_cache_bytes = a.v_cache_bytes = kv.nbytes
            arr = np.asarray(lens or [], np.int32)
            a.seg_len = ffi.cast("int32_t *", ffi.from_buffer(arr)) if lens is not None else ffi.NULL
            a.n_seg = len(arr) if n_seg is None else n_seg
            for k, v in attn.items():
                setattr(a, k, v)
            xx = x.copy()
            rc = lib.qs_block_forward(c, ffi.cast("float *", ffi.from_buffer(xx)), 4 - n_past,
                                      ffi.cast("int32_t *", ffi.from_buffer(pos)), n_past, 1)
            if rc:
                assert np.array_equal(xx, x)
            return rc

        assert forward([2, 2]) == lib.QS_OK and forward([1, 3]) == lib.QS_OK and forward(None) == lib.QS_OK
        for lens, kw in (([2, 1], {}), ([2, 3], {}), ([0, 4], {}), ([-1, 5], {}), ([4], {"n_seg": 0}),
                         (None, {"n_seg": 2}), ([2, 2], {"non_causal": 0}), ([1, 2], {"n_past": 1}),
                         ([1, 1, 1, 1, 1], {"n_seg": 5})):
            assert forward(lens, **kw) == lib.QS_ERR_SIZE, (lens, kw)
