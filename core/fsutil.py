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

Per OS (this module is the file-safety seam; :mod:`.sysinfo` holds the other OS facts): the ``open`` flags that
only some systems have are the module constants :data:`O_BINARY`, :data:`O_NONBLOCK`, … (0 where absent, so
``os.open`` never meets an ``AttributeError``; every descriptor is opened ``O_BINARY`` on Windows, where ``os.open``
would otherwise translate line ends). Linux writes ``O_TMPFILE`` files and links them with ``linkat``; macOS,
Windows and filesystems without it use the named hidden temporary. Windows replaces an existing target with
``os.replace`` too, but not one another program has open, nor a read-only one: both are refused with one line
(:class:`TargetInUse`), as are names Windows forbids (:func:`windows_name_problem`; :func:`portable_name` makes a
name from data valid everywhere). Directories are synced only on POSIX. :func:`pread` / :func:`pwrite` /
:func:`pread_into` are positional I/O everywhere (Windows has no ``pread``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

from . import sysinfo
from .shardnames import sibling_shards

WINDOWS = sys.platform == "win32"
LINUX = sys.platform.startswith("linux")

#: ``open`` flags that exist on some systems only, 0 where absent: Windows has just ``O_BINARY`` (and needs it:
#: without it ``os.open`` gives a text-mode descriptor); POSIX has the others (``O_CLOEXEC`` is what Python's
#: ``os.open`` adds by itself; it stays spelled out)
O_BINARY: int = getattr(os, "O_BINARY", 0)
O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
O_NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)
O_NOCTTY: int = getattr(os, "O_NOCTTY", 0)
O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)
#: read-only and read-write descriptors of binary files, on every OS
O_READ = os.O_RDONLY | O_BINARY | O_CLOEXEC
O_READWRITE = os.O_RDWR | O_BINARY | O_CLOEXEC
#: tests switch this off to exercise the named-temporary path Linux shares with every other OS
USE_O_TMPFILE = True

#: our temporaries' names: ``.NAME.quantscope-tmp-PID-TOKEN`` (``bak`` for the backup of a replaced file); the
#: token is 12 random hex digits, so no name a person or another program gives a file matches by chance
TEMP_MARK = "quantscope-"
_TEMP_RE = re.compile(r"^\..+\.quantscope-(?:tmp|bak)-([1-9][0-9]{0,9})-[0-9a-f]{12}$")
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
        fd = os.open(path, O_READ | O_NONBLOCK | O_NOCTTY)
    except OSError as exc:
        raise PathRefused(f"{os.fspath(path)}: cannot read: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # swapped between the stat and the open
        os.close(fd)
        raise PathRefused(f"{os.fspath(path)}: is {kind_of(st.st_mode)}, not a regular file")
    if O_NONBLOCK and hasattr(os, "set_blocking"):  # POSIX: reads of the regular file block as usual again
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
    """Whether ``pid`` may be a running process (anything odd, a PID beyond the OS's range included: yes)."""
    return sysinfo.pid_running(pid)


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


#: file systems that compare names without case by default: NTFS (Windows) and APFS/HFS+ (macOS)
CASELESS_NAMES = WINDOWS or sys.platform == "darwin"


def _same_name(a: Path, b: Path) -> bool:
    """Whether two resolved paths name one file: equal, or (Windows, macOS) equal but for case."""
    if CASELESS_NAMES:
        return os.fspath(a).casefold() == os.fspath(b).casefold()
    return a == b


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _fsync_dir(path: Path) -> None:
    """Sync a folder's entries (POSIX; Windows cannot open a directory as a descriptor, and NTFS journals the
    rename itself)."""
    if WINDOWS:
        return
    try:
        dfd = os.open(path, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _link_unnamed(fd: int, name: Path) -> Path:
    """Linux: give the ``O_TMPFILE`` file behind ``fd`` the name ``name`` (``linkat`` of ``/proc/self/fd/N``)."""
    if not LINUX:
        raise OSError(errno.ENOTSUP, "unnamed temporaries exist on Linux only")
    dfd = os.open(name.parent, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    try:  # an explicit dir fd makes os.link use linkat(..., AT_SYMLINK_FOLLOW)
        os.link(f"/proc/self/fd/{fd}", name.name, dst_dir_fd=dfd, follow_symlinks=True)
    finally:
        os.close(dfd)
    return name


def _hard_link(src: Path, dst: Path) -> None:
    """A second name for the regular file ``src`` (its symlink not followed on POSIX; Windows' CreateHardLink
    takes no such choice, and ``src`` is a resolved path there)."""
    if WINDOWS:
        os.link(src, dst)
    else:
        os.link(src, dst, follow_symlinks=False)


class TargetInUse(PermissionError):
    """Windows would not replace an output: another program has the file open (or it became read-only). The
    message is one line naming the file."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _replace(src: Path, dst: Path) -> None:
    """``os.replace``; on Windows a target open elsewhere (or read-only) raises :class:`TargetInUse` with a
    one-line reason instead of a bare "Access is denied"."""
    try:
        os.replace(src, dst)
    except PermissionError as exc:
        if not WINDOWS:
            raise
        raise TargetInUse(exc.errno, "another program has this file open (or it is read-only), and Windows does "
                          "not replace such a file; close it there and try again", os.fspath(dst)) from None


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
            if WINDOWS and (problem := windows_name_problem(op.name)):
                raise PathRefused(f"{label} {op}: {problem}")
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
            if WINDOWS and ost is not None and not ost.st_mode & stat.S_IWRITE:
                raise PathRefused(f"{label} {op}: is read-only, and Windows does not replace a read-only file; "
                                  "clear its read-only attribute or choose another output path")
            for ip, ireal, ikey in ins:
                if str(real) == ireal or (ost is not None and ikey == (ost.st_dev, ost.st_ino)):
                    raise PathRefused(f"{label} {op}: is the input file {ip}; choose another output path")
            for other, other_st in seen:
                if _same_name(real, other.target) or (ost is not None and other_st is not None
                                                      and _same(ost, other_st)):
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
        if LINUX and USE_O_TMPFILE and hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd"):
            try:  # Linux: an unnamed file, linked in at commit (nothing to clean up after a kill -9)
                o.fd = os.open(folder, os.O_TMPFILE | O_READWRITE, 0o644)
                return o.fd
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
                    raise
        o.named = temp_name(o.target)  # every other OS and filesystem: a hidden named temporary
        o.fd = os.open(o.named, O_READWRITE | os.O_CREAT | os.O_EXCL, 0o644)
        return o.fd

    def write_text(self, label: str, text: str) -> None:
        """Write a whole text output (UTF-8) to its temporary."""
        self.write_bytes(label, text.encode("utf-8"))

    def write_bytes(self, label: str, data: bytes | bytearray | memoryview) -> None:
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
            if o.named is None:  # Linux's O_TMPFILE: give the unnamed file a (hidden) name in its folder
                o.named = _link_unnamed(o.fd, temp_name(o.target))
            os.close(o.fd)
            o.fd = -1
        try:
            for o in self._outs:
                if os.path.lexists(o.target):
                    o.existed = True
                    bak = temp_name(o.target, "bak")
                    try:  # a second name keeps the old content until every rename succeeded
                        _hard_link(o.target, bak)
                        o.backup = bak
                    except (OSError, NotImplementedError):  # no hard links here: that file cannot be restored
                        pass
            for o in self._outs:
                assert o.named is not None
                _replace(o.named, o.target)
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


# ------------------------------------------------------------------------------------ file names on every OS
#: device names Windows reserves in every folder, with any extension (``NUL.txt`` too)
WINDOWS_RESERVED = frozenset({"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$",
                              *(f"{dev}{n}" for dev in ("COM", "LPT") for n in (*"0123456789", "\u00b9",
                                                                                  "\u00b2", "\u00b3"))})
#: characters no Windows file name may hold (besides the controls U+0000..U+001F)
WINDOWS_FORBIDDEN_CHARS = '<>:"/\\|?*'
#: the longest file name: 255 UTF-16 units on Windows (NTFS) and macOS (APFS), 255 bytes on Linux
NAME_MAX = 255
_BAD_CHAR = re.compile('[<>:"/\\\\|?*\x00-\x1f\x7f]')


def windows_name_problem(name: str) -> str | None:
    """Why Windows cannot have a file named ``name`` (one path component), in words; None when it can. Checked
    on every OS, so that names made from data can be tested here."""
    if name in ("", ".", ".."):
        return "is not a file name"
    bad = next((c for c in name if c in WINDOWS_FORBIDDEN_CHARS or ord(c) < 32), None)
    if bad is not None:
        return f"contains {bad!r}, which Windows does not allow in a file name"
    if name[-1] in ". ":
        return "ends with a dot or a space, which Windows drops from a file name"
    if name.split(".")[0].rstrip(" ").upper() in WINDOWS_RESERVED:
        return f"{name.split('.')[0].rstrip(' ')!r} is a device name Windows reserves in every folder"
    if len(name.encode("utf-16-le")) // 2 > NAME_MAX:
        return f"is longer than the {NAME_MAX} characters Windows allows in a file name"
    return None


def portable_name(name: str, fallback: str = "_") -> str:
    """``name`` (from data: a model or tensor name, a pattern, a title) made a file name every OS accepts: path
    separators, ``<>:"|?*`` and control characters become ``_``, trailing dots and spaces go, a Windows device
    name gets a ``_`` in front (``CON.gguf`` -> ``_CON.gguf``), and a name over 255 UTF-8 bytes is cut before its
    extension. ``fallback`` when nothing is left."""
    text = _BAD_CHAR.sub("_", name)
    if len(text.encode("utf-8")) > NAME_MAX:
        stem, dot, ext = text.rpartition(".")
        if not dot or len(ext) > 16:
            stem, ext = text, ""
        suffix = f".{ext}" if ext else ""
        keep = NAME_MAX - len(suffix.encode("utf-8"))
        stem = stem.encode("utf-8")[:keep].decode("utf-8", errors="ignore")
        text = stem + suffix
    text = text.rstrip(". ")
    if not text or text in (".", ".."):
        return fallback
    if text.split(".")[0].rstrip(" ").upper() in WINDOWS_RESERVED:
        text = "_" + text
        if len(text.encode("utf-8")) > NAME_MAX:
            text = text.encode("utf-8")[:NAME_MAX].decode("utf-8", errors="ignore").rstrip(". ")
    return text


# ------------------------------------------------------------------------------------------ positional I/O
#: tests switch this off to exercise the seek-and-read path of systems without ``pread`` (Windows)
USE_OS_PREAD = True
_SEEK_LOCK = threading.Lock()


def pread(fd: int, n: int, offset: int) -> bytes:
    """Up to ``n`` bytes at ``offset`` of ``fd`` (fewer only at the end of the file), the descriptor's position
    unchanged: ``os.pread`` on POSIX; on Windows a seek, reads and a seek back, serialised by a lock among the
    callers of this module."""
    if USE_OS_PREAD and hasattr(os, "pread"):
        return os.pread(fd, n, offset)
    with _SEEK_LOCK:
        here = os.lseek(fd, 0, os.SEEK_CUR)
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            parts: list[bytes] = []
            left = n
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 30))
                if not chunk:
                    break
                parts.append(chunk)
                left -= len(chunk)
            return b"".join(parts)
        finally:
            os.lseek(fd, here, os.SEEK_SET)


def pread_into(fd: int, buf: memoryview | bytearray, offset: int) -> int:
    """Read ``len(buf)`` bytes at ``offset`` into ``buf`` (``os.preadv`` where it exists, else :func:`pread`);
    the count read."""
    if USE_OS_PREAD and hasattr(os, "preadv"):
        return os.preadv(fd, [buf], offset)
    data = pread(fd, len(buf), offset)
    memoryview(buf)[: len(data)] = data
    return len(data)


def pwrite(fd: int, data: bytes | memoryview, offset: int) -> int:
    """Write all of ``data`` at ``offset`` of ``fd``, the descriptor's position unchanged (``os.pwrite`` on POSIX;
    a seek, writes and a seek back under the lock elsewhere); the count written."""
    if USE_OS_PREAD and hasattr(os, "pwrite"):
        mv, pos = memoryview(data), offset
        while mv:
            done = os.pwrite(fd, mv, pos)
            mv, pos = mv[done:], pos + done
        return pos - offset
    with _SEEK_LOCK:
        here = os.lseek(fd, 0, os.SEEK_CUR)
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            mv = memoryview(data)
            while mv:
                mv = mv[os.write(fd, mv):]
            return len(data)
        finally:
            os.lseek(fd, here, os.SEEK_SET)


#: whether the kernel can copy between files itself (Linux, FreeBSD); elsewhere callers copy with pread and write
HAS_COPY_FILE_RANGE = hasattr(os, "copy_file_range")


def copy_file_range(src_fd: int, dst_fd: int, count: int, offset: int) -> int:
    """Copy up to ``count`` bytes at ``offset`` of ``src_fd`` to ``dst_fd``'s current position in the kernel
    (``os.copy_file_range``); the count copied, 0 at the source's end. Raises ``OSError`` as the kernel does
    (``EXDEV``, ``EINVAL``, ``EOPNOTSUPP``: copy by hand instead), and ``ENOSYS`` where the OS has no such call
    (macOS, Windows)."""
    if hasattr(os, "copy_file_range"):
        return os.copy_file_range(src_fd, dst_fd, count, offset)
    raise OSError(errno.ENOSYS, "copy_file_range does not exist on this system")


def release_cached_pages(fd: int, offset: int, length: int) -> None:
    """Advise the OS that ``[offset, offset + length)`` of ``fd`` is not needed soon (``posix_fadvise``
    ``DONTNEED``: Linux starts writing its dirty pages back without waiting and drops the clean ones from the page
    cache); nothing where there is no such call (macOS, Windows). Advice only: errors are ignored."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def release_mapped_pages(m: object, start: int, length: int) -> None:
    """Let the OS drop the resident pages of ``[start, start + length)`` of the read-only mapping ``m`` (an
    ``mmap.mmap``; page-aligned range): ``madvise(MADV_DONTNEED)`` where it exists, nothing on Windows (it drops
    a file view's pages by itself under pressure)."""
    import mmap

    if not hasattr(mmap, "MADV_DONTNEED") or not hasattr(m, "madvise"):
        return
    try:
        m.madvise(mmap.MADV_DONTNEED, start, length)
    except (OSError, ValueError):
        pass


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
