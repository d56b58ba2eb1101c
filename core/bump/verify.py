"""Verify a bump file: its checksum, and every section against the GGUF it was converted from."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..fsutil import PathRefused, open_input
from ..gguf import GGUFFile
from .convert import section_chunks
from .plan import plan_conversion
from .reader import BumpError, BumpFile, compute_checksum, open_bump, read_manifest

#: config.json key -> (what it must equal, read from the bump), checked when a config.json lies beside the file.
_CONFIG_FIELDS = (("num_hidden_layers", "num_layers"), ("hidden_size", "embed_dim"),
                  ("num_attention_heads", "num_heads"), ("vocab_size", "vocab_size"),
                  ("max_position_embeddings", "context_len"), ("num_key_value_heads", "kv_heads"),
                  ("intermediate_size", "ffn"))


@dataclass
class VerifyReport:
    bump: BumpFile
    checksum_ok: bool
    problems: list[str] = field(default_factory=list)
    sections_checked: int = 0

    @property
    def ok(self) -> bool:
        return self.checksum_ok and not self.problems


def config_problems(b: BumpFile, config: str | os.PathLike[str] | None = None) -> list[str]:
    """Disagreements between the bump's header (and inferred kv heads / ffn) and a config.json (default: the
    one beside the file, if any)."""
    path = Path(config) if config else b.path.with_name("config.json")
    cfg = read_manifest(path)
    if cfg is None:
        return []
    have = {"num_layers": b.header.num_layers, "embed_dim": b.header.embed_dim, "num_heads": b.header.num_heads,
            "vocab_size": b.header.vocab_size, "context_len": b.header.context_len, "kv_heads": b.kv_heads,
            "ffn": b.ffn}
    out = []
    for key, mine in _CONFIG_FIELDS:
        if key in cfg and have[mine] is not None and cfg[key] != have[mine]:
            out.append(f"{path.name}: {key} is {cfg[key]!r} but the bump has {mine} {have[mine]}")
    return out


def verify_against(bump_path: str | os.PathLike[str], gguf_path: str | os.PathLike[str] | None = None, *,
                   manifest: str | os.PathLike[str] | None = None, config: str | os.PathLike[str] | None = None,
                   progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check the checksum, the header fields the checksum does not cover (model_type, aligned sizes, reserved
    bytes) and a config.json beside the file; with ``gguf_path`` also compare header, dtype codes and every
    section's bytes with what converting that GGUF under the bump's profile produces."""
    b = open_bump(bump_path, manifest)
    total = b.file_size * (2 if gguf_path else 1)
    hash_progress = (lambda d, _t: progress(d, total)) if progress else None
    report = VerifyReport(b, compute_checksum(b.path, hash_progress) == b.header.checksum)
    if not report.checksum_ok:
        report.problems.append("checksum: the SHA-256 of bytes [128, EOF) does not match the header")
    report.problems += b.header.field_problems()
    report.problems += config_problems(b, config)
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
        try:
            fd = open_input(bump_path)
        except PathRefused as exc:
            raise BumpError(str(exc)) from None
        with os.fdopen(fd, "rb") as fh:
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
