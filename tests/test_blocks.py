"""Single-block decoders: ggml's Q4_K layout (not the seed's), field consistency for every type."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from quantscope.core.gguf import GGUFFile
from quantscope.core.quant import can_decode, decode_block, ggml_type
from quantscope.core.quant.dequant import DEQUANTIZERS

# ---------------------------------------------------------------- the Q4_K test vector
SC = [1, 2, 3, 4, 5, 6, 7, 63]
MN = [0, 1, 2, 3, 4, 5, 6, 40]


def q4k_vector() -> bytes:
    """d = 1.0, dmin = 0.5, the scales/mins above packed as get_scale_min_k4 expects, and code bytes whose
    low nibble is l % 16 and high nibble 15 - l % 16 (l = byte index within its 32-byte chunk)."""
    b = bytearray(144)
    b[0:2] = np.float16(1.0).tobytes()
    b[2:4] = np.float16(0.5).tobytes()
    for j in range(4):
        b[4 + j] = (SC[j] & 63) | ((SC[j + 4] >> 4) << 6)
        b[8 + j] = (MN[j] & 63) | ((MN[j + 4] >> 4) << 6)
        b[12 + j] = (SC[j + 4] & 15) | ((MN[j + 4] & 15) << 4)
    for c in range(4):
        for lane in range(32):
            b[16 + 32 * c + lane] = (lane % 16) | ((15 - lane % 16) << 4)
    return bytes(b)


# (element, expected value) worked out by hand from x = d*sc[s]*q - dmin*m[s]
Q4K_EXPECTED = {
    0: 0.0,  # s=0, q=lo(qs[0])=0
    1: 1.0,  # s=0, q=1: 1*1*1 - 0.5*0
    15: 15.0,
    32: 29.5,  # s=1, q=hi(qs[0])=15: 2*15 - 0.5*1
    63: -0.5,  # s=1, lane 31: hi = 15 - 15 = 0: 0 - 0.5*1
    64: -1.0,  # s=2, q=0: 0 - 0.5*2
    200: 53.0,  # s=6 (chunk 3 low), lane 8: q=8: 7*8 - 0.5*6
    224: 925.0,  # s=7, lane 0: q=15: 63*15 - 0.5*40
    255: -20.0,  # s=7, lane 31: q=0: -0.5*40
}


def seed_q4k(raw: bytes) -> np.ndarray:
    """The seed prose's (wrong) reading: plain 6-bit scales/mins, sequential nibbles, centred codes."""
    d = float(np.frombuffer(raw, "<f2", 1, 0)[0])
    dmin = float(np.frombuffer(raw, "<f2", 1, 2)[0])
    sc = [raw[4 + s % 12] & 63 for s in range(8)]
    mn = [raw[4 + (s + 8) % 12] & 63 for s in range(8)]
    out = np.empty(256, np.float32)
    for e in range(256):
        byte = raw[16 + e // 2]
        q = byte & 15 if e % 2 == 0 else byte >> 4
        s = e // 32
        out[e] = d * sc[s] * (q - 8) + dmin * mn[s]
    return out


def test_q4k_vector_follows_ggml():
    b = decode_block("Q4_K", q4k_vector())
    assert b.scales == {"sc": SC, "m": MN}
    assert b.field("d").value["float"] == 1.0 and b.field("dmin").value["float"] == 0.5
    for e, x in Q4K_EXPECTED.items():
        assert b.values[e] == np.float32(x), e
    # sub-block of each element: chunk c low nibbles -> 2c, high nibbles -> 2c+1
    assert b.group.tolist() == [e // 32 for e in range(256)]
    assert b.code_byte[32] == 16 and b.code_shift[32] == 4
    assert b.code_byte[64] == 48 and b.code_shift[64] == 0


def test_seed_reading_would_fail_the_vector():
    raw = q4k_vector()
    seed = seed_q4k(raw)
    assert any(seed[e] != np.float32(x) for e, x in Q4K_EXPECTED.items())
    assert not np.array_equal(seed, decode_block("Q4_K", raw).values)


def test_q4k_scale_sources_rebuild_the_scales():
    rng = np.random.default_rng(5)
    for _ in range(50):
        raw = rng.integers(0, 256, 144, dtype=np.uint8).tobytes()
        b = decode_block("Q4_K", raw)
        for name in ("sc", "m"):
            for i, parts in enumerate(b.scale_sources[name]):
                v = 0
                for p in parts:
                    v |= ((raw[p.byte] >> p.bit_lo) & ((1 << p.n_bits) - 1)) << p.value_bit
                assert v == b.scales[name][i]
                assert sum(p.n_bits for p in parts) == 6
                assert all(4 <= p.byte < 16 for p in parts)


@pytest.mark.parametrize("name", sorted(DEQUANTIZERS))
def test_fields_explain_every_value(name):
    t = ggml_type(name)
    assert can_decode(t)
    rng = np.random.default_rng(len(name) * 7919)
    for _ in range(20):
        raw = rng.integers(0, 256, t.block_bytes, dtype=np.uint8)
        if t.is_quantized:  # keep scales finite so the identity below is about arithmetic, not NaN
            raw[:] = np.where(rng.random(t.block_bytes) < 0.5, raw, raw & 0x3B)
        b = decode_block(t, raw.tobytes())
        assert b.values.shape == (t.block_elems,)
        assert sum(f.size for f in b.fields) == t.block_bytes
        offsets = sorted((f.offset, f.size) for f in b.fields)
        assert all(a[0] + a[1] == c[0] for a, c in itertools.pairwise(offsets))
        with np.errstate(all="ignore"):
            rebuilt = (b.multiplier * b.code.astype(np.float32) + b.offset).astype(np.float32)
        assert np.array_equal(rebuilt, b.values, equal_nan=True)
        if b.code_bits:
            low = min(b.code_bits, 4) if name != "Q3_K" else 2
            stored = (raw[b.code_byte] >> b.code_shift) & ((1 << low) - 1)
            assert np.array_equal(stored, b.raw_code & ((1 << low) - 1))
        assert b.explain(t.block_elems - 1).startswith(f"x[{t.block_elems - 1}] = ")


def test_decode_rejects_wrong_length_and_unknown_format():
    with pytest.raises(ValueError, match="144 bytes"):
        decode_block("Q4_K", b"\0" * 143)
    with pytest.raises(NotImplementedError):
        decode_block("Q1_0", b"\0" * 18)


def test_real_q4k_block_matches_tensor_dequant(model_path):
    from quantscope.core.quant import dequantize

    with GGUFFile(model_path("gemma3")) as f:
        t = f.tensor("blk.3.ffn_down.weight")
        assert t.type.name == "Q4_K"
        b = decode_block(t.type, f.block_bytes(t, 7, 2))
        row = dequantize(f.tensor_rows(t)[7], t.type)
        assert np.array_equal(b.values, row[512:768])
        assert "d · sc[" in b.explain(37)


@pytest.mark.parametrize(("name", "value"), [("I8", np.int8(-5)), ("I16", np.int16(-30000)),
                                             ("I32", np.int32(123456789)), ("I64", np.int64(-(2**40) - 3)),
                                             ("F64", np.float64(1 / 3))])
def test_integer_and_f64_elements_show_their_exact_value(name, value):
    b = decode_block(name, value.tobytes())
    assert b.fields[0].value == value.item() and type(b.fields[0].value) is type(value.item())
    assert b.values[0] == np.float32(value) and repr(value.item()) in b.explain(0)
