"""Safe file access for hostile paths: inputs that must be regular files, and outputs written atomically.

Inputs: :func:`open_input` refuses FIFOs, devices, sockets and directories before anything can block (``stat``
first, then ``open`` with ``O_NONBLOCK`` and ``fstat`` again, so a path swapped for a FIFO in between is still
refused).

Outputs: :class:`OutputSet` checks every output against the inputs and against each other (same real path or same
device and inode, so symlinks and hard links are caught), refuses existing non-regular outputs, writes each output
to an unnamed ``O_TMPFILE`` (or, where the filesystem lacks it, a hidden ``.NAME.quantscope-tmp-PID-TOKEN``) and
renames them into place only when all were written and synced. Hidden temporaries of dead processes in an output
folder are removed on the next run there: only names carrying that marker (``quantscope-``, a PID and a 12-digit
random token), so a user's ``.bashrc.bak-2024-1`` is never touched.

The input set: inside :func:`input_scope` (the CLI runs every verb in one) each file read through
:func:`check_input` / :func:`open_input` is remembered with its real path and device/inode, and every
:class:`OutputSet` of that scope refuses to write over any of them, whichever writer it is. Inputs given to an
:class:`OutputSet` explicitly count with every shard their name says they belong to.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

from .shardnames import sibling_shards

#: our temporaries' names: ``.NAME.quantscope-tmp-PID-TOKEN`` (``bak`` for the backup of a replaced file); the
#: token is 12 random hex digits, so no name a person or another program gives a file matches by chance
TEMP_MARK = "quantscope-"
_TEMP_RE = re.compile(r"^\..+\.quantscope-(?:tmp|bak)-([1-9][0-9]{0,9})-[0-9a-f]{12}$")
#: Linux's largest PID (``pid_max`` is at most 2**22)
_PID_MAX = 1 << 22
#: at most this many characters of the target's name go into a temporary's name (NAME_MAX is 255 bytes)
_NAME_KEEP = 64


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


class _InputSet:
    """The files the current command read: (given path, real path, device and inode)."""

    def __init__(self) -> None:
        self.files: list[tuple[str, str, tuple[int, int]]] = []

    def add(self, path: str | os.PathLike[str], st: os.stat_result) -> None:
        given = os.fspath(path)
        key = (st.st_dev, st.st_ino)
        if all(k != key for _g, _r, k in self.files):
            self.files.append((given, os.path.realpath(given), key))


_scope: _InputSet | None = None


@contextlib.contextmanager
def input_scope() -> Iterator[_InputSet]:
    """Remember every input read inside the block (through :func:`check_input` / :func:`open_input`); every
    :class:`OutputSet` made inside it refuses those files as outputs. The CLI runs each verb in one."""
    global _scope
    outer, _scope = _scope, _InputSet()
    try:
        yield _scope
    finally:
        _scope = outer


def scope_inputs() -> list[str]:
    """The inputs the current :func:`input_scope` has seen (empty outside one)."""
    return [g for g, _r, _k in _scope.files] if _scope is not None else []


def check_input(path: str | os.PathLike[str]) -> os.stat_result:
    """``stat`` an input path; raises :class:`PathRefused` unless it is an existing regular file. Inside an
    :func:`input_scope` the file joins the command's input set."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise PathRefused(f"{os.fspath(path)}: no such file") from None
    except OSError as exc:
        raise PathRefused(f"{os.fspath(path)}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise PathRefused(f"{os.fspath(path)}: is {kind_of(st.st_mode)}, not a regular file")
    if _scope is not None:
        _scope.add(path, st)
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


#: the largest text file a command reads whole (a calibration text, a rule file, a chat template)
MAX_TEXT_BYTES = 256 << 20


def read_text_input(path: str | os.PathLike[str], label: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of the regular file ``path`` (CR LF and CR read as LF, as text mode does), through
    :func:`open_input` (no FIFO, device or directory; never blocks) and at most ``max_bytes`` long. Raises
    :class:`PathRefused` naming ``label`` with the reason."""
    fd = open_input(path)
    where = f"{label} {os.fspath(path)}" if label else os.fspath(path)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise PathRefused(f"{where}: {size:,} bytes; a text file may hold at most {max_bytes:,}")
        with os.fdopen(os.dup(fd), "rb") as fp:
            data = fp.read(max_bytes + 1)
    except OSError as exc:
        raise PathRefused(f"{where}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise PathRefused(f"{where}: grew beyond {max_bytes:,} bytes while it was read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PathRefused(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` may be a running process (anything odd, a PID beyond Linux's range included: yes)."""
    if pid == os.getpid() or not 0 < pid <= _PID_MAX:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):  # EPERM: alive, someone else's
        return True
    return True


def is_stale_temp(name: str) -> bool:
    """Whether ``name`` is one of our temporaries (see :func:`temp_name`) whose process no longer runs."""
    m = _TEMP_RE.match(name)
    return m is not None and not _pid_alive(int(m.group(1)))


def clean_stale_temps(folder: str | os.PathLike[str]) -> list[str]:
    """Remove our hidden temporaries (``.NAME.quantscope-tmp-PID-TOKEN``, ``…-bak-…``) left in ``folder`` by
    processes that no longer exist; regular files only, never any other name. Returns the names removed."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for e in entries:
        try:
            if not is_stale_temp(e.name):
                continue
        except (ValueError, OverflowError):
            continue
        try:
            if not e.is_file(follow_symlinks=False):
                continue
            os.unlink(e.path)
            removed.append(e.name)
        except OSError:
            pass
    return removed


def temp_name(target: Path, kind: str = "tmp") -> Path:
    """A fresh hidden name beside ``target`` for our temporary: ``.NAME.quantscope-KIND-PID-TOKEN`` (NAME cut to
    64 characters so that a long file name still leaves room)."""
    return target.with_name(f".{target.name[:_NAME_KEEP]}.{TEMP_MARK}{kind}-{os.getpid()}-{secrets.token_hex(6)}")


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


def _input_set(inputs: Iterable[str | os.PathLike[str]],
               replaces: Iterable[str | os.PathLike[str]]) -> list[tuple[str, str, tuple[int, int] | None]]:
    """(path, real path, device and inode) of every input an output must not be: the given ones with the shards
    their names (or their links' targets) imply, and the current scope's, less ``replaces``."""
    found: list[tuple[str, str, tuple[int, int] | None]] = []
    for p in inputs:
        real = os.path.realpath(p)
        for q in dict.fromkeys([Path(p), *sibling_shards(p), *sibling_shards(real)]):
            try:
                st = os.stat(q)
                key: tuple[int, int] | None = (st.st_dev, st.st_ino)
            except (OSError, ValueError):
                key = None
            found.append((os.fspath(q), os.path.realpath(q), key))
    if _scope is not None:
        found += _scope.files
    skip_real: set[str] = set()
    skip_key: set[tuple[int, int]] = set()
    for r in replaces:
        skip_real.add(os.path.realpath(r))
        try:
            st = os.stat(r)
            skip_key.add((st.st_dev, st.st_ino))
        except OSError:
            pass
    return [(g, r, k) for g, r, k in found if r not in skip_real and (k is None or k not in skip_key)]


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
                 inputs: Iterable[str | os.PathLike[str]] = (), *,
                 replaces: Iterable[str | os.PathLike[str]] = (), make_dirs: bool = False) -> None:
        """``inputs``: files the outputs must not be (with every shard of a split model their names imply, and,
        inside an :func:`input_scope`, every file the command read); ``replaces``: inputs an output may
        nevertheless replace (``edit --force``); ``make_dirs``: create a missing output folder (our own data
        folders) instead of refusing it."""
        ins = _input_set(inputs, replaces)
        self._make_dirs = make_dirs
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
            for ip, ireal, ikey in ins:
                if str(real) == ireal or (ost is not None and ikey == (ost.st_dev, ost.st_ino)):
                    raise PathRefused(f"{label} {op}: is the input file {ip}; choose another output path")
            for other, other_st in seen:
                if real == other.target or (ost is not None and other_st is not None and _same(ost, other_st)):
                    raise PathRefused(f"{label} {op} and {other.label} {other.given} name the same file; "
                                      "choose different paths")
            parent = real.parent
            if parent.exists() and not parent.is_dir():
                raise PathRefused(f"{label} {op}: {parent} is not a directory")
            if not make_dirs and not parent.exists():
                raise PathRefused(f"{label} {op}: the folder {parent} does not exist (create it first)")
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
        """Create the temporary for ``label`` (its folder too with ``make_dirs``) and return a read-write
        descriptor."""
        o = self._get(label)
        folder = o.target.parent
        if self._make_dirs:
            folder.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(folder)
        if hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd"):
            try:
                o.fd = os.open(folder, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o644)
                return o.fd
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
                    raise
        o.named = temp_name(o.target)
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
                name = temp_name(o.target)
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
                    bak = temp_name(o.target, "bak")
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
                 inputs: Iterable[str | os.PathLike[str]] = (), *, make_dirs: bool = False) -> Path:
    """Write one file all-or-nothing through a temporary (same checks as :class:`OutputSet`)."""
    with OutputSet([(label, path)], inputs, make_dirs=make_dirs) as out:
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
