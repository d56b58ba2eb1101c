"""Block decoders (fields, codes, scale groups, formula) for the i-quants, ternary and FP4 types; registered in
core/quant/blocks.py (both build on core/quant/block_fields.py). For a lattice type the element's ``code`` is its
code-book coordinate with the sign applied (``raw_code`` the stored grid index), so ``values == multiplier · code +
offset`` holds bit for bit as for every other type (docs/quant-formats.md, "I-quants, ternary and FP4 types")."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..base.ggml_types import GGMLType
from . import iquants as IQ
from .block_fields import BlockField, DecodedBlock, build_block, bytes_field, fp16, fp16_field

E = np.arange(256)


def _arr(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, np.uint8).reshape(1, -1)


def _lattice(t: GGMLType, raw: bytes, *, fields: list[BlockField], idx: np.ndarray, per: int, book: str,
             signs: np.ndarray, db: np.ndarray, group: np.ndarray, gsize: int, cb: np.ndarray, formula: str,
             scale_name: str, scales: np.ndarray, mult_text: Callable[[int], str]) -> DecodedBlock:
    """Common part of the IQ2/IQ3 decoders: ``idx`` per code-book entry of ``per`` elements, ``signs`` ±1 per
    element, ``db`` the multiplier per element."""
    g = IQ.grid(book)
    coord = g[idx[E // per], E % per].astype(np.int16)
    code = coord * signs.astype(np.int16)
    raw_code = idx[E // per]

    def terms(i: int) -> str:
        sign = "−" if signs[i] < 0 else "+"
        return f"{mult_text(i)} · {sign}G[{int(raw_code[i])}][{i % per}] = {float(db[i]):.7g} · {int(code[i])}"

    return build_block(t, raw, fields, code, raw_code, db, np.zeros(256), group, cb, np.zeros(256), 8, formula, gsize,
                  scales={scale_name: [int(v) for v in scales]}, explain_terms=terms)


def _iq2_xxs(t: GGMLType, raw: bytes) -> DecodedBlock:
    idx, sidx, sc, d = (x[0] for x in IQ.iq2_xxs_fields(_arr(raw)))
    signs = IQ.sign_bits(IQ.sign_table()[sidx]).reshape(-1)  # (8 groups, 4 entries, 8) -> 256
    group = E // 32
    db = (d[0] * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.25))[group]
    fields = [fp16_field(raw, "d", 0, "super-block scale"),
              bytes_field(raw, "qs", 2, 64, "per 32 elements 8 bytes: 4 grid indices (IQ2_XXS code book, 8 "
                           "coordinates each), then a u32 with 4 × 7-bit sign indices (bits 0-27) and the 4-bit scale "
                           "(bits 28-31)")]
    return _lattice(t, raw, fields=fields, idx=idx.reshape(-1), per=8, book="IQ2_XXS", signs=signs, db=db,
                    group=group, gsize=32, cb=2 + 8 * group + (E % 32) // 8, scale_name="s", scales=sc,
                    formula="x = d · (0.5 + s) · ¼ · ±G[q][k]",
                    mult_text=lambda i: f"{float(d[0]):.7g} · (0.5 + {int(sc[i // 32])}) · ¼")


def _iq2_xs(t: GGMLType, raw: bytes) -> DecodedBlock:
    idx, sidx, sc, d = (x[0] for x in IQ.iq2_xs_fields(_arr(raw)))
    signs = IQ.sign_bits(IQ.sign_table()[sidx]).reshape(-1)
    group = E // 16
    db = (d[0] * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.25))[group]
    fields = [fp16_field(raw, "d", 0, "super-block scale"),
              bytes_field(raw, "qs", 2, 64, "32 little-endian u16, one per 8 elements: 9-bit grid index (IQ2_XS "
                           "code book) | 7-bit sign index << 9"),
              bytes_field(raw, "scales", 66, 8, "4-bit scales, one per 16 elements (low nibble first)")]
    return _lattice(t, raw, fields=fields, idx=idx.astype(np.int64), per=8, book="IQ2_XS", signs=signs, db=db,
                    group=group, gsize=16, cb=2 + 2 * (E // 8), scale_name="s", scales=sc,
                    formula="x = d · (0.5 + s) · ¼ · ±G[q][k]",
                    mult_text=lambda i: f"{float(d[0]):.7g} · (0.5 + {int(sc[i // 16])}) · ¼")


def _iq2_s(t: GGMLType, raw: bytes) -> DecodedBlock:
    idx, sbytes, sc, d = (x[0] for x in IQ.iq2_s_fields(_arr(raw)))
    signs = IQ.sign_bits(sbytes).reshape(-1)
    group = E // 16
    db = (d[0] * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.25))[group]
    fields = [fp16_field(raw, "d", 0, "super-block scale"),
              bytes_field(raw, "qs", 2, 32, "low 8 bits of the 10-bit grid index (IQ2_S code book), one per 8 "
                           "elements"),
              bytes_field(raw, "signs", 34, 32, "one sign bit per element (set: negative)"),
              bytes_field(raw, "qh", 66, 8, "bits 8-9 of the grid indices, 2 per index, 4 per byte"),
              bytes_field(raw, "scales", 74, 8, "4-bit scales, one per 16 elements (low nibble first)")]
    return _lattice(t, raw, fields=fields, idx=idx.astype(np.int64), per=8, book="IQ2_S", signs=signs, db=db,
                    group=group, gsize=16, cb=2 + E // 8, scale_name="s", scales=sc,
                    formula="x = d · (0.5 + s) · ¼ · ±G[q][k]",
                    mult_text=lambda i: f"{float(d[0]):.7g} · (0.5 + {int(sc[i // 16])}) · ¼")


def _iq3_xxs(t: GGMLType, raw: bytes) -> DecodedBlock:
    idx, sidx, sc, d = (x[0] for x in IQ.iq3_xxs_fields(_arr(raw)))
    signs = IQ.sign_bits(IQ.sign_table()[sidx]).reshape(-1)
    group = E // 32
    db = (d[0] * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.5))[group]
    fields = [fp16_field(raw, "d", 0, "super-block scale"),
              bytes_field(raw, "qs", 2, 64, "grid indices (IQ3_XXS code book, 4 coordinates each), one per 4 "
                           "elements"),
              bytes_field(raw, "scales_signs", 66, 32, "8 u32, one per 32 elements: 4 × 7-bit sign indices "
                           "(bits 0-27) and the 4-bit scale (bits 28-31)")]
    return _lattice(t, raw, fields=fields, idx=idx.reshape(-1).astype(np.int64), per=4, book="IQ3_XXS",
                    signs=signs, db=db, group=group, gsize=32, cb=2 + E // 4, scale_name="s", scales=sc,
                    formula="x = d · (0.5 + s) · ½ · ±G[q][k]",
                    mult_text=lambda i: f"{float(d[0]):.7g} · (0.5 + {int(sc[i // 32])}) · ½")


def _iq3_s(t: GGMLType, raw: bytes) -> DecodedBlock:
    idx, sbytes, sc, d = (x[0] for x in IQ.iq3_s_fields(_arr(raw)))
    signs = IQ.sign_bits(sbytes).reshape(-1)
    group = E // 32
    db = (d[0] * (1 + 2 * sc).astype(np.float32))[group]
    fields = [fp16_field(raw, "d", 0, "super-block scale"),
              bytes_field(raw, "qs", 2, 64, "low 8 bits of the 9-bit grid index (IQ3_S code book, 4 coordinates "
                           "each), one per 4 elements"),
              bytes_field(raw, "qh", 66, 8, "9th bit of the grid indices, 8 per byte"),
              bytes_field(raw, "signs", 74, 32, "one sign bit per element (set: negative)"),
              bytes_field(raw, "scales", 106, 4, "4-bit scales, one per 32 elements (low nibble first)")]
    return _lattice(t, raw, fields=fields, idx=idx.astype(np.int64), per=4, book="IQ3_S", signs=signs, db=db,
                    group=group, gsize=32, cb=2 + E // 4, scale_name="s", scales=sc,
                    formula="x = d · (1 + 2s) · ±G[q][k]",
                    mult_text=lambda i: f"{float(d[0]):.7g} · (1 + 2·{int(sc[i // 32])})")


def _iq1(t: GGMLType, raw: bytes, *, fields: list[BlockField], idx: np.ndarray, neg: np.ndarray, dl: np.ndarray,
         group: np.ndarray, gsize: int, cb: np.ndarray, sc: np.ndarray, d: float) -> DecodedBlock:
    coord = IQ.grid("IQ1_S")[idx[E // 8], E % 8].astype(np.int16)
    delta = np.where(neg[E // 8] == 0, IQ.IQ1_DELTA, -IQ.IQ1_DELTA).astype(np.float32)
    offs = (dl * delta).astype(np.float32)

    def terms(i: int) -> str:
        return (f"d · (2s + 1) · (G[{int(idx[i // 8])}][{i % 8}] {'−' if delta[i] < 0 else '+'} ⅛) = {d:.7g} · "
                f"(2·{int(sc[group[i]])} + 1) · ({int(coord[i])} {'−' if delta[i] < 0 else '+'} 0.125)")

    return build_block(t, raw, fields, coord, idx[E // 8], dl, offs, group, cb, np.zeros(256), 8,
                  "x = d · (2s + 1) · (G[q][k] ± ⅛)", gsize, scales={"s": [int(v) for v in sc]},
                  explain_terms=terms)


def _iq1_s(t: GGMLType, raw: bytes) -> DecodedBlock:
    idx, sc, neg, d = (x[0] for x in IQ.iq1_s_fields(_arr(raw)))
    group = E // 32
    dl = (d[0] * (2 * sc.astype(np.float32) + 1))[group]
    fields = [fp16_field(raw, "d", 0, "super-block scale"),
              bytes_field(raw, "qs", 2, 32, "low 8 bits of the 11-bit grid index (IQ1 code book of -1/0/1 "
                           "coordinates), one per 8 elements"),
              bytes_field(raw, "qh", 34, 16, "8 u16, one per 32 elements: 4 × 3 high index bits (bits 0-11), the "
                           "3-bit scale (12-14), the sign of the ⅛ offset (15)")]
    return _iq1(t, raw, fields=fields, idx=idx.reshape(-1).astype(np.int64), neg=np.repeat(neg, 4), dl=dl,
                group=group, gsize=32, cb=2 + E // 8, sc=sc, d=float(d[0]))


def _iq1_m(t: GGMLType, raw: bytes) -> DecodedBlock:
    idx, neg, sc, d = (x[0] for x in IQ.iq1_m_fields(_arr(raw)))
    group = E // 16
    dl = (d[0] * (2 * sc.astype(np.float32) + 1))[group]
    fields = [bytes_field(raw, "qs", 0, 32, "low 8 bits of the 11-bit grid index (IQ1 code book), one per 8 "
                           "elements"),
              bytes_field(raw, "qh", 32, 16, "a nibble per 8 elements: 3 high index bits, then the sign of the ⅛ "
                           "offset"),
              bytes_field(raw, "scales", 48, 8, "4 u16: 4 × 3-bit scales (one per 16 elements) in bits 0-11; "
                           "bits 12-15 of the four words are the fp16 super-block scale d")]
    return _iq1(t, raw, fields=fields, idx=idx.astype(np.int64), neg=neg, dl=dl, group=group, gsize=16,
                cb=E // 8, sc=sc, d=float(d[0]))


def _tq1_0(t: GGMLType, raw: bytes) -> DecodedBlock:
    trit = IQ.tq1_0_trits(_arr(raw))[0].astype(np.int16)
    d = fp16(raw, 52)
    cb = np.where(E < 160, E % 32, np.where(E < 240, 32 + (E - 160) % 16, 48 + (E - 240) % 4))
    digit = np.where(E < 160, E // 32, np.where(E < 240, (E - 160) // 16, (E - 240) // 4))
    fields = [bytes_field(raw, "qs", 0, 48, "5 base-3 digits per byte, stored as ⌈256·v/243⌉ (bytes 0-31: "
                           "elements 0-159, digit k of byte j = element 32k + j; bytes 32-47: elements 160-239)"),
              bytes_field(raw, "qh", 48, 4, "4 base-3 digits per byte: elements 240-255"),
              fp16_field(raw, "d", 52, "block scale")]

    def terms(i: int) -> str:
        return f"d · (t − 1) = {d:.7g} · ({int(trit[i])} − 1)   (digit {int(digit[i])} of byte {int(cb[i])})"

    return build_block(t, raw, fields, trit - 1, trit, np.full(256, d), np.zeros(256), np.zeros(256), cb,
                  np.zeros(256), 0, "x = d · (t − 1),  t ∈ {0, 1, 2}", 256, explain_terms=terms)


def _tq2_0(t: GGMLType, raw: bytes) -> DecodedBlock:
    q = IQ.tq2_0_codes(_arr(raw))[0].astype(np.int16)
    d = fp16(raw, 64)
    fields = [bytes_field(raw, "qs", 0, 64, "2-bit codes: element 128h + 32k + j at bits 2k of byte 32h + j"),
              fp16_field(raw, "d", 64, "block scale")]
    return build_block(t, raw, fields, q - 1, q, np.full(256, d), np.zeros(256), np.zeros(256),
                  32 * (E // 128) + E % 32, 2 * ((E % 128) // 32), 2, "x = d · (q − 1)", 256,
                  explain_terms=lambda i: f"d · (q − 1) = {d:.7g} · ({int(q[i])} − 1)")


def _fp4_codes(qs: np.ndarray) -> np.ndarray:
    return np.concatenate([qs & 15, qs >> 4]).astype(np.int16)


def _mxfp4(t: GGMLType, raw: bytes) -> DecodedBlock:
    b = np.frombuffer(raw, np.uint8)
    half = float(IQ.e8m0_half(b[0:1])[0])
    q = _fp4_codes(b[1:17])
    k = IQ.FP4_VALUES[q].astype(np.int16)
    e = np.arange(32)
    fields = [BlockField("e", 0, 1, "e8m0", {"bits": int(b[0]), "float": 2 * half}, "shared exponent: 2^(e − 127)"),
              bytes_field(raw, "qs", 1, 16, "FP4 (E2M1) codes: low nibbles = elements 0-15, high = 16-31")]
    return build_block(t, raw, fields, k, q, np.full(32, half), np.zeros(32), np.zeros(32), 1 + e % 16,
                  np.where(e < 16, 0, 4), 4, "x = 2^(e − 127) · E2M1[q]  (= ½·2^(e−127) · 2·E2M1[q])", 32,
                  explain_terms=lambda i: f"½·2^({int(b[0])} − 127) · 2·E2M1[{int(q[i])}] = {half:.7g} · {int(k[i])}")


def _nvfp4(t: GGMLType, raw: bytes) -> DecodedBlock:
    b = np.frombuffer(raw, np.uint8)
    half = IQ.ue4m3_half(b[0:4])
    e = np.arange(64)
    s, r = e // 16, e % 16
    cb = 4 + 8 * s + r % 8
    q = ((b[cb] >> np.where(r < 8, 0, 4)) & 15).astype(np.int16)
    k = IQ.FP4_VALUES[q].astype(np.int16)
    fields = [bytes_field(raw, "scales", 0, 4, "UE4M3 scales (unsigned FP8, bias 7), one per 16 elements"),
              bytes_field(raw, "qs", 4, 32, "FP4 (E2M1) codes: per 16 elements 8 bytes, low nibbles = elements "
                           "0-7, high = 8-15")]
    return build_block(t, raw, fields, k, q, half[s], np.zeros(64), s, cb, np.where(r < 8, 0, 4), 4,
                  "x = UE4M3[s] · E2M1[q]", 16, scales={"ue4m3": [int(v) for v in b[0:4]]},
                  explain_terms=lambda i: f"½·UE4M3(0x{int(b[i // 16]):02x}) · 2·E2M1[{int(q[i])}] = "
                                          f"{float(half[i // 16]):.7g} · {int(k[i])}")


DECODERS: dict[str, Callable[[GGMLType, bytes], DecodedBlock]] = {
    "IQ2_XXS": _iq2_xxs, "IQ2_XS": _iq2_xs, "IQ2_S": _iq2_s, "IQ3_XXS": _iq3_xxs, "IQ3_S": _iq3_s,
    "IQ1_S": _iq1_s, "IQ1_M": _iq1_m, "TQ1_0": _tq1_0, "TQ2_0": _tq2_0, "MXFP4": _mxfp4, "NVFP4": _nvfp4,
}
