"""Has an opened file changed on disk? Identity stamps (size, mtime, inode) and the error for "it did".

Model files are memory-mapped: truncating or replacing one while it is read makes the mapped pages unreadable.
The native kernels turn that into :class:`~quantscope.core.native.kernels.MappedFileError` (a
:class:`FileChangedError`); Python code that is about to read a mapping for long compares stamps first.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path


class FileChangedError(Exception):
    """An opened (memory-mapped) file changed on disk while it was in use; ``str()`` says how, when known."""


@dataclass(frozen=True)
class FileStamp:
    """What identifies one version of a file: device, inode, size and modification time."""

    dev: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | Path) -> FileStamp | None:
        """The file's stamp now, or ``None`` when it no longer exists (or cannot be stat'ed)."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def content_identity(path: str | Path) -> str:
    """A file's identity by its content, for caches keyed to one file: its size and the SHA-256 of its first and
    last 4 MiB (the header, the tensor table and a stretch of the data) -- not a hash of gigabytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        h.update(str(size).encode())
        h.update(fh.read(4 << 20))
        if size > 8 << 20:
            fh.seek(size - (4 << 20))
            h.update(fh.read(4 << 20))
    return h.hexdigest()[:32]


def describe_change(old: FileStamp, new: FileStamp | None) -> str | None:
    """How ``new`` differs from ``old`` in words, or ``None`` when it is the same version of the file."""
    if new is None:
        return "it was deleted or renamed"
    if (new.dev, new.inode) != (old.dev, old.inode):
        return "it was replaced by another file"
    if new.size != old.size:
        return f"its size went from {old.size:,} to {new.size:,} bytes"
    if new.mtime_ns != old.mtime_ns:
        return "it was modified"
    return None


class FileWatch:
    """The stamp of a file taken when it was opened, to compare against later."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        stamp = FileStamp.of(self.path)
        if stamp is None:
            raise FileNotFoundError(str(self.path))
        self.stamp = stamp

    def change(self) -> str | None:
        """How the file changed since it was opened, or ``None``."""
        return describe_change(self.stamp, FileStamp.of(self.path))

    def check(self) -> None:
        """Raise :class:`FileChangedError` when the file changed since it was opened."""
        what = self.change()
        if what is not None:
            raise FileChangedError(f"{self.path.name} changed on disk: {what}")
