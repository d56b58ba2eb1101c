"""The C string-array walker and UTF-8 validator agree with Python on random and hostile input."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from quantscope.core.native import ffi, lib


def utf8_invalid_at(data: bytes) -> int:
    buf = ffi.from_buffer("uint8_t[]", data)
    return lib.qs_utf8_invalid_at(buf, len(data))


def python_invalid_at(data: bytes) -> int:
    try:
        data.decode("utf-8")
        return len(data)
    except UnicodeDecodeError as exc:
        return exc.start


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=64))
def test_utf8_validator_matches_python_on_bytes(data):
    assert utf8_invalid_at(data) == python_invalid_at(data)


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=40), st.binary(max_size=4))
def test_utf8_validator_matches_python_on_text_with_junk(text, junk):
    data = text.encode("utf-8", "surrogatepass") + junk
    assert utf8_invalid_at(data) == python_invalid_at(data)


def pack_strings(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<Q", len(s)) + s for s in items)


def scan(data: bytes, count: int, want_offsets: bool = True, max_len: int = 1 << 30):
    buf = ffi.from_buffer("uint8_t[]", data)
    offsets = ffi.new("uint64_t[]", count + 1) if want_offsets else ffi.NULL
    end, pos, idx = ffi.new("uint64_t *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
    code = lib.qs_scan_strings(buf, len(data), count, max_len, 1, offsets, end, pos, idx)
    return code, end[0], pos[0], idx[0], (list(offsets) if want_offsets else None)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=20), max_size=30))
def test_scan_finds_every_string(items):
    raw = [s.encode("utf-8", "surrogatepass") for s in items]
    data = pack_strings(raw) + b"trailing"
    valid = all(python_invalid_at(r) == len(r) for r in raw)
    code, end, _pos, idx, offsets = scan(data, len(raw))
    if valid:
        assert code == 0
        assert end == len(data) - len(b"trailing")
        expect, p = [], 0
        for r in raw:
            expect.append(p)
            p += 8 + len(r)
        assert offsets[:-1] == expect and offsets[-1] == end
    else:
        assert code == 4
        bad = next(i for i, r in enumerate(raw) if python_invalid_at(r) != len(r))
        assert idx == bad


def test_scan_errors():
    data = pack_strings([b"abc", b"de"])
    assert scan(data, 3)[0] == 1  # no room for a third length
    assert scan(data[:-1], 2)[0:3:2] == (2, 11)  # second string runs past the end; error at its length field
    assert scan(struct.pack("<Q", 2**40) + b"x", 1, max_len=1 << 30)[0] == 3
    assert scan(pack_strings([b"ok", b"\xc3\x28"]), 2)[0:3:2] == (4, 10 + 8)
    assert scan(b"", 0)[0:2] == (0, 0)
