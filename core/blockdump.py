"""Text and JSON rendering of one decoded block (``quantscope dump-block``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .fsutil import printable
from .gguf import GGUFFile
from .quant import DecodedBlock, decode_block


def locate_and_decode(f: GGUFFile, tensor: str, row: int, block: int) -> tuple[DecodedBlock, int]:
    """Decode block ``block`` of row ``row`` of ``tensor``; returns it with its absolute file offset."""
    t = f.tensor(tensor)
    off, _ = f.block_location(t, row, block)
    assert t.type is not None
    return decode_block(t.type, f.block_bytes(t, row, block)), off


def hexdump(raw: bytes, base: int = 0, width: int = 16) -> list[str]:
    """Classic hex dump lines with in-block offsets (and absolute offsets when ``base`` is given)."""
    out = []
    for i in range(0, len(raw), width):
        chunk = raw[i : i + width]
        hx = " ".join(f"{b:02x}" for b in chunk)
        out.append(f"  +{i:03d}  {base + i:>12,}  {hx}")
    return out


def _fmt_field_value(v: Any) -> str:
    if isinstance(v, dict) and "bits" in v:
        return f"0x{v['bits']:04x} = {v['float']:.8g}"
    if isinstance(v, list):
        return " ".join(str(x) for x in v)
    if isinstance(v, int):
        return f"0x{v:08x}"
    return str(v)


def render_block(b: DecodedBlock, *, tensor: str = "", row: int = 0, block: int = 0, file_offset: int = 0,
                 element: int | None = None) -> str:
    """Human-readable dump: raw hex, every field, unpacked scales with bit sources, codes and values."""
    L: list[str] = []
    L.append(f"{tensor}  row {row}  block {block}  type {b.type.name}  "
             f"({b.type.block_bytes} bytes, {b.type.block_elems} elements) at file offset {file_offset:,}")
    L.append(f"formula: {b.formula}")
    L.append("")
    L.append("raw bytes")
    L.extend(hexdump(b.raw, file_offset))
    L.append("")
    L.append("fields")
    for fd in b.fields:
        L.append(f"  {fd.name:<9} @{fd.offset:<3d} {fd.size:>3} B  {fd.kind:<5} {fd.description}")
        if isinstance(fd.value, list) and len(fd.value) > 16:
            for i in range(0, len(fd.value), 16):
                L.append("      " + " ".join(f"{x:4d}" for x in fd.value[i : i + 16]))
        else:
            L.append(f"      {_fmt_field_value(fd.value)}")
    if b.scales:
        L.append("")
        L.append("unpacked scales")
        for name, vals in b.scales.items():
            L.append(f"  {name:<3} " + " ".join(f"{v:4d}" for v in vals))
        for name, srcs in b.scale_sources.items():
            L.append(f"  bit sources of {name}[i] (block byte[bits] -> value bits):")
            for i, parts in enumerate(srcs):
                desc = ", ".join(
                    f"byte {p.byte}[{p.bit_lo + p.n_bits - 1}:{p.bit_lo}] -> bits {p.value_bit + p.n_bits - 1}:"
                    f"{p.value_bit}" for p in parts)
                L.append(f"    {name}[{i}] = {b.scales[name][i]:>3}  <- {desc}")
    if b.code_bits:
        L.append("")
        L.append(f"codes ({b.code_bits}-bit, stored) by element; group = scale group of {b.group_size}")
        for i in range(0, len(b.raw_code), 32):
            L.append(f"  [{i:3d}] g{int(b.group[i]):<2d} " + " ".join(f"{int(c):2d}" for c in b.raw_code[i : i + 32]))
    L.append("")
    vals = b.values
    with np.errstate(invalid="ignore"):
        L.append(f"values (float32): min {np.nanmin(vals) if np.isfinite(vals).any() else float('nan'):.6g}  "
                 f"max {np.nanmax(vals) if np.isfinite(vals).any() else float('nan'):.6g}  "
                 f"nan {int(np.isnan(vals).sum())}  inf {int(np.isinf(vals).sum())}")
    for i in range(0, len(vals), 8):
        L.append(f"  [{i:3d}] " + " ".join(f"{float(v):>12.6g}" for v in vals[i : i + 8]))
    if element is not None:
        L.append("")
        L.append(b.explain(element))
    return "\n".join(printable(line) for line in L)


def block_to_json(b: DecodedBlock, *, tensor: str, row: int, block: int, file_offset: int) -> dict[str, Any]:
    """JSON-ready form of a decoded block."""
    return {
        "tensor": tensor,
        "row": row,
        "block": block,
        "type": b.type.name,
        "file_offset": file_offset,
        "raw_hex": b.raw.hex(),
        "formula": b.formula,
        "fields": [
            {"name": fd.name, "offset": fd.offset, "size": fd.size, "kind": fd.kind, "value": fd.value,
             "description": fd.description}
            for fd in b.fields
        ],
        "scales": b.scales,
        "scale_sources": {
            k: [[{"byte": p.byte, "bit_lo": p.bit_lo, "n_bits": p.n_bits, "value_bit": p.value_bit} for p in parts]
                for parts in v]
            for k, v in b.scale_sources.items()
        },
        "codes": b.raw_code.tolist(),
        "groups": b.group.tolist(),
        "values": [float(v) for v in b.values],
    }
