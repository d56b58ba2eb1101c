"""An opened file as the views see it: a GGUF (with its summary) or a bump file, plus per-file caches."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantscope.core.analysis import TensorAnalysis
from quantscope.core.bump import BumpError, BumpFile, is_bump, open_bump
from quantscope.core.filestate import FileWatch
from quantscope.core.fsutil import PathRefused, check_input, printable
from quantscope.core.gguf import GGUFError, GGUFFile
from quantscope.core.summary import summarize

if TYPE_CHECKING:
    from quantscope.core.hub import Peek


class OpenError(Exception):
    """A file could not be opened; ``str()`` is the message for the user, ``detail`` the technical reason."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


@dataclass
class Document:
    """One opened file. Exactly one of ``gguf`` / ``bump`` is set. ``remote``: a GGUF on the hub, read over range
    requests (its header, then the blocks the inspector shows); ``path`` is then its name in the repository."""

    path: Path
    open_ms: float
    gguf: GGUFFile | None = None
    bump: BumpFile | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    analyses: dict[str, TensorAnalysis] = field(default_factory=dict)
    watch: FileWatch | None = None  # the file's identity when it was opened
    stale: str | None = None  # how the file changed on disk since (then its mapping must not be read again)
    remote: Peek | None = None

    def change(self) -> str | None:
        """How the file changed on disk since it was opened (``None``: unchanged); remembered once seen."""
        if self.stale is None and self.watch is not None:
            self.stale = self.watch.change()
        return self.stale

    @property
    def kind(self) -> str:
        return "gguf" if self.gguf is not None else "bump"

    @property
    def title(self) -> str:
        return self.path.name

    @property
    def location(self) -> str:
        """Where the file is: its path, or ``hf://org/repo/file.gguf``."""
        return self.remote.ref if self.remote is not None else str(self.path)

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
    try:
        watch = FileWatch(p)  # taken before the mapping: a change during the open is seen too
    except OSError as exc:
        raise OpenError(f"{p.name} cannot be read.", str(exc)) from None
    if is_bump(p):
        try:
            b = open_bump(p)
        except BumpError as exc:
            raise OpenError(f"{p.name} is not a readable bump file.", str(exc)) from None
        return Document(p, (time.perf_counter() - t0) * 1000, bump=b, watch=watch)
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
    return Document(p, (time.perf_counter() - t0) * 1000, gguf=f, summary=s, watch=watch)


def open_remote_document(ref: str, known: Peek | None = None) -> Document:
    """``hf://org/repo/file.gguf`` opened as a document without a download: its header read over range requests
    (core/hub.py's peek, with the local files' validation), summarised; blocks are fetched when shown. Network:
    run it in a worker. ``known``: its header read already (the hub view's, for the fit). Raises
    :class:`OpenError`."""
    from quantscope.core import hub

    t0 = time.perf_counter()
    try:
        repo, name = hub.parse_hf_url(ref)
        p = known if known is not None and known.ref == f"hf://{repo}/{name}" else hub.peek(repo, name)
    except hub.HubError as exc:
        raise OpenError(f"{printable(ref)} cannot be read from the hub.", str(exc)) from None
    except GGUFError as exc:
        raise OpenError(f"{printable(ref)} is not a readable GGUF file.", str(exc)) from None
    try:
        s = summarize(p.gguf)
    except Exception as exc:
        raise OpenError(f"{printable(ref)} could not be summarised.", str(exc)) from None
    s["path"] = p.ref
    return Document(Path(Path(name).name), (time.perf_counter() - t0) * 1000, gguf=p.gguf, summary=s, remote=p)
