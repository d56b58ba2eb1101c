"""Corrupt, truncated and hostile GGUF input.

Every malformed file must raise :class:`GGUFError` (never ``IndexError``, ``struct.error``, numpy errors...) and
point at the byte where the problem is. Fixtures are either written with gguf-py's ``GGUFWriter`` (realistic) or
hand-assembled with :func:`build` (exact control over every field), then patched.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantscope.core.catalog import model_path
from quantscope.core.gguf import GGUFError, GGUFFile, StringArray, ValueType

VT = ValueType
F32, F16, Q8_0 = 0, 1, 8

_SCALAR_FMT = {
    VT.UINT8: "<B",
    VT.INT8: "<b",
    VT.UINT16: "<H",
    VT.INT16: "<h",
    VT.UINT32: "<I",
    VT.INT32: "<i",
    VT.FLOAT32: "<f",
    VT.BOOL: "<B",
    VT.UINT64: "<Q",
    VT.INT64: "<q",
    VT.FLOAT64: "<d",
}


# ---------------------------------------------------------------------------------------------- byte builder
def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return u64(len(b)) + b


class Raw(bytes):
    """A value given as its exact encoded bytes."""


def encode_value(vtype: int, v: Any) -> bytes:
    if isinstance(v, Raw):
        return bytes(v)
    if vtype == VT.STRING:
        return gstr(v)
    if vtype == VT.ARRAY:
        etype, items = v
        return u32(etype) + u64(len(items)) + b"".join(encode_value(etype, x) for x in items)
    return struct.pack(_SCALAR_FMT[VT(vtype)], v)


def encode_kv(key: str | bytes, vtype: int, v: Any) -> bytes:
    return gstr(key) + u32(vtype) + encode_value(vtype, v)


def encode_ti(name: str, ne: list[int], type_id: int, offset: int) -> bytes:
    return gstr(name) + u32(len(ne)) + b"".join(u64(d) for d in ne) + u32(type_id) + u64(offset)


@dataclass(frozen=True)
class KVPos:
    start: int  # key length field
    key: int  # key bytes
    type: int  # value type field
    value: int  # value (for arrays: the element type field; count at +4, elements at +12)


@dataclass(frozen=True)
class TIPos:
    start: int  # name length field
    name: int
    n_dims: int
    dims: tuple[int, ...]
    type: int
    offset: int


@dataclass
class Layout:
    buf: bytearray
    kv: dict[str | bytes, KVPos]
    ti: dict[str, TIPos]
    header_end: int
    data_start: int

    def put(self, pos: int, raw: bytes) -> Layout:
        self.buf[pos : pos + len(raw)] = raw
        return self

    @property
    def data(self) -> bytes:
        return bytes(self.buf)


STD_KVS: list[tuple[str | bytes, int, Any]] = [
    ("general.architecture", VT.STRING, "llama"),
    ("test.u32", VT.UINT32, 7),
    ("tokenizer.ggml.tokens", VT.ARRAY, (VT.STRING, ["a", "bc", "déf"])),
    ("test.counts", VT.ARRAY, (VT.UINT32, [1, 2, 3])),
]
# name, ne, type, offset: a=[0,32) b=[32,100) c=[128,160)
STD_TENSORS: list[tuple[str, list[int], int, int]] = [
    ("a", [8], F32, 0),
    ("b", [32, 2], Q8_0, 32),
    ("c", [4, 2], F32, 128),
]
STD_DATA_LEN = 160


def std_tensors(**override: tuple[str, list[int], int, int]) -> list[tuple[str, list[int], int, int]]:
    return [override.get(t[0], t) for t in STD_TENSORS]


def build(
    kvs: list[tuple[str | bytes, int, Any]] | None = None,
    tensors: list[tuple[str, list[int], int, int]] | None = None,
    data: bytes | int = STD_DATA_LEN,
    *,
    alignment: int = 32,
    version: int = 3,
    n_kv: int | None = None,
    n_tensors: int | None = None,
) -> Layout:
    """Assemble a GGUF file: header, KVs, tensor infos, zero padding to ``alignment``, then ``data``."""
    kvs = STD_KVS if kvs is None else kvs
    tensors = STD_TENSORS if tensors is None else tensors
    buf = bytearray(b"GGUF" + u32(version))
    buf += u64(len(tensors) if n_tensors is None else n_tensors)
    buf += u64(len(kvs) if n_kv is None else n_kv)
    kv_pos: dict[str | bytes, KVPos] = {}
    for key, vtype, v in kvs:
        at = len(buf)
        klen = len(key.encode("utf-8") if isinstance(key, str) else key)
        kv_pos[key] = KVPos(at, at + 8, at + 8 + klen, at + 12 + klen)
        buf += encode_kv(key, vtype, v)
    ti_pos: dict[str, TIPos] = {}
    for name, ne, type_id, offset in tensors:
        at = len(buf)
        nd = at + 8 + len(name.encode("utf-8"))
        dims = tuple(nd + 4 + 8 * i for i in range(len(ne)))
        tpos = nd + 4 + 8 * len(ne)
        ti_pos.setdefault(name, TIPos(at, at + 8, nd, dims, tpos, tpos + 4))
        buf += encode_ti(name, ne, type_id, offset)
    header_end = len(buf)
    data_start = -(-header_end // alignment) * alignment
    buf += bytes(data_start - header_end)
    buf += bytes(i * 7 % 251 for i in range(data)) if isinstance(data, int) else data
    return Layout(buf, kv_pos, ti_pos, header_end, data_start)


def string_elem_pos(first: int, items: list[bytes | str], i: int) -> int:
    """Offset of element ``i``'s length field in a string array whose elements start at ``first``."""
    return first + sum(8 + len(s.encode("utf-8") if isinstance(s, str) else s) for s in items[:i])


def open_error(buf: bytes | bytearray, match: str, offset: int | None, *, strict: bool = True) -> GGUFError:
    """Open ``buf``; it must raise GGUFError matching ``match`` at byte ``offset``."""
    with pytest.raises(GGUFError, match=match) as ei:
        GGUFFile(bytes(buf), strict=strict)
    err = ei.value
    assert err.offset == offset, f"error at {err.offset}, expected {offset}: {err}"
    assert err.message and str(err)
    return err


# ---------------------------------------------------------------------------------------------- fixtures
@dataclass(frozen=True)
class WriterFile:
    data: bytes
    path: Path


def _write_with_gguf_py(path: Path, *, alignment: int | None = None, big_endian: bool = False) -> bytes:
    rng = np.random.default_rng(1234)
    endian = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    w = gguf.GGUFWriter(path, "llama", endianess=endian)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_name("corrupt-test")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("test.flag", True)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "hé", "日本", "", "🙂", "</s>"])
    w.add_key_value("test.u32arr", [1, 2, 3, 0xFFFFFFFF], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT32)
    w.add_array("tokenizer.ggml.scores", [0.0, -1.5, 2.25, 3.0, 4.0, 5.0])
    w.add_uint32("general.quantization_version", 2)
    # Q8_0 [32, 3] given as its bytes (3 rows of one 34-byte block): 102 bytes, padded to 128
    w.add_tensor("tok.weight", rng.integers(0, 256, (3, 34), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("norm.weight", rng.standard_normal(5).astype(np.float32))  # 20 bytes, padded to 32
    w.add_tensor("proj.weight", rng.standard_normal((4, 8)).astype(np.float16))  # 64 bytes, ends the file
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def writer_file(tmp_path_factory: pytest.TempPathFactory) -> WriterFile:
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    return WriterFile(_write_with_gguf_py(path), path)


def _tensor_offset_field(t: Any) -> int:
    """File offset of a tensor info's ``offset`` field."""
    return t.info_offset + 8 + len(t.name.encode("utf-8")) + 4 + 8 * len(t.ne) + 4


# ---------------------------------------------------------------------------------------------- sanity
def test_builder_std_layout_is_valid_and_agrees_with_gguf_py(tmp_path: Path) -> None:
    lay = build()
    path = tmp_path / "std.gguf"
    path.write_bytes(lay.data)
    for src in (lay.data, bytearray(lay.data), memoryview(lay.data), path):
        with GGUFFile(src) as f:
            assert f.problems == []
            assert f.architecture == "llama"
            assert f.get("test.u32") == 7
            assert list(f.get("tokenizer.ggml.tokens")) == ["a", "bc", "déf"]
            assert f.get("test.counts").tolist() == [1, 2, 3]
            assert f.header_end == lay.header_end and f.data_start == lay.data_start
            assert [(t.name, t.offset, t.n_bytes) for t in f.tensors] == [("a", 0, 32), ("b", 32, 68), ("c", 128, 32)]
            assert bytes(f.tensor_bytes("c")) == bytes(lay.buf[lay.data_start + 128 : lay.data_start + 160])
            for name, pos in lay.ti.items():
                assert _tensor_offset_field(f.tensor(name)) == pos.offset
    oracle = gguf.GGUFReader(path)
    assert [t.name for t in oracle.tensors] == ["a", "b", "c"]
    assert oracle.tensors[2].data_offset == lay.data_start + 128
    assert oracle.fields["test.u32"].contents() == 7


def test_writer_fixture_opens(writer_file: WriterFile) -> None:
    with GGUFFile(writer_file.data) as f:
        assert f.problems == []
        assert list(f.get("tokenizer.ggml.tokens")) == ["<s>", "hé", "日本", "", "🙂", "</s>"]
        assert f.get("test.u32arr").tolist() == [1, 2, 3, 0xFFFFFFFF]
        assert f.get("test.flag") is True
        assert [t.name for t in f.tensors] == ["tok.weight", "norm.weight", "proj.weight"]
        last = f.tensors[-1]
        assert last.data_offset + last.n_bytes == len(writer_file.data)


# ---------------------------------------------------------------------------------------------- 1. truncation
def _check_truncations(full: bytes) -> int:
    """Truncate ``full`` at every byte up to the data start and at points inside each tensor's data."""
    with GGUFFile(full) as f:
        items = [(kv.offset, kv.end) for kv in f.metadata.values()]
        starts = [t.info_offset for t in f.tensors] + [f.header_end]
        items += list(itertools.pairwise(starts))
        header_end, data_start = f.header_end, f.data_start
        tensors = [(t.name, t.data_offset, t.n_bytes, _tensor_offset_field(t)) for t in f.tensors]
    checked = 0
    for cut in range(data_start + 1):
        with pytest.raises(GGUFError) as ei:
            GGUFFile(full[:cut])
        err = ei.value
        assert err.offset is not None, f"cut {cut}: {err}"
        if cut < 24:
            assert err.offset == 0 and f"file is only {cut} bytes" in str(err)
        elif cut < header_end:
            start = next(a for a, b in items if a <= cut < b)
            assert err.offset in (8, 16) or start <= err.offset <= cut, f"cut {cut}: {err}"
        elif cut < data_start:
            assert err.offset == header_end and "data section would start" in str(err), f"cut {cut}: {err}"
        else:  # file ends exactly at the data start: the first tensor lies outside
            assert err.offset == tensors[0][3] and "lies outside" in str(err), f"cut {cut}: {err}"
        checked += 1
    ends = sorted({p for _, o, n, _ in tensors for p in (o + 1, o + n // 2, o + n - 1)})
    for cut in ends:
        name, _, _, field = next(t for t in tensors if t[1] + t[2] > cut)
        open_error(full[:cut], rf"tensor '{name}': data \[\d+, \d+\) lies outside the {cut}-byte file", field)
        checked += 1
    # a file whose last tensor ends exactly at EOF (no trailing padding) is fine
    end = max(o + n for _, o, n, _ in tensors)
    with GGUFFile(full[:end]) as f:
        assert len(f.tensors) == len(tensors)
    return checked


def test_truncation_everywhere_writer_file(writer_file: WriterFile) -> None:
    assert _check_truncations(writer_file.data) > 400


def test_truncation_everywhere_built_file() -> None:
    lay = build()
    assert lay.data_start % 32 == 0 and lay.header_end != lay.data_start
    assert _check_truncations(lay.data) > 200


@pytest.mark.parametrize("cut", [0, 3, 23, 24, 40, -100, -1])
def test_truncated_file_on_disk(writer_file: WriterFile, tmp_path: Path, cut: int) -> None:
    data = writer_file.data[:cut]
    p = tmp_path / "cut.gguf"
    p.write_bytes(data)
    with pytest.raises(GGUFError) as ei:
        GGUFFile(p)
    assert ei.value.offset is not None and 0 <= ei.value.offset <= len(data)
    if len(data) < 24:
        assert f"file is only {len(data)} bytes" in str(ei.value)


def test_missing_file_is_gguf_error(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFFile(tmp_path / "nope.gguf")


# ---------------------------------------------------------------------------------------------- 2. magic, version
def test_bad_magic() -> None:
    lay = build().put(0, b"GGUG")
    err = open_error(lay.buf, "bad magic", 0)
    assert err.expected == "b'GGUF'"
    open_error(build().put(0, b"\0\0\0\0").buf, "bad magic", 0)


@pytest.mark.parametrize(
    ("version", "match"),
    [(0, "unsupported GGUF version 0"), (1, "v1"), (4, "unsupported GGUF version 4"), (0xFFFFFFFF, "unsupported")],
)
def test_bad_version(version: int, match: str) -> None:
    open_error(build(version=version).buf, match, 4)


def test_version_2_is_read() -> None:
    with GGUFFile(build(version=2).data) as f:
        assert f.version == 2 and len(f.tensors) == 3


def test_big_endian_header_bytes() -> None:
    lay = build().put(4, b"\x00\x00\x00\x03")
    err = open_error(lay.buf, "big-endian", 4)
    assert "0x03000000" in str(err)
    open_error(build().put(4, b"\x00\x00\x00\x02").buf, "big-endian", 4)


def test_big_endian_file_written_by_gguf_py(tmp_path: Path) -> None:
    data = _write_with_gguf_py(tmp_path / "be.gguf", big_endian=True)
    assert data[4:8] == b"\x00\x00\x00\x03"
    open_error(data, "big-endian", 4)
    with pytest.raises(GGUFError, match="big-endian"):
        GGUFFile(tmp_path / "be.gguf")


# ---------------------------------------------------------------------------------------------- 3. sizes and counts
@pytest.mark.parametrize("count", [2**63, 2**40, 2**64 - 1, 1000])
def test_huge_tensor_count(count: int) -> None:
    open_error(build(n_tensors=count).buf, f"tensor count {count} cannot fit", 8)


@pytest.mark.parametrize("count", [2**63, 2**40, 2**64 - 1, 1000])
def test_huge_kv_count(count: int) -> None:
    open_error(build(n_kv=count).buf, f"metadata count {count} cannot fit", 16)


def test_kv_count_one_too_many_is_caught_at_the_end() -> None:
    lay = build(n_kv=len(STD_KVS) + 1)
    # the tensor infos are then read as a KV: "a" is a 1-byte key, n_dims=1 read as value type UINT8...
    with pytest.raises(GGUFError) as ei:
        GGUFFile(lay.data)
    assert ei.value.offset is not None and ei.value.offset >= lay.ti["a"].start


@pytest.mark.parametrize("length", [2**40, 2**63, 2**64 - 1, 2**30 + 1])
def test_huge_key_length(length: int) -> None:
    lay = build()
    pos = lay.kv["test.u32"].start
    err = open_error(lay.put(pos, u64(length)).buf, f"metadata key length {length} is implausible", pos)
    assert err.expected == "at most 1073741824 bytes"


def test_key_length_past_eof() -> None:
    lay = build()
    pos = lay.kv["test.u32"].start
    open_error(lay.put(pos, u64(2**29)).buf, r"file ends after \d+ of the 536870912 bytes of metadata key", pos + 8)


@pytest.mark.parametrize("length", [2**40, 2**63, 2**64 - 1])
def test_huge_string_value_length(length: int) -> None:
    lay = build()
    pos = lay.kv["general.architecture"].value
    open_error(lay.put(pos, u64(length)).buf, f"string value of 'general.architecture' length {length}", pos)


def test_string_value_past_eof() -> None:
    lay = build()
    pos = lay.kv["general.architecture"].value
    open_error(lay.put(pos, u64(len(lay.buf))).buf, "file ends after", pos + 8)


@pytest.mark.parametrize("index", [0, 1, 2])
@pytest.mark.parametrize(
    ("length", "match"),
    [
        (2**40, "string length exceeds the 1 GiB cap"),
        (2**64 - 1, "string length exceeds the 1 GiB cap"),
        (2**30 + 1, "string length exceeds the 1 GiB cap"),
        (10_000, "string runs past the end of the file"),
    ],
)
def test_huge_string_array_element_length(index: int, length: int, match: str) -> None:
    lay = build()
    items = ["a", "bc", "déf"]
    pos = string_elem_pos(lay.kv["tokenizer.ggml.tokens"].value + 12, items, index)
    open_error(lay.put(pos, u64(length)).buf, rf"'tokenizer.ggml.tokens'\[{index}\]: {match}", pos)


@pytest.mark.parametrize("key", ["test.counts", "tokenizer.ggml.tokens"])
@pytest.mark.parametrize("count", [2**63, 2**40, 2**64 - 1, 2**30 + 1])
def test_huge_array_count(key: str, count: int) -> None:
    lay = build()
    pos = lay.kv[key].value + 4
    open_error(lay.put(pos, u64(count)).buf, f"array '{key}' claims {count} ", pos)


@pytest.mark.parametrize(("key", "elem"), [("test.counts", 4), ("tokenizer.ggml.tokens", 8)])
def test_array_count_exceeding_remaining_bytes(key: str, elem: int) -> None:
    lay = build()
    pos = lay.kv[key].value + 4
    remaining = len(lay.buf) - (pos + 8)
    err = open_error(lay.put(pos, u64(remaining // elem + 1)).buf, f"more than the {remaining} bytes left", pos)
    assert err.expected == f"at most {remaining // elem} elements"


def test_array_count_within_file_but_too_large_for_the_strings() -> None:
    # 4 strings claimed, 3 present: the 4th "string" is the next key's length field + bytes, after that the
    # parser runs out of well-formed data; whatever it reports must be a GGUFError
    lay = build()
    lay.put(lay.kv["tokenizer.ggml.tokens"].value + 4, u64(4))
    with pytest.raises(GGUFError):
        GGUFFile(lay.data)


# ---------------------------------------------------------------------------------------------- 4. value types, keys
@pytest.mark.parametrize("vtype", [13, 99, 2**31, 2**32 - 1])
def test_unknown_value_type(vtype: int) -> None:
    lay = build()
    pos = lay.kv["test.u32"].type
    err = open_error(lay.put(pos, u32(vtype)).buf, f"unknown value type {vtype} for 'test.u32'", pos)
    assert err.expected == "a value type 0..12"


@pytest.mark.parametrize("etype", [13, 99, 2**32 - 1])
def test_unknown_array_element_type(etype: int) -> None:
    lay = build()
    pos = lay.kv["test.counts"].value
    open_error(lay.put(pos, u32(etype)).buf, f"unknown value type {etype} for 'test.counts'", pos)


@pytest.mark.parametrize("v", [2, 255])
def test_bool_value_not_0_or_1(v: int) -> None:
    lay = build([*STD_KVS, ("test.flag", VT.BOOL, v)])
    err = open_error(lay.buf, f"BOOL value {v} for 'test.flag'", lay.kv["test.flag"].value)
    assert err.expected == "0 or 1"
    with GGUFFile(build([*STD_KVS, ("test.flag", VT.BOOL, 1)]).data) as f:
        assert f.get("test.flag") is True


def test_bool_array_element_not_0_or_1() -> None:
    lay = build([*STD_KVS, ("test.flags", VT.ARRAY, (VT.BOOL, [1, 0, 3, 1]))])
    first = lay.kv["test.flags"].value + 12
    open_error(lay.buf, "BOOL element 2 of 'test.flags' is 3", first + 2)
    with GGUFFile(build([*STD_KVS, ("test.flags", VT.ARRAY, (VT.BOOL, [1, 0, 1]))]).data) as f:
        v = f.get("test.flags")
        assert v.dtype == np.bool_ and v.tolist() == [True, False, True]


def test_duplicate_key() -> None:
    kvs = [*STD_KVS[:2], ("test.u32", VT.UINT32, 8), *STD_KVS[2:]]
    lay = build(kvs)
    # the builder's position map keeps the last occurrence: that is where the duplicate is
    open_error(lay.buf, "duplicate metadata key 'test.u32'", lay.kv["test.u32"].start)


def test_duplicate_key_with_another_type() -> None:
    lay = build([*STD_KVS, ("test.u32", VT.STRING, "x")])
    open_error(lay.buf, "duplicate metadata key 'test.u32'", lay.kv["test.u32"].start)


def test_empty_key() -> None:
    lay = build([*STD_KVS[:2], ("", VT.UINT32, 1), *STD_KVS[2:]])
    open_error(lay.buf, "empty metadata key", lay.kv[""].start)


_BAD_UTF8 = [
    b"\xff",
    b"\x80",
    b"\xc0\x80",  # overlong NUL
    b"\xc1\xbf",  # overlong
    b"\xe0\x80\x80",  # overlong 3-byte
    b"\xed\xa0\x80",  # UTF-16 surrogate
    b"\xf0\x80\x80\x80",  # overlong 4-byte
    b"\xf4\x90\x80\x80",  # > U+10FFFF
    b"\xf5\x80\x80\x80",
    b"\xe2\x82",  # truncated sequence at the end
    b"\xe2\x28\xa1",  # bad continuation
]


@pytest.mark.parametrize("prefix", ["", "ab", "abcdefghij"])  # also past the C validator's 8-byte ASCII fast path
@pytest.mark.parametrize("bad", _BAD_UTF8)
def test_invalid_utf8_in_key(prefix: str, bad: bytes) -> None:
    key = b"k" + prefix.encode() + bad
    lay = build([*STD_KVS[:2], (key, VT.UINT32, 1), *STD_KVS[2:]])
    open_error(lay.buf, "metadata key is not valid UTF-8", lay.kv[key].key + 1 + len(prefix))


@pytest.mark.parametrize("prefix", ["", "ab", "abcdefghij"])
@pytest.mark.parametrize("bad", _BAD_UTF8)
def test_invalid_utf8_in_string_value(prefix: str, bad: bytes) -> None:
    lay = build([*STD_KVS, ("test.s", VT.STRING, prefix.encode() + bad + b"tail")])
    open_error(lay.buf, "string value of 'test.s' is not valid UTF-8", lay.kv["test.s"].value + 8 + len(prefix))


@pytest.mark.parametrize("prefix", ["", "ab", "abcdefghij"])
@pytest.mark.parametrize("bad", _BAD_UTF8)
def test_invalid_utf8_in_string_array_element(prefix: str, bad: bytes) -> None:
    items: list[bytes | str] = ["ok", "日本", prefix.encode() + bad + b"z", "after"]
    lay = build([*STD_KVS, ("test.strs", VT.ARRAY, (VT.STRING, items))])
    first = lay.kv["test.strs"].value + 12
    pos = string_elem_pos(first, items, 2) + 8 + len(prefix)
    open_error(lay.buf, r"'test.strs'\[2\]: string is not valid UTF-8", pos)


def test_valid_multibyte_utf8_everywhere() -> None:
    text = "aé日🙂\U0010ffff\u07ff\ud7ff\ue000" * 3
    lay = build([*STD_KVS, (text, VT.STRING, text), ("test.strs", VT.ARRAY, (VT.STRING, [text, "", text[::-1]]))])
    with GGUFFile(lay.data) as f:
        assert f.get(text) == text
        assert list(f.get("test.strs")) == [text, "", text[::-1]]


# ---------------------------------------------------------------------------------------------- 5. alignment
@pytest.mark.parametrize(
    ("vtype", "value", "label"),
    [
        (VT.UINT64, 32, "UINT64"),
        (VT.STRING, "32", "STRING"),
        (VT.INT32, 32, "INT32"),
        (VT.UINT16, 32, "UINT16"),
        (VT.ARRAY, (VT.UINT32, [32]), r"ARRAY\[UINT32\]"),
    ],
)
def test_alignment_wrong_type(vtype: int, value: Any, label: str) -> None:
    lay = build([*STD_KVS, ("general.alignment", vtype, value)])
    err = open_error(lay.buf, f"general.alignment has type {label}", lay.kv["general.alignment"].type)
    assert err.expected == "type UINT32"


@pytest.mark.parametrize("value", [0, 24, 3, 33, 2**32 - 1])
def test_alignment_not_power_of_two(value: int) -> None:
    lay = build([*STD_KVS, ("general.alignment", VT.UINT32, value)])
    open_error(lay.buf, f"general.alignment is {value}", lay.kv["general.alignment"].value)


def test_custom_alignment_64_hand_built() -> None:
    tensors = [("a", [8], F32, 0), ("b", [32, 2], Q8_0, 64), ("c", [4, 2], F32, 192)]
    for filler in range(64):  # pick a header length where 32- and 64-alignment give different data starts
        kvs = [*STD_KVS, ("general.alignment", VT.UINT32, 64), ("test.filler", VT.STRING, "f" * filler)]
        lay = build(kvs, tensors, 224, alignment=64)
        if lay.data_start != -(-lay.header_end // 32) * 32:
            break
    assert lay.data_start % 64 == 0 and lay.data_start - lay.header_end > 32
    with GGUFFile(lay.data) as f:
        assert f.alignment == 64 and f.data_start == lay.data_start and f.problems == []
        c = f.tensor("c")
        assert c.data_offset == lay.data_start + 192
        assert bytes(f.tensor_bytes(c)) == bytes(lay.buf[lay.data_start + 192 : lay.data_start + 224])
    # offset 32 is 32- but not 64-aligned
    bad = build([*STD_KVS, ("general.alignment", VT.UINT32, 64)], std_tensors(), 224, alignment=64)
    open_error(bad.buf, "tensor 'b': data offset 32 is not a multiple of the alignment 64", bad.ti["b"].offset)


def test_custom_alignment_64_written_by_gguf_py(tmp_path: Path) -> None:
    data = _write_with_gguf_py(tmp_path / "a64.gguf", alignment=64)
    with GGUFFile(data) as f:
        assert f.alignment == 64 and f.data_start % 64 == 0 and f.problems == []
        assert all(t.offset % 64 == 0 for t in f.tensors)
        assert f.data_start == -(-f.header_end // 64) * 64
        oracle = gguf.GGUFReader(tmp_path / "a64.gguf")
        for t, o in zip(f.tensors, oracle.tensors, strict=True):
            assert t.data_offset == o.data_offset
            assert bytes(f.tensor_bytes(t)) == o.data.tobytes()


def test_alignment_one_allows_any_offset() -> None:
    tensors = [("a", [8], F32, 0), ("b", [3], F32, 33)]
    lay = build([*STD_KVS, ("general.alignment", VT.UINT32, 1)], tensors, 45, alignment=1)
    with GGUFFile(lay.data) as f:
        assert f.data_start == f.header_end and f.tensor("b").data_offset == lay.data_start + 33


# ---------------------------------------------------------------------------------------------- 6. tensor infos
@pytest.mark.parametrize("strict", [True, False])
def test_too_many_dims(strict: bool) -> None:
    lay = build(tensors=std_tensors(c=("c", [1, 1, 4, 2, 1], F32, 128)))
    open_error(lay.buf, "tensor 'c' has 5 dimensions", lay.ti["c"].n_dims, strict=strict)


@pytest.mark.parametrize("strict", [True, False])
def test_n_dims_huge(strict: bool) -> None:
    lay = build()
    pos = lay.ti["b"].n_dims
    open_error(lay.put(pos, u32(2**32 - 1)).buf, "tensor 'b' has 4294967295 dimensions", pos, strict=strict)


@pytest.mark.parametrize("strict", [True, False])
def test_duplicate_tensor_name(strict: bool) -> None:
    tensors = [*STD_TENSORS, ("b", [8], F32, 160)]
    lay = build(tensors=tensors, data=192)
    second_b = lay.ti["c"].start + len(encode_ti("c", [4, 2], F32, 128))
    open_error(lay.buf, "duplicate tensor name 'b'", second_b, strict=strict)


@pytest.mark.parametrize("strict", [True, False])
def test_empty_tensor_name(strict: bool) -> None:
    lay = build(tensors=[*STD_TENSORS, ("", [8], F32, 160)], data=192)
    open_error(lay.buf, "empty tensor name", lay.ti[""].start, strict=strict)


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize(("ne", "bad_dim"), [([2**63], 0), ([8, 2**64 - 1], 1), ([4, 1, 1, 2**63 + 5], 3)])
def test_dimension_at_least_2_63(strict: bool, ne: list[int], bad_dim: int) -> None:
    lay = build(tensors=std_tensors(c=("c", ne, F32, 128)))
    open_error(lay.buf, f"dimension {bad_dim} of 'c' is {ne[bad_dim]}", lay.ti["c"].dims[bad_dim], strict=strict)


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize(
    ("ne", "bad_dim"), [([2**32, 2**32], 1), ([2**62, 2], 1), ([2**31, 2**31, 2], 2), ([2, 2**61, 1, 2], 3)]
)
def test_element_count_overflow(strict: bool, ne: list[int], bad_dim: int) -> None:
    lay = build(tensors=std_tensors(c=("c", ne, F32, 128)))
    open_error(lay.buf, "element count of 'c' overflows 64 bits", lay.ti["c"].dims[bad_dim], strict=strict)


def test_large_but_valid_element_count_is_out_of_file() -> None:
    lay = build(tensors=std_tensors(c=("c", [2**31, 2**31], F32, 128)))  # 2^62 elements: legal, but not here
    open_error(lay.buf, "tensor 'c': data .* lies outside", lay.ti["c"].offset)


def test_zero_sized_tensor_is_fine() -> None:
    lay = build(tensors=[*STD_TENSORS, ("z", [0, 2**62], Q8_0, 160)])
    with GGUFFile(lay.data) as f:
        z = f.tensor("z")
        assert z.n_elements == 0 and z.n_bytes == 0 and z.problem is None
        assert f.tensor_bytes(z).size == 0


def _check_recoverable(lay: Layout, bad: str, match: str, offset: int) -> None:
    """Strict: raises at ``offset``. Non-strict: opens, ``bad`` has a problem, the other tensors read fine."""
    open_error(lay.buf, match, offset)
    with GGUFFile(lay.data, strict=False) as f:
        assert len(f.problems) == 1, f.problems
        (p,) = f.problems
        assert isinstance(p, GGUFError) and p.offset == offset
        assert f"tensor '{bad}'" in str(p)
        t = f.tensor(bad)
        assert t.problem is not None and t.problem in str(p)
        with pytest.raises(GGUFError, match=f"tensor '{bad}' cannot be read"):
            f.tensor_bytes(t)
        with pytest.raises(GGUFError):
            f.tensor_rows(bad)
        for other in f.tensors:
            if other.name != bad:
                assert other.problem is None
                raw = f.tensor_bytes(other)
                assert raw.size == other.n_bytes
                assert bytes(raw) == bytes(lay.buf[other.data_offset : other.data_offset + other.n_bytes])


def test_row_length_not_multiple_of_block() -> None:
    lay = build(tensors=std_tensors(b=("b", [33, 2], Q8_0, 32)))
    _check_recoverable(lay, "b", "tensor 'b': row length 33 is not a multiple of Q8_0's block of 32", lay.ti["b"].type)


def test_quantized_scalar_tensor_is_not_a_whole_block() -> None:
    lay = build(tensors=std_tensors(b=("b", [], Q8_0, 32)))
    _check_recoverable(lay, "b", "tensor 'b': row length 1 is not a multiple", lay.ti["b"].type)


@pytest.mark.parametrize("offset", [130, 129, 16, 2**64 - 1])
def test_unaligned_offset(offset: int) -> None:
    lay = build(tensors=std_tensors(c=("c", [4, 2], F32, offset)))
    _check_recoverable(
        lay, "c", f"tensor 'c': data offset {offset} is not a multiple of the alignment 32", lay.ti["c"].offset
    )


@pytest.mark.parametrize("offset", [160, 192, 2**40, 2**64 - 32])
def test_offset_out_of_file(offset: int) -> None:
    lay = build(tensors=std_tensors(c=("c", [4, 2], F32, offset)))
    _check_recoverable(lay, "c", r"tensor 'c': data \[\d+, \d+\) lies outside the \d+-byte file", lay.ti["c"].offset)


def test_data_runs_past_eof() -> None:
    lay = build()
    del lay.buf[-1]
    _check_recoverable(lay, "c", f"tensor 'c': data .* lies outside the {len(lay.buf)}-byte file", lay.ti["c"].offset)


def test_first_tensor_runs_past_eof() -> None:
    lay = build(tensors=std_tensors(a=("a", [8, 1000], F32, 0)))
    _check_recoverable(lay, "a", "tensor 'a': data .* lies outside", lay.ti["a"].offset)


def test_overlapping_tensors() -> None:
    lay = build(tensors=std_tensors(c=("c", [4, 2], F32, 96)))  # b is [32, 100)
    _check_recoverable(lay, "c", r"tensor 'c': data overlaps tensor 'b'", lay.ti["c"].offset)


def test_overlapping_tensors_same_offset() -> None:
    lay = build(tensors=std_tensors(c=("c", [4, 2], F32, 32)))
    with pytest.raises(GGUFError, match=r"data overlaps tensor '[bc]'"):
        GGUFFile(lay.data)
    with GGUFFile(lay.data, strict=False) as f:
        assert len(f.problems) == 1
        assert sum(t.problem is not None for t in f.tensors) == 1


def test_overlapping_tensors_reported_in_file_order_offset() -> None:
    # "a" (in info order first) is placed after "c" and overlaps it: the later one by offset is flagged
    lay = build(tensors=std_tensors(a=("a", [8], F32, 128)))
    _check_recoverable(lay, "c", r"tensor 'c': data overlaps tensor 'a'", lay.ti["c"].offset)


def test_overlap_hidden_behind_a_zero_sized_tensor() -> None:
    # x = [0, 128), z = 0 bytes at 32, y = [64, 96): y overlaps x although z sits between them by offset
    tensors = [("x", [32], F32, 0), ("z", [0], F32, 32), ("y", [8], F32, 64)]
    lay = build(tensors=tensors, data=128)
    _check_recoverable(lay, "y", r"tensor 'y': data overlaps tensor 'x'", lay.ti["y"].offset)


def test_overlap_with_a_non_adjacent_tensor() -> None:
    # a = [0, 256) contains b = [32, 64) and c = [128, 160): both overlap a, not only the first by offset
    tensors = [("a", [64], F32, 0), ("b", [8], F32, 32), ("c", [8], F32, 128)]
    lay = build(tensors=tensors, data=256)
    open_error(lay.buf, r"tensor 'b': data overlaps tensor 'a'", lay.ti["b"].offset)
    with GGUFFile(lay.data, strict=False) as f:
        assert {t.name for t in f.tensors if t.problem} == {"b", "c"}
        assert sorted(p.offset for p in f.problems) == [lay.ti["b"].offset, lay.ti["c"].offset]
        assert "overlaps tensor 'a'" in (f.tensor("c").problem or "")


def test_data_start_past_eof() -> None:
    lay = build()
    del lay.buf[lay.header_end :]
    assert lay.header_end % 32
    open_error(lay.buf, f"data section would start at {lay.data_start}, past the end", lay.header_end)
    open_error(lay.buf, "data section would start", lay.header_end, strict=False)


def test_no_tensors_no_data_is_fine() -> None:
    lay = build(tensors=[], data=0)
    del lay.buf[lay.header_end :]
    with GGUFFile(lay.data) as f:
        assert f.tensors == [] and f.get("test.u32") == 7


def test_several_problems_all_listed_when_not_strict() -> None:
    tensors = [("a", [8], F32, 8), ("b", [33, 2], Q8_0, 32), ("c", [4, 2], F32, 2**40), ("d", [8], 57, 0)]
    lay = build(tensors=tensors)
    with GGUFFile(lay.data, strict=False) as f:
        assert [t.problem is not None for t in f.tensors] == [True, True, True, True]
        assert sorted(p.offset for p in f.problems) == sorted(
            [lay.ti["a"].offset, lay.ti["b"].type, lay.ti["c"].offset, lay.ti["d"].type]
        )


# ---------------------------------------------------------------------------------------------- 7. unknown types
@pytest.mark.parametrize(
    ("type_id", "name"),
    [(57, "unknown type 57"), (2**32 - 1, "unknown type 4294967295"), (4, "removed type 4 (Q4_2)"),
     (31, "removed type 31 (Q4_0_4_4)"), (36, "removed type 36")],
)
@pytest.mark.parametrize("strict", [True, False])
def test_unknown_tensor_type_opens(type_id: int, name: str, strict: bool) -> None:
    lay = build(tensors=std_tensors(b=("b", [32, 2], type_id, 32)))
    with GGUFFile(lay.data, strict=strict) as f:
        b = f.tensor("b")
        assert b.type is None and b.type_id == type_id
        assert b.type_name.startswith(name)
        assert b.n_bytes is None and b.row_bytes is None and b.bits_per_weight is None
        assert b.problem is not None
        assert len(f.problems) == 1
        (p,) = f.problems
        assert isinstance(p, GGUFError) and p.offset == lay.ti["b"].type and name in str(p)
        with pytest.raises(GGUFError, match="tensor 'b' cannot be read"):
            f.tensor_bytes("b")
        for other in ("a", "c"):
            t = f.tensor(other)
            assert bytes(f.tensor_bytes(t)) == bytes(lay.buf[t.data_offset : t.data_offset + t.n_bytes])
        assert f.tensor_array("c").shape == (2, 4)


def test_unknown_type_does_not_hide_other_tensor_problems() -> None:
    lay = build(tensors=std_tensors(b=("b", [32, 2], 57, 32), c=("c", [4, 2], F32, 136)))
    open_error(lay.buf, "tensor 'c': data offset 136 is not a multiple", lay.ti["c"].offset)


# ---------------------------------------------------------------------------------------------- 8. nested arrays
def test_nested_arrays_of_uint8() -> None:
    inner = [[1, 2, 3], [], [255]]
    lay = build([*STD_KVS, ("test.nested", VT.ARRAY, (VT.ARRAY, [(VT.UINT8, x) for x in inner]))])
    with GGUFFile(lay.data) as f:
        kv = f.metadata["test.nested"]
        assert kv.type == VT.ARRAY and kv.elem_type == VT.ARRAY and kv.count == 3
        assert isinstance(kv.value, list) and len(kv.value) == 3
        for got, want in zip(kv.value, inner, strict=True):
            assert isinstance(got, np.ndarray) and got.dtype == np.uint8
            assert got.tolist() == want
        assert f.get("test.counts").tolist() == [1, 2, 3]  # parsing continued correctly after it


def test_nested_arrays_of_strings_and_arrays() -> None:
    value = (VT.ARRAY, [(VT.STRING, ["x", "yé"]), (VT.ARRAY, [(VT.INT16, [-1, 2])])])
    lay = build([*STD_KVS, ("test.nested", VT.ARRAY, value)])
    with GGUFFile(lay.data) as f:
        strs, deeper = f.get("test.nested")
        assert isinstance(strs, StringArray) and list(strs) == ["x", "yé"]
        assert isinstance(deeper, list) and deeper[0].tolist() == [-1, 2]


def _nest(levels: int) -> tuple[int, Any]:
    v: tuple[int, Any] = (VT.UINT8, [7])
    for _ in range(levels - 1):
        v = (VT.ARRAY, [v])
    return v


def test_nested_arrays_depth_limit() -> None:
    ok = build([*STD_KVS, ("test.deep", VT.ARRAY, _nest(9))])
    with GGUFFile(ok.data) as f:
        v = f.get("test.deep")
        for _ in range(8):
            v = v[0]
        assert v.tolist() == [7]
    lay = build([*STD_KVS, ("test.deep", VT.ARRAY, _nest(40))])
    # each level is 4 (element type) + 8 (count) bytes; the 9th level's element type is refused
    open_error(lay.buf, "arrays nested too deeply in 'test.deep'", lay.kv["test.deep"].value + 8 * 12)


def test_nested_array_inner_count_huge() -> None:
    lay = build([*STD_KVS, ("test.nested", VT.ARRAY, (VT.ARRAY, [(VT.UINT8, [1]), (VT.UINT8, [2])]))])
    second_count = lay.kv["test.nested"].value + 12 + 13 + 4
    open_error(lay.put(second_count, u64(2**40)).buf, "array 'test.nested' claims 1099511627776", second_count)


def test_nested_array_outer_count_bounded_by_min_size() -> None:
    lay = build([*STD_KVS, ("test.nested", VT.ARRAY, (VT.ARRAY, [(VT.UINT8, [1])]))])
    pos = lay.kv["test.nested"].value + 4
    remaining = len(lay.buf) - pos - 8
    open_error(lay.put(pos, u64(remaining // 12 + 1)).buf, "claims", pos)


# ---------------------------------------------------------------------------------------------- 9. fuzzing
_U32_VALUES = [0, 1, 2, 4, 5, 8, 9, 12, 13, 57, 2**31, 2**32 - 1, 0x03000000]
_U64_VALUES = [0, 1, 7, 8, 24, 31, 32, 33, 64, 2**16, 2**30, 2**30 + 1, 2**32 - 1, 2**32, 2**40, 2**62,
               2**63 - 1, 2**63, 2**64 - 1]


@st.composite
def _mutations(draw: st.DrawFn, size: int, anchors: tuple[int, ...]) -> list[tuple[str, int, Any]]:
    ops: list[tuple[str, int, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.integers(0, 2))
        if where == 0:  # near a structural field (key/value/tensor-info starts, counts, ...)
            delta = draw(st.one_of(st.sampled_from([0, 4, 8, 12]), st.integers(-2, 20)))
            pos = draw(st.sampled_from(anchors)) + delta
        elif where == 1:  # anywhere in the header
            pos = draw(st.integers(4, anchors[-1]))
        else:
            pos = draw(st.integers(0, size))
        kind = draw(st.sampled_from(["byte", "ascii", "u32", "u64", "insert", "delete", "truncate"]))
        if kind == "byte":
            arg: Any = draw(st.integers(0, 255))
        elif kind == "ascii":  # keeps strings valid UTF-8: renames keys/tensors, may create duplicates
            kind, arg = "byte", draw(st.sampled_from(b"a.z_0"))
        elif kind == "u32":
            arg = draw(st.one_of(st.sampled_from(_U32_VALUES), st.integers(0, 2**32 - 1)))
        elif kind == "u64":
            arg = draw(st.one_of(st.sampled_from(_U64_VALUES), st.integers(0, 2**64 - 1)))
        elif kind == "insert":
            arg = draw(st.binary(min_size=1, max_size=24))
        elif kind == "delete":
            arg = draw(st.integers(1, 40))
        else:
            arg = None
        ops.append((kind, max(pos, 0), arg))
    return ops


def _apply(base: bytes, ops: list[tuple[str, int, Any]]) -> bytes:
    buf = bytearray(base)
    for kind, pos, arg in ops:
        pos = min(pos, len(buf))
        if kind == "byte":
            buf[pos : pos + 1] = bytes([arg])
        elif kind == "u32":
            buf[pos : pos + 4] = u32(arg)
        elif kind == "u64":
            buf[pos : pos + 8] = u64(arg)
        elif kind == "insert":
            buf[pos:pos] = arg
        elif kind == "delete":
            del buf[pos : pos + arg]
        else:
            del buf[pos:]
    return bytes(buf)


def _anchors(f: GGUFFile) -> tuple[int, ...]:
    points = {4, 8, 16, 24, f.header_end, f.data_start}
    for kv in f.metadata.values():
        points |= {kv.offset, kv.value_offset, kv.end}
        if isinstance(kv.value, StringArray) and len(kv.value):
            points |= {kv.value.offset_of(len(kv.value) // 2), kv.value.offset_of(-1)}
    for t in f.tensors:
        points |= {t.info_offset, _tensor_offset_field(t) - 4}
    return tuple(sorted(points))


def _touch(value: Any, string_limit: int | None) -> None:
    if isinstance(value, StringArray):
        n = len(value)
        lengths = value.lengths()
        assert lengths.shape == (n,)
        if string_limit is None or n <= string_limit:
            items = list(value)
        else:
            half = string_limit // 2
            items = value[:half] + value[n - half :]
        assert all(isinstance(s, str) for s in items)
        if n:
            assert value[-1] == value.raw(n - 1).decode("utf-8")
            assert value.start <= value.offset_of(n - 1) < value.end
    elif isinstance(value, np.ndarray):
        value.tobytes()
    elif isinstance(value, list):
        for v in value:
            _touch(v, string_limit)
    else:
        assert isinstance(value, (str, int, float, bool))


def _exercise(buf: bytes, *, strict: bool, string_limit: int | None = None) -> None:
    """Open ``buf``: GGUFError or success, nothing else; if it opens, everything readable must read."""
    try:
        f = GGUFFile(buf, strict=strict)
    except GGUFError as err:
        assert err.offset is None or 0 <= err.offset <= len(buf), err
        return
    with f:
        for kv in f.metadata.values():
            _ = kv.type_label, kv.count
            _touch(kv.value, string_limit)
        _ = f.architecture, f.file_type_name
        assert 0 <= f.header_end <= f.data_start
        assert f.data_start % f.alignment == 0
        for p in f.problems:
            assert isinstance(p, GGUFError)
        for t in f.tensors:
            _ = t.type_name, t.shape, t.row_bytes, t.bits_per_weight, t.n_rows
            if t.problem is None:
                assert t.n_bytes is not None and t.data_offset + t.n_bytes <= len(buf)
                assert t.offset % f.alignment == 0
                raw = f.tensor_bytes(t)
                assert raw.size == t.n_bytes
                if t.n_bytes:
                    assert len(f.block_bytes(t, 0, 0)) == t.type.block_bytes
            else:
                assert any(f"tensor {t.name!r}" in str(p) for p in f.problems)
                with pytest.raises(GGUFError):
                    f.tensor_bytes(t)


@pytest.fixture(scope="module")
def fuzz_base(writer_file: WriterFile) -> tuple[bytes, tuple[int, ...]]:
    with GGUFFile(writer_file.data) as f:
        anchors = _anchors(f)
    return writer_file.data, anchors


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), strict=st.booleans())
def test_fuzz_small_file(fuzz_base: tuple[bytes, tuple[int, ...]], data: st.DataObject, strict: bool) -> None:
    base, anchors = fuzz_base
    ops = data.draw(_mutations(len(base), anchors), label="ops")
    _exercise(_apply(base, ops), strict=strict)


@settings(max_examples=300, deadline=None)
@given(
    payload=st.one_of(
        st.binary(max_size=12),
        st.lists(st.integers(0x78, 0xFF), max_size=8).map(bytes),
        st.text(max_size=6).map(lambda s: s.encode("utf-8", "surrogatepass")),
    ),
    prefix=st.integers(0, 11),
)
def test_fuzz_utf8_validation_matches_python(payload: bytes, prefix: int) -> None:
    """The native string-array validator, the key/value decoder and Python's strict UTF-8 agree, offsets too."""
    text = b"p" * prefix + payload
    try:
        text.decode("utf-8")
        bad: int | None = None
    except UnicodeDecodeError as exc:
        bad = exc.start
    key = b"x" + text
    items: list[bytes | str] = ["ok", text, "z"]
    cases = [
        (build([*STD_KVS, (key, VT.UINT32, 1)]), lambda lay: lay.kv[key].key + 1),
        (build([*STD_KVS, ("test.s", VT.STRING, text)]), lambda lay: lay.kv["test.s"].value + 8),
        (
            build([*STD_KVS, ("test.strs", VT.ARRAY, (VT.STRING, items))]),
            lambda lay: string_elem_pos(lay.kv["test.strs"].value + 12, items, 1) + 8,
        ),
    ]
    for lay, where in cases:
        if bad is None:
            with GGUFFile(lay.data) as f:
                if "test.s" in f:
                    assert f.get("test.s") == text.decode()
                elif "test.strs" in f:
                    assert f.get("test.strs")[1] == text.decode()
                else:
                    assert f.get(key.decode()) == 1
        else:
            open_error(lay.buf, "not valid UTF-8", where(lay) + bad)


@pytest.mark.models
def test_fuzz_real_model_header() -> None:
    path = model_path("smollm2")
    if not path.exists():
        pytest.fail(f"test model missing at {path}: run `quantscope models fetch` first")
    with GGUFFile(path) as f:
        data_start = f.data_start
        anchors = _anchors(f)
        n_tensors = len(f.tensors)
    with path.open("rb") as fh:
        header = fh.read(data_start)
    with GGUFFile(header, strict=False) as f:  # unmutated: every tensor lies past the end, nothing else wrong
        assert len(f.tensors) == n_tensors and len(f.problems) == n_tensors
    with pytest.raises(GGUFError, match="lies outside"):
        GGUFFile(header)

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(ops=_mutations(len(header), anchors))
    def run(ops: list[tuple[str, int, Any]]) -> None:
        _exercise(_apply(header, ops), strict=False, string_limit=512)

    run()
