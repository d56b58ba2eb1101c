"""Reference dequantization of ggml block formats in vectorised numpy, bit-exact with ggml.

Every function takes the raw bytes as a ``uint8`` array of shape ``(n_blocks, block_bytes)`` and writes
``float32`` values into ``out`` of shape ``(n_blocks, block_elems)``. All arithmetic is float32 and every
product is exact (see docs/quant-formats.md §2), so the results equal ggml's bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..base.ggml_types import GGMLType, ggml_type
from . import iquants as _iquants

#: IQ4_NL / IQ4_XS non-linear code book.
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


def fp16_at(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 field at byte ``offset`` of every block, as float32 of shape ``(n_blocks, 1)``."""
    return np.ascontiguousarray(blocks[:, offset : offset + 2]).view("<f2").astype(np.float32)


def nibbles_split(qs: np.ndarray) -> np.ndarray:
    """``(..., n)`` bytes -> ``(..., 2n)`` codes: low nibbles first, then high nibbles (32-element formats)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def unpack_k4_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml ``get_scale_min_k4``: 12 bytes -> 8 six-bit scales and 8 six-bit mins, each ``(n_blocks, 8)``."""
    lo, mid, hi = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return sc, mn


def unpack_q3k_scales(scales: np.ndarray) -> np.ndarray:
    """Q3_K's 12 scale bytes -> 16 six-bit scales (unsigned, 0..63; subtract 32 to use), ``(n_blocks, 16)``."""
    low = np.concatenate([scales[:, 0:8] & 15, scales[:, 0:8] >> 4], axis=1)
    j = np.arange(16)
    high = (scales[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    return low | (high << 4)


def _f32(blocks: np.ndarray, out: np.ndarray) -> None:
    out[:] = np.ascontiguousarray(blocks).view("<f4")


def _f16(blocks: np.ndarray, out: np.ndarray) -> None:
    out[:] = np.ascontiguousarray(blocks).view("<f2")


def _bf16(blocks: np.ndarray, out: np.ndarray) -> None:
    np.left_shift(np.ascontiguousarray(blocks).view("<u2"), 16, out=out.view(np.uint32), dtype=np.uint32)


def _q4_0(b: np.ndarray, out: np.ndarray) -> None:
    q = nibbles_split(b[:, 2:18]).astype(np.int8) - np.int8(8)
    np.multiply(q, fp16_at(b, 0), out=out)


def _q4_1(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(nibbles_split(b[:, 4:20]), fp16_at(b, 0), out=out)
    out += fp16_at(b, 2)


def _q5_bits(qh_bytes: np.ndarray) -> np.ndarray:
    qh = np.ascontiguousarray(qh_bytes).view("<u4")  # (n, 1)
    return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q5_0(b: np.ndarray, out: np.ndarray) -> None:
    q = nibbles_split(b[:, 6:22]) | (_q5_bits(b[:, 2:6]) << 4)
    np.multiply(q.view(np.int8) - np.int8(16), fp16_at(b, 0), out=out)


def _q5_1(b: np.ndarray, out: np.ndarray) -> None:
    q = nibbles_split(b[:, 8:24]) | (_q5_bits(b[:, 4:8]) << 4)
    np.multiply(q, fp16_at(b, 0), out=out)
    out += fp16_at(b, 2)


def _q8_0(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(b[:, 2:34].view(np.int8), fp16_at(b, 0), out=out)


def _q2_k(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    sc = b[:, 0:16].reshape(n, 2, 4, 2, 1)
    qs = b[:, 16:80].reshape(n, 2, 1, 32)
    d, dmin = fp16_at(b, 80).reshape(n, 1, 1, 1, 1), fp16_at(b, 82).reshape(n, 1, 1, 1, 1)
    q = ((qs >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3).reshape(n, 2, 4, 2, 16)
    dl = d * (sc & 15).astype(np.float32)
    ml = dmin * (sc >> 4).astype(np.float32)
    o = out.reshape(n, 2, 4, 2, 16)
    np.multiply(dl, q, out=o)
    o -= ml


def _q3_k(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    hmask = b[:, 0:32].reshape(n, 1, 1, 32)
    qs = b[:, 32:96].reshape(n, 2, 1, 32)
    sc = (unpack_q3k_scales(b[:, 96:108]).astype(np.int8) - np.int8(32)).reshape(n, 2, 4, 2, 1)
    d = fp16_at(b, 108).reshape(n, 1, 1, 1, 1)
    shift = np.arange(4, dtype=np.uint8).reshape(1, 1, 4, 1)
    q2 = ((qs >> (2 * shift)) & 3).astype(np.int8)
    hbit = (hmask >> (np.arange(2, dtype=np.uint8).reshape(1, 2, 1, 1) * 4 + shift)) & 1
    q = (q2 - np.where(hbit != 0, np.int8(0), np.int8(4))).reshape(n, 2, 4, 2, 16)
    np.multiply(d * sc.astype(np.float32), q, out=out.reshape(n, 2, 4, 2, 16))


def _k4_codes(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K code bytes ``(n, 128)`` -> low 4 bits per element ``(n, 8, 32)`` in sub-block order."""
    n = qs.shape[0]
    c = qs.reshape(n, 4, 1, 32)
    return np.concatenate([c & 15, c >> 4], axis=2).reshape(n, 8, 32)


def _q4_k(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    d, dmin = fp16_at(b, 0), fp16_at(b, 2)
    sc, mn = unpack_k4_scales(b[:, 4:16])
    q = _k4_codes(b[:, 16:144])
    o = out.reshape(n, 8, 32)
    np.multiply((d * sc.astype(np.float32))[:, :, None], q, out=o)
    o -= (dmin * mn.astype(np.float32))[:, :, None]


def _q5_k(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    d, dmin = fp16_at(b, 0), fp16_at(b, 2)
    sc, mn = unpack_k4_scales(b[:, 4:16])
    qh = b[:, 16:48].reshape(n, 1, 32)
    hb = (qh >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = _k4_codes(b[:, 48:176]) | (hb << 4)
    o = out.reshape(n, 8, 32)
    np.multiply((d * sc.astype(np.float32))[:, :, None], q, out=o)
    o -= (dmin * mn.astype(np.float32))[:, :, None]


def q6_k_codes(b: np.ndarray) -> np.ndarray:
    """Q6_K blocks -> 6-bit codes 0..63 per element, ``(n, 256)``.

    Works on 64-bit words (8 codes at a time): within each half, low nibbles of ``ql[0:64]`` then high
    nibbles give the low 4 bits in element order; ``(qh >> 2k) & 3`` gives the top 2 bits of 32-element run k.
    """
    n = b.shape[0]
    ql = np.ascontiguousarray(b[:, 0:128]).view(np.uint64).reshape(n, 2, 8)
    qh = np.ascontiguousarray(b[:, 128:192]).view(np.uint64).reshape(n, 2, 1, 4)
    codes = np.concatenate([ql & _M4, (ql >> _U4) & _M4], axis=2)
    codes |= (((qh >> _Q6_SHIFTS) & _M2) << _U4).reshape(n, 2, 16)
    return codes.view(np.uint8).reshape(n, 256)


_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_M2 = np.uint64(0x0303030303030303)
_U4 = np.uint64(4)
_Q6_SHIFTS = (2 * np.arange(4, dtype=np.uint64)).reshape(1, 1, 4, 1)


def _q6_k(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    q = (q6_k_codes(b).view(np.int8) - np.int8(32)).reshape(n, 16, 16)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    np.multiply((fp16_at(b, 208) * sc)[:, :, None], q, out=out.reshape(n, 16, 16))


def _iq4_nl(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(IQ4_NL_VALUES[nibbles_split(b[:, 2:18])], fp16_at(b, 0), out=out)


def iq4_xs_scales(b: np.ndarray) -> np.ndarray:
    """IQ4_XS blocks -> the 8 six-bit sub-block scales (0..63; subtract 32 to use), ``(n, 8)``."""
    sh = np.ascontiguousarray(b[:, 2:4]).view("<u2").astype(np.uint16)  # (n, 1)
    k = np.arange(8)
    sl = (b[:, 4 + k // 2] >> (4 * (k % 2)).astype(np.uint8)) & 15
    return sl.astype(np.uint16) | (((sh >> (2 * k).astype(np.uint16)) & 3) << 4)


def _iq4_xs(b: np.ndarray, out: np.ndarray) -> None:
    n = b.shape[0]
    d = fp16_at(b, 0)
    ls = iq4_xs_scales(b).astype(np.int16) - 32
    dl = (d * ls.astype(np.float32))[:, :, None]
    qs = b[:, 8:136].reshape(n, 8, 16)
    vals = IQ4_NL_VALUES[np.concatenate([qs & 15, qs >> 4], axis=2)]
    np.multiply(dl, vals, out=out.reshape(n, 8, 32))


DEQUANTIZERS: dict[str, Callable[[np.ndarray, np.ndarray], None]] = {
    "F32": _f32,
    "F16": _f16,
    "BF16": _bf16,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl,
    "IQ4_XS": _iq4_xs,
    **_iquants.DEQUANTIZERS,
}

#: Rows per chunk when dequantizing big tensors (bounds temporaries to a few MB).
_CHUNK_BLOCKS = 1 << 14


def can_dequantize(qtype: GGMLType | int | str) -> bool:
    """True when :func:`dequantize` supports the type."""
    t = qtype if isinstance(qtype, GGMLType) else ggml_type(qtype)
    return t.name in DEQUANTIZERS


def dequantize(raw: np.ndarray, qtype: GGMLType | int | str) -> np.ndarray:
    """Dequantize raw bytes to float32.

    ``raw`` is ``uint8`` whose last dimension holds whole rows' bytes (e.g. ``GGUFFile.tensor_rows``) or a flat
    byte buffer; the result has the same leading dimensions and the last becomes elements per row.
    """
    t = qtype if isinstance(qtype, GGMLType) else ggml_type(qtype)
    fn = DEQUANTIZERS.get(t.name)
    if fn is None:
        raise NotImplementedError(f"no reference dequantizer for {t.name}")
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise TypeError(f"dequantize expects uint8 bytes, got {raw.dtype}")
    if raw.ndim == 0:
        raise ValueError("dequantize expects at least one dimension of bytes")
    row_bytes = raw.shape[-1]
    if row_bytes % t.block_bytes:
        raise ValueError(f"last dimension {row_bytes} is not a multiple of {t.name}'s {t.block_bytes}-byte block")
    out_shape = (*raw.shape[:-1], row_bytes // t.block_bytes * t.block_elems)
    blocks = raw.reshape(-1, t.block_bytes)
    n = blocks.shape[0]
    out = np.empty((n, t.block_elems), dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf scales are data here, not errors
        for a in range(0, n, _CHUNK_BLOCKS):
            b = min(n, a + _CHUNK_BLOCKS)
            fn(blocks[a:b], out[a:b])
    return out.reshape(out_shape)
