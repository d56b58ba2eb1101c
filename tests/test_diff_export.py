"""`quantscope diff` and `quantscope export` (core/gguf/diff.py, core/export.py, cli/diff.py, cli/export.py).

Two small GGUFs written with gguf-py's GGUFWriter differ in every way the diff reports; the figures are checked
against numpy on gguf-py's dequantization of the same bytes (``gguf.quants.dequantize``), the exported .npy files
against ``numpy.load`` and gguf-py, the block exports against ``quantscope dump-block --json``.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import stat
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

from quantscope.cli.main import main
from quantscope.core import export
from quantscope.core.fsutil import PathRefused
from quantscope.core.gguf import GGUFFile
from quantscope.core.gguf import diff as diff_mod
from quantscope.core.gguf.diff import (
    MIN_WINDOW,
    DiffCancelled,
    compare_values,
    diff_files,
    locate_blocks,
    locate_difference,
)
from quantscope.core.jobs import Cancelled, CancelToken
from quantscope.core.native.kernels import quantize_rows
from quantscope.core.quant import decode_block

V = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType
RNG_SEED = 1919


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(RNG_SEED)
    return {
        "same.weight": rng.standard_normal((8, 64)).astype(np.float32),
        "removed.weight": rng.standard_normal((4, 32)).astype(np.float32),
        "added.weight": rng.standard_normal((2, 32)).astype(np.float32),
        "reshaped.weight": rng.standard_normal((4, 64)).astype(np.float32),
        "q8.weight": rng.standard_normal((16, 256)).astype(np.float32),
        "q4k.weight": (rng.standard_normal((12, 512)) * 0.05).astype(np.float32),
        "f16.weight": rng.standard_normal((6, 32)).astype(np.float16),
        "q8same.weight": rng.standard_normal((3, 4, 64)).astype(np.float32),
        "zero.weight": np.zeros((2, 32), np.float32),
    }


SCORES = np.linspace(-1, 1, 3000, dtype=np.float32)


def write_pair(folder: Path) -> tuple[Path, Path]:
    """A.gguf and B.gguf: B changes metadata (value, type, array element, string array, added/removed keys) and
    tensors (added, removed, reshaped, retyped F32 -> Q8_0 / Q4_K, one F16 element, one all-zero -> nonzero)."""
    w8 = _weights()
    pa, pb = folder / "A.gguf", folder / "B.gguf"
    wa, wb = gguf.GGUFWriter(str(pa), "llama"), gguf.GGUFWriter(str(pb), "llama")
    for w, name in ((wa, "model A"), (wb, "model B")):
        w.add_key_value("general.name", name, V.STRING)
        w.add_key_value("test.same", 42, V.UINT32)
        w.add_key_value("test.same_array", [1, 2, 3], V.ARRAY, sub_type=V.INT32)
    wa.add_key_value("test.count", 7, V.UINT32)
    wb.add_key_value("test.count", 7, V.INT32)  # type change, same value
    wa.add_key_value("test.eps", 1e-5, V.FLOAT32)
    wb.add_key_value("test.eps", 1e-6, V.FLOAT32)
    scores_b = SCORES.copy()
    scores_b[1234] = 5.0
    wa.add_key_value("test.scores", SCORES.tolist(), V.ARRAY, sub_type=V.FLOAT32)
    wb.add_key_value("test.scores", scores_b.tolist(), V.ARRAY, sub_type=V.FLOAT32)
    wa.add_key_value("test.tokens", ["<s>", "hello", "world", "!"], V.ARRAY, sub_type=V.STRING)
    wb.add_key_value("test.tokens", ["<s>", "hello", "World", "!"], V.ARRAY, sub_type=V.STRING)
    wa.add_key_value("test.ids", [1, 2, 3], V.ARRAY, sub_type=V.INT32)
    wb.add_key_value("test.ids", [1, 2, 3, 4], V.ARRAY, sub_type=V.INT32)  # a longer array, same prefix
    wa.add_key_value("test.elem_type", [1, 2], V.ARRAY, sub_type=V.INT32)
    wb.add_key_value("test.elem_type", [1, 2], V.ARRAY, sub_type=V.UINT32)  # element type change
    wa.add_key_value("test.template", "{% for m in messages %}{{ m.content }}{% endfor %}", V.STRING)
    wb.add_key_value("test.template", "{% for m in messages %}{{ m.text }}{% endfor %}", V.STRING)
    wa.add_key_value("test.removed", True, V.BOOL)
    wb.add_key_value("test.added", "new", V.STRING)

    for name in ("same.weight", "q8same.weight"):
        for w in (wa, wb):
            data = w8[name]
            if name == "q8same.weight":
                w.add_tensor(name, gguf.quants.quantize(data, Q.Q8_0), raw_dtype=Q.Q8_0)
            else:
                w.add_tensor(name, data)
    wa.add_tensor("removed.weight", w8["removed.weight"])
    wb.add_tensor("added.weight", w8["added.weight"])
    wa.add_tensor("reshaped.weight", w8["reshaped.weight"])
    wb.add_tensor("reshaped.weight", w8["reshaped.weight"].reshape(8, 32))
    wa.add_tensor("q8.weight", w8["q8.weight"])
    wb.add_tensor("q8.weight", gguf.quants.quantize(w8["q8.weight"], Q.Q8_0), raw_dtype=Q.Q8_0)
    wa.add_tensor("q4k.weight", w8["q4k.weight"])
    # gguf-py 0.19 has no Q4_K quantizer (only its dequantizer): our native one (ggml's bytes) writes the blocks
    wb.add_tensor("q4k.weight", np.array(quantize_rows("Q4_K", w8["q4k.weight"])), raw_dtype=Q.Q4_K)
    f16b = w8["f16.weight"].copy()
    f16b[3, 17] = np.float16(100.0)
    wa.add_tensor("f16.weight", w8["f16.weight"])
    wb.add_tensor("f16.weight", f16b)
    wa.add_tensor("zero.weight", w8["zero.weight"])
    wb.add_tensor("zero.weight", np.full((2, 32), 0.5, np.float32))
    _finish(wa)
    _finish(wb)
    return pa, pb


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_pair(tmp_path_factory.mktemp("diff"))


def _gguf_py_values(path: Path, name: str) -> np.ndarray:
    """The oracle: gguf-py's reader and dequantizer, as float64 rows (n_rows, ne0)."""
    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == name)
    x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
    return x.reshape(-1, int(t.shape[0]))


def _oracle_figures(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    d = b - a
    n = a.size
    rmse = math.sqrt(float(np.sum(d * d)) / n)
    rms_a = math.sqrt(float(np.sum(a * a)) / n)
    na, nb = math.sqrt(float(np.sum(a * a))), math.sqrt(float(np.sum(b * b)))
    return {"rmse": rmse, "max_abs": float(np.max(np.abs(d))),
            "cosine": float(np.sum(a * b)) / (na * nb) if na and nb else math.nan,
            "rel_error": rmse / rms_a if rms_a else math.inf}


# ------------------------------------------------------------------------------------------------------ diff


def test_metadata_changes(pair):
    pa, pb = pair
    with GGUFFile(pa) as a, GGUFFile(pb) as b:
        d = diff_files(a, b, values=False)
    ch = {m.key: m for m in d.metadata}
    assert set(ch) == {"general.name", "test.count", "test.eps", "test.scores", "test.tokens", "test.ids",
                       "test.elem_type", "test.template", "test.removed", "test.added"}
    # general.architecture, general.alignment? (gguf-py writes none), test.same, test.same_array
    assert d.metadata_same == 3
    assert ch["general.name"].kind == "value" and (ch["general.name"].value_a, ch["general.name"].value_b) == (
        "model A", "model B")
    assert ch["general.name"].first_diff == 6 and ch["general.name"].at_b == "B"
    c = ch["test.count"]
    assert (c.kind, c.type_a, c.type_b, c.value_a, c.value_b) == ("type", "UINT32", "INT32", 7, 7)
    e = ch["test.eps"]
    assert e.kind == "value" and e.value_a == pytest.approx(1e-5) and e.value_b == pytest.approx(1e-6)
    s = ch["test.scores"]
    assert (s.kind, s.count_a, s.count_b, s.first_diff) == ("value", 3000, 3000, 1234)
    assert s.at_a == pytest.approx(float(SCORES[1234])) and s.at_b == 5.0
    assert s.digest_a != s.digest_b and len(s.digest_a) == 32
    import hashlib

    assert s.digest_a == hashlib.blake2b(SCORES.astype("<f4").tobytes(), digest_size=16).hexdigest()
    assert s.value_a["count"] == 3000 and len(s.value_a["head"]) == 8
    t = ch["test.tokens"]
    assert (t.first_diff, t.at_a, t.at_b, t.count_a) == (2, "world", "World", 4)
    ids = ch["test.ids"]
    assert (ids.count_a, ids.count_b, ids.first_diff, ids.at_a, ids.at_b) == (3, 4, 3, None, 4)
    assert ch["test.elem_type"].kind == "type"
    assert (ch["test.elem_type"].type_a, ch["test.elem_type"].type_b) == ("ARRAY[INT32]", "ARRAY[UINT32]")
    tp = ch["test.template"]
    assert tp.first_diff == len("{% for m in messages %}{{ m.") and tp.at_a.startswith("content")
    assert ch["test.removed"].kind == "removed" and ch["test.removed"].value_a is True
    assert ch["test.added"].kind == "added" and ch["test.added"].value_b == "new"


def test_tensor_table_and_values_against_gguf_py(pair):
    pa, pb = pair
    with GGUFFile(pa) as a, GGUFFile(pb) as b:
        d = diff_files(a, b)
    td = {t.name: t for t in d.tensors}
    assert [t.name for t in d.tensors][-1] == "added.weight"  # A's order, then B's new tensors
    assert td["removed.weight"].status == "removed" and td["removed.weight"].shape_a == (4, 32)
    assert td["added.weight"].status == "added" and td["added.weight"].type_b == "F32"
    r = td["reshaped.weight"]
    assert (r.status, r.reshaped, r.shape_a, r.shape_b, r.values) == ("changed", True, (4, 64), (8, 32), None)
    for name in ("same.weight", "q8same.weight"):
        assert td[name].status == "same" and td[name].values.exact
        assert td[name].values.rmse == 0 and td[name].values.cosine == 1.0
    for name, qt in (("q8.weight", "Q8_0"), ("q4k.weight", "Q4_K"), ("f16.weight", "F16"), ("zero.weight", "F32")):
        t = td[name]
        assert t.status == "changed" and t.type_b == qt and not t.values.exact
        assert t.retyped == (qt not in ("F16", "F32"))
        x, y = _gguf_py_values(pa, name), _gguf_py_values(pb, name)
        want = _oracle_figures(x, y)
        v = t.values
        assert v.n_compared == x.size and v.rows_compared == v.rows_total == x.shape[0]
        assert v.rmse == pytest.approx(want["rmse"], rel=1e-9)
        assert v.max_abs == pytest.approx(want["max_abs"], rel=1e-9)
        if name == "zero.weight":  # A is all zero: no direction, infinite relative error
            assert math.isnan(v.cosine) and v.rel_error == math.inf
        else:
            assert v.cosine == pytest.approx(want["cosine"], rel=1e-12)
            assert v.rel_error == pytest.approx(want["rel_error"], rel=1e-9)
        k = int(np.argmax(np.abs(y - x)))
        assert v.max_abs_at == divmod(k, x.shape[1])
    assert td["f16.weight"].values.max_abs_at == (3, 17)
    assert td["f16.weight"].values.first_diff_row == 3
    assert td["q4k.weight"].values.rel_error > td["q8.weight"].values.rel_error  # 4.5 vs 8.5 bits per weight
    assert not d.identical
    c = d.counts()
    assert (c["tensors_added"], c["tensors_removed"], c["tensors_retyped"], c["tensors_reshaped"]) == (1, 1, 2, 1)
    assert (c["tensors_exact"], c["tensors_values_differ"], c["metadata_type"]) == (2, 4, 2)


def test_json_is_strict_and_complete(pair):
    pa, pb = pair
    with GGUFFile(pa) as a, GGUFFile(pb) as b:
        d = diff_files(a, b)
    text = d.to_json()

    def no_constants(x: str) -> None:
        raise AssertionError(f"non-strict JSON constant {x}")

    obj = json.loads(text, parse_constant=no_constants)
    assert obj["identical"] is False
    z = next(t for t in obj["tensors"] if t["name"] == "zero.weight")
    assert z["values"]["cosine"] == "nan" and z["values"]["rel_error"] == "inf"
    assert next(t for t in obj["tensors"] if t["name"] == "same.weight")["values"]["rms_a"] is None
    assert obj["a"]["path"] == str(pa) and obj["b"]["n_tensors"] == 8
    assert {m["key"] for m in obj["metadata"]} >= {"test.scores", "test.count"}


def test_filter_sampling_and_identity(pair):
    pa, pb = pair
    with GGUFFile(pa) as a, GGUFFile(pb) as b:
        d = diff_files(a, b, tensor=r"^q8\.", max_rows=4)
        assert [t.name for t in d.tensors] == ["q8.weight"]
        v = d.tensors[0].values
        assert (v.rows_compared, v.rows_total, v.n_compared) == (4, 16, 4 * 256)
        x, y = _gguf_py_values(pa, "q8.weight"), _gguf_py_values(pb, "q8.weight")
        from quantscope.core.quant.lab import sample_rows

        rows = sample_rows(16, 4)
        assert v.rmse == pytest.approx(_oracle_figures(x[rows], y[rows])["rmse"], rel=1e-9)
        with GGUFFile(pa) as a2:
            same = diff_files(a, a2)
        assert same.identical and not same.metadata and all(t.values.exact for t in same.tensors)
        assert same.metadata_same == len(a.metadata)


def test_locate_difference(pair):
    pa, pb = pair
    with GGUFFile(pa) as a, GGUFFile(pb) as b:
        loc = locate_difference(a, b, "f16.weight")
        assert (loc.row, loc.col, loc.block_a, loc.block_b, loc.element_a) == (3, 17, 17, 17, 0)
        assert loc.value_b == 100.0 and loc.abs_diff == pytest.approx(abs(100.0 - loc.value_a))
        x, y = _gguf_py_values(pa, "q4k.weight"), _gguf_py_values(pb, "q4k.weight")
        loc = locate_difference(a, b, "q4k.weight")
        sse = ((y - x) ** 2).reshape(x.shape[0], -1, 256).sum(axis=2)  # lcm(1, 256): whole Q4_K blocks
        i, j = np.unravel_index(int(np.argmax(sse)), sse.shape)
        assert (loc.row, loc.region) == (i, (j * 256, j * 256 + 256))
        assert loc.block_b == j and loc.block_a == loc.col and loc.element_b == loc.col - j * 256
        assert loc.region_rmse == pytest.approx(math.sqrt(sse[i, j] / 256), rel=1e-9)
        assert loc.col == j * 256 + int(np.argmax(np.abs(y - x)[i, j * 256:(j + 1) * 256]))
        assert locate_difference(a, b, "same.weight") is None
        with pytest.raises(ValueError, match="shapes"):
            locate_difference(a, b, "reshaped.weight")
        with pytest.raises(KeyError):
            locate_difference(a, b, "nope")


@pytest.mark.parametrize("name", ["q8.weight", "q4k.weight", "f16.weight"])
def test_locate_blocks_holds_both_blocks_and_the_window(pair, name):
    """Qt-free: both files' blocks where the tensor differs most, decoded, and the window's values (gguf-py's)."""
    pa, pb = pair
    with GGUFFile(pa) as a, GGUFFile(pb) as b:
        found = locate_blocks(a, b, name)
        loc = locate_difference(a, b, name)
        assert found is not None and found.loc == loc
        w0, w1 = found.window
        if name == "f16.weight":  # an element type: MIN_WINDOW columns around the element
            assert (w0, w1) == (loc.col // MIN_WINDOW * MIN_WINDOW, loc.col // MIN_WINDOW * MIN_WINDOW + MIN_WINDOW)
        else:
            assert found.window == loc.region
        for f, path, s, block, element in ((a, pa, found.a, loc.block_a, loc.element_a),
                                           (b, pb, found.b, loc.block_b, loc.element_b)):
            t = f.tensor(name)
            assert (s.block, s.element, s.type_name) == (block, element, t.type_name)
            assert (s.offset, s.size) == f.block_location(t, loc.row, block)
            dec = decode_block(t.type, f.block_bytes(t, loc.row, block))
            np.testing.assert_array_equal(s.decoded.values, dec.values)
            row = _gguf_py_values(path, name)[loc.row]
            np.testing.assert_array_equal(s.values, row[w0:w1].astype(np.float32))
        assert locate_blocks(a, b, "same.weight") is None


def test_progress_and_cancel(pair):
    pa, pb = pair
    seen: list[tuple[int, int]] = []
    with GGUFFile(pa) as a, GGUFFile(pb) as b:
        diff_files(a, b, progress=lambda d, t: seen.append((d, t)))
        total = seen[-1][1]
        pairs = [n for n in ("same.weight", "q8same.weight", "q8.weight", "q4k.weight", "f16.weight", "zero.weight")]
        assert total == sum(a.tensor(n).n_bytes + b.tensor(n).n_bytes for n in pairs)
        assert seen[-1][0] == total and all(x[0] <= y[0] for x, y in itertools.pairwise(seen))
        tok = CancelToken()
        tok.cancel()
        with pytest.raises(DiffCancelled) as ei:
            diff_files(a, b, cancel=tok)
        assert isinstance(ei.value, Cancelled)
        with pytest.raises(ValueError, match="max_rows"):
            diff_files(a, b, max_rows=0)
        with pytest.raises(ValueError, match="shapes"):
            compare_values(a, a.tensor("reshaped.weight"), b, b.tensor("reshaped.weight"))
        tok2 = CancelToken()

        def cancel_midway(done: int, total: int) -> None:
            if done > 0:
                tok2.cancel()

        with pytest.raises(DiffCancelled):
            diff_files(a, b, progress=cancel_midway, cancel=tok2)


def _big_pair(folder: Path) -> tuple[Path, Path, np.ndarray]:
    x = np.random.default_rng(7).standard_normal((256, 1024)).astype(np.float32)
    paths = []
    for name, data in (("big_a.gguf", x), ("big_b.gguf", x.astype(np.float16))):
        w = gguf.GGUFWriter(str(folder / name), "llama")
        w.add_tensor("big.weight", data)
        _finish(w)
        paths.append(folder / name)
    return paths[0], paths[1], x


def test_memory_is_bounded_by_the_chunk(tmp_path, monkeypatch):
    pa, pb, x = _big_pair(tmp_path)  # 1 MiB of F32 against F16: a whole-tensor float64 pass would take 2+ MiB each
    monkeypatch.setattr(diff_mod, "CHUNK_VALUES", 4096)
    monkeypatch.setattr(export, "CHUNK_BYTES", 16384)
    with GGUFFile(pa) as a, GGUFFile(pb) as b:
        tracemalloc.start()
        try:
            d = diff_files(a, b)
            _, peak_diff = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            export.export_tensor_npy(b, "big.weight", tmp_path / "big.npy")
            _, peak_export = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak_diff < 400_000 and peak_export < 400_000, (peak_diff, peak_export)
    v = d.tensors[0].values
    y = x.astype(np.float16).astype(np.float64)
    assert v.rmse == pytest.approx(_oracle_figures(x.astype(np.float64), y)["rmse"], rel=1e-9)
    assert np.array_equal(np.load(tmp_path / "big.npy"), x.astype(np.float16).astype(np.float32))


# ------------------------------------------------------------------------------------------------------ CLI diff


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_diff_text_sections_and_exit_status(pair, capsys):
    pa, pb = pair
    rc, out, _err = run(capsys, "diff", pa, pb)
    assert rc == 1
    for section in ("Metadata: ", "Tensors: ", "Values, by relative error", "Result: the files differ"):
        assert section in out
    assert "~ test.count  type UINT32 -> INT32: 7 -> 7" in out
    assert "~ test.scores  ARRAY[FLOAT32] × 3,000: first difference at [1,234]" in out
    assert "+ added.weight  F32 [2, 32]" in out and "- removed.weight  F32 [4, 32]" in out
    assert "~ reshaped.weight  F32 [4, 64] -> F32 [8, 32]" in out
    values = out.split("Values, by relative error")[1].splitlines()[2:6]
    names = [line.split()[0] for line in values]
    with GGUFFile(pa) as a, GGUFFile(pb) as b:
        d = diff_files(a, b)
    by_rel = sorted((t for t in d.tensors if t.values is not None and not t.values.exact),
                    key=lambda t: -t.values.rel_error)
    assert names == [t.name for t in by_rel] and names[0] == "zero.weight"
    assert "2 bit-identical" in out

    rc, out, _ = run(capsys, "diff", pa, pb, "--json")
    assert rc == 1
    obj = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert obj["identical"] is False and obj == json.loads(d.to_json())

    rc, out, _ = run(capsys, "diff", pa, pa)
    assert rc == 0 and "Result: no differences" in out and "every tensor compared is bit-identical" in out
    rc, out, _ = run(capsys, "diff", pa, pa, "--no-values", "--json")
    assert rc == 0 and json.loads(out)["values_compared"] is False
    assert {t["status"] for t in json.loads(out)["tensors"]} == {"unchecked"}
    rc, out, _ = run(capsys, "diff", pa, pb, "--tensor", "^q8\\.", "--max-rows", "2", "--json")
    obj = json.loads(out)
    assert rc == 1 and [t["name"] for t in obj["tensors"]] == ["q8.weight"]
    assert obj["tensors"][0]["values"]["rows_compared"] == 2 and obj["tensors"][0]["values"]["sampled"] is True


@pytest.mark.parametrize(("argv", "message"), [
    (["diff", "{a}", "{missing}"], "no such file"),
    (["diff", "{a}", "{b}", "--tensor", "("], "not a regular expression"),
    (["diff", "{a}", "{b}", "--max-rows", "0"], "out of range"),
    (["diff", "{a}", "{text}"], "not a readable GGUF file"),
    (["diff", "{a}"], "required"),
])
def test_cli_diff_errors_exit_2_in_one_line(pair, tmp_path, capsys, argv, message):
    pa, pb = pair
    text = tmp_path / "notes.txt"
    text.write_text("not a gguf file at all, but long enough to have a header\n")
    args = [x.format(a=pa, b=pb, missing=tmp_path / "nope.gguf", text=text) for x in argv]
    rc, out, err = run(capsys, *args)
    assert rc == 2 and out == ""
    assert err.startswith("quantscope: error: ") and err.count("\n") == 1 and message in err


def test_real_model_against_itself_is_all_exact(model_path, capsys):
    p = model_path("qwen2.5-coder")
    with GGUFFile(p) as a, GGUFFile(p) as b:
        d = diff_files(a, b, threads=0)
        assert d.identical and not d.metadata and d.metadata_same == len(a.metadata)
        assert len(d.tensors) == len(a.tensors) > 200
        assert all(t.status == "same" and t.values.exact for t in d.tensors)
    rc, out, _ = run(capsys, "diff", p, p, "--tensor", "^blk\\.0\\.")
    assert rc == 0 and "Result: no differences" in out


# ------------------------------------------------------------------------------------------------------ export


def _reader_tensor(path: Path, name: str):
    r = gguf.GGUFReader(str(path))
    return next(t for t in r.tensors if t.name == name)


@pytest.mark.parametrize("name", ["q4k.weight", "q8.weight", "f16.weight", "q8same.weight", "added.weight"])
def test_export_npy_equals_gguf_py(pair, tmp_path, capsys, name):
    pb = pair[1]
    t = _reader_tensor(pb, name)
    with GGUFFile(pb) as f:
        info = f.tensor(name)
    want = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(info.shape)
    rc, out, _err = run(capsys, "export", pb, name, "-o", tmp_path / "v.npy")
    assert rc == 0 and "wrote" in out
    got = np.load(tmp_path / "v.npy")
    assert got.dtype == np.dtype("<f4") and got.shape == info.shape
    assert np.array_equal(got, want)

    rc, _, _ = run(capsys, "export", pb, name, "-o", tmp_path / "r.npy", "--raw")
    assert rc == 0
    raw = np.load(tmp_path / "r.npy")
    assert raw.tobytes() == np.asarray(t.data).tobytes()
    with GGUFFile(pb) as f:
        assert raw.tobytes() == f.tensor_bytes(name).tobytes()
    if info.type.is_quantized:
        assert raw.dtype == np.uint8 and raw.shape == (info.n_rows, info.row_bytes)
    else:
        assert raw.dtype == np.asarray(t.data).dtype and raw.shape == info.shape


def test_export_streams_in_chunks_with_progress(pair, tmp_path, monkeypatch):
    pb = pair[1]
    monkeypatch.setattr(export, "CHUNK_BYTES", 1024)
    seen: list[tuple[int, int]] = []
    with GGUFFile(pb) as f:
        res = export.export_tensor_npy(f, "q4k.weight", tmp_path / "q.npy", progress=lambda d, n: seen.append((d, n)))
        assert res.data_bytes == 12 * 512 * 4 and len(seen) >= 12 and seen[-1] == (res.data_bytes, res.data_bytes)
        res = export.export_tensor_npy(f, "q4k.weight", tmp_path / "r.npy", raw=True,
                                       progress=lambda d, n: seen.append((d, n)))
        assert seen[-1] == (12 * 2 * 144, 12 * 2 * 144) and res.shape == (12, 2 * 144)
    t = _reader_tensor(pb, "q4k.weight")
    assert np.array_equal(np.load(tmp_path / "q.npy"), gguf.quants.dequantize(t.data, t.tensor_type))


def test_export_cancel_leaves_nothing(pair, tmp_path, monkeypatch):
    pb = pair[1]
    monkeypatch.setattr(export, "CHUNK_BYTES", 1024)
    tok = CancelToken()
    target = tmp_path / "out" / "c.npy"
    target.parent.mkdir()
    with GGUFFile(pb) as f:
        with pytest.raises(export.ExportCancelled):
            export.export_tensor_npy(f, "q4k.weight", target, progress=lambda d, n: tok.cancel(), cancel=tok)
        assert os.listdir(target.parent) == []
        target.write_bytes(b"old")  # an existing output keeps its content
        with pytest.raises(Cancelled):
            export.export_tensor_npy(f, "q4k.weight", target, progress=lambda d, n: tok.cancel(), cancel=tok)
        with pytest.raises(export.ExportCancelled):
            export.export_metadata(f, tmp_path / "out" / "m.json", cancel=tok)
    assert target.read_bytes() == b"old" and os.listdir(target.parent) == ["c.npy"]


def test_export_block_equals_dump_block_json(pair, tmp_path, capsys):
    pb = pair[1]
    for name, row, block in (("q4k.weight", 5, 1), ("q8.weight", 3, 7), ("f16.weight", 3, 17)):
        rc, out, _ = run(capsys, "dump-block", pb, name, "--row", row, "--block", block, "--json")
        assert rc == 0
        want = json.loads(out)
        rc, _, _ = run(capsys, "export", pb, name, "--block", f"{row}:{block}", "-o", tmp_path / "b.json")
        assert rc == 0 and json.loads((tmp_path / "b.json").read_text()) == want
        rc, _, _ = run(capsys, "export", pb, name, "--block", f"{row}:{block}", "-o", tmp_path / "b.csv")
        assert rc == 0
        with open(tmp_path / "b.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert list(rows[0]) == list(export.BLOCK_CSV_COLUMNS)
        meta = {r["name"]: r["value"] for r in rows if r["section"] == "block"}
        assert (meta["tensor"], int(meta["row"]), int(meta["block"]), meta["type"], int(meta["file_offset"])) == (
            name, row, block, want["type"], want["file_offset"])
        fields: dict[str, dict] = {}
        for r in (r for r in rows if r["section"] == "field"):
            fd = fields.setdefault(r["name"], {"name": r["name"], "offset": int(r["offset"]), "size": int(r["size"]),
                                               "kind": r["kind"], "description": r["description"], "value": None})
            num = float(r["value"]) if any(c in r["value"] for c in ".en") else int(r["value"])
            if r["bits"]:
                fd["value"] = {"bits": int(r["bits"]), "float": num}
            elif r["index"]:
                fd["value"] = [*(fd["value"] or []), num]
            else:
                fd["value"] = num
        assert list(fields.values()) == want["fields"]
        values = [float(r["value"]) for r in rows if r["section"] == "element" and r["name"] == "value"]
        codes = [int(r["value"]) for r in rows if r["section"] == "element" and r["name"] == "raw_code"]
        assert values == want["values"] and codes == want["codes"]
        scales = {}
        for r in (r for r in rows if r["section"] == "scale"):
            scales.setdefault(r["name"], []).append(int(r["value"]))
        assert scales == want["scales"]


def test_export_metadata_json(pair, tmp_path, capsys):
    pa = pair[0]
    rc, _out, _ = run(capsys, "export", pa, "--metadata", "-o", tmp_path / "m.json")
    assert rc == 0
    obj = json.loads((tmp_path / "m.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert obj["format"] == "quantscope-metadata" and obj["gguf_version"] == 3
    md = obj["metadata"]
    r = gguf.GGUFReader(str(pa))
    assert list(md) == [k for k in r.fields if not k.startswith("GGUF.")]
    assert md["test.tokens"] == {"type": "ARRAY[STRING]", "value": ["<s>", "hello", "world", "!"]}
    assert md["test.scores"]["type"] == "ARRAY[FLOAT32]" and md["test.scores"]["value"] == SCORES.tolist()
    assert md["test.count"] == {"type": "UINT32", "value": 7} and md["test.removed"]["value"] is True
    with GGUFFile(pa) as f:
        assert [t["name"] for t in obj["tensors"]] == [t.name for t in f.tensors]
        q = next(t for t in obj["tensors"] if t["name"] == "q8same.weight")
        info = f.tensor("q8same.weight")
        assert (q["shape"], q["ne"], q["offset"], q["n_bytes"], q["type"]) == (
            [3, 4, 64], [64, 4, 3], info.data_offset, info.n_bytes, "Q8_0")


@pytest.mark.parametrize(("argv", "message"), [
    (["export", "{b}", "nope.weight", "-o", "{out}/x.npy"], "no tensor named 'nope.weight'"),
    (["export", "{b}", "q8.weight", "-o", "{b}"], "is the input file"),
    (["export", "{b}", "--metadata", "-o", "{b}"], "is the input file"),
    (["export", "{b}", "q8.weight", "-o", "{fifo}"], "FIFO"),
    (["export", "{b}", "q8.weight", "--block", "0:9", "-o", "{out}/b.json"], "out of range"),
    (["export", "{b}", "q8.weight", "--block", "99:0", "-o", "{out}/b.json"], "out of range"),
    (["export", "{b}", "q8.weight", "--block", "1-2", "-o", "{out}/b.json"], "ROW:BLOCK"),
    (["export", "{b}", "q8.weight", "--block", "0:0", "-o", "{out}/b.txt"], ".csv or .json"),
    (["export", "{b}", "q8.weight", "--metadata", "-o", "{out}/m.json"], "leave out TENSOR"),
    (["export", "{b}", "-o", "{out}/x.npy"], "give a TENSOR"),
    (["export", "{b}", "--metadata", "--raw", "-o", "{out}/m.json"], "--raw"),
    (["export", "{b}", "q8.weight"], "required"),
    (["export", "{b}", "q8.weight", "-o", "{out}/sub/"], "not a file name"),
])
def test_cli_export_refusals(pair, tmp_path, capsys, argv, message):
    pb = pair[1]
    fifo = tmp_path / "fifo.npy"
    os.mkfifo(fifo)
    (tmp_path / "out").mkdir()
    before = pb.read_bytes()
    args = [x.format(b=pb, out=tmp_path / "out", fifo=fifo) for x in argv]
    rc, out, err = run(capsys, *args)
    assert rc == 2 and out == ""
    assert err.startswith("quantscope: error: ") and err.count("\n") == 1 and message in err, err
    assert pb.read_bytes() == before and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert os.listdir(tmp_path / "out") == []


def test_export_refuses_a_link_to_the_input(pair, tmp_path):
    pb = pair[1]
    link = tmp_path / "link.npy"
    link.symlink_to(pb)
    with GGUFFile(pb) as f, pytest.raises(PathRefused, match="input file"):
        export.export_tensor_npy(f, "q8.weight", link)
    assert link.is_symlink()


def test_nested_arrays_and_broken_tensors(pair, tmp_path, capsys):
    paths = []
    for name, v in (("n1.gguf", [[1, 2], [3]]), ("n2.gguf", [[1, 2], [4]])):
        w = gguf.GGUFWriter(str(tmp_path / name), "llama")
        w.add_key_value("test.nested", v, V.ARRAY, sub_type=V.ARRAY)
        _finish(w)
        paths.append(tmp_path / name)
    with GGUFFile(paths[0]) as a, GGUFFile(paths[1]) as b:
        (m,) = diff_files(a, b).metadata
    assert (m.key, m.kind, m.type_a, m.count_a, m.first_diff) == ("test.nested", "value", "ARRAY[ARRAY]", 2, 1)
    assert m.at_a["head"] == [3] and m.at_b["head"] == [4]

    pa = pair[0]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(pa.read_bytes()[:-16])  # the last tensor (zero.weight) now runs past the end
    rc, out, _ = run(capsys, "diff", pa, cut)
    assert rc == 1 and "? zero.weight  F32 [2, 32]: zero.weight in " in out and "cannot be read" in out
    with GGUFFile(pa) as a, GGUFFile(cut, strict=False) as b:
        d = diff_files(a, b)
        z = next(t for t in d.tensors if t.name == "zero.weight")
        assert (z.status, z.values) == ("changed", None)
        assert all(t.status == "same" for t in d.tensors if t.name != "zero.weight")
    rc, out, _ = run(capsys, "diff", cut, cut)  # unreadable in both: not compared, the rest is identical
    assert rc == 0 and "1 not compared" in out
