"""Verify a bump file: its checksum, and every section against the GGUF it was converted from."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..gguf import GGUFFile
from .convert import section_chunks
from .plan import plan_conversion
from .reader import BumpError, BumpFile, compute_checksum, open_bump


@dataclass
class VerifyReport:
    bump: BumpFile
    checksum_ok: bool
    problems: list[str] = field(default_factory=list)
    sections_checked: int = 0

    @property
    def ok(self) -> bool:
        return self.checksum_ok and not self.problems


def verify_against(bump_path: str | os.PathLike[str], gguf_path: str | os.PathLike[str] | None = None, *,
                   manifest: str | os.PathLike[str] | None = None,
                   progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check the checksum; with ``gguf_path`` also compare header, dtype codes and every section's bytes with
    what converting that GGUF under the bump's profile produces."""
    b = open_bump(bump_path, manifest)
    total = b.file_size * (2 if gguf_path else 1)
    hash_progress = (lambda d, _t: progress(d, total)) if progress else None
    report = VerifyReport(b, compute_checksum(b.path, hash_progress) == b.header.checksum)
    if not report.checksum_ok:
        report.problems.append("checksum: the SHA-256 of bytes [128, EOF) does not match the header")
    if gguf_path is None:
        return report
    assert b.profile is not None
    with GGUFFile(gguf_path) as f:
        plan = plan_conversion(f, b.profile, b.header.context_len, drop_untied_head=True)
        want = plan.header(b.header.checksum)
        if want != b.header:
            report.problems.append(f"header: expected {want}, found {b.header}")
        if plan.codes != b.codes:
            first = next(i for i, (x, y) in enumerate(zip(plan.codes, b.codes, strict=False)) if x != y)
            report.problems.append(f"dtype table: first difference at section {first} ({plan.sections[first].name})")
            return report
        done = b.file_size
        with open(Path(bump_path), "rb") as fh:
            for s, off, have in zip(plan.sections, plan.offsets(), b.sections, strict=True):
                if (off, s.size) != (have.offset, have.size):
                    report.problems.append(f"{s.name}: at {have.offset} size {have.size}, expected {off} size {s.size}")
                    continue
                fh.seek(off)
                pos = off
                for data, _ in section_chunks(f, s):
                    got = fh.read(len(data))
                    if got != bytes(data):
                        k = next((i for i, (x, y) in enumerate(zip(got, bytes(data), strict=False)) if x != y),
                                 len(got))
                        report.problems.append(f"{s.name}: bytes differ from the GGUF source at file offset {pos + k}")
                        break
                    pos += len(data)
                    done += len(data)
                    if progress:
                        progress(done, total)
                report.sections_checked += 1
    return report


__all__ = ["BumpError", "VerifyReport", "verify_against"]
