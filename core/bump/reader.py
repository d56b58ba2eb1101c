"""Reading, inspecting and verifying BUMPWGT3 files.

The file does not say which dtype profile it uses: a manifest beside it (ours records ``profile``) decides, else
the profile (and the kv-head count and ffn size, which the header lacks) is inferred by finding the one reading
under which every section size agrees with the header dimensions and the file length.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.ggml_types import ggml_type
from ..fsutil import PathRefused, open_input, pread, printable
from .format import CHECKSUM_OFFSET, HEADER_SIZE, MAGIC, PER_LAYER, PROFILES, BumpHeader, align_context, code_to_type

CHUNK = 8 << 20


class BumpError(ValueError):
    """A bump file is truncated, corrupted or not a BUMPWGT3 file; the message says what and where."""


@dataclass(frozen=True)
class BumpSection:
    name: str
    code: int
    type_name: str
    offset: int
    size: int


@dataclass
class BumpFile:
    """A parsed BUMPWGT3 file (header, dtype codes, sections laid out under the inferred profile)."""

    path: Path
    file_size: int
    header: BumpHeader
    codes: bytes
    profile: str | None
    profile_source: str  # "manifest" | "inferred" | "ambiguous"
    kv_heads: int | None
    ffn: int | None
    sections: list[BumpSection] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. a malformed manifest.json beside it (ignored)

    @property
    def body_offset(self) -> int:
        return HEADER_SIZE + 4 + len(self.codes)

    def checksum_ok(self, progress: Callable[[int, int], None] | None = None) -> bool:
        """Recompute SHA-256 of bytes [128, EOF) and compare with the header's."""
        return compute_checksum(self.path, progress) == self.header.checksum

    def section(self, name: str) -> BumpSection:
        for s in self.sections:
            if s.name == name:
                return s
        raise KeyError(name)


def compute_checksum(path: Path, progress: Callable[[int, int], None] | None = None) -> bytes:
    h = hashlib.sha256()
    try:
        fd = open_input(path)
    except PathRefused as exc:
        raise BumpError(str(exc)) from None
    size = os.fstat(fd).st_size
    done = HEADER_SIZE
    with os.fdopen(fd, "rb") as fh:
        fh.seek(HEADER_SIZE)
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(done, size)
    return h.digest()


def section_names(n_layers: int) -> list[str]:
    names = ["token_emb", "pos_emb"]
    for i in range(n_layers):
        names += [f"layer.{i}.{s}" for s in PER_LAYER]
    return [*names, "final_ln_gamma", "final_ln_bias"]


def _row_bytes(type_name: str, n: int) -> int | None:
    t = ggml_type(type_name)
    return None if n % t.block_elems else n // t.block_elems * t.block_bytes


def layout(h: BumpHeader, codes: bytes, profile: str, kv_heads: int, ffn: int) -> list[BumpSection] | None:
    """Section offsets and sizes under one reading, or ``None`` when the codes do not fit that profile."""
    table = code_to_type(profile)
    types = [table.get(c) for c in codes]
    if any(t is None for t in types):
        return None
    E, hd, H, C, V = h.embed_dim, h.head_dim, h.num_heads, h.context_len, h.vocab_size
    names = section_names(h.num_layers)
    sizes: list[int] = []
    for name, tname in zip(names, types, strict=True):
        assert tname is not None
        key = name.split(".")[-1]
        rows_k = {"token_emb": (V, E), "wq": (H * hd, E), "wk": (kv_heads * hd, E), "wv": (kv_heads * hd, E),
                  "wo": (E, H * hd), "w1": (2 * ffn, E), "w2": (E, ffn)}
        vec = {"pos_emb": C * E, "ln1_gamma": E, "ln2_gamma": E, "bq": H * hd, "bk": kv_heads * hd,
               "bv": kv_heads * hd, "bo": E, "b1": 2 * ffn, "b2": E, "final_ln_gamma": E, "final_ln_bias": E}
        if key in vec:
            if tname != "F32":
                return None
            sizes.append(4 * vec[key])
        else:
            rows, k = rows_k[key]
            rb = _row_bytes(tname, k)
            if rb is None:
                return None
            sizes.append(rows * rb)
    out, pos = [], HEADER_SIZE + 4 + len(codes)
    for name, tname, code, size in zip(names, types, codes, sizes, strict=True):
        assert tname is not None
        out.append(BumpSection(name, code, tname, pos, size))
        pos += size
    return out


def _solve(h: BumpHeader, codes: bytes, profile: str, file_size: int) -> list[tuple[int, int, list[BumpSection]]]:
    """Every (kv_heads, ffn) for which the layout under ``profile`` ends exactly at ``file_size``."""
    table = code_to_type(profile)
    if any(c not in table for c in codes):
        return []
    found = []
    H = h.num_heads
    for kv in _divisors(H):
        # total size is affine in ffn: evaluate at two points and solve.
        def total(ffn: int, kv: int = kv) -> int | None:
            secs = layout(h, codes, profile, kv, ffn)
            return None if secs is None else secs[-1].offset + secs[-1].size
        a, b = total(256), total(512)
        if a is None or b is None or b == a:
            continue
        slope = (b - a) / 256
        ffn_f = 256 + (file_size - a) / slope
        ffn = round(ffn_f)
        if ffn <= 0 or abs(ffn - ffn_f) > 1e-6:
            continue
        secs = layout(h, codes, profile, kv, ffn)
        if secs is not None and secs[-1].offset + secs[-1].size == file_size:
            found.append((kv, ffn, secs))
    return found


#: a manifest larger than this is not read (ours are a few KiB)
MAX_MANIFEST_BYTES = 16 << 20


def _divisors(n: int) -> list[int]:
    """Divisors of ``n`` in ascending order, in O(sqrt(n))."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i * i != n:
                large.append(n // i)
        i += 1
    return small + large[::-1]


def _check_dims(p: Path, h: BumpHeader, size: int) -> None:
    """Refuse header dimensions that cannot fit in ``size`` bytes, before any loop or layout uses them: every
    section holds at least its float32 vectors and its smallest-type matrices, so the claim must fit."""
    for name, v, at in (("num_layers", h.num_layers, 0x10), ("vocab_size", h.vocab_size, 0x14),
                        ("embed_dim", h.embed_dim, 0x18), ("context_len", h.context_len, 0x1C),
                        ("num_heads", h.num_heads, 0x20), ("head_dim", h.head_dim, 0x24)):
        if v == 0:
            raise BumpError(f"{p}: {name} is 0 at byte {at:#x}")
    if h.num_heads > h.embed_dim:
        raise BumpError(f"{p}: num_heads {h.num_heads} (byte 0x20) exceeds embed_dim {h.embed_dim}")
    E, L = h.embed_dim, h.num_layers
    # float32 vectors: pos_emb, 2 norms + bq + bo + b2 per layer (bk/bv/b1 and the matrices only add), final ln x2;
    # matrices at no less than 0.5 bytes per weight: token_emb, wq and wo per layer.
    least = (HEADER_SIZE + 4 + 14 * L + 4 + 4 * h.context_len * E + L * 5 * 4 * E + 8 * E
             + h.vocab_size * E // 2 + L * E * E)
    if least > size:
        raise BumpError(f"{p}: the header claims {L} layers, embed {E}, vocab {h.vocab_size}, context "
                        f"{h.context_len}, which need at least {least:,} bytes; the file has {size:,} (corrupted or "
                        "truncated)")


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The JSON object in a small regular file (a manifest or config.json), or ``None`` when it is missing or
    malformed (see :func:`load_manifest`)."""
    return load_manifest(path)[0]


def load_manifest(path: Path) -> tuple[dict[str, Any] | None, str]:
    """``(manifest, problem)``: a regular file of at most 16 MiB holding a JSON object, else ``None`` and why.
    Opened without blocking (a FIFO in its place is refused, never waited on)."""
    try:
        fd = open_input(path)
    except PathRefused as exc:
        why = str(exc)
        return None, why[len(f"{path}: "):] if why.startswith(f"{path}: ") else why
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            return None, f"larger than {MAX_MANIFEST_BYTES >> 20} MiB"
        man = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if not isinstance(man, dict):
        return None, f"a JSON {type(man).__name__}, not an object"
    return man, ""


def _manifest_count(v: object) -> int:
    """A positive integer from the manifest, else 0 (ignored)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 32 else 0


def open_bump(path: str | os.PathLike[str], manifest: str | os.PathLike[str] | None = None) -> BumpFile:
    """Parse a bump file; ``manifest`` (default: ``manifest.json`` beside it, if any) may name the profile."""
    p = Path(path)
    try:
        fd = open_input(p)
    except PathRefused as exc:
        raise BumpError(str(exc)) from None
    try:
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(HEADER_SIZE + 4)
            if len(head) < HEADER_SIZE:
                raise BumpError(f"{p}: file is {size} bytes, shorter than the 128-byte BUMPWGT3 header")
            if head[:8] != MAGIC:
                raise BumpError(f"{p}: bad magic {printable(head[:8])} at byte 0; expected {MAGIC!r}")
            if len(head) < HEADER_SIZE + 4:
                raise BumpError(f"{p}: file ends at byte {size}, inside the section count at byte 128")
            h = BumpHeader.unpack(head)
            if h.version != 3:
                raise BumpError(f"{p}: version {h.version} at byte 8; expected 3")
            if h.num_heads == 0 or h.embed_dim % h.num_heads or h.head_dim != h.embed_dim // h.num_heads:
                raise BumpError(f"{p}: head_dim {h.head_dim} (byte 0x24) does not equal embed_dim {h.embed_dim} / "
                                f"num_heads {h.num_heads}")
            if h.aligned_context != align_context(h.context_len):
                raise BumpError(f"{p}: aligned_context {h.aligned_context} (byte 0x38) is not context "
                                f"{h.context_len} rounded up to 16")
            _check_dims(p, h, size)
            count = int.from_bytes(head[HEADER_SIZE:], "little")
            expected_count = 14 * h.num_layers + 4
            if count != expected_count:
                raise BumpError(f"{p}: section count {count} at byte 128; expected 14*{h.num_layers}+4 = "
                                f"{expected_count}")
            codes = fh.read(count)
    except OSError as exc:
        raise BumpError(f"{path}: cannot read: {exc.strerror}") from None
    if len(codes) != count:
        raise BumpError(f"{p}: file ends at byte {size} inside the dtype table (needs {count} bytes from byte 132)")
    man_path = Path(manifest) if manifest else p.with_name("manifest.json")
    notes: list[str] = []
    man: dict[str, Any] | None = None
    if man_path.exists() or man_path.is_symlink():
        man, why = load_manifest(man_path)
        if why:
            notes.append(f"{man_path.name} beside the bump is malformed: {why}; ignored, the layout is inferred")
    man_profile = man.get("profile") if man is not None else None
    if man is not None and isinstance(man_profile, str) and man_profile in PROFILES:
        kv, ffn = _manifest_count(man.get("num_kv_heads")), _manifest_count(man.get("intermediate_size"))
        secs = layout(h, codes, man_profile, kv, ffn) if kv and ffn else None
        if secs is not None and secs[-1].offset + secs[-1].size == size:
            return BumpFile(p, size, h, codes, man_profile, "manifest", kv, ffn, secs, [man_profile], notes)
        end = f"ends at byte {secs[-1].offset + secs[-1].size}" if secs else "cannot be laid out"
        notes.append(f"{man_path.name} beside the bump does not describe it: its {man_profile} layout "
                     f"(num_kv_heads {printable(repr(man.get('num_kv_heads')))[:40]}, "
                     f"intermediate_size {printable(repr(man.get('intermediate_size')))[:40]}) "
                     f"{end}, the file has {size} bytes; ignored, the layout is inferred")
    elif man is not None and "profile" in man:
        shown = printable(repr(str(man_profile)[:40]))
        notes.append(f"{man_path.name} beside the bump names an unknown profile {shown}; ignored")
    solutions = {prof: _solve(h, codes, prof, size) for prof in PROFILES}
    fits = {prof: sols for prof, sols in solutions.items() if sols}
    if not fits:
        table_ok = [prof for prof in PROFILES if all(c in code_to_type(prof) for c in codes)]
        why = ("no dtype table contains every code" if not table_ok else
               f"no kv-head count and ffn size make the sections end at the file's {size} bytes (truncated or "
               "corrupted)")
        raise BumpError(f"{p}: cannot lay out the sections: {why}")
    if len(fits) == 1:
        prof, sols = next(iter(fits.items()))
        kv, ffn, secs = sols[0]
        return BumpFile(p, size, h, codes, prof, "inferred", kv, ffn, secs, [prof], notes)
    prof = "ckernel" if "ckernel" in fits else next(iter(fits))
    kv, ffn, secs = fits[prof][0]
    return BumpFile(p, size, h, codes, prof, "ambiguous", kv, ffn, secs, list(fits), notes)


def describe(b: BumpFile, checksum: bool | None = None) -> dict[str, Any]:
    """JSON-ready description (what ``quantscope inspect`` prints for a bump file)."""
    h = b.header
    return {
        "path": str(b.path), "file_size": b.file_size, "magic": h.magic.decode(), "version": h.version,
        "model_type": h.model_type, "num_layers": h.num_layers, "vocab_size": h.vocab_size, "embed_dim": h.embed_dim,
        "context_len": h.context_len, "num_heads": h.num_heads, "head_dim": h.head_dim,
        "aligned_embed_dim": h.aligned_embed_dim, "aligned_head_dim": h.aligned_head_dim,
        "aligned_context": h.aligned_context, "checksum": h.checksum.hex(), "checksum_ok": checksum,
        "profile": b.profile, "profile_source": b.profile_source, "profiles_that_fit": b.candidates,
        "num_kv_heads": b.kv_heads, "intermediate_size": b.ffn,
        "dtype_table": {str(code): code_to_type(b.profile).get(code) if b.profile else None
                        for code in sorted(set(b.codes))},
        "sections": [{"name": s.name, "dtype": s.type_name, "code": s.code, "offset": s.offset, "size": s.size}
                     for s in b.sections],
    }


def render_bump(d: dict[str, Any]) -> str:
    lines = [
        f"File        {d['path']}",
        f"Size        {d['file_size']:,} bytes",
        f"Format      {d['magic']} version {d['version']}, model_type {d['model_type']}",
        f"Model       {d['num_layers']} layers, embed {d['embed_dim']}, heads {d['num_heads']} x {d['head_dim']}, "
        f"kv heads {d['num_kv_heads']}, ffn {d['intermediate_size']}, vocab {d['vocab_size']}, context "
        f"{d['context_len']} (aligned {d['aligned_context']})",
        f"Profile     {d['profile']} ({d['profile_source']}"
        + (f"; also fits: {', '.join(d['profiles_that_fit'])}" if d["profile_source"] == "ambiguous" else "") + ")",
        f"Checksum    {d['checksum']}  "
        + {True: "verifies", False: "DOES NOT VERIFY", None: "(not checked)"}[d["checksum_ok"]],
        "",
        "Dtype table " + ", ".join(f"{k} = {v}" for k, v in d["dtype_table"].items()),
        "",
        f"  {'section':<22} {'dtype':<6} {'code':>4} {'offset':>14} {'size':>14}",
    ]
    for s in d["sections"]:
        lines.append(f"  {s['name']:<22} {s['type_name'] if 'type_name' in s else s['dtype']:<6} {s['code']:>4} "
                     f"{s['offset']:>14,} {s['size']:>14,}")
    return "\n".join(printable(line) for line in lines)


def is_bump(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file starting with the BUMPWGT3 magic (never opens a FIFO or device)."""
    try:
        fd = open_input(path)
    except PathRefused:
        return False
    try:
        return pread(fd, 8, 0) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


__all__ = ["CHECKSUM_OFFSET", "BumpError", "BumpFile", "BumpSection", "describe", "is_bump", "open_bump",
           "render_bump"]
