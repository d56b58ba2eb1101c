"""The one GGUF encoder (core/gguf/writer.py) against gguf-py's GGUFWriter and GGUFReader: every value type,
nested arrays, tensor infos, alignment variants, the streamed data section and its checks."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from quantscope.core.base.gguf_constants import ValueType as T
from quantscope.core.gguf import GGUFFile
from quantscope.core.gguf.writer import (
    DataSection,
    GGUFHeader,
    GGUFWriteError,
    TypedArray,
    encode_entry,
    encode_value,
    ggml_dims,
    write_gguf,
)

V = gguf.GGUFValueType

#: (key, value, our type, gguf-py's type): every scalar type, and an array of each
SCALARS = [
    ("t.u8", 200, T.UINT8, V.UINT8), ("t.i8", -100, T.INT8, V.INT8), ("t.u16", 65000, T.UINT16, V.UINT16),
    ("t.i16", -32000, T.INT16, V.INT16), ("t.u32", 4_000_000_000, T.UINT32, V.UINT32),
    ("t.i32", -2_000_000_000, T.INT32, V.INT32), ("t.f32", 0.25, T.FLOAT32, V.FLOAT32),
    ("t.bool", True, T.BOOL, V.BOOL),
    ("t.str", "héllo ✓", T.STRING, V.STRING), ("t.u64", (1 << 64) - 1, T.UINT64, V.UINT64),
    ("t.i64", -(1 << 63), T.INT64, V.INT64), ("t.f64", -1.5e300, T.FLOAT64, V.FLOAT64),
]
ARRAYS = [
    ("a.u8", [0, 1, 255], T.UINT8, V.UINT8), ("a.i8", [-128, 0, 127], T.INT8, V.INT8),
    ("a.u16", [1, 65535], T.UINT16, V.UINT16), ("a.i16", [-32768, 5], T.INT16, V.INT16),
    ("a.u32", [7, 4_294_967_295], T.UINT32, V.UINT32), ("a.i32", [-1, 2, -3], T.INT32, V.INT32),
    ("a.f32", [0.5, -2.0, 3.25], T.FLOAT32, V.FLOAT32), ("a.bool", [True, False, True], T.BOOL, V.BOOL),
    ("a.str", ["a", "", "ünï"], T.STRING, V.STRING), ("a.u64", [0, (1 << 64) - 1], T.UINT64, V.UINT64),
    ("a.i64", [-(1 << 63), 9], T.INT64, V.INT64), ("a.f64", [1e-300, 2.5], T.FLOAT64, V.FLOAT64),
]
NESTED = [[1, 2, 3], [4], [5, 6]]


def _tensors() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    return [("w.f32", rng.standard_normal((3, 5)).astype(np.float32)),  # 60 bytes: padding follows
            ("w.f16", rng.standard_normal((2, 2, 3)).astype(np.float16)),
            ("w.i8", np.arange(7, dtype=np.int8)),
            ("w.one", np.ones((1, 4), np.float32))]  # a leading 1 in numpy order: a trailing ggml dimension of 1


def _gguf_py(path: Path, alignment: int | None, tensors: bool = True, data: bool = True) -> bytes:
    w = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, val, _, vt in SCALARS:
        w.add_key_value(key, val, vt)
    for key, val, _, vt in ARRAYS:
        w.add_key_value(key, val, V.ARRAY, sub_type=vt)
    w.add_key_value("a.nested", NESTED, V.ARRAY)
    if tensors:
        for name, arr in _tensors():
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    if data:
        w.write_tensors_to_file()
    else:
        w.write_ti_data_to_file()
    w.close()
    return path.read_bytes()


def _ours(path: Path, alignment: int | None, tensors: bool = True, pad: bool = True) -> bytes:
    h = GGUFHeader()
    h.add_string("general.architecture", "llama")
    if alignment is not None:
        h.add_u32("general.alignment", alignment)
    for key, val, vt, _ in SCALARS:
        h.add(key, vt, val)
    for key, val, vt, _ in ARRAYS:
        h.add(key, T.ARRAY, val, vt)
    h.add("a.nested", T.ARRAY, [TypedArray(T.INT32, v) for v in NESTED], T.ARRAY)
    data = []
    if tensors:
        types = {np.float32: gguf.GGMLQuantizationType.F32, np.float16: gguf.GGMLQuantizationType.F16,
                 np.int8: gguf.GGMLQuantizationType.I8}
        for name, arr in _tensors():
            h.add_tensor(name, arr.shape[::-1], int(types[arr.dtype.type]), arr.nbytes)
            data.append([arr.tobytes()[:5], memoryview(arr.tobytes()[5:])])  # two chunks each
    return write_gguf(path, h, data, pad_without_tensors=pad).read_bytes()


@pytest.mark.parametrize("alignment", [None, 1, 8, 64, 256])
def test_bytes_match_gguf_py(tmp_path: Path, alignment: int | None) -> None:
    theirs = _gguf_py(tmp_path / "theirs.gguf", alignment)
    ours = _ours(tmp_path / "ours.gguf", alignment)
    assert ours == theirs
    a = alignment or 32
    with GGUFFile(tmp_path / "ours.gguf") as f:
        assert f.alignment == a
        assert all(t.data_offset % a == 0 for t in f.tensors)
        assert f.file_size % a == 0  # the last tensor is padded too


@pytest.mark.parametrize("data", [True, False])
def test_no_tensors_matches_gguf_py(tmp_path: Path, data: bool) -> None:
    """Without tensors gguf-py pads the header only when it writes the (empty) data section."""
    theirs = _gguf_py(tmp_path / "t.gguf", None, tensors=False, data=data)
    assert _ours(tmp_path / "o.gguf", None, tensors=False, pad=data) == theirs
    assert (len(theirs) % 32 == 0) == data


def test_round_trip_every_value_type(tmp_path: Path) -> None:
    _ours(tmp_path / "o.gguf", 64)
    r = gguf.GGUFReader(tmp_path / "o.gguf")
    with GGUFFile(tmp_path / "o.gguf") as f:
        for key, val, vt, _ in SCALARS:
            assert f.metadata[key].type == vt
            got = f.get(key)
            if vt == T.FLOAT32:
                assert got == pytest.approx(val)
            else:
                assert got == val, key
            assert r.fields[key].types == [V(int(vt))]
        for key, val, vt, _ in ARRAYS:
            assert (f.metadata[key].type, f.metadata[key].elem_type) == (T.ARRAY, vt)
            assert list(f.get(key)) == pytest.approx(val) if vt in (T.FLOAT32, T.FLOAT64) else list(f.get(key)) == val
            assert r.fields[key].types == [V.ARRAY, V(int(vt))]
        assert [list(x) for x in f.get("a.nested")] == NESTED
        assert r.fields["a.nested"].types[:2] == [V.ARRAY, V.ARRAY]
        for (name, arr), t in zip(_tensors(), f.tensors, strict=True):
            assert t.name == name
            assert bytes(f.tensor_bytes(t)) == arr.tobytes()
    for (name, arr), t in zip(_tensors(), r.tensors, strict=True):
        assert t.name == name and np.array_equal(np.asarray(t.data).reshape(arr.shape), arr)


def test_tensor_dims_as_given_and_as_ggml(tmp_path: Path) -> None:
    assert ggml_dims((4, 1, 1)) == (4,)
    assert ggml_dims((4, 1, 3, 1)) == (4, 1, 3)
    assert ggml_dims((1, 1)) == (1,)
    assert ggml_dims(()) == (1,)
    h = GGUFHeader()
    h.add_tensor("a", (4, 1, 1), 0, 16)
    h.add_tensor("b", ggml_dims((4, 1, 1)), 0, 16)
    path = write_gguf(tmp_path / "d.gguf", h, [[bytes(16)], [bytes(16)]])
    with GGUFFile(path) as f:
        assert [t.ne for t in f.tensors] == [(4, 1, 1), (4,)]
        assert [t.data_offset - f.tensors[0].data_offset for t in f.tensors] == [0, 32]


@pytest.mark.parametrize(("vtype", "value"), [
    (T.UINT8, 256), (T.INT8, -129), (T.UINT16, -1), (T.INT16, 1 << 15), (T.UINT32, 1 << 32), (T.INT32, -(1 << 31) - 1),
    (T.UINT64, -1), (T.INT64, 1 << 63), (T.BOOL, 2),
])
def test_out_of_range_values_refused(vtype: T, value: int) -> None:
    with pytest.raises(GGUFWriteError):
        encode_value(vtype, value)
    with pytest.raises(GGUFWriteError):
        encode_value(T.ARRAY, [0, value], vtype)


def test_bad_arrays_and_alignment_refused() -> None:
    with pytest.raises(GGUFWriteError, match="element type"):
        encode_value(T.ARRAY, [1])
    with pytest.raises(GGUFWriteError, match="TypedArray"):
        encode_value(T.ARRAY, [[1, 2]], T.ARRAY)
    deep: object = TypedArray(T.INT32, [1])
    for _ in range(9):
        deep = TypedArray(T.ARRAY, [deep])
    with pytest.raises(GGUFWriteError, match="nested"):
        encode_value(T.ARRAY, [deep], T.ARRAY)
    for a in (0, 3, 48, -32):
        with pytest.raises(GGUFWriteError, match="power of two"):
            GGUFHeader(a)
        with pytest.raises(GGUFWriteError, match="power of two"):
            GGUFHeader().add_u32("general.alignment", a)
    with pytest.raises(GGUFWriteError, match="UINT32"):
        GGUFHeader().add("general.alignment", T.UINT64, 64)
    h = GGUFHeader()
    h.add_tensor("t", (4,), 0, 16)
    with pytest.raises(GGUFWriteError, match="before the tensors"):
        h.add_u32("general.alignment", 64)
    with pytest.raises(GGUFWriteError, match="dimension"):
        h.add_tensor("u", (1 << 63,), 0, 16)
    with pytest.raises(GGUFWriteError, match="dimension"):
        h.add_tensor("u", (-1,), 0, 16)


def test_entry_layout() -> None:
    assert encode_entry("k", T.UINT16, 0x1234) == (b"\x01" + bytes(7) + b"k" + (2).to_bytes(4, "little")
                                                    + b"\x34\x12")
    assert encode_entry("s", T.ARRAY, ["ab"], T.STRING) == (
        (1).to_bytes(8, "little") + b"s" + (9).to_bytes(4, "little") + (8).to_bytes(4, "little")
        + (1).to_bytes(8, "little") + (2).to_bytes(8, "little") + b"ab")


def test_data_section_checks_sizes() -> None:
    out = bytearray()
    d = DataSection(out.extend, 32, [5, 40])
    d.write(b"abc")
    with pytest.raises(GGUFWriteError, match="expected 5"):
        d.end_tensor()
    d.write(b"de")
    assert d.end_tensor() == 27
    with pytest.raises(GGUFWriteError, match="its size is 40"):
        d.write(bytes(41))
    with pytest.raises(GGUFWriteError, match="1 of 2 tensors"):
        d.finish()
    d2 = DataSection(out.extend, 32, [])
    with pytest.raises(GGUFWriteError, match="more tensors"):
        d2.write(b"x")


def test_write_is_streamed_and_leaves_nothing_on_failure(tmp_path: Path) -> None:
    h = GGUFHeader()
    h.add_tensor("a", (8,), 0, 32)
    h.add_tensor("b", (8,), 0, 32)
    seen: list[int] = []

    def chunks(i: int):
        seen.append(i)
        yield bytes(32)

    def tensors():
        for i in range(2):
            # the chunks of tensor i are asked for only once tensor i-1 was written
            assert seen == list(range(i))
            yield chunks(i)

    out = write_gguf(tmp_path / "s.gguf", h, tensors())
    assert out.stat().st_size == len(h.encode()) + 64
    bad = tmp_path / "bad.gguf"
    with pytest.raises(GGUFWriteError):
        write_gguf(bad, h, [[bytes(32)]])  # one tensor missing
    assert sorted(os.listdir(tmp_path)) == ["s.gguf"]


def test_duplicates_and_bad_tensor_infos_refused() -> None:
    h = GGUFHeader()
    h.add_u32("a.key", 1)
    with pytest.raises(GGUFWriteError, match="given twice"):
        h.add_string("a.key", "x")
    with pytest.raises(GGUFWriteError, match="given twice"):
        h.add_raw(encode_entry("a.key", T.UINT8, 3))  # copied entries count too
    h.add_raw(encode_entry("b.key", T.UINT8, 3))
    with pytest.raises(GGUFWriteError, match="given twice"):
        h.add("b.key", T.UINT8, 4)
    for raw in (b"", bytes(8), (5).to_bytes(8, "little") + b"abc"):
        with pytest.raises(GGUFWriteError, match="must start with its key"):
            h.add_raw(raw)
    assert len(h.entries) == 2
    h.add_tensor("t", (4,), 0, 16)
    with pytest.raises(GGUFWriteError, match="given twice"):
        h.add_tensor("t", (4,), 0, 16)
    with pytest.raises(GGUFWriteError, match="a name"):
        h.add_tensor("", (4,), 0, 16)
    with pytest.raises(GGUFWriteError, match="at most 4"):
        h.add_tensor("u", (1, 1, 1, 1, 1), 0, 4)
    assert len(h.infos) == 1 and h.data_size == 32
