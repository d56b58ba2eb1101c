"""BERT-family embedding models (issue 51: bert, nomic-bert, jina-bert-v2) against llama.cpp: the fixtures of
tests/bert_fixtures.py, written here, must be the bytes recorded in tests/data/bert/meta.json, tokenize as
llama-embedding did and embed within cosine 0.9999 of its vectors per input (per token with ``none`` pooling), with
the file's pooling and with overrides."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from quantscope.core.engine.encoder import EmbedError, Encoder, alibi_slopes, gelu_f16, normalize
from quantscope.core.engine.generate import Engine, load_failure
from quantscope.core.gguf import GGUFFile
from quantscope.core.model import EmbeddingModel, UnsupportedModel, read_config
from quantscope.core.native import ffi, lib, nn

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
    """The native block (the plan's post-LayerNorm residuals, plain or gated FFN, non-causal attention with RoPE or
    ALiBi) against the float32 numpy forward: float noise for F32 weights (and a K or V value that float noise
    moves across an F16 rounding boundary: both round them as llama.cpp's flash attention does), activation
    quantization noise for Q8_0 ones."""
    with Encoder(fixtures[name], threads=2) as enc:
        assert enc.blocks is not None
        seqs = [enc.tokenize(t) for t in TEXTS]
        ref = enc.forward_numpy(seqs)
        for s, r in zip(seqs, ref, strict=True):
            got, = enc.forward_native([s])
            f32 = VARIANTS[name].quant == "F32"
            assert np.abs(got - r).max() < (2e-3 if f32 else 0.2)  # rows of LayerNorm outputs (values of ~1)
            assert min(_cos(g, w) for g, w in zip(got, r, strict=True)) > (0.99999 if f32 else 0.998)


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
            if VARIANTS[name].quant == "F32":
                assert np.abs(got - alone).max() < 1e-5
            else:  # a quantized product's row-tile and remainder kernels sum in another order (~1e-7), and the
                # F16-table GELU (ggml's) turns that into an F16 step now and then: close, not equal
                assert min(_cos(g, w) for g, w in zip(got, alone, strict=True)) > 0.9995
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
        kv, kv2 = np.zeros(4 * 64, np.float32), np.zeros(4 * 64, np.float32)  # (kept alive: the calls' caches)

        def forward(lens: list[int] | None, n_seg: int | None = None, n_past: int = 0, **attn) -> int:
            c = ffi.new("qs_block *", b[0])
            a = c.attn
            a.n_ctx, a.k_cache, a.v_cache = 4, ffi.from_buffer(kv), ffi.from_buffer(kv2)
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


def test_alibi_slopes_are_ggmls():
    """qs_alibi_slope (C) and alibi_slopes (numpy) give ggml_soft_max_ext's slopes: 2^-1 .. 2^-8 for 8 heads and
    max_bias 8 (the ALiBi paper's), and past the largest power of two the odd powers of m1."""
    assert np.allclose(alibi_slopes(8, 8.0), 2.0 ** -np.arange(1, 9))
    six = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]  # n2 = 4: m0 = 2^-2, m1 = 2^-1
    assert np.allclose(alibi_slopes(6, 8.0), six)
    for H, bias in ((4, 8.0), (6, 8.0), (12, 8.0), (5, 3.0), (1, 8.0)):
        assert np.allclose([lib.qs_alibi_slope(H, h, bias) for h in range(H)], alibi_slopes(H, bias), rtol=1e-6)
    assert lib.qs_alibi_slope(4, 2, 0.0) == 1.0


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_native_alibi_attention_matches_numpy(dtype):
    """qs_attention_alibi against the same attention in numpy (grouped heads, 6 query heads over 3 KV heads; F32
    and F16 caches): softmax(scale q.k - slope_h |i - j|) v; bad sizes and positions refused before anything is
    read."""
    rng = np.random.default_rng(1)
    T, H, KV, D, scale, bias = 9, 6, 3, 8, 0.35, 8.0
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    k = rng.standard_normal((T, KV, D)).astype(dtype)
    v = rng.standard_normal((T, KV, D)).astype(dtype)
    pos = np.arange(T, dtype=np.int32)
    out = np.zeros((T, H, D), np.float32)

    def call(n_q=T, p=pos, heads=H, kv_heads=KV, n_kv=T, max_bias=bias, f16=int(dtype == np.float16)) -> int:
        return lib.qs_attention_alibi(ffi.cast("float *", ffi.from_buffer(q)), n_q,
                                      ffi.cast("int32_t *", ffi.from_buffer(p)), heads, D, ffi.from_buffer(k),
                                      ffi.from_buffer(v), f16, kv_heads, n_kv, scale, max_bias,
                                      ffi.cast("float *", ffi.from_buffer(out)), 2)

    assert call() == lib.QS_OK
    slopes = alibi_slopes(H, bias)
    dist = np.abs(pos[:, None] - pos[None, :]).astype(np.float64)
    k64, v64 = k.astype(np.float64), v.astype(np.float64)
    for h in range(H):
        kh = h // (H // KV)
        s = q[:, h].astype(np.float64) @ k64[:, kh].T * scale - slopes[h] * dist
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        assert np.allclose(out[:, h], p @ v64[:, kh], atol=1e-5)
    bad_pos = pos.copy()
    bad_pos[3] = -1
    for kwargs, code in (({"n_kv": 0}, lib.QS_ERR_SIZE), ({"kv_heads": 4}, lib.QS_ERR_HEADS),
                         ({"max_bias": -1.0}, lib.QS_ERR_SIZE), ({"max_bias": float("nan")}, lib.QS_ERR_SIZE),
                         ({"p": bad_pos}, lib.QS_ERR_POS), ({"n_q": -1}, lib.QS_ERR_SIZE),
                         ({"f16": 2}, lib.QS_ERR_SIZE)):
        assert call(**kwargs) == code


def _forward_block(block, n_embd: int) -> int:
    """qs_block_forward of one layer description on 3 zero rows (F16 caches of this call): its return code."""
    x = np.zeros((3, n_embd), np.float32)
    pos = np.arange(3, dtype=np.int32)
    k_cache, v_cache = np.zeros(3 * n_embd, np.float16), np.zeros(3 * n_embd, np.float16)
    a = block.attn
    a.n_ctx, a.k_cache, a.v_cache = 3, ffi.from_buffer(k_cache), ffi.from_buffer(v_cache)
    a.k_cache_bytes = a.v_cache_bytes = k_cache.nbytes
    return lib.qs_block_forward(block, ffi.cast("float *", ffi.from_buffer(x)), 3,
                                ffi.cast("int32_t *", ffi.from_buffer(pos)), 0, 1)


def test_nomic_and_jina_layers_as_the_block_walks_them(fixtures):
    """nomic-bert: fused q/k/v without biases, NeoX RoPE on q and k, SwiGLU; jina-bert-v2: ALiBi (max_bias 8, no
    RoPE) and GEGLU with the biases of up and down (the gate's rows of the fused ffn_up, or ffn_gate); the block
    refuses ALiBi outside the encoder's attention."""
    with Encoder(fixtures["nomic-mean"], threads=1) as enc:
        b = enc.blocks[0]
        assert (b.rope.skip, b.rope.neox, b.rope.dim, b.rope.base, b.attn.alibi_max_bias) == (0, 1, 16, 1000.0, 0.0)
        assert nn.block_plan(b) == [
            "norm copy: x -> h", "tap attn_in: h", "proj h -> q:wq k:wk v:wv", "qk_post", "tap q: q",
            "attend: q -> att", "tap wo_in: att", "proj att -> o:wo",
            "residual ln post_attn_norm+post_attn_norm_b: x = ln(x + o)", "norm copy: x -> h", "tap ffn_in: h",
            "proj h -> g:gate u:up", "glu silu: g * u -> a", "tap down_in: a", "proj a -> o:down",
            "residual ln post_ffn_norm+post_ffn_norm_b: x = ln(x + o)"]
    for name, up in (("jina-mean", "proj h -> g:gate u:up"), ("jina-cls-split", "proj h -> g:gate u:up+bup")):
        with Encoder(fixtures[name], threads=1) as enc:
            b = enc.blocks[1]
            assert (b.rope.skip, b.attn.alibi_max_bias, b.ffn.plain, b.ffn.gelu) == (1, 8.0, 0, 1)
            plan = nn.block_plan(b)
            assert up in plan and "glu gelu: g * u -> a" in plan
            assert "proj a -> o:down+bdown" in plan
            assert _forward_block(ffi.new("qs_block *", b[0]), enc.n_embd) == lib.QS_OK
            for change in (lambda c: setattr(c.attn, "non_causal", 0), lambda c: setattr(c.attn, "softcap", 5.0),
                           lambda c: setattr(c.attn, "alibi_max_bias", -1.0),
                           lambda c: setattr(c.attn, "alibi_max_bias", float("inf"))):
                c = ffi.new("qs_block *", b[0])
                change(c)
                assert _forward_block(c, enc.n_embd) == lib.QS_ERR_SIZE


def test_gelu_is_ggmls_f16_table():
    """qs_gelu_f16 / qs_geglu_f16 (C) and gelu_f16 (numpy) compute ggml's CPU GELU: fp16(gelu(fp16(x))), 0 at or
    below -10, x at or above 10 (exactly, on every F16 value in between and beyond); the block takes the switch on
    an encoder's layer only."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    x = np.concatenate([x[np.isfinite(x)], [-10.0, 10.0, -10.001, 10.001, 3.14159265, -0.7071]]).astype(np.float32)
    up = np.linspace(-2.0, 2.0, x.size, dtype=np.float32)
    got, glu = np.empty_like(x), np.empty_like(x)
    lib.qs_gelu_f16(ffi.cast("float *", ffi.from_buffer(x)), ffi.cast("float *", ffi.from_buffer(got)), x.size)
    lib.qs_geglu_f16(ffi.cast("float *", ffi.from_buffer(x)), ffi.cast("float *", ffi.from_buffer(up)),
                     ffi.cast("float *", ffi.from_buffer(glu)), x.size)
    want = gelu_f16(x)
    # np.tanh and tanhf differ in float's last bit: one F16 step at times, relatively large only where 1 + tanh
    # cancels (x near -4, values of 1e-4)
    assert np.allclose(got, want, rtol=1e-3, atol=1e-6) and (got == want).mean() > 0.99
    assert np.array_equal(glu, got * up)
    assert got[x.size - 6] == 0.0 and got[x.size - 5] == 10.0 and got[x.size - 3] == np.float32(10.001)
    assert got[x.size - 2].astype(np.float16).astype(np.float32) == got[x.size - 2]  # an F16 value


def test_the_f16_gelu_is_an_encoders_switch(fixtures):
    with Encoder(fixtures["bert-mean"], threads=1) as enc:
        b = ffi.new("qs_block *", enc.blocks[0][0])
        assert b.ffn.gelu_f16 == 1 and _forward_block(b, enc.n_embd) == lib.QS_OK
        for change in (lambda c: setattr(c.ffn, "gelu_f16", 2), lambda c: setattr(c, "post_ln", 0)):
            c = ffi.new("qs_block *", b[0])
            change(c)
            assert _forward_block(c, enc.n_embd) in (lib.QS_ERR_SIZE, lib.QS_ERR_VECTOR)
    with Encoder(fixtures["nomic-mean"], threads=1) as enc:
        assert enc.blocks[0].ffn.gelu_f16 == 0  # SwiGLU
