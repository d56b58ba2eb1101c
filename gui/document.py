"""An opened file as the views see it: a GGUF (with its summary) or a bump file, plus per-file caches."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantscope.core.analysis import TensorAnalysis
from quantscope.core.bump import BumpError, BumpFile, is_bump, open_bump
from quantscope.core.fsutil import PathRefused, check_input, printable
from quantscope.core.gguf import GGUFError, GGUFFile
from quantscope.core.summary import summarize


class OpenError(Exception):
    """A file could not be opened; ``str()`` is the message for the user, ``detail`` the technical reason."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


@dataclass
class Document:
    """One opened file. Exactly one of ``gguf`` / ``bump`` is set."""

    path: Path
    open_ms: float
    gguf: GGUFFile | None = None
    bump: BumpFile | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    analyses: dict[str, TensorAnalysis] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "gguf" if self.gguf is not None else "bump"

    @property
    def title(self) -> str:
        return self.path.name

    def close(self) -> None:
        if self.gguf is not None:
            self.gguf.close()


def open_document(path: str | Path) -> Document:
    """Open a GGUF (non-strict: problems are listed, not fatal) or BUMPWGT3 file; raises :class:`OpenError`."""
    p = Path(path)
    if not p.exists():
        raise OpenError(f"{p} does not exist.")
    if p.is_dir():
        raise OpenError(f"{p} is a folder, not a model file.")
    try:
        check_input(p)  # a FIFO, device or socket would block or never end: refused before any open
    except PathRefused as exc:
        raise OpenError(f"{printable(p.name)} is not a regular file.", str(exc)) from None
    t0 = time.perf_counter()
    if is_bump(p):
        try:
            b = open_bump(p)
        except BumpError as exc:
            raise OpenError(f"{p.name} is not a readable bump file.", str(exc)) from None
        return Document(p, (time.perf_counter() - t0) * 1000, bump=b)
    try:
        f = GGUFFile(p, strict=False)
    except GGUFError as exc:
        raise OpenError(f"{p.name} is not a readable GGUF file.", str(exc)) from None
    except OSError as exc:
        raise OpenError(f"{p.name} cannot be read.", str(exc)) from None
    try:
        s = summarize(f)
    except Exception as exc:  # a file that parses but cannot be summarised is still a bad file
        f.close()
        raise OpenError(f"{p.name} could not be summarised.", str(exc)) from None
    return Document(p, (time.perf_counter() - t0) * 1000, gguf=f, summary=s)
