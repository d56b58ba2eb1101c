"""Application icons for macOS (``.icns``) and Windows (``.ico``), made in pure Python from the PNG icons.

Both containers hold PNG images as they are: an ``.icns`` file is ``b"icns"`` + its total length (big-endian
u32), then entries of a 4-byte type + entry length (header included) + PNG bytes, the type naming the pixel size
(``ic07`` 128, ``ic08`` 256, ...); an ``.ico`` file is a 6-byte header (0, type 1, count), 16-byte directory
entries (width, height with 0 meaning 256, colours, reserved, planes, bits per pixel, byte count, offset) and the
PNG images. The sizes below the largest given one are made by halving it (2x2 box filter over premultiplied
alpha), so one 256 px PNG yields 16..256.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Sequence

from .fsutil import write_atomic

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: pixel size -> the icns types holding a PNG of that many pixels a side (the @2x types too: ic11 is 16@2x)
ICNS_TYPES: dict[int, tuple[bytes, ...]] = {
    16: (b"icp4",), 32: (b"icp5", b"ic11"), 64: (b"icp6", b"ic12"), 128: (b"ic07",), 256: (b"ic08", b"ic13"),
    512: (b"ic09", b"ic14"), 1024: (b"ic10",)}
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # PNG colour type -> samples per pixel (8-bit, no palette)


class IconError(ValueError):
    """A PNG this module cannot use (not a PNG, not 8-bit grey/RGB(A), interlaced, not square)."""


def png_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` from the PNG's IHDR chunk."""
    if data[:8] != PNG_MAGIC or data[12:16] != b"IHDR":
        raise IconError("not a PNG image")
    w, h = struct.unpack(">II", data[16:24])
    return w, h


def _chunks(data: bytes) -> Iterable[tuple[bytes, bytes]]:
    pos = 8
    while pos + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        yield kind, data[pos + 8:pos + 8 + n]
        pos += 12 + n


def decode_png(data: bytes) -> tuple[int, int, bytearray]:
    """``(width, height, RGBA bytes row by row)`` of an 8-bit, non-interlaced grey, grey+alpha, RGB or RGBA PNG."""
    w, h = png_size(data)
    depth, ctype, _, _, interlace = data[24:29]
    if depth != 8 or ctype not in _CHANNELS or interlace:
        raise IconError(f"PNG with bit depth {depth}, colour type {ctype}, interlace {interlace}: only 8-bit "
                        "non-interlaced grey/RGB(A) is read")
    raw = zlib.decompress(b"".join(body for kind, body in _chunks(data) if kind == b"IDAT"))
    bpp = _CHANNELS[ctype]
    stride = w * bpp
    if len(raw) < h * (stride + 1):
        raise IconError("PNG image data is truncated")
    prev = bytearray(stride)
    px = bytearray()
    for y in range(h):
        ftype = raw[y * (stride + 1)]
        row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if ftype == 1:
            for i in range(bpp, stride):
                row[i] = (row[i] + row[i - bpp]) & 255
        elif ftype == 2:
            row = bytearray((a + b) & 255 for a, b in zip(row, prev, strict=True))
        elif ftype == 3:
            for i in range(stride):
                row[i] = (row[i] + ((row[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
        elif ftype == 4:
            for i in range(stride):
                a = row[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        elif ftype != 0:
            raise IconError(f"PNG row filter {ftype} is not defined")
        px += row
        prev = row
    if bpp == 4:
        return w, h, px
    out = bytearray(w * h * 4)
    for i in range(w * h):
        s = px[i * bpp:(i + 1) * bpp]
        out[i * 4:i * 4 + 4] = (bytes((s[0],) * 3) + (bytes(s[1:]) or b"\xff")) if bpp <= 2 else bytes(s) + b"\xff"
    return w, h, out


def encode_png(w: int, h: int, rgba: bytes | bytearray) -> bytes:
    """An 8-bit RGBA PNG of ``rgba`` (unfiltered rows, zlib level 9)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    stride = w * 4
    rows = b"".join(b"\x00" + bytes(rgba[y * stride:(y + 1) * stride]) for y in range(h))
    return (PNG_MAGIC + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


def halve(w: int, h: int, rgba: bytes | bytearray) -> tuple[int, int, bytearray]:
    """The image at half its width and height: each pixel the mean of a 2x2 block, colours weighted by alpha."""
    w2, h2 = w // 2, h // 2
    out = bytearray(w2 * h2 * 4)
    for y in range(h2):
        r0, r1 = 2 * y * w * 4, (2 * y + 1) * w * 4
        for x in range(w2):
            quads = [rgba[r + 8 * x + d:r + 8 * x + d + 4] for r in (r0, r1) for d in (0, 4)]
            alpha = sum(q[3] for q in quads)
            o = (y * w2 + x) * 4
            for c in range(3):
                out[o + c] = (sum(q[c] * q[3] for q in quads) + alpha // 2) // alpha if alpha else 0
            out[o + 3] = (alpha + 2) // 4
    return w2, h2, out


def _read(png: bytes | str | os.PathLike[str]) -> bytes:
    return png if isinstance(png, bytes) else open(png, "rb").read()


def icon_images(pngs: Iterable[bytes | str | os.PathLike[str]], sizes: Sequence[int]) -> dict[int, bytes]:
    """PNG bytes by pixel size for each of ``sizes`` that a given square PNG has or that halving the largest one
    reaches (the given images are kept byte for byte)."""
    given: dict[int, bytes] = {}
    for png in pngs:
        data = _read(png)
        w, h = png_size(data)
        if w != h:
            raise IconError(f"icon images must be square, not {w}x{h}")
        given[w] = data
    if not given:
        raise IconError("no PNG icon given")
    out = {s: given[s] for s in sizes if s in given}
    w, h, px = decode_png(given[max(given)])
    while w > min(sizes):
        w, h, px = halve(w, h, px)
        if w in sizes and w not in out:
            out[w] = encode_png(w, h, px)
    return dict(sorted(out.items()))


def icns_bytes(images: dict[int, bytes]) -> bytes:
    """An ``.icns`` container of PNG images by pixel size (sizes without an icns type are left out)."""
    body = b"".join(t + struct.pack(">I", 8 + len(png)) + png for size, png in sorted(images.items())
                    for t in ICNS_TYPES.get(size, ()))
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def ico_bytes(images: dict[int, bytes]) -> bytes:
    """An ``.ico`` file of PNG images by pixel size (at most 256)."""
    items = sorted((s, png) for s, png in images.items() if s <= 256)
    offset = 6 + 16 * len(items)
    head, body = struct.pack("<HHH", 0, 1, len(items)), b""
    for size, png in items:
        head += struct.pack("<BBBBHHII", size % 256, size % 256, 0, 0, 1, 32, len(png), offset + len(body))
        body += png
    return head + body


def write_icns(pngs: Iterable[bytes | str | os.PathLike[str]], out: str | os.PathLike[str]) -> None:
    """Write ``out`` as the ``.icns`` of ``pngs`` (paths or bytes; 16..512 px, halving the largest as needed)."""
    write_atomic(out, icns_bytes(icon_images(pngs, sorted(ICNS_TYPES))), label="icns")


def write_ico(pngs: Iterable[bytes | str | os.PathLike[str]], out: str | os.PathLike[str]) -> None:
    """Write ``out`` as the ``.ico`` of ``pngs`` (paths or bytes; 16..256 px, halving the largest as needed)."""
    write_atomic(out, ico_bytes(icon_images(pngs, ICO_SIZES)), label="ico")
