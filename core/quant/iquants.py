"""Reference dequantization of ggml's low-bit families in vectorised numpy, bit-exact with ggml (gguf-py):
the i-quants (lattice code books with sign bits), the ternary TQ types and the FP4 types (docs/quant-formats.md,
"I-quants, ternary and FP4 types").

Same contract as core/quant/dequant.py: ``b`` is ``(n_blocks, block_bytes)`` uint8, ``out`` is
``(n_blocks, block_elems)`` float32. Each value is the product of the float32 factors in ggml's order, so every
rounding matches.
"""

from __future__ import annotations

import base64
import zlib
from functools import cache

import numpy as np

from .iq_grids import BOOKS

#: E2M1 (FP4) values times two, by 4-bit code: MXFP4 and NVFP4 halve their scales instead.
FP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
#: IQ1_S / IQ1_M: the offset added to every code-book coordinate, its sign chosen per group.
IQ1_DELTA = np.float32(0.125)


@cache
def grid(name: str) -> np.ndarray:
    """The code book of ``name`` (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S or IQ1_S, which IQ1_M shares) as
    float32 ``(entries, coordinates)``."""
    rows, cols, values, blob = BOOKS[name]
    idx = np.frombuffer(zlib.decompress(base64.b64decode("".join(blob))), np.uint8)
    return np.array(values, dtype=np.float32)[idx].reshape(rows, cols)


@cache
def sign_table() -> np.ndarray:
    """ggml's ``ksigns_iq2xs``: a 7-bit sign index -> 8 sign bits, the 8th making the count of minus signs even."""
    i = np.arange(128, dtype=np.uint8)
    parity = np.unpackbits(i[:, None], axis=1).sum(axis=1) & 1
    return (i | (parity.astype(np.uint8) << 7)).astype(np.uint8)


def sign_bits(bytes_: np.ndarray) -> np.ndarray:
    """``(..., n)`` sign bytes -> ``(..., n, 8)`` of +1/-1 (bit j set: element j negative)."""
    bits = (bytes_[..., None] >> np.arange(8, dtype=np.uint8)) & 1
    return np.where(bits == 0, np.float32(1), np.float32(-1))


def _d(b: np.ndarray, off: int = 0) -> np.ndarray:
    return np.ascontiguousarray(b[:, off : off + 2]).view("<f2").astype(np.float32)


def _u32(b: np.ndarray, a: int, z: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, a:z]).view("<u4")


def _u16(b: np.ndarray, a: int, z: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, a:z]).view("<u2")


def iq2_xxs_fields(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group of 32: grid indices ``(n, 8, 4)``, sign indices ``(n, 8, 4)``, 4-bit scales ``(n, 8)``; and d."""
    q = _u32(b, 2, 66).reshape(-1, 8, 2)
    idx = q[:, :, 0:1].view(np.uint8).reshape(-1, 8, 4)
    aux = q[:, :, 1]
    signs = ((aux[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & 127).astype(np.uint8)
    return idx, signs, (aux >> 28).astype(np.uint8), _d(b)


def _iq2_xxs(b: np.ndarray, out: np.ndarray) -> None:
    idx, signs, sc, d = iq2_xxs_fields(b)
    db = (d * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.25))[:, :, None, None]
    s = sign_bits(sign_table()[signs])
    np.multiply(db * grid("IQ2_XXS")[idx], s, out=out.reshape(-1, 8, 4, 8))


def iq2_xs_fields(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per 8 elements: 9-bit grid index and 7-bit sign index ``(n, 32)``; 4-bit scale per 16 ``(n, 16)``; d."""
    q = _u16(b, 2, 66)
    sc = b[:, 66:74]
    return (q & 511), (q >> 9).astype(np.uint8), np.stack([sc & 15, sc >> 4], axis=2).reshape(-1, 16), _d(b)


def _iq2_xs(b: np.ndarray, out: np.ndarray) -> None:
    idx, signs, sc, d = iq2_xs_fields(b)
    db = (d * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.25))[:, :, None, None]
    v = grid("IQ2_XS")[idx].reshape(-1, 16, 2, 8)
    s = sign_bits(sign_table()[signs]).reshape(-1, 16, 2, 8)
    np.multiply(db * v, s, out=out.reshape(-1, 16, 2, 8))


def iq2_s_fields(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per 8 elements: 10-bit grid index ``(n, 32)`` (8 low bits in qs, 2 in qh) and sign byte ``(n, 32)``;
    4-bit scale per 16 ``(n, 16)``; d."""
    qh = b[:, 66:74]
    hi = ((qh[:, :, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3).reshape(-1, 32).astype(np.uint16)
    idx = b[:, 2:34].astype(np.uint16) | (hi << 8)
    sc = b[:, 74:82]
    return idx, b[:, 34:66], np.stack([sc & 15, sc >> 4], axis=2).reshape(-1, 16), _d(b)


def _iq2_s(b: np.ndarray, out: np.ndarray) -> None:
    idx, signs, sc, d = iq2_s_fields(b)
    db = (d * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.25))[:, :, None, None]
    v = grid("IQ2_S")[idx].reshape(-1, 16, 2, 8)
    np.multiply(db * v, sign_bits(signs).reshape(-1, 16, 2, 8), out=out.reshape(-1, 16, 2, 8))


def iq3_xxs_fields(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group of 32: 8 grid indices (4 elements each) ``(n, 8, 8)``, 4 sign indices ``(n, 8, 4)``, scale
    ``(n, 8)``; d."""
    aux = _u32(b, 66, 98)
    signs = ((aux[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & 127).astype(np.uint8)
    return b[:, 2:66].reshape(-1, 8, 8), signs, (aux >> 28).astype(np.uint8), _d(b)


def _iq3_xxs(b: np.ndarray, out: np.ndarray) -> None:
    idx, signs, sc, d = iq3_xxs_fields(b)
    db = (d * (np.float32(0.5) + sc.astype(np.float32)) * np.float32(0.5))[:, :, None, None]
    v = grid("IQ3_XXS")[idx].reshape(-1, 8, 4, 8)
    np.multiply(db * v, sign_bits(sign_table()[signs]), out=out.reshape(-1, 8, 4, 8))


def iq3_s_fields(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per 4 elements: 9-bit grid index ``(n, 64)`` (8 low bits in qs, the 9th in qh); sign bytes ``(n, 32)``;
    4-bit scale per 32 ``(n, 8)``; d."""
    qh = b[:, 66:74]
    hi = ((qh[:, :, None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(-1, 64).astype(np.uint16)
    idx = b[:, 2:66].astype(np.uint16) | (hi << 8)
    sc = b[:, 106:110]
    return idx, b[:, 74:106], np.stack([sc & 15, sc >> 4], axis=2).reshape(-1, 8), _d(b)


def _iq3_s(b: np.ndarray, out: np.ndarray) -> None:
    idx, signs, sc, d = iq3_s_fields(b)
    db = (d * (1 + 2 * sc).astype(np.float32))[:, :, None, None]
    v = grid("IQ3_S")[idx].reshape(-1, 8, 4, 8)
    np.multiply(db * v, sign_bits(signs).reshape(-1, 8, 4, 8), out=out.reshape(-1, 8, 4, 8))


def iq1_s_fields(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group of 32: 4 11-bit grid indices ``(n, 8, 4)``, 3-bit scale ``(n, 8)``, delta sign (1: negative)
    ``(n, 8)``; d."""
    qh = _u16(b, 34, 50)
    hi = (qh[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7
    idx = b[:, 2:34].reshape(-1, 8, 4).astype(np.uint16) | (hi << 8)
    return idx, ((qh >> 12) & 7).astype(np.uint8), (qh >> 15).astype(np.uint8), _d(b)


def _iq1_s(b: np.ndarray, out: np.ndarray) -> None:
    idx, sc, neg, d = iq1_s_fields(b)
    dl = (d * (2 * sc.astype(np.float32) + 1))[:, :, None, None]
    delta = np.where(neg == 0, IQ1_DELTA, -IQ1_DELTA)[:, :, None, None]
    np.multiply(dl, grid("IQ1_S")[idx] + delta, out=out.reshape(-1, 8, 4, 8))


def iq1_m_fields(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per 8 elements: 11-bit grid index and delta sign ``(n, 32)``; 3-bit scale per 16 ``(n, 16)``; d, whose
    16 bits are the top nibbles of the four scale words."""
    qh = b[:, 32:48]
    nib = np.stack([qh & 15, qh >> 4], axis=2).reshape(-1, 32)
    idx = b[:, 0:32].astype(np.uint16) | ((nib & 7).astype(np.uint16) << 8)
    sw = _u16(b, 48, 56)
    dbits = ((sw[:, 0] >> 12) | ((sw[:, 1] >> 8) & 0x00F0) | ((sw[:, 2] >> 4) & 0x0F00) | (sw[:, 3] & 0xF000))
    d = dbits.astype(np.uint16).view("<f2").astype(np.float32)[:, None]
    sc = ((sw[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(-1, 16).astype(np.uint8)
    return idx, (nib >> 3).astype(np.uint8), sc, d


def _iq1_m(b: np.ndarray, out: np.ndarray) -> None:
    idx, neg, sc, d = iq1_m_fields(b)
    dl = (d * (2 * sc.astype(np.float32) + 1))[:, :, None, None]  # per 16 elements
    delta = np.where(neg == 0, IQ1_DELTA, -IQ1_DELTA).reshape(-1, 16, 2, 1)
    np.multiply(dl, grid("IQ1_S")[idx].reshape(-1, 16, 2, 8) + delta, out=out.reshape(-1, 16, 2, 8))


#: TQ1_0's base-3 digit weights: digit k of a byte q (q = ceil(256 * v / 243), v = sum of trits * 3^(4-k)) is
#: ((q * 3^k) mod 256) * 3 >> 8.
_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def tq1_0_trits(b: np.ndarray) -> np.ndarray:
    """The 256 ternary digits (0, 1, 2) of each TQ1_0 block, in element order, ``(n, 256)`` uint8."""
    n = b.shape[0]

    def digits(q: np.ndarray, k: int) -> np.ndarray:  # (n, m) bytes -> (n, k * m): digit-major
        t = (q[:, None, :] * _POW3[:k, None]).astype(np.uint8)  # uint8 wrap-around is the mod 256
        return ((t.astype(np.uint16) * 3) >> 8).astype(np.uint8).reshape(n, -1)

    return np.concatenate([digits(b[:, 0:32], 5), digits(b[:, 32:48], 5), digits(b[:, 48:52], 4)], axis=1)


def _tq1_0(b: np.ndarray, out: np.ndarray) -> None:
    d = _d(b, 52)
    np.multiply(d, (tq1_0_trits(b).astype(np.int8) - 1).astype(np.float32), out=out)


def tq2_0_codes(b: np.ndarray) -> np.ndarray:
    """TQ2_0's 2-bit codes (0..2, value = code - 1) in element order, ``(n, 256)``."""
    q = b[:, 0:64].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]
    return (q & 3).reshape(-1, 256)


def _tq2_0(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(_d(b, 64), (tq2_0_codes(b).astype(np.int8) - 1).astype(np.float32), out=out)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half: 2^(e - 127) / 2 as float32 (e = 0 and 1 give the subnormals 2^-128 and 2^-127)."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
    return bits.view(np.float32)


def _mxfp4(b: np.ndarray, out: np.ndarray) -> None:
    d = e8m0_half(b[:, 0:1])
    q = b[:, 1:17]
    np.multiply(d, FP4_VALUES[np.concatenate([q & 15, q >> 4], axis=1)].astype(np.float32), out=out)


def ue4m3_half(x: np.ndarray) -> np.ndarray:
    """NVFP4's unsigned E4M3 scale (bias 7; 0 and 0x7F mean 0) times 0.5, float32."""
    exp = (x >> 3).astype(np.int32) & 15
    man = (x & 7).astype(np.float32)
    raw = np.where(exp == 0, man * np.float32(2.0**-9),
                   (np.float32(1) + man / np.float32(8)) * np.exp2(exp.astype(np.float32) - 7)).astype(np.float32)
    return np.where((x == 0) | (x == 0x7F), np.float32(0), raw * np.float32(0.5)).astype(np.float32)


def _nvfp4(b: np.ndarray, out: np.ndarray) -> None:
    d = ue4m3_half(b[:, 0:4])[:, :, None]  # per 16 elements
    q = b[:, 4:36].reshape(-1, 4, 8)
    v = FP4_VALUES[np.concatenate([q & 15, q >> 4], axis=2)].astype(np.float32)
    np.multiply(d, v, out=out.reshape(-1, 4, 16))


DEQUANTIZERS = {
    "IQ2_XXS": _iq2_xxs, "IQ2_XS": _iq2_xs, "IQ2_S": _iq2_s, "IQ3_XXS": _iq3_xxs, "IQ3_S": _iq3_s,
    "IQ1_S": _iq1_s, "IQ1_M": _iq1_m, "TQ1_0": _tq1_0, "TQ2_0": _tq2_0, "MXFP4": _mxfp4, "NVFP4": _nvfp4,
}
