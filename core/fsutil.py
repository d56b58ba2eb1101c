"""Safe file access for hostile paths: inputs that must be regular files, and outputs written atomically.

Inputs: :func:`open_input` refuses FIFOs, devices, sockets and directories before anything can block (``stat``
first, then ``open`` with ``O_NONBLOCK`` and ``fstat`` again, so a path swapped for a FIFO in between is still
refused).

Outputs: :class:`OutputSet` checks every output against the inputs and against each other (same real path or same
device and inode, so symlinks and hard links are caught), refuses existing non-regular outputs, writes each output
to an unnamed ``O_TMPFILE`` (or, where the filesystem lacks it, a hidden ``.NAME.tmp-PID-N``) and renames them
into place only when all were written and synced. Hidden temporaries of dead processes in an output folder are
removed on the next run there.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType

_TEMP_RE = re.compile(r"^\..+\.(?:tmp|bak)-(\d+)-\d+$")
_counter = itertools.count()


class PathRefused(ValueError):
    """A path cannot be used as given (not a regular file, aliases another path...); the message says why."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words (``"a FIFO (named pipe)"``)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_input(path: str | os.PathLike[str]) -> os.stat_result:
    """``stat`` an input path; raises :class:`PathRefused` unless it is an existing regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise PathRefused(f"{os.fspath(path)}: no such file") from None
    except OSError as exc:
        raise PathRefused(f"{os.fspath(path)}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise PathRefused(f"{os.fspath(path)}: is {kind_of(st.st_mode)}, not a regular file")
    return st


def open_input(path: str | os.PathLike[str]) -> int:
    """Open a regular file read-only and return the descriptor; never blocks on a FIFO or device.

    Raises :class:`PathRefused` for anything but an existing, readable regular file."""
    check_input(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise PathRefused(f"{os.fspath(path)}: cannot read: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # swapped between the stat and the open
        os.close(fd)
        raise PathRefused(f"{os.fspath(path)}: is {kind_of(st.st_mode)}, not a regular file")
    os.set_blocking(fd, True)
    return fd


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, someone else's
        return True
    return True


def clean_stale_temps(folder: str | os.PathLike[str]) -> list[str]:
    """Remove our hidden temporaries (``.NAME.tmp-PID-N``, ``.NAME.bak-PID-N``) left in ``folder`` by processes
    that no longer exist; regular files only. Returns the names removed."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for e in entries:
        m = _TEMP_RE.match(e.name)
        if not m or _pid_alive(int(m.group(1))):
            continue
        try:
            if not e.is_file(follow_symlinks=False):
                continue
            os.unlink(e.path)
            removed.append(e.name)
        except OSError:
            pass
    return removed


def _temp_name(target: Path, kind: str = "tmp") -> Path:
    return target.with_name(f".{target.name}.{kind}-{os.getpid()}-{next(_counter)}")


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _fsync_dir(path: Path) -> None:
    try:
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


class _Out:
    def __init__(self, label: str, given: Path, target: Path) -> None:
        self.label = label
        self.given = given
        self.target = target
        self.fd = -1
        self.named: Path | None = None  # the named temporary (fallback, or O_TMPFILE once linked)
        self.backup: Path | None = None
        self.existed = False
        self.replaced = False


class OutputSet:
    """Outputs written together: all or nothing.

    ``OutputSet([("-o", out), ("--config", cfg)], inputs=[src])`` checks the paths (raises :class:`PathRefused`);
    :meth:`open` gives a writable descriptor per label (a temporary), :meth:`commit` syncs and renames every one
    into place, leaving the old files untouched if anything fails. Leaving the ``with`` block without a commit
    discards the temporaries."""

    def __init__(self, outputs: Sequence[tuple[str, str | os.PathLike[str]]],
                 inputs: Iterable[str | os.PathLike[str]] = ()) -> None:
        ins: list[tuple[Path, str, os.stat_result | None]] = []
        for p in inputs:
            ip = Path(p)
            try:
                ist: os.stat_result | None = os.stat(ip)
            except OSError:
                ist = None
            ins.append((ip, os.path.realpath(ip), ist))
        self._outs: list[_Out] = []
        seen: list[tuple[_Out, os.stat_result | None]] = []
        for label, p in outputs:
            given = os.fspath(p)  # before Path() drops a trailing slash ("out/" names a folder, not a file)
            op = Path(p)
            if not given or given.endswith((os.sep, "/")) or given.endswith((os.sep + ".", "/.")) or op.name in (
                    "", ".", ".."):
                raise PathRefused(f"{label} {given!r}: not a file name")
            real = Path(os.path.realpath(op))
            try:
                ost: os.stat_result | None = os.stat(real)
            except FileNotFoundError:
                ost = None
            except NotADirectoryError:
                up = next((a for a in reversed(real.parents) if a.exists() and not a.is_dir()), real.parent)
                raise PathRefused(f"{label} {op}: {up} is not a directory") from None
            except OSError as exc:
                raise PathRefused(f"{label} {op}: cannot use this path: {exc.strerror}") from None
            if ost is not None and not stat.S_ISREG(ost.st_mode):
                raise PathRefused(f"{label} {op}: is {kind_of(ost.st_mode)}; an output must be a regular file "
                                  "or not exist yet")
            for ip, ireal, ist in ins:
                if str(real) == ireal or (ost is not None and ist is not None and _same(ost, ist)):
                    raise PathRefused(f"{label} {op}: is the input file {ip}; choose another output path")
            for other, other_st in seen:
                if real == other.target or (ost is not None and other_st is not None and _same(ost, other_st)):
                    raise PathRefused(f"{label} {op} and {other.label} {other.given} name the same file; "
                                      "choose different paths")
            parent = real.parent
            if parent.exists() and not parent.is_dir():
                raise PathRefused(f"{label} {op}: {parent} is not a directory")
            o = _Out(label, op, real)
            self._outs.append(o)
            seen.append((o, ost))
        self.committed = False

    def target(self, label: str) -> Path:
        """The resolved path an output will be renamed to."""
        return self._get(label).target

    def _get(self, label: str) -> _Out:
        for o in self._outs:
            if o.label == label:
                return o
        raise KeyError(label)

    def open(self, label: str) -> int:
        """Create the temporary for ``label`` (its folder too) and return a read-write descriptor."""
        o = self._get(label)
        folder = o.target.parent
        folder.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(folder)
        if hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd"):
            try:
                o.fd = os.open(folder, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o644)
                return o.fd
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
                    raise
        o.named = _temp_name(o.target)
        o.fd = os.open(o.named, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        return o.fd

    def write_text(self, label: str, text: str) -> None:
        """Write a whole text output (UTF-8) to its temporary."""
        self.write_bytes(label, text.encode("utf-8"))

    def write_bytes(self, label: str, data: bytes) -> None:
        o = self._get(label)
        fd = o.fd if o.fd >= 0 else self.open(label)
        mv = memoryview(data)
        while mv:
            mv = mv[os.write(fd, mv):]

    def commit(self) -> None:
        """Sync every temporary and rename all of them into place; on failure the targets keep their old
        content (already replaced ones are restored) and the temporaries are removed."""
        for o in self._outs:
            if o.fd < 0:
                raise RuntimeError(f"{o.label}: nothing was written")
            try:  # again: the path may have been swapped for a FIFO or device while we wrote
                mode = os.stat(o.target).st_mode
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(mode):
                raise PathRefused(f"{o.label} {o.given}: is {kind_of(mode)}; an output must be a regular file "
                                  "or not exist yet")
        for o in self._outs:
            os.fsync(o.fd)
            if o.named is None:  # give the unnamed file a (hidden) name in its folder
                name = _temp_name(o.target)
                dfd = os.open(name.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:  # an explicit dir fd makes os.link use linkat(..., AT_SYMLINK_FOLLOW)
                    os.link(f"/proc/self/fd/{o.fd}", name.name, dst_dir_fd=dfd, follow_symlinks=True)
                finally:
                    os.close(dfd)
                o.named = name
            os.close(o.fd)
            o.fd = -1
        try:
            for o in self._outs:
                if os.path.lexists(o.target):
                    o.existed = True
                    bak = _temp_name(o.target, "bak")
                    try:  # a second name keeps the old content until every rename succeeded
                        os.link(o.target, bak, follow_symlinks=False)
                        o.backup = bak
                    except OSError:  # no hard links here: that file cannot be restored
                        pass
            for o in self._outs:
                assert o.named is not None
                os.replace(o.named, o.target)
                o.named = None
                o.replaced = True
        except BaseException:
            for o in self._outs:
                if o.replaced:
                    if o.backup is not None:
                        os.replace(o.backup, o.target)
                        o.backup = None
                    elif not o.existed:
                        os.unlink(o.target)
            raise
        finally:
            for o in self._outs:
                if o.backup is not None:
                    try:
                        os.unlink(o.backup)
                    except OSError:
                        pass
                    o.backup = None
        for folder in {o.target.parent for o in self._outs}:
            _fsync_dir(folder)
        self.committed = True

    def discard(self) -> None:
        """Close and remove every temporary (the targets are untouched)."""
        for o in self._outs:
            if o.fd >= 0:
                os.close(o.fd)
                o.fd = -1
            if o.named is not None:
                try:
                    os.unlink(o.named)
                except OSError:
                    pass
                o.named = None

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.discard()


def write_atomic(path: str | os.PathLike[str], data: bytes | str, label: str = "output",
                 inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Write one file all-or-nothing through a temporary (same checks as :class:`OutputSet`)."""
    with OutputSet([(label, path)], inputs) as out:
        out.write_bytes(label, data.encode("utf-8") if isinstance(data, str) else data)
        out.commit()
        return out.target(label)


_CTRL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _esc(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def printable(text: object) -> str:
    """``str(text)`` with control characters (C0, DEL, C1, line separators, bidi overrides) escaped visibly
    (``\\x1b``, ``\\n``, ``\\u202e``), so file-controlled strings cannot drive the terminal."""
    return _CTRL.sub(_esc, str(text))


_JSON_CTRL = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def json_text(obj: object, indent: int | None = 1) -> str:
    """Strict JSON of ``obj`` (through :func:`json_safe`) that keeps non-ASCII text readable but escapes every
    control character, DEL, C1 and bidi override as ``\\uXXXX`` (they only occur inside strings)."""
    import json

    text = json.dumps(json_safe(obj), indent=indent, ensure_ascii=False, allow_nan=False)
    return _JSON_CTRL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def json_safe(obj: object) -> object:
    """A copy of ``obj`` that strict JSON can encode: NaN and ±infinity become the strings ``"nan"``,
    ``"inf"``, ``"-inf"``; numpy scalars and arrays become Python numbers and lists; tuples become lists."""
    import math

    import numpy as np

    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    elif isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {str(json_safe(k)) if not isinstance(k, str) else k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
