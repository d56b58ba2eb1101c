"""The quantization lab (core/quant/lab.py) and `quantscope quant-stats`: what each type loses on a tensor."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from quantscope.cli import main as cli
from quantscope.core.base.ggml_types import GGML_TYPES, ggml_type
from quantscope.core.gguf import GGUFFile
from quantscope.core.native import kernels as K
from quantscope.core.quant import lab
from quantscope.core.quant.imatrix import Imatrix, ImatrixEntry
from quantscope.core.quant.quantize import QuantizeOptions, quantize_file

N_EXP = 4


def _normal(shape: tuple[int, ...], seed: int = 0, std: float = 0.05) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, std, shape).astype(np.float32)


def _write_model(path: Path, *, nan_at: tuple[int, int] | None = None, emb_cols: int = 256) -> Path:
    """A tiny F32 llama-like file: an embedding, two 2-D weights (rows of 256 and of 96), a norm, 3-D experts."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_uint32("llama.expert_count", N_EXP)
    w.add_tensor("token_embd.weight", _normal((64, emb_cols), 1, 0.5))
    q = _normal((48, 256), 2)
    q[:, 7] *= 8.0
    if nan_at is not None:
        q[nan_at] = np.nan
    w.add_tensor("blk.0.attn_q.weight", q)
    w.add_tensor("blk.0.attn_v.weight", _normal((32, 96), 3))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(256, np.float32))
    exps = _normal((N_EXP, 16, 256), 4)
    exps[2] *= 10.0  # one expert's values are larger: the imatrix slice of each expert must meet its own rows
    w.add_tensor("blk.0.ffn_up_exps.weight", exps)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("lab")
    f32 = _write_model(d / "f32.gguf")
    q8 = d / "q8.gguf"
    quantize_file(f32, q8, QuantizeOptions("Q8_0", threads=1))
    return {"f32": f32, "q8": q8, "other": _write_model(d / "other.gguf", emb_cols=128),
            "nan": _write_model(d / "nan.gguf", nan_at=(5, 9))}


def _imatrix(path: Path) -> Imatrix:
    rng = np.random.default_rng(7)
    entries = {
        "blk.0.attn_q.weight": ImatrixEntry(rng.uniform(0.1, 2.0, 256).astype(np.float32), np.array([4], np.int64)),
        "blk.0.ffn_up_exps.weight": ImatrixEntry(rng.uniform(0.1, 2.0, 256 * N_EXP).astype(np.float32),
                                                 np.array([4, 2, 1, 8], np.int64)),
    }
    return Imatrix(path, entries)


# ----------------------------------------------------------------------------------------------------- the types


def test_candidate_types_are_the_native_quantizers_cheapest_first() -> None:
    native = {t.name for t in GGML_TYPES.values() if t.is_quantized and K.can_quantize(t)}
    assert set(lab.CANDIDATE_TYPES) == native | {"F16", "BF16"}
    assert len(set(lab.CANDIDATE_TYPES)) == len(lab.CANDIDATE_TYPES)
    bits = [ggml_type(t).bits_per_weight for t in lab.CANDIDATE_TYPES]
    assert bits == sorted(bits)
    assert lab.candidate_types(["q4_k", "Q4_K", "f16"]) == ["Q4_K", "F16"]
    with pytest.raises(ValueError, match="unknown ggml type"):
        lab.candidate_types(["Q9_K"])
    with pytest.raises(ValueError, match="no quantizer"):
        lab.candidate_types(["IQ2_XXS"])


# ----------------------------------------------------------------------------------------------------- the figures


def _q8_0_reference(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_0_ref and its dequantizer, written out in numpy."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    d = amax / np.float32(127)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = b * inv
    q = np.clip(np.trunc(v + np.copysign(np.float32(0.5), v)), -128, 127)  # roundf: halves away from zero
    return (d.astype(np.float16).astype(np.float32) * q).reshape(x.shape)


def test_q8_0_of_a_ramp() -> None:
    x = np.linspace(-1.0, 1.0, 8 * 256, dtype=np.float32).reshape(8, 256)
    y = _q8_0_reference(x)
    e = lab.error_stats(x, "Q8_0")
    d = y.astype(np.float64) - x
    assert e.type == "Q8_0" and e.bits_per_weight == 8.5 and e.n_values == x.size
    assert e.rmse == pytest.approx(math.sqrt(np.mean(d * d)), rel=1e-9)
    assert e.max_abs == pytest.approx(np.abs(d).max(), rel=1e-9)
    assert e.snr_db == pytest.approx(10 * math.log10(np.sum(x.astype(np.float64) ** 2) / np.sum(d * d)), rel=1e-9)
    x64, y64 = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    cos = np.dot(x64, y64) / np.linalg.norm(x64) / np.linalg.norm(y64)
    assert e.cosine == pytest.approx(cos, abs=1e-12)
    assert e.rel_rmse == pytest.approx(e.rmse / math.sqrt(np.mean(x.astype(np.float64) ** 2)), rel=1e-9)
    assert e.weighted_rmse is None and e.block_rmse is None
    assert 0 < e.rmse < 1 / 127 / 2 * 1.01  # half a step of the largest block's scale at most
    raw, back = lab.requantize(x, "Q8_0")
    assert raw.shape == (8, 8 * 34) and raw.dtype == np.uint8
    np.testing.assert_array_equal(back, y)


@pytest.mark.parametrize("qtype", ["Q8_0", "F16", "BF16", "Q4_0"])
def test_exact_on_values_the_type_holds(qtype: str) -> None:
    if qtype == "Q8_0":  # integers with 127 in every block: the scale is 1
        x = np.tile(np.arange(256, dtype=np.float32) % 255 - 127, (4, 1))
        x[:, ::32] = 127
    elif qtype == "Q4_0":  # Q4_0 codes -8..7 with a scale of -1 (ggml takes the signed extreme): -x in 7..-8
        x = np.tile(np.arange(256, dtype=np.float32) % 16 - 7, (4, 1))
        x[:, ::32] = 8
    else:  # small multiples of 1/8 are exact in both 16-bit floats
        x = np.tile((np.arange(256, dtype=np.float32) - 128) / 8, (4, 1))
    e = lab.error_stats(x, qtype, blocks=True)
    assert e.exact and e.rmse == 0.0 and e.max_abs == 0.0 and e.rel_rmse == 0.0
    assert e.snr_db == math.inf and e.cosine == 1.0
    assert e.block_rmse is not None and not e.block_rmse.any()


def test_inexact_values_are_not_reported_exact() -> None:
    x = np.full((1, 32), 1.0, np.float32)
    x[0, 3] = 1.0 + 2.0**-20  # below F16's and BF16's precision
    for q in ("F16", "BF16"):
        e = lab.error_stats(x, q)
        assert not e.exact and e.max_abs == pytest.approx(2.0**-20) and math.isfinite(e.snr_db) and e.cosine <= 1.0


def test_weighted_rmse() -> None:
    x = _normal((64, 256), 11, 1.0)
    w = np.random.default_rng(12).uniform(0.0, 3.0, 256).astype(np.float32)
    w[5] = 200.0
    w64 = w.astype(np.float64)
    for q in ("Q4_K", "IQ4_NL", "Q4_0", "F16"):
        e = lab.error_stats(x, q, w)
        _, y = lab.requantize(x, q, w)
        d2 = (y.astype(np.float64) - x) ** 2
        assert e.weighted_rmse == pytest.approx(math.sqrt((d2 * w64).sum() / (w64.sum() * 64)), rel=1e-9)
        assert e.rmse == pytest.approx(math.sqrt(d2.mean()), rel=1e-9)
    # the types with a weighted search spend their precision where the weight is
    for q in ("Q4_K", "IQ4_NL"):
        _, plain = lab.requantize(x, q)
        d2 = (plain.astype(np.float64) - x) ** 2
        plain_w = math.sqrt((d2 * w64).sum() / (w64.sum() * 64))
        assert lab.error_stats(x, q, w).weighted_rmse < 0.8 * plain_w  # type: ignore[operator]
    # all-zero importance: the weighted figure is undefined, not a crash
    assert math.isnan(lab.error_stats(x, "Q8_0", np.zeros(256, np.float32)).weighted_rmse)  # type: ignore[arg-type]


def test_block_rmse_finds_the_outlier() -> None:
    x = _normal((16, 512), 21, 0.02)
    x[9, 300] = 3.0
    for q, blk in (("Q4_K", 256), ("Q4_0", 32), ("IQ4_XS", 256), ("F16", 1)):
        e = lab.error_stats(x, q, blocks=True)
        assert e.block_rmse is not None and e.block_rmse.dtype == np.float32
        assert e.block_rmse.shape == (16, 512 // blk)
        if q != "F16":  # an F16 value of 3.0 is exact; its neighbours' errors are what they are
            assert np.unravel_index(np.argmax(e.block_rmse), e.block_rmse.shape) == (9, 300 // blk)
        # equal-sized blocks: the whole RMSE is the RMS of the blocks' RMSEs
        assert math.sqrt(np.mean(e.block_rmse.astype(np.float64) ** 2)) == pytest.approx(e.rmse, rel=1e-5)
        _, y = lab.requantize(x, q)
        per = np.sqrt(((y.astype(np.float64) - x) ** 2).reshape(16, -1, blk).mean(axis=2))
        np.testing.assert_allclose(e.block_rmse, per, rtol=1e-6, atol=1e-12)


def test_expert_imatrix_slices_meet_their_rows() -> None:
    ne0, per = 256, 8
    x = _normal((N_EXP * per, ne0), 31, 1.0)
    w = np.random.default_rng(32).uniform(0.0, 1.0, N_EXP * ne0).astype(np.float32)
    w[2 * ne0:3 * ne0] = 0.0
    w[2 * ne0 + 17] = 50.0  # expert 2 cares about one column only
    raw, y = lab.requantize(x, "Q4_K", w)
    for e in range(N_EXP):
        rows = slice(e * per, (e + 1) * per)
        np.testing.assert_array_equal(raw[rows], K.quantize_rows("Q4_K", x[rows], w[e * ne0:(e + 1) * ne0]))
    assert not np.array_equal(raw, K.quantize_rows("Q4_K", x, w[:ne0]))  # one slice for all rows is different
    s = lab.error_stats(x, "Q4_K", w)
    d2 = (y.astype(np.float64) - x) ** 2
    wr = w.astype(np.float64).reshape(N_EXP, 1, ne0)
    want = math.sqrt((d2.reshape(N_EXP, per, ne0) * wr).sum() / (wr.sum() * per))
    assert s.weighted_rmse == pytest.approx(want, rel=1e-9)
    with pytest.raises(ValueError, match="importance vector has 768 values"):
        lab.error_stats(x, "Q4_K", w[:3 * ne0])  # 3 slices do not split 32 rows
    with pytest.raises(ValueError, match="importance vector has 100 values"):
        lab.error_stats(x, "Q4_K", w[:100])
    bad = w.copy()
    bad[3] = -1.0
    with pytest.raises(ValueError, match="finite and not negative"):
        lab.error_stats(x, "Q4_K", bad)
    bad[3] = np.inf
    with pytest.raises(ValueError, match="finite and not negative"):
        lab.requantize(x, "Q4_K", bad)


def test_sample_rows() -> None:
    np.testing.assert_array_equal(lab.sample_rows(10, None), np.arange(10))
    np.testing.assert_array_equal(lab.sample_rows(10, 50), np.arange(10))
    s = lab.sample_rows(1000, 10)
    assert s.size == 10 and np.all(np.diff(s) > 0) and s[0] >= 0 and s[-1] < 1000 and s[-1] > 900
    g = lab.sample_rows(4 * 100, 20, 4)  # 5 rows from each expert of 100
    assert g.size == 20
    np.testing.assert_array_equal(g // 100, np.repeat(np.arange(4), 5))
    assert lab.sample_rows(4 * 100, 2, 4).size == 4  # at least one row per expert
    with pytest.raises(ValueError, match="at least 1"):
        lab.sample_rows(10, 0)


def test_skips_progress_and_cancel() -> None:
    x = _normal((40, 96), 41)
    got = lab.requantize_errors(x, ["Q4_K", "Q4_0", "IQ4_XS", "Q8_0", "BF16"])
    assert [e.type for e in got] == ["Q4_0", "Q8_0", "BF16"]  # 96 is no whole 256-block: skipped, not an error
    with pytest.raises(ValueError, match="not whole Q4_K blocks"):
        lab.error_stats(x, "Q4_K")
    with pytest.raises(ValueError, match="not whole Q6_K blocks"):
        lab.requantize(x, "Q6_K")
    assert lab.requantize_errors(x, ["Q4_K"]) == []
    seen: list[tuple[int, int, str]] = []
    big = _normal((2 * lab.CHUNK_VALUES // 256 + 3, 256), 42)  # three chunks
    lab.requantize_errors(big, ["Q4_0", "F16"], progress=lambda d, t, q: seen.append((d, t, q)))
    assert [s[0] for s in seen] == sorted(s[0] for s in seen) and len(seen) == 6
    assert seen[-1][:2] == (2 * big.size, 2 * big.size) and {s[2] for s in seen} == {"Q4_0", "F16"}
    # chunked sums agree with one pass over everything
    e = lab.error_stats(big, "Q4_0")
    _, y = lab.requantize(big, "Q4_0")
    assert e.rmse == pytest.approx(math.sqrt(((y.astype(np.float64) - big) ** 2).mean()), rel=1e-9)
    calls = [0]

    def cancel() -> bool:
        calls[0] += 1
        return calls[0] > 2

    with pytest.raises(lab.LabCancelled):
        lab.requantize_errors(big, ["Q4_0", "F16"], cancel=cancel)


@pytest.mark.parametrize("qtype", ["Q4_K", "F16", "BF16"])
def test_non_finite_values_are_a_clear_error(qtype: str) -> None:
    x = _normal((6, 256), 51)
    x[4, 100] = np.inf
    with pytest.raises(ValueError, match="row 4 holds a value that is not a finite number"):
        lab.error_stats(x, qtype)
    x[4, 100] = np.nan
    with pytest.raises(ValueError, match="row 4 holds"):
        lab.requantize(x, qtype)
    with pytest.raises(ValueError, match="row 4 holds"):
        lab.requantize_errors(x, lab.CANDIDATE_TYPES)


def test_bad_values() -> None:
    with pytest.raises(ValueError, match="2-D"):
        lab.error_stats(np.zeros((2, 2, 32), np.float32), "Q8_0")
    with pytest.raises(ValueError, match="no values"):
        lab.error_stats(np.zeros((0, 32), np.float32), "Q8_0")
    with pytest.raises(ValueError, match="unknown ggml type"):
        lab.error_stats(np.zeros((1, 32), np.float32), "Q4_9")
    z = lab.error_stats(np.zeros((2, 64), np.float32), "Q4_0")  # zeros stay zeros
    assert z.exact and z.snr_db == math.inf and z.cosine == 1.0 and z.rel_rmse == 0.0


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q5_1", "MXFP4"])
def test_against_gguf_py(qtype: str) -> None:
    """gguf-py's numpy quantizers give the same bytes, so the same dequantized values and the same RMSE."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    x = _normal((32, 512), 61, 1.0)
    x[3, 40] = 9.0
    gq = quantize(x, GGMLQuantizationType[qtype])
    raw, y = lab.requantize(x, qtype)
    np.testing.assert_array_equal(raw, gq)
    gy = dequantize(gq, GGMLQuantizationType[qtype])
    np.testing.assert_array_equal(y, gy)
    d = gy.astype(np.float64) - x
    e = lab.error_stats(x, qtype)
    assert e.rmse == pytest.approx(math.sqrt(np.mean(d * d)), rel=1e-12)
    assert e.max_abs == pytest.approx(np.abs(d).max(), rel=1e-12)


# ------------------------------------------------------------------------------------------------------- files


def _same(a: Sequence[lab.ErrorStats], b: Sequence[lab.ErrorStats]) -> None:
    """The same figures up to the float64 rounding of summing in other chunks."""
    assert [e.type for e in a] == [e.type for e in b]
    for x, y in zip(a, b, strict=True):
        for k in ("rmse", "max_abs", "snr_db", "cosine", "rel_rmse", "weighted_rmse", "n_values"):
            vx, vy = getattr(x, k), getattr(y, k)
            assert (vx is None) == (vy is None), k
            if vx is not None:
                assert vx == pytest.approx(vy, rel=1e-12, abs=1e-15), k


def test_tensor_values_and_reference(files: dict[str, Path]) -> None:
    with GGUFFile(files["f32"]) as f32, GGUFFile(files["q8"]) as q8, GGUFFile(files["other"]) as other:
        assert q8.tensor("blk.0.attn_q.weight").type_name == "Q8_0"
        want = f32.tensor_array("blk.0.attn_q.weight")
        np.testing.assert_array_equal(lab.tensor_values(f32, "blk.0.attn_q.weight"), want)
        deq = lab.tensor_values(q8, "blk.0.attn_q.weight")
        assert deq.shape == (48, 256) and not np.array_equal(deq, want)
        np.testing.assert_array_equal(deq, _q8_0_reference(want))
        np.testing.assert_array_equal(lab.tensor_values(q8, "blk.0.attn_q.weight", reference=f32), want)
        exps = lab.tensor_values(q8, "blk.0.ffn_up_exps.weight", reference=f32)
        np.testing.assert_array_equal(exps, f32.tensor_array("blk.0.ffn_up_exps.weight").reshape(-1, 256))
        some = lab.tensor_values(f32, "blk.0.ffn_up_exps.weight", max_rows=8)  # two rows from each expert
        np.testing.assert_array_equal(some, exps[lab.sample_rows(N_EXP * 16, 8, N_EXP)])
        with pytest.raises(ValueError, match="reference's tensor is 128x64, this file's 256x64"):
            lab.tensor_values(q8, "token_embd.weight", reference=other)
        with _without_experts(files) as lacking:
            with pytest.raises(ValueError, match=r"no tensor named 'blk\.0\.ffn_up_exps\.weight' in .*renamed\.gguf"):
                lab.tensor_values(f32, "blk.0.ffn_up_exps.weight", reference=lacking)
        with pytest.raises(ValueError, match="1 dimension"):
            lab.tensor_values(f32, "blk.0.attn_norm.weight")
        with pytest.raises(ValueError, match="no tensor named 'nope'"):
            lab.tensor_values(f32, "nope")


def _without_experts(files: dict[str, Path]) -> GGUFFile:
    """The Q8_0 file with the expert tensor renamed (same length): a reference that lacks one tensor."""
    p = files["q8"].with_name("q8-renamed.gguf")
    data = files["q8"].read_bytes().replace(b"blk.0.ffn_up_exps.weight", b"blk.0.ffn_up_eXps.weight")
    p.write_bytes(data)
    return GGUFFile(p)


def test_file_stats(files: dict[str, Path]) -> None:
    types = ["Q4_0", "Q4_K", "Q8_0", "F16"]
    with GGUFFile(files["f32"]) as f32, GGUFFile(files["q8"]) as q8:
        st = lab.file_stats(f32, types)
        assert [s.name for s in st] == ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_v.weight",
                                        "blk.0.ffn_up_exps.weight"]  # the norm is no quantizable weight
        by = {s.name: s for s in st}
        assert by["blk.0.attn_v.weight"].skipped == ("Q4_K",)
        assert [e.type for e in by["blk.0.attn_v.weight"].errors] == ["Q4_0", "Q8_0", "F16"]
        x = by["blk.0.ffn_up_exps.weight"]
        assert x.shape == (256, 16, N_EXP) and x.n_elements == 256 * 16 * N_EXP and x.source_type == "F32"
        assert x.rows_measured == 16 * N_EXP and not x.from_reference
        vals = lab.tensor_values(f32, "blk.0.ffn_up_exps.weight")
        _same(x.errors, lab.requantize_errors(vals, types))
        # the Q8_0 file measured against the F32 reference gives the F32 file's figures
        ref = lab.file_stats(q8, types, reference=f32)
        assert [s.errors for s in ref] == [s.errors for s in st]
        assert all(s.from_reference and s.source_type == "F32" for s in ref)
        own = lab.file_stats(q8, types, pattern=r"attn_q")
        assert [s.name for s in own] == ["blk.0.attn_q.weight"] and own[0].source_type == "Q8_0"
        assert own[0].errors != by["blk.0.attn_q.weight"].errors
        # the whole-file figures weigh each tensor by its elements
        summ = {u.stats.type: u for u in lab.summarize(st, types)}
        assert list(summ) == types
        assert summ["Q4_K"].n_tensors == 3 and summ["Q8_0"].n_tensors == 4
        q4 = [(s.n_elements, e) for s in st for e in s.errors if e.type == "Q4_0"]
        n = sum(k for k, _ in q4)
        assert summ["Q4_0"].n_elements == n
        assert summ["Q4_0"].stats.rmse == pytest.approx(math.sqrt(sum(k * e.rmse**2 for k, e in q4) / n), rel=1e-9)
        assert summ["Q4_0"].stats.max_abs == max(e.max_abs for _, e in q4)
        with pytest.raises(ValueError, match="not a regular expression"):
            lab.file_stats(f32, types, pattern="attn(")


def test_file_stats_imatrix_and_sampling(files: dict[str, Path]) -> None:
    im = _imatrix(files["f32"])
    with GGUFFile(files["f32"]) as f:
        st = {s.name: s for s in lab.file_stats(f, ["Q4_K", "IQ4_XS"], imatrix=im, max_rows=8)}
        exps = st["blk.0.ffn_up_exps.weight"]
        assert exps.rows_measured == 8 and st["token_embd.weight"].rows_measured == 8
        assert all(e.weighted_rmse is not None for e in exps.errors)
        assert all(e.weighted_rmse is None for e in st["token_embd.weight"].errors)  # no entry: unweighted
        w = im.weights("blk.0.ffn_up_exps.weight")
        vals = lab.tensor_values(f, "blk.0.ffn_up_exps.weight", max_rows=8)
        _same(exps.errors, lab.requantize_errors(vals, ["Q4_K", "IQ4_XS"], w))
        # another model's imatrix: refused before any work
        bad = Imatrix(files["f32"], {"blk.0.attn_q.weight": ImatrixEntry(np.ones(128, np.float32),
                                                                          np.array([1], np.int64))})
        with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight: the imatrix entry has 128 values"):
            lab.file_stats(f, ["Q4_K"], imatrix=bad, progress=lambda *a: pytest.fail("started"))
        summ = lab.summarize(list(st.values()))
        assert [u.stats.type for u in summ] == ["Q4_K", "IQ4_XS"]
        assert summ[0].stats.weighted_rmse is not None
        # sampled tensors count for all their elements, not for the rows measured
        ks = [(s.n_elements, s.errors[0]) for s in st.values() if s.errors]
        assert len({e.n_values / k for k, e in ks}) > 1
        n = sum(k for k, _ in ks)
        assert summ[0].n_elements == n
        assert summ[0].stats.rmse == pytest.approx(math.sqrt(sum(k * e.rmse**2 for k, e in ks) / n), rel=1e-9)


def test_file_stats_non_finite(files: dict[str, Path]) -> None:
    with GGUFFile(files["nan"]) as f:
        with pytest.raises(ValueError, match=r"blk.0.attn_q.weight: row 5 holds a value that is not a finite"):
            lab.file_stats(f, ["F16"])
        with pytest.raises(ValueError, match="row 5 holds"):
            lab.file_stats(f, ["Q8_0"], pattern="attn_q", max_rows=48)
        assert lab.file_stats(f, ["Q8_0"], pattern="attn_v")[0].errors  # the other tensors are fine


# --------------------------------------------------------------------------------------------------------- CLI


def test_cli_table(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["quant-stats", str(files["f32"]), "--types", "q4_0,Q4_K,F16", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "4 tensors x 3 types" in lines[0]
    head = lines[1].split()
    assert head[:3] == ["tensor", "from", "type"] and "rmse" in head and "cosine" in head and "SNR" in head
    rows = [ln.split() for ln in lines if ln.startswith("blk.0.attn_v.weight")]
    assert [r[2] for r in rows] == ["Q4_0", "F16"]
    with GGUFFile(files["f32"]) as f:
        e = lab.error_stats(lab.tensor_values(f, "blk.0.attn_v.weight"), "Q4_0")
    assert rows[0][3] == "4.500" and float(rows[0][4]) == pytest.approx(e.rmse, rel=1e-3)
    i = lines.index("whole file (element-weighted)")
    assert [ln.split()[0] for ln in lines[i + 2:] if ln.strip()] == ["Q4_0", "Q4_K", "F16"]


def test_cli_json(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    args = ["quant-stats", str(files["q8"]), "--reference", str(files["f32"]), "--types", "Q8_0,F16,Q4_K",
            "--tensor", "attn", "--max-rows", "16", "--json"]
    assert cli.main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["types"] == ["Q8_0", "F16", "Q4_K"] and d["max_rows"] == 16
    assert [t["name"] for t in d["tensors"]] == ["blk.0.attn_q.weight", "blk.0.attn_v.weight"]
    q = d["tensors"][0]
    assert q["source_type"] == "F32" and q["rows_measured"] == 16 and q["shape"] == [256, 48]
    assert [e["type"] for e in q["errors"]] == ["Q8_0", "F16", "Q4_K"]
    assert d["tensors"][1]["skipped"] == ["Q4_K"]
    assert {"bits_per_weight", "rmse", "max_abs", "snr_db", "cosine", "rel_rmse", "weighted_rmse"} <= set(
        q["errors"][0])
    assert [s["type"] for s in d["summary"]] == ["Q8_0", "F16", "Q4_K"]
    assert d["summary"][2]["n_tensors"] == 1


def test_cli_json_exact_is_inf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gguf

    p = tmp_path / "exact.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_tensor("blk.0.attn_q.weight", (np.arange(64 * 32, dtype=np.float32).reshape(32, 64) - 1024) / 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert cli.main(["quant-stats", str(p), "--types", "F16", "--json"]) == 0
    e = json.loads(capsys.readouterr().out)["tensors"][0]["errors"][0]
    assert e["snr_db"] == "inf" and e["rmse"] == 0.0 and e["cosine"] == 1.0


def test_cli_real_expert_imatrix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """llama-imatrix's file for the 8-expert test model: each expert's slice weighs (and quantizes) its rows."""
    from quantscope.core.quant.imatrix import read_imatrix

    from . import quantize_models

    model = quantize_models.write_model("qwen3moe", tmp_path / "qwen3moe.gguf")
    imf = Path(__file__).parent / "data" / "quantize" / "qwen3moe.imatrix.gguf"
    name = "blk.1.ffn_down_exps.weight"
    assert cli.main(["quant-stats", str(model), "--imatrix", str(imf), "--tensor", r"^blk\.1\.ffn_down_exps",
                     "--types", "Q4_K,IQ4_XS,Q8_0", "--max-rows", "64", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    (t,) = d["tensors"]
    assert t["name"] == name and t["rows_measured"] == 64 and t["shape"][2] == 8
    im = read_imatrix(imf)
    w = im.weights(name)
    assert w is not None and w.size == 8 * t["shape"][0]
    with GGUFFile(model) as f:
        vals = lab.tensor_values(f, name, max_rows=64)
    want = lab.requantize_errors(vals, ["Q4_K", "IQ4_XS", "Q8_0"], w)
    for got, e in zip(t["errors"], want, strict=True):
        assert got["type"] == e.type and got["weighted_rmse"] == pytest.approx(e.weighted_rmse, rel=1e-12)
        assert got["rmse"] == pytest.approx(e.rmse, rel=1e-12)
    flat = lab.requantize_errors(vals, ["Q4_K"], w[: t["shape"][0]])  # expert 0's slice for every row differs
    assert flat[0].weighted_rmse != pytest.approx(want[0].weighted_rmse, rel=1e-9)


@pytest.mark.parametrize(("extra", "message"), [
    (["--types", "Q4_K,Q9_9"], "--types: unknown ggml type 'Q9_9'"),
    (["--types", "IQ2_XXS"], "--types: IQ2_XXS: Quantscope has no quantizer"),
    (["--types", ","], "--types: no type given"),
    (["--tensor", "attn("], "--tensor: 'attn(' is not a regular expression"),
    (["--tensor", "nothing_matches"], "no quantizable 2-D/3-D weight in"),
    (["--max-rows", "0"], "quant-stats: argument --max-rows: 0 is out of range"),
    (["--imatrix", "/nonexistent/im.gguf"], "/nonexistent/im.gguf"),
    (["--reference", "OTHER"], "the reference's tensor is 128x64, this file's 256x64"),
    (["--reference", "NAN"], "blk.0.attn_q.weight: row 5 holds a value that is not a finite number"),
])
def test_cli_errors_are_one_line(extra: list[str], message: str, files: dict[str, Path],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    extra = [str(files["other"]) if a == "OTHER" else str(files["nan"]) if a == "NAN" else a for a in extra]
    assert cli.main(["quant-stats", str(files["f32"]), *extra]) == 2
    err = capsys.readouterr().err
    err_lines = [ln for ln in err.splitlines() if not ln.startswith("quant-stats: ")]  # progress lines aside
    assert len(err_lines) == 1 and err_lines[0].startswith("quantscope: error: "), err
    assert message in err_lines[0]


def test_cli_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["quant-stats", str(tmp_path / "none.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantscope: error: ") and err.count("\n") == 1
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    assert cli.main(["quant-stats", str(tmp_path / "junk.gguf")]) == 2
    err = capsys.readouterr().err
    assert "not a readable GGUF file" in err and err.count("\n") == 1


# ------------------------------------------------------------------------------------- helpers for the GUI


@pytest.mark.parametrize("qtype", lab.CANDIDATE_TYPES)
def test_requantize_block_is_the_whole_round_trip_s_block(qtype: str) -> None:
    ne0, per = 512, 4
    x = _normal((N_EXP * per, ne0), 41, 0.3)
    w = np.random.default_rng(42).uniform(0.1, 2.0, N_EXP * ne0).astype(np.float32)
    raw, y = lab.requantize(x, qtype, w)
    t = ggml_type(qtype)
    be, bb = t.block_elems, t.block_bytes
    for row, block in ((0, 0), (9, 1), (N_EXP * per - 1, ne0 // be - 1)):  # row 9: the third expert's weights
        p = lab.requantize_block(x, qtype, row, block, w)
        assert p.columns == (block * be, (block + 1) * be)
        np.testing.assert_array_equal(p.original, x[row, block * be:(block + 1) * be])
        np.testing.assert_array_equal(p.requantized, y[row, block * be:(block + 1) * be])
        assert p.raw == raw[row, block * bb:(block + 1) * bb].tobytes()
        d = p.requantized.astype(np.float64) - p.original
        assert p.rmse == pytest.approx(math.sqrt(np.mean(d * d)), rel=1e-12)
        assert p.worst_element == (int(np.argmax(np.abs(d))), float(np.abs(d).max()))
    with pytest.raises(ValueError, match="no block"):
        lab.requantize_block(x, qtype, N_EXP * per, 0)


def test_worst_block_and_the_exports(files: dict[str, Path]) -> None:
    a = np.array([[0.1, np.nan], [0.5, 0.2]], np.float32)
    assert lab.worst_block(a) == (1, 0, pytest.approx(0.5))
    with pytest.raises(ValueError):
        lab.worst_block(np.full((2, 2), np.nan, np.float32))
    types = ["Q4_K", "Q8_0"]
    with GGUFFile(files["f32"]) as f:
        stats = lab.file_stats(f, types, max_rows=8)
    summary = lab.summarize(stats, types)
    doc = lab.stats_report(stats, summary, file="x.gguf", types=types)
    assert doc["file"] == "x.gguf" and [t["name"] for t in doc["tensors"]] == [s.name for s in stats]  # type: ignore[index]
    import csv
    import io

    rows = list(csv.reader(io.StringIO(lab.stats_csv(stats, summary))))
    assert tuple(rows[0]) == lab.CSV_COLUMNS
    body = [dict(zip(lab.CSV_COLUMNS, r, strict=True)) for r in rows[1:]]
    assert len(body) == sum(len(s.errors) for s in stats) + len(summary)
    first = stats[0].errors[0]
    assert body[0]["tensor"] == stats[0].name and float(body[0]["rmse"]) == first.rmse
    assert body[-1]["scope"] == "summary" and int(body[-1]["n_tensors"]) == summary[-1].n_tensors
