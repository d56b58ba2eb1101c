"""Synthetic GGUF files written by gguf-py: every value type, string arrays, alignment, v2, big-endian."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest

from quantscope.core.gguf import GGUFError, GGUFFile, StringArray, ValueType

SCALARS = [
    ("t.u8", gguf.GGUFValueType.UINT8, 200),
    ("t.i8", gguf.GGUFValueType.INT8, -100),
    ("t.u16", gguf.GGUFValueType.UINT16, 65000),
    ("t.i16", gguf.GGUFValueType.INT16, -32000),
    ("t.u32", gguf.GGUFValueType.UINT32, 4_000_000_000),
    ("t.i32", gguf.GGUFValueType.INT32, -2_000_000_000),
    ("t.f32", gguf.GGUFValueType.FLOAT32, 0.1),
    ("t.bool", gguf.GGUFValueType.BOOL, True),
    ("t.str", gguf.GGUFValueType.STRING, "héllo ✓ 世界"),
    ("t.u64", gguf.GGUFValueType.UINT64, 2**63 + 5),
    ("t.i64", gguf.GGUFValueType.INT64, -(2**62)),
    ("t.f64", gguf.GGUFValueType.FLOAT64, 1 / 3),
]
ARRAYS = [
    ("a.u8", gguf.GGUFValueType.UINT8, [0, 1, 255]),
    ("a.i8", gguf.GGUFValueType.INT8, [-128, 0, 127]),
    ("a.u16", gguf.GGUFValueType.UINT16, [1, 65535]),
    ("a.i16", gguf.GGUFValueType.INT16, [-5, 5]),
    ("a.u32", gguf.GGUFValueType.UINT32, list(range(1000))),
    ("a.i32", gguf.GGUFValueType.INT32, [-1, 2, -3]),
    ("a.f32", gguf.GGUFValueType.FLOAT32, [0.5, -1.25, 3.0e8]),
    ("a.bool", gguf.GGUFValueType.BOOL, [True, False, True]),
    ("a.str", gguf.GGUFValueType.STRING, ["", "a", "Ġthe", "<|im_start|>", "✓" * 50, "x" * 3000]),
    ("a.u64", gguf.GGUFValueType.UINT64, [2**64 - 1, 0]),
    ("a.i64", gguf.GGUFValueType.INT64, [-(2**63), 2**63 - 1]),
    ("a.f64", gguf.GGUFValueType.FLOAT64, [1e300, -1e-300]),
]


def write_all_types(path, alignment=None, endianess=gguf.GGUFEndian.LITTLE):
    w = gguf.GGUFWriter(str(path), "llama", endianess=endianess)
    if alignment:
        w.add_custom_alignment(alignment)
    for key, vt, v in SCALARS:
        w.add_key_value(key, v, vt)
    for key, vt, v in ARRAYS:
        w.add_key_value(key, v, gguf.GGUFValueType.ARRAY, sub_type=vt)
    rng = np.random.default_rng(7)
    w.add_tensor("f32", rng.standard_normal((3, 8)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((5,)).astype(np.float16))
    q = rng.integers(0, 256, size=(2, 34 * 2), dtype=np.uint8)
    q[:, 0:2] = q[:, 34:36] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    w.add_tensor("q8", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("i32", np.arange(7, dtype=np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_every_value_type_matches_gguf_py(tmp_path):
    path = write_all_types(tmp_path / "all.gguf")
    ref = gguf.GGUFReader(path)
    with GGUFFile(path) as f:
        assert list(f.metadata) == [k for k in ref.fields if not k.startswith("GGUF.")]
        for key, field in ref.fields.items():
            if key.startswith("GGUF."):
                continue
            kv = f.metadata[key]
            assert int(kv.type) == int(field.types[0])
            exp = field.contents()
            if kv.type == ValueType.ARRAY:
                assert int(kv.elem_type) == int(field.types[1])
                got = kv.value.to_list() if isinstance(kv.value, StringArray) else kv.value.tolist()
                if kv.elem_type == ValueType.FLOAT32:
                    exp = [float(np.float32(x)) for x in exp]
                assert got == exp, key
            elif kv.type == ValueType.FLOAT32:
                assert np.float32(kv.value) == np.float32(exp)
            else:
                assert kv.value == exp, key
        for ours, theirs in zip(f.tensors, ref.tensors, strict=True):
            assert (ours.name, ours.ne, ours.type_id, ours.data_offset, ours.n_bytes) == (
                theirs.name, tuple(int(x) for x in theirs.shape), int(theirs.tensor_type), theirs.data_offset,
                theirs.n_bytes)
        assert np.array_equal(f.tensor_array("f32"), ref.tensors[0].data)
        assert f.tensor_array("f32").shape == (3, 8)
        assert np.array_equal(f.tensor_array("f16"), ref.tensors[1].data)
        assert np.array_equal(f.tensor_rows("q8"), ref.tensors[2].data)
        assert f.tensor_array("i32").tolist() == list(range(7))
        with pytest.raises(TypeError, match="block format"):
            f.tensor_array("q8")


def test_typed_values_and_labels(tmp_path):
    with GGUFFile(write_all_types(tmp_path / "all.gguf")) as f:
        assert f.get("t.bool") is True
        assert f.get("t.u64") == 2**63 + 5
        assert f.metadata["a.str"].type_label == "ARRAY[STRING]"
        assert f.metadata["t.u8"].type_label == "UINT8"
        assert f.get("a.bool").dtype == np.bool_
        assert f.get("a.f64").dtype == np.dtype("<f8")
        assert f.metadata["a.u32"].count == 1000
        assert f.metadata["t.u32"].count is None


def test_string_array_lazy_sequence(tmp_path):
    with GGUFFile(write_all_types(tmp_path / "all.gguf")) as f:
        s = f.get("a.str")
        expected = ["", "a", "Ġthe", "<|im_start|>", "✓" * 50, "x" * 3000]
        assert len(s) == len(expected)
        assert s[-1] == expected[-1] and s[0] == ""
        assert s[1:4] == expected[1:4]
        assert s[::-2] == expected[::-2]
        assert list(s) == expected
        assert s.lengths().tolist() == [len(x.encode()) for x in expected]
        assert s.raw(2) == "Ġthe".encode()
        assert s.nbytes == sum(8 + len(x.encode()) for x in expected)
        assert s.offset_of(1) == s.start + 8
        with pytest.raises(IndexError):
            s[6]
        with pytest.raises(IndexError):
            s[-7]


def test_custom_alignment(tmp_path):
    with GGUFFile(write_all_types(tmp_path / "al.gguf", alignment=64)) as f:
        assert f.alignment == 64
        assert f.data_start % 64 == 0
        assert all(t.offset % 64 == 0 for t in f.tensors)
        assert f.tensor_array("i32").tolist() == list(range(7))


def test_big_endian_is_refused_by_name(tmp_path):
    path = write_all_types(tmp_path / "be.gguf", endianess=gguf.GGUFEndian.BIG)
    with pytest.raises(GGUFError, match="big-endian") as ei:
        GGUFFile(path)
    assert ei.value.offset == 4


def test_version_2_reads_like_3(tmp_path):
    data = bytearray(write_all_types(tmp_path / "v3.gguf").read_bytes())
    struct.pack_into("<I", data, 4, 2)
    with GGUFFile(bytes(data)) as f:
        assert f.version == 2
        assert f.get("t.str") == "héllo ✓ 世界"


def test_version_1_is_refused_by_name(tmp_path):
    data = bytearray(write_all_types(tmp_path / "v3.gguf").read_bytes())
    struct.pack_into("<I", data, 4, 1)
    with pytest.raises(GGUFError, match="v1") as ei:
        GGUFFile(bytes(data))
    assert ei.value.offset == 4


def test_file_and_buffer_give_the_same(tmp_path):
    path = write_all_types(tmp_path / "x.gguf")
    with GGUFFile(path) as a:
        b = GGUFFile(path.read_bytes())
        assert [(t.name, t.ne, t.data_offset) for t in a.tensors] == [(t.name, t.ne, t.data_offset) for t in b.tensors]
        assert list(a.metadata) == list(b.metadata)


def test_close_with_live_views_is_safe(tmp_path):
    path = write_all_types(tmp_path / "x.gguf")
    f = GGUFFile(path)
    view = f.tensor_array("f32")
    f.close()  # the mapping stays alive for the view
    assert view.shape == (3, 8)
    assert np.isfinite(view).all()


def test_missing_file_is_a_gguf_error(tmp_path):
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFFile(tmp_path / "nope.gguf")
