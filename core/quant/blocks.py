"""Structured decoders for single ggml blocks: every field by name, per-element codes and scale groups.

These feed ``quantscope dump-block`` and the GUI's block inspector. Values come from the reference
dequantizer (one source of truth); each element is also explained as ``multiplier * code + offset``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..base.ggml_types import GGML_TYPES, GGMLType, ggml_type
from .block_fields import BitSource, BlockField, DecodedBlock, build_block, bytes_field, fp16, fp16_field, signed
from .dequant import (
    IQ4_NL_VALUES,
    dequantize,
    iq4_xs_scales,
    q6_k_codes,
    unpack_k4_scales,
    unpack_q3k_scales,
)
from .iq_blocks import DECODERS as _IQ_DECODERS


def _split32(base: int) -> tuple[np.ndarray, np.ndarray]:
    """Code locations of the 32-element formats: element e<16 in the low nibble of byte base+e, else high."""
    e = np.arange(32)
    return base + (e % 16), np.where(e < 16, 0, 4)


def _decode_plain(t: GGMLType, raw: bytes) -> DecodedBlock:
    n = t.block_elems
    desc = t.description
    if t.is_exact:  # integers and F64: the value shown exactly in the field, as float32 in the plot
        exact = np.frombuffer(raw, dtype=t.dtype, count=1)[0]
        values = np.array([exact], dtype=np.float32)
        fields = [BlockField("value", 0, t.block_bytes, t.name.lower(), exact.item(), desc)]
    else:
        values = dequantize(np.frombuffer(raw, dtype=np.uint8).reshape(1, -1), t)[0]
        fields = [BlockField("value", 0, t.block_bytes, t.name.lower(), float(values[0]), desc)]
    one = np.ones(n)
    return DecodedBlock(
        t, raw, fields, values, np.zeros(n, np.int16), np.zeros(n, np.int16), one.astype(np.float32),
        values.copy(), np.zeros(n, np.int16), np.zeros(n, np.int16), np.zeros(n, np.int8), 0, "x = value", 1,
        explain_terms=lambda i: f"{t.name} {fields[0].value!r} (bytes {raw.hex(' ')})" if t.is_exact
        else f"{t.name} 0x{raw.hex()}",
    )


def _decode_q4_0(t: GGMLType, raw: bytes) -> DecodedBlock:
    d = fp16(raw, 0)
    qs = np.frombuffer(raw, np.uint8, 16, 2)
    q = np.concatenate([qs & 15, qs >> 4]).astype(np.int16)
    cb, sh = _split32(2)
    fields = [fp16_field(raw, "d", 0, "block scale"), bytes_field(raw, "qs", 2, 16, "4-bit codes: low nibbles = "
              "elements 0-15, high nibbles = 16-31")]
    return build_block(t, raw, fields, q - 8, q, np.full(32, d), np.zeros(32), np.zeros(32), cb, sh, 4,
                  "x = d · (q − 8)", 32, explain_terms=lambda i: f"d · (q − 8) = {d:.7g} · ({int(q[i])} − 8)")


def _decode_q4_1(t: GGMLType, raw: bytes) -> DecodedBlock:
    d, m = fp16(raw, 0), fp16(raw, 2)
    qs = np.frombuffer(raw, np.uint8, 16, 4)
    q = np.concatenate([qs & 15, qs >> 4]).astype(np.int16)
    cb, sh = _split32(4)
    fields = [fp16_field(raw, "d", 0, "block scale"), fp16_field(raw, "m", 2, "block minimum (added)"),
              bytes_field(raw, "qs", 4, 16, "4-bit codes: low nibbles = elements 0-15, high nibbles = 16-31")]
    return build_block(t, raw, fields, q, q, np.full(32, d), np.full(32, m), np.zeros(32), cb, sh, 4,
                  "x = d · q + m", 32, explain_terms=lambda i: f"d · q + m = {d:.7g} · {int(q[i])} {signed('+', m)}")


def _q5_codes(raw: bytes, qh_off: int, qs_off: int) -> tuple[np.ndarray, int]:
    qh = int.from_bytes(raw[qh_off : qh_off + 4], "little")
    qs = np.frombuffer(raw, np.uint8, 16, qs_off)
    low = np.concatenate([qs & 15, qs >> 4]).astype(np.int16)
    high = np.array([(qh >> e) & 1 for e in range(32)], dtype=np.int16)
    return low | (high << 4), qh


def _decode_q5_0(t: GGMLType, raw: bytes) -> DecodedBlock:
    d = fp16(raw, 0)
    q, qh = _q5_codes(raw, 2, 6)
    cb, sh = _split32(6)
    fields = [fp16_field(raw, "d", 0, "block scale"),
              BlockField("qh", 2, 4, "u32", qh, "bit e = 5th bit of element e"),
              bytes_field(raw, "qs", 6, 16, "low 4 bits: low nibbles = elements 0-15, high nibbles = 16-31")]
    return build_block(t, raw, fields, q - 16, q, np.full(32, d), np.zeros(32), np.zeros(32), cb, sh, 5,
                  "x = d · (q − 16)", 32, explain_terms=lambda i: f"d · (q − 16) = {d:.7g} · ({int(q[i])} − 16)")


def _decode_q5_1(t: GGMLType, raw: bytes) -> DecodedBlock:
    d, m = fp16(raw, 0), fp16(raw, 2)
    q, qh = _q5_codes(raw, 4, 8)
    cb, sh = _split32(8)
    fields = [fp16_field(raw, "d", 0, "block scale"), fp16_field(raw, "m", 2, "block minimum (added)"),
              BlockField("qh", 4, 4, "u32", qh, "bit e = 5th bit of element e"),
              bytes_field(raw, "qs", 8, 16, "low 4 bits: low nibbles = elements 0-15, high nibbles = 16-31")]
    return build_block(t, raw, fields, q, q, np.full(32, d), np.full(32, m), np.zeros(32), cb, sh, 5,
                  "x = d · q + m", 32, explain_terms=lambda i: f"d · q + m = {d:.7g} · {int(q[i])} {signed('+', m)}")


def _decode_q8_0(t: GGMLType, raw: bytes) -> DecodedBlock:
    d = fp16(raw, 0)
    q = np.frombuffer(raw, np.int8, 32, 2).astype(np.int16)
    fields = [fp16_field(raw, "d", 0, "block scale"), bytes_field(raw, "qs", 2, 32, "int8 codes", signed=True)]
    return build_block(t, raw, fields, q, q, np.full(32, d), np.zeros(32), np.zeros(32), 2 + np.arange(32),
                  np.zeros(32), 8, "x = d · q", 32, explain_terms=lambda i: f"d · q = {d:.7g} · {int(q[i])}")


def _decode_iq4_nl(t: GGMLType, raw: bytes) -> DecodedBlock:
    d = fp16(raw, 0)
    qs = np.frombuffer(raw, np.uint8, 16, 2)
    idx = np.concatenate([qs & 15, qs >> 4]).astype(np.int16)
    k = IQ4_NL_VALUES[idx].astype(np.int16)
    cb, sh = _split32(2)
    fields = [fp16_field(raw, "d", 0, "block scale"),
              bytes_field(raw, "qs", 2, 16, "4-bit indices into the IQ4_NL code book (low nibbles first)")]
    return build_block(t, raw, fields, k, idx, np.full(32, d), np.zeros(32), np.zeros(32), cb, sh, 4,
                  "x = d · K[q],  K = IQ4_NL code book", 32,
                  explain_terms=lambda i: f"d · K[q] = {d:.7g} · K[{int(idx[i])}] = {d:.7g} · {int(k[i])}")


def k4_scale_sources() -> dict[str, list[list[BitSource]]]:
    """Which bits of the 12 scale bytes (block offsets 4..15) feed each Q4_K/Q5_K 6-bit scale and min."""
    base = 4
    sc: list[list[BitSource]] = []
    mn: list[list[BitSource]] = []
    for s in range(8):
        if s < 4:
            sc.append([BitSource(base + s, 0, 6, 0)])
            mn.append([BitSource(base + s + 4, 0, 6, 0)])
        else:
            sc.append([BitSource(base + s + 4, 0, 4, 0), BitSource(base + s - 4, 6, 2, 4)])
            mn.append([BitSource(base + s + 4, 4, 4, 0), BitSource(base + s, 6, 2, 4)])
    return {"sc": sc, "m": mn}


def _k_quant_common(raw: bytes, qs_off: int) -> tuple[float, float, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    d, dmin = fp16(raw, 0), fp16(raw, 2)
    sc, mn = unpack_k4_scales(np.frombuffer(raw, np.uint8, 12, 4).reshape(1, 12))
    e = np.arange(256)
    c, r = e // 64, e % 64
    code_byte = qs_off + 32 * c + r % 32
    code_shift = np.where(r < 32, 0, 4)
    return d, dmin, sc[0].astype(np.int64), mn[0].astype(np.int64), code_byte, code_shift


def _decode_q4_k(t: GGMLType, raw: bytes) -> DecodedBlock:
    d, dmin, sc, mn, cb, sh = _k_quant_common(raw, 16)
    group = np.arange(256) // 32
    q = ((np.frombuffer(raw, np.uint8)[cb] >> sh) & 15).astype(np.int16)
    mult = np.float32(d) * sc[group].astype(np.float32)
    offs = -(np.float32(dmin) * mn[group].astype(np.float32))
    fields = [
        fp16_field(raw, "d", 0, "super-block scale of the 6-bit scales"),
        fp16_field(raw, "dmin", 2, "super-block scale of the 6-bit mins"),
        bytes_field(raw, "scales", 4, 12, "8 six-bit scales + 8 six-bit mins (get_scale_min_k4 packing)"),
        bytes_field(raw, "qs", 16, 128, "4-bit codes; bytes 32c..32c+31: low nibbles = sub-block 2c, "
                     "high nibbles = sub-block 2c+1"),
    ]

    def terms(i: int) -> str:
        s = int(group[i])
        return (f"d · sc[{s}] · q − dmin · m[{s}] = {d:.7g} · {int(sc[s])} · {int(q[i])} "
                f"{signed('−', dmin)} · {int(mn[s])}")

    return build_block(t, raw, fields, q, q, mult, offs, group, cb, sh, 4, "x = d · sc[s] · q − dmin · m[s]", 32,
                  scales={"sc": [int(v) for v in sc], "m": [int(v) for v in mn]},
                  scale_sources=k4_scale_sources(), explain_terms=terms)


def _decode_q5_k(t: GGMLType, raw: bytes) -> DecodedBlock:
    d, dmin, sc, mn, cb, sh = _k_quant_common(raw, 48)
    group = np.arange(256) // 32
    b = np.frombuffer(raw, np.uint8)
    hb = (b[16 + np.arange(256) % 32] >> group) & 1
    q = (((b[cb] >> sh) & 15) | (hb << 4)).astype(np.int16)
    mult = np.float32(d) * sc[group].astype(np.float32)
    offs = -(np.float32(dmin) * mn[group].astype(np.float32))
    fields = [
        fp16_field(raw, "d", 0, "super-block scale of the 6-bit scales"),
        fp16_field(raw, "dmin", 2, "super-block scale of the 6-bit mins"),
        bytes_field(raw, "scales", 4, 12, "8 six-bit scales + 8 six-bit mins (get_scale_min_k4 packing)"),
        bytes_field(raw, "qh", 16, 32, "5th bits: bit s of byte l = element 32s+l"),
        bytes_field(raw, "qs", 48, 128, "low 4 bits, laid out as Q4_K's qs"),
    ]

    def terms(i: int) -> str:
        s = int(group[i])
        return (f"d · sc[{s}] · q − dmin · m[{s}] = {d:.7g} · {int(sc[s])} · {int(q[i])} "
                f"{signed('−', dmin)} · {int(mn[s])}")

    return build_block(t, raw, fields, q, q, mult, offs, group, cb, sh, 5, "x = d · sc[s] · q − dmin · m[s]", 32,
                  scales={"sc": [int(v) for v in sc], "m": [int(v) for v in mn]},
                  scale_sources=k4_scale_sources(), explain_terms=terms)


def _decode_q6_k(t: GGMLType, raw: bytes) -> DecodedBlock:
    b = np.frombuffer(raw, np.uint8)
    d = fp16(raw, 208)
    q = q6_k_codes(b.reshape(1, -1))[0].astype(np.int16)
    scales = np.frombuffer(raw, np.int8, 16, 192).astype(np.int64)
    e = np.arange(256)
    h, k, lane = e // 128, (e % 128) // 32, e % 32
    cb = 64 * h + lane + np.where(k % 2 == 1, 32, 0)
    sh = np.where(k >= 2, 4, 0)
    group = e // 16
    mult = np.float32(d) * scales[group].astype(np.float32)
    fields = [
        bytes_field(raw, "ql", 0, 128, "low 4 bits (two halves of 64 bytes)"),
        bytes_field(raw, "qh", 128, 64, "high 2 bits, four elements per byte"),
        bytes_field(raw, "scales", 192, 16, "int8 scale per 16 elements", signed=True),
        fp16_field(raw, "d", 208, "super-block scale"),
    ]

    def terms(i: int) -> str:
        j = int(group[i])
        return f"d · sc[{j}] · (q − 32) = {d:.7g} · {int(scales[j])} · ({int(q[i])} − 32)"

    return build_block(t, raw, fields, q - 32, q, mult, np.zeros(256), group, cb, sh, 6, "x = d · sc[j] · (q − 32)", 16,
                  scales={"sc": [int(v) for v in scales]}, explain_terms=terms)


def _decode_q2_k(t: GGMLType, raw: bytes) -> DecodedBlock:
    b = np.frombuffer(raw, np.uint8)
    d, dmin = fp16(raw, 80), fp16(raw, 82)
    e = np.arange(256)
    n, j, lane = e // 128, (e % 128) // 32, e % 32
    cb = 16 + 32 * n + lane
    sh = 2 * j
    q = ((b[cb] >> sh) & 3).astype(np.int16)
    group = 8 * n + 2 * j + lane // 16
    sc = (b[0:16] & 15).astype(np.int64)
    mn = (b[0:16] >> 4).astype(np.int64)
    mult = np.float32(d) * sc[group].astype(np.float32)
    offs = -(np.float32(dmin) * mn[group].astype(np.float32))
    fields = [
        bytes_field(raw, "scales", 0, 16, "per 16 elements: low nibble = scale, high nibble = min"),
        bytes_field(raw, "qs", 16, 64, "2-bit codes, four per byte"),
        fp16_field(raw, "d", 80, "super-block scale of the scales"),
        fp16_field(raw, "dmin", 82, "super-block scale of the mins"),
    ]

    def terms(i: int) -> str:
        s = int(group[i])
        return (f"d · sc[{s}] · q − dmin · m[{s}] = {d:.7g} · {int(sc[s])} · {int(q[i])} "
                f"{signed('−', dmin)} · {int(mn[s])}")

    return build_block(t, raw, fields, q, q, mult, offs, group, cb, sh, 2, "x = d · sc[s] · q − dmin · m[s]", 16,
                  scales={"sc": [int(v) for v in sc], "m": [int(v) for v in mn]}, explain_terms=terms)


def _decode_q3_k(t: GGMLType, raw: bytes) -> DecodedBlock:
    b = np.frombuffer(raw, np.uint8)
    d = fp16(raw, 108)
    e = np.arange(256)
    n, j, lane = e // 128, (e % 128) // 32, e % 32
    cb = 32 + 32 * n + lane
    sh = 2 * j
    q2 = ((b[cb] >> sh) & 3).astype(np.int16)
    hb = (b[lane] >> (4 * n + j)) & 1
    q = (q2 | (hb << 2)).astype(np.int16)  # stored 3-bit code
    code = q2 - np.where(hb != 0, 0, 4)
    group = 8 * n + 2 * j + lane // 16
    sc = unpack_q3k_scales(b[96:108].reshape(1, 12))[0].astype(np.int64)
    mult = np.float32(d) * (sc[group] - 32).astype(np.float32)
    sources: list[list[BitSource]] = []
    for s in range(16):
        low = BitSource(96 + s, 0, 4, 0) if s < 8 else BitSource(96 + s - 8, 4, 4, 0)
        sources.append([low, BitSource(96 + 8 + s % 4, 2 * (s // 4), 2, 4)])
    fields = [
        bytes_field(raw, "hmask", 0, 32, "3rd bits: bit 4n+j of byte l (element 128n+32j+l); clear = subtract 4"),
        bytes_field(raw, "qs", 32, 64, "low 2 bits, four per byte"),
        bytes_field(raw, "scales", 96, 12, "16 six-bit scales (biased by 32)"),
        fp16_field(raw, "d", 108, "super-block scale"),
    ]

    def terms(i: int) -> str:
        s = int(group[i])
        return f"d · (sc[{s}] − 32) · q = {d:.7g} · ({int(sc[s])} − 32) · {int(code[i])}"

    return build_block(t, raw, fields, code, q, mult, np.zeros(256), group, cb, sh, 3, "x = d · (sc[s] − 32) · q", 16,
                  scales={"sc": [int(v) for v in sc]}, scale_sources={"sc": sources}, explain_terms=terms)


def _decode_iq4_xs(t: GGMLType, raw: bytes) -> DecodedBlock:
    b = np.frombuffer(raw, np.uint8)
    d = fp16(raw, 0)
    ls = iq4_xs_scales(b.reshape(1, -1))[0].astype(np.int64)
    e = np.arange(256)
    group, r = e // 32, e % 32
    cb = 8 + 16 * group + r % 16
    sh = np.where(r < 16, 0, 4)
    idx = ((b[cb] >> sh) & 15).astype(np.int16)
    k = IQ4_NL_VALUES[idx].astype(np.int16)
    mult = np.float32(d) * (ls[group] - 32).astype(np.float32)
    sources = [[BitSource(4 + s // 2, 4 * (s % 2), 4, 0), BitSource(2 + (2 * s) // 8, (2 * s) % 8, 2, 4)]
               for s in range(8)]
    fields = [
        fp16_field(raw, "d", 0, "super-block scale"),
        BlockField("scales_h", 2, 2, "u16", int.from_bytes(raw[2:4], "little"), "high 2 bits of the 8 scales"),
        bytes_field(raw, "scales_l", 4, 4, "low 4 bits of the 8 scales (two per byte)"),
        bytes_field(raw, "qs", 8, 128, "4-bit code-book indices; 16 bytes per 32-element sub-block"),
    ]

    def terms(i: int) -> str:
        s = int(group[i])
        return f"d · (ls[{s}] − 32) · K[q] = {d:.7g} · ({int(ls[s])} − 32) · {int(k[i])}"

    return build_block(t, raw, fields, k, idx, mult, np.zeros(256), group, cb, sh, 4, "x = d · (ls[s] − 32) · K[q]", 32,
                  scales={"ls": [int(v) for v in ls]}, scale_sources={"ls": sources}, explain_terms=terms)


_DECODERS: dict[str, Callable[[GGMLType, bytes], DecodedBlock]] = {
    **{t.name: _decode_plain for t in GGML_TYPES.values() if t.dtype is not None},
    "Q4_0": _decode_q4_0,
    "Q4_1": _decode_q4_1,
    "Q5_0": _decode_q5_0,
    "Q5_1": _decode_q5_1,
    "Q8_0": _decode_q8_0,
    "Q2_K": _decode_q2_k,
    "Q3_K": _decode_q3_k,
    "Q4_K": _decode_q4_k,
    "Q5_K": _decode_q5_k,
    "Q6_K": _decode_q6_k,
    "IQ4_NL": _decode_iq4_nl,
    "IQ4_XS": _decode_iq4_xs,
    **_IQ_DECODERS,
}


def can_decode(qtype: GGMLType | int | str) -> bool:
    """True when :func:`decode_block` knows the type's fields."""
    t = qtype if isinstance(qtype, GGMLType) else ggml_type(qtype)
    return t.name in _DECODERS


def decode_block(qtype: GGMLType | int | str, raw: bytes) -> DecodedBlock:
    """Decode one block of ``qtype`` from exactly ``block_bytes`` bytes."""
    t = qtype if isinstance(qtype, GGMLType) else ggml_type(qtype)
    if len(raw) != t.block_bytes:
        raise ValueError(f"a {t.name} block is {t.block_bytes} bytes, got {len(raw)}")
    fn = _DECODERS.get(t.name)
    if fn is None:
        raise NotImplementedError(f"no block decoder for {t.name}")
    with np.errstate(invalid="ignore", over="ignore"):
        return fn(t, bytes(raw))
