"""Every OS-specific call of core/, cli/ and gui/ sits in its seam, under a branch per OS.

The scanner reads the source (ast) for the modules, ``os``/``signal``/``mmap`` names, call arguments and path
literals that exist on only some systems (Linux/POSIX: ``fcntl``, ``resource``, ``O_TMPFILE``, ``/proc``,
``os.pread``, ``SIGBUS``, ``fork`` …; Windows: ``winreg``, ``msvcrt``, ``O_BINARY``, ``ctypes.windll`` …). Outside
the seam modules any such use fails the test; inside them each must sit under a test of the OS (``sys.platform``,
``os.name``, ``hasattr``/``getattr`` of the module, a module flag set from one of those, an early return on one),
or in a ``try`` that catches ``ImportError``/``AttributeError``. The seams' own behaviour is tested below on this
machine: the name checks, the memory and descriptor figures against ``/proc``, the parsers of the other systems'
outputs with sample text, and the named-temporary and seek-and-read paths of the systems without ``O_TMPFILE`` and
``pread``, forced here."""

from __future__ import annotations

import ast
import errno
import mmap
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from quantscope.core import bench, cpu, fsutil, sysinfo
from quantscope.core.fsutil import OutputSet, PathRefused, portable_name, windows_name_problem, write_atomic

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("core", "cli", "gui")

#: the seams: the only modules that may use an OS-specific call (each under a branch per OS)
SEAMS = {
    "core/fsutil.py": "files: open flags, O_TMPFILE+linkat vs named temporaries, replace, positional I/O, names",
    "core/sysinfo.py": "memory, descriptors, RSS, processes",
    "core/cpu.py": "the CPU's name (/proc/cpuinfo, sysctl, the Windows registry)",
    "core/desktop.py": "desktop integration (XDG, the macOS bundle, the Windows registry)",
    "core/desktop_xdg.py": "desktop integration: Linux and BSD (XDG)",
    "core/desktop_macos.py": "desktop integration: macOS",
    "core/desktop_windows.py": "desktop integration: Windows",
}
#: seams that are one OS's branch as a whole (core/desktop.py picks one per OS): their uses need no test inside
ONE_OS_MODULES = {"core/desktop_xdg.py", "core/desktop_macos.py", "core/desktop_windows.py"}

#: uses still outside a seam, (file, name) -> the seam call that replaces it (none left). The test fails when one of
#: these is gone (delete its line), so the list only shrinks.
PENDING: dict[tuple[str, str], str] = {}

#: modules that exist on some systems only
OS_MODULES = {"fcntl", "resource", "pwd", "grp", "termios", "tty", "pty", "posix", "crypt", "spwd", "syslog",
              "winreg", "_winreg", "msvcrt", "_winapi", "winsound", "_overlapped", "nt"}
#: ``os`` names that are missing, or do something else, on Windows or on macOS (``os.kill(pid, 0)`` terminates the
#: process on Windows), or exist on Windows only
OS_NAMES = {
    "O_NOFOLLOW", "O_TMPFILE", "O_DIRECTORY", "O_CLOEXEC", "O_NONBLOCK", "O_NOCTTY", "O_PATH", "O_NOATIME",
    "O_DIRECT", "O_SYNC", "O_DSYNC", "O_RSYNC", "O_ASYNC", "O_NDELAY", "O_LARGEFILE", "O_SHLOCK", "O_EXLOCK",
    "O_BINARY", "O_NOINHERIT", "O_TEXT", "O_SEQUENTIAL", "O_RANDOM", "O_SHORT_LIVED", "O_TEMPORARY",
    "getuid", "geteuid", "getgid", "getegid", "getgroups", "setuid", "setgid", "seteuid", "setegid", "fork",
    "forkpty", "killpg", "getpgid", "setpgid", "setsid", "getsid", "getpgrp", "setpgrp", "sched_getaffinity",
    "sched_setaffinity", "statvfs", "fstatvfs", "sysconf", "sysconf_names", "pathconf", "fpathconf", "confstr",
    "pread", "pwrite", "preadv", "pwritev", "copy_file_range", "sendfile", "splice", "posix_fadvise",
    "posix_fallocate", "POSIX_FADV_DONTNEED", "POSIX_FADV_SEQUENTIAL", "POSIX_FADV_WILLNEED", "mkfifo", "mknod",
    "major", "minor", "makedev", "chown", "lchown", "fchown", "fchmod", "lchmod", "getloadavg", "nice", "wait3",
    "wait4", "WNOHANG", "sync", "fdatasync", "memfd_create", "set_blocking", "get_blocking", "uname", "kill",
    "lockf", "openpty", "ttyname", "ctermid", "getpriority", "setpriority", "eventfd", "pidfd_open", "posix_spawn",
    "posix_spawnp", "register_at_fork", "startfile", "add_dll_directory", "get_handle_inheritable",
    "set_handle_inheritable", "getresuid", "getresgid", "initgroups", "getlogin",
}
#: ``signal`` names Windows has; every other ``SIG*`` is POSIX-only (or, SIGBREAK, Windows-only)
SIGNALS_EVERYWHERE = {"SIGINT", "SIGTERM", "SIGABRT", "SIGFPE", "SIGILL", "SIGSEGV", "SIG_DFL", "SIG_IGN"}
SIGNAL_FUNCS = {"alarm", "setitimer", "getitimer", "pthread_kill", "pthread_sigmask", "sigwait", "sigwaitinfo",
                "sigtimedwait", "siginterrupt", "sigpending", "pause", "CTRL_C_EVENT", "CTRL_BREAK_EVENT"}
#: keyword arguments of subprocess / os / mmap calls that only some systems take
OS_KEYWORDS = {"preexec_fn", "start_new_session", "pass_fds", "process_group", "extra_groups", "umask",
               "creationflags", "startupinfo", "dir_fd", "src_dir_fd", "dst_dir_fd"}
#: path literals of one OS family
OS_PATHS = ("/proc", "/sys/", "/dev/")
#: environment variables of one OS family (X11/Wayland sessions, XDG folders, Windows' profile folders)
OS_ENV = {"DISPLAY", "WAYLAND_DISPLAY", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR",
          "XDG_CURRENT_DESKTOP", "LOCALAPPDATA", "APPDATA", "USERPROFILE"}
#: ctypes' Windows-only names
CTYPES_WINDOWS = {"windll", "WinDLL", "oledll", "OleDLL", "WINFUNCTYPE", "GetLastError", "FormatError", "WinError",
                  "get_last_error", "set_last_error"}
#: flags (fsutil's) that make an ``os.open`` descriptor binary on Windows, where it is text mode by default
BINARY_FLAGS = {"O_BINARY", "O_READ", "O_READWRITE"}
#: exception types whose ``except`` makes a ``try`` body a branch per OS
GUARD_EXCEPTIONS = {"ImportError", "ModuleNotFoundError", "AttributeError", "NotImplementedError"}


@dataclass(frozen=True)
class Use:
    """One OS-specific use: where, what, and whether it sits under an OS branch."""

    path: str
    line: int
    name: str
    guarded: bool


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _is_os_test(expr: ast.AST, flags: set[str]) -> bool:
    """Whether an expression tests the OS: ``sys.platform``, ``os.name``, ``platform.system()``, ``hasattr`` /
    ``getattr`` of something, or a flag set from one of those."""
    for n in ast.walk(expr):
        d = _dotted(n)
        if d in ("sys.platform", "os.name", "platform.system") or d in flags:
            return True
        if isinstance(n, ast.Name) and n.id in flags:
            return True
        if isinstance(n, ast.Attribute) and n.attr in flags:  # sysinfo.WINDOWS, fsutil.LINUX
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("hasattr", "getattr"):
            return True
    return False


def _module_flags(tree: ast.Module) -> set[str]:
    """Module-level names assigned from an OS test (``WINDOWS = sys.platform == "win32"``), and the flags the
    seams export under those names."""
    flags = {"WINDOWS", "LINUX", "MACOS", "POSIX"}
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        is_test = isinstance(value, (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.Call))  # a truth value, not a number
        if value is not None and is_test and _is_os_test(value, flags):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flags |= {t.id for t in targets if isinstance(t, ast.Name)}
    return flags


def _exits(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def _guarded(chain: list[tuple[ast.AST, str, int]], flags: set[str]) -> bool:
    """Whether the innermost node of ``chain`` (ancestors with the field and index the path went through) sits
    under an OS branch."""
    for parent, field, index in chain:
        if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and field in ("body", "orelse") and _is_os_test(
                parent.test, flags):
            return True
        if isinstance(parent, ast.BoolOp) and index > 0 and any(_is_os_test(v, flags)
                                                                for v in parent.values[:index]):
            return True  # ``hasattr(os, "x") and os.x(...)``
        if isinstance(parent, ast.Try) and field == "body":
            for h in parent.handlers:
                names = {_dotted(e) for e in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])} \
                    if h.type is not None else {"BaseException"}
                if names & GUARD_EXCEPTIONS:
                    return True
        if field in ("body", "orelse", "finalbody") and index >= 0:  # an earlier ``if <os test>: return``
            siblings = getattr(parent, field)
            for s in siblings[:index]:
                if isinstance(s, ast.If) and _is_os_test(s.test, flags) and (_exits(s.body) or _exits(s.orelse)):
                    return True
    return False


def _binary_flags(flags: ast.AST, chain: list[tuple[ast.AST, str, int]]) -> bool:
    """Whether an ``os.open`` flags expression has ``O_BINARY`` (or fsutil's ``O_READ``/``O_READWRITE``), itself
    or through a variable assigned in the same function (``flags = … | getattr(os, "O_BINARY", 0)``)."""

    def mentions(expr: ast.AST) -> bool:
        return any((isinstance(n, (ast.Name, ast.Attribute)) and _dotted(n).split(".")[-1] in BINARY_FLAGS)
                   or (isinstance(n, ast.Constant) and n.value in BINARY_FLAGS) for n in ast.walk(expr))

    if mentions(flags):
        return True
    names = {n.id for n in ast.walk(flags) if isinstance(n, ast.Name)}
    func = next((p for p, _f, _i in chain if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    return func is not None and any(
        isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in a.targets)
        and mentions(a.value) for a in ast.walk(func))


def scan_source(text: str, path: str = "<source>") -> list[Use]:
    """Every OS-specific use in a module's source, with whether it is under an OS branch."""
    tree = ast.parse(text, path)
    flags = _module_flags(tree)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    uses: list[Use] = []

    def hit(node: ast.AST, name: str, chain: list[tuple[ast.AST, str, int]]) -> None:
        uses.append(Use(path, getattr(node, "lineno", 0), name, _guarded(chain, flags)))

    def visit(node: ast.AST, chain: list[tuple[ast.AST, str, int]]) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for m in mods:
                if m.split(".")[0] in OS_MODULES:
                    hit(node, f"import {m.split('.')[0]}", chain)
        elif isinstance(node, ast.Attribute):
            base = _dotted(node.value)
            if base == "os" and node.attr in OS_NAMES:
                hit(node, f"os.{node.attr}", chain)
            elif base == "signal" and ((node.attr.startswith("SIG") and node.attr not in SIGNALS_EVERYWHERE)
                                       or node.attr.startswith("ITIMER_") or node.attr in SIGNAL_FUNCS):
                hit(node, f"signal.{node.attr}", chain)
            elif base == "mmap" and node.attr.startswith(("MAP_", "PROT_", "MADV_")):
                hit(node, f"mmap.{node.attr}", chain)
            elif node.attr == "madvise":
                hit(node, "madvise", chain)
            elif base.split(".")[-1] == "ctypes" and node.attr in CTYPES_WINDOWS:
                hit(node, f"ctypes.{node.attr}", chain)
        elif isinstance(node, ast.Call):
            func = _dotted(node.func)
            if func == "os.open" and len(node.args) >= 2 and not _binary_flags(node.args[1], chain):
                hit(node, "os.open without O_BINARY", chain)
            for kw in node.keywords:
                if kw.arg in OS_KEYWORDS:
                    hit(node, f"{func or 'call'}({kw.arg}=)", chain)
                elif func == "mmap.mmap" and kw.arg in ("prot", "flags", "tagname"):
                    hit(node, f"mmap({kw.arg}=)", chain)
                elif func in ("os.link", "os.chmod", "os.utime") and kw.arg == "follow_symlinks":
                    hit(node, f"{func}(follow_symlinks=)", chain)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value.startswith(OS_PATHS) or node.value in ("/proc", "/dev/fd"):
                hit(node, f"path {node.value.split()[0][:24]!r}", chain)
            elif node.value in OS_ENV:
                hit(node, f"env {node.value}", chain)
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if isinstance(child, ast.AST):
                        visit(child, [(node, field, i), *chain])
            elif isinstance(value, ast.AST):
                visit(value, [(node, field, -1), *chain])

    visit(tree, [])
    return uses


def scan_tree(root: Path = ROOT) -> list[Use]:
    uses: list[Use] = []
    for top in SCANNED:
        for p in sorted((root / top).rglob("*.py")):
            rel = p.relative_to(root).as_posix()
            uses += scan_source(p.read_text(encoding="utf-8"), rel)
    return uses


# -------------------------------------------------------------------------------------------- the scanner
def test_os_specific_calls_sit_in_their_seams_under_a_branch_per_os() -> None:
    uses = scan_tree()
    outside = [u for u in uses if u.path not in SEAMS and (u.path, u.name) not in PENDING]
    unbranched = [u for u in uses if u.path in SEAMS and u.path not in ONE_OS_MODULES and not u.guarded]
    assert not outside, "OS-specific calls outside a seam (use core/fsutil.py or core/sysinfo.py):\n" + "\n".join(
        f"  {u.path}:{u.line}: {u.name}" for u in outside)
    assert not unbranched, "OS-specific calls in a seam without a branch per OS:\n" + "\n".join(
        f"  {u.path}:{u.line}: {u.name}" for u in unbranched)
    found = {(u.path, u.name) for u in uses}
    stale = sorted(k for k in PENDING if k not in found)
    assert not stale, f"no longer used there: delete from PENDING: {stale}"


def test_the_seams_do_hold_the_calls_they_are_for() -> None:
    """The scanner sees the real thing: the seams' own branches are found (and found guarded)."""
    names = {(u.path, u.name) for u in scan_tree()}
    for want in [("core/fsutil.py", "os.O_TMPFILE"), ("core/fsutil.py", "path '/proc/self/fd'"),
                 ("core/fsutil.py", "os.pread"), ("core/sysinfo.py", "import resource"),
                 ("core/sysinfo.py", "path '/proc/meminfo'"), ("core/sysinfo.py", "ctypes.WinDLL"),
                 ("core/sysinfo.py", "os.kill"), ("core/cpu.py", "import winreg"),
                 ("core/cpu.py", "path '/proc/cpuinfo'")]:
        assert want in names, want


PLANTED = '''
import os
import sys
import fcntl

def bad(fd):
    return os.pread(fd, 4, 0), open("/proc/self/status").read()

def good(fd):
    if hasattr(os, "pread"):
        return os.pread(fd, 4, 0)
    return b""

def early(fd):
    if sys.platform == "win32":
        return None
    return os.sysconf("SC_PAGE_SIZE")

def guarded_import():
    try:
        import resource
    except ImportError:
        return None
    return resource

WINDOWS = os.name == "nt"
LIMIT = 1 if WINDOWS else 2

def flagged():
    return 0 if WINDOWS else os.getuid()

def not_a_flag():
    return 0 if LIMIT else os.getgid()

def kill_it(pid):
    os.kill(pid, 0)
    os.open("x", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=3)
    os.open("y", fsutil.O_READ), os.open("z", os.O_RDWR | O_BINARY)
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0)
    os.open("w", flags)
'''


def test_the_scanner_finds_a_planted_violation() -> None:
    uses = scan_source(PLANTED, "planted.py")
    got = {(u.line, u.name, u.guarded) for u in uses}
    assert (4, "import fcntl", False) in got
    assert (7, "os.pread", False) in got and (7, "path '/proc/self/status'", False) in got
    assert (11, "os.pread", True) in got
    assert (17, "os.sysconf", True) in got
    assert (21, "import resource", True) in got
    assert (30, "os.getuid", True) in got and (33, "os.getgid", False) in got
    assert {(36, "os.kill", False), (37, "os.O_NOFOLLOW", False), (37, "os.open(dir_fd=)", False),
            (37, "os.open without O_BINARY", False)} <= got
    assert sum(not u.guarded for u in uses) == 8


def test_a_violation_in_a_copy_of_the_tree_fails_the_check(tmp_path: Path) -> None:
    """A copy of the scanned folders with one planted call outside the seams: the check's list is not empty."""
    import shutil

    for top in SCANNED:
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.pyc"))
    (tmp_path / "core" / "planted.py").write_text("import os\n\n\ndef f():\n    return os.getuid()\n")
    outside = [u for u in scan_tree(tmp_path) if u.path not in SEAMS and (u.path, u.name) not in PENDING]
    assert [(u.path, u.name) for u in outside] == [("core/planted.py", "os.getuid")]


# ----------------------------------------------------------------------------------------- names on every OS
@pytest.mark.parametrize("name", ["CON", "con", "nul.txt", "NUL.tar.gz", "Aux", "PRN.gguf", "COM1", "lpt9.log",
                                  "COM\u00b9", "CONIN$", "a<b", "a>b", "a:b", 'a"b', "a/b", "a\\b", "a|b", "a?b",
                                  "a*b", "tab\there", "nl\n", "x\x00", "trailing.", "trailing ", "..", ".", "",
                                  "x" * 256, "\u00e9" * 256])
def test_names_windows_forbids(name: str) -> None:
    assert windows_name_problem(name)
    fixed = portable_name(name)
    assert windows_name_problem(fixed) is None and len(fixed.encode("utf-8")) <= 255, fixed


@pytest.mark.parametrize("name", ["model.gguf", "CONSOLE.txt", "com10", "LPT", "nul-model.gguf", ".hidden",
                                  "Qwen2.5-0.5B-Q4_K_M.gguf", "x" * 255, "\u00e9" * 255, "a b.txt", "con_x"])
def test_names_windows_accepts_are_kept(name: str) -> None:
    assert windows_name_problem(name) is None
    if len(name.encode("utf-8")) <= 255:
        assert portable_name(name) == name


def test_portable_name_keeps_the_extension_and_whole_characters() -> None:
    long = "\u00e9" * 200 + ".gguf"
    fixed = portable_name(long)
    assert fixed.endswith("\u00e9.gguf") and len(fixed.encode("utf-8")) <= 255
    assert portable_name("blk.0/attn:q?") == "blk.0_attn_q_" and portable_name("CON.gguf") == "_CON.gguf"
    assert portable_name("...") == "_" and portable_name(" . ", "export") == "export"


def test_names_from_data_are_portable() -> None:
    """File names the app makes from data (a tensor or key name, a conversation's title) are ones every OS
    accepts; archive members the catalogue keeps are refused in one line when some OS could not hold them."""
    from quantscope.core import catalog

    kept: set[str] = set()
    catalog.check_member_name("a.tar.gz", "p/models/ggml-vocab-llama.gguf", "vocab", "ggml-vocab-llama.gguf", kept)
    catalog.check_member_name("a.tar.gz", "p/models/templates/x.jinja", "templates", "GGML-vocab-llama.gguf", kept)
    for name, why in (("con.jinja", "device name"), ("a:b.jinja", "':'"), ("GGML-VOCAB-LLAMA.gguf", "only in case"),
                      ("x.jinja ", "ends with a dot or a space"), ("a\\b.jinja", "'\\\\\\\\'")):
        with pytest.raises(catalog.FetchError, match=why) as exc:
            catalog.check_member_name("a.tar.gz", f"p/models/{name}", "vocab", name, kept)
        assert "\n" not in str(exc.value) and str(exc.value).startswith("a.tar.gz: the member p/models/")
    folder = catalog.cache_dir() / catalog.LLAMA_DATA.name
    if folder.is_dir():  # the pinned archive's members, as fetched: every one passes
        kept = set()
        for p in sorted(folder.rglob("*")):
            if p.is_file() and p.parent != folder:
                catalog.check_member_name("a", p.name, p.parent.name, p.name, kept)
    pytest.importorskip("PySide6")
    from quantscope.gui.exports import _safe_name
    from quantscope.gui.views.chat_persist import export_file_name

    assert [_safe_name(n) for n in ("CON", "aux.weight", "blk.0.attn_q.weight", "a/b:c", "..", "x" * 300)] == [
        "_CON", "_aux.weight", "blk.0.attn_q.weight", "a_b_c", "export", "x" * 120]
    assert export_file_name("con", "md") == "_con.md" and export_file_name("LPT1", "json") == "_LPT1.json"
    assert export_file_name("How do I: x?", "md") == "How do I_ x_.md" and export_file_name(" ", "md") == \
        "conversation.md"
    assert export_file_name("é" * 300, "json") == "é" * 120 + ".json"
    for made in (_safe_name("CON") + ".npy", export_file_name("nul", "md"), export_file_name("ab" * 200, "md")):
        assert windows_name_problem(made) is None, made


def test_a_windows_writer_refuses_a_forbidden_name_in_one_line(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fsutil, "WINDOWS", True)  # the check itself is plain Python: run it here
    for bad, why in (("NUL.gguf", "device name"), ("a:b.json", "':'"), ("out.", "ends with a dot")):
        with pytest.raises(PathRefused, match=why) as exc:
            write_atomic(tmp_path / bad, "x")
        assert "\n" not in str(exc.value) and str(exc.value).startswith("output ")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    write_atomic(tmp_path / "out.", "x")  # Linux keeps such a name
    assert (tmp_path / "out.").read_text() == "x"


def test_a_windows_writer_refuses_a_read_only_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "ro.json"
    target.write_text("old")
    target.chmod(0o444)
    monkeypatch.setattr(fsutil, "WINDOWS", True)
    with pytest.raises(PathRefused, match="is read-only, and Windows does not replace"):
        write_atomic(target, "new")
    assert target.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["ro.json"]


def test_a_target_windows_cannot_replace_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What Windows answers for a target another program has open (PermissionError) becomes one line, and the
    old file and folder stay as they were."""
    target = tmp_path / "busy.gguf"
    target.write_bytes(b"old")
    real = os.replace

    def denied(a, b):  # type: ignore[no-untyped-def]
        if Path(b) == target:
            raise PermissionError(errno.EACCES, "Access is denied")
        return real(a, b)

    monkeypatch.setattr(fsutil, "WINDOWS", True)
    monkeypatch.setattr(os, "replace", denied)
    with pytest.raises(fsutil.TargetInUse) as exc:
        write_atomic(target, b"new")
    assert str(exc.value) == (f"{target}: another program has this file open (or it is read-only), and Windows "
                              "does not replace such a file; close it there and try again")
    assert target.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["busy.gguf"]


def test_outputs_differing_only_in_case_collide_where_names_are_caseless(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """On Windows and macOS ``Out.json`` and ``out.json`` are one file: refused before anything is written."""
    outs = [("-o", tmp_path / "Model.gguf"), ("--config", tmp_path / "model.GGUF")]
    with OutputSet(outs):  # Linux: two files
        pass
    monkeypatch.setattr(fsutil, "CASELESS_NAMES", True)
    with pytest.raises(PathRefused, match="name the same file"):
        OutputSet(outs)
    assert list(tmp_path.iterdir()) == []


# -------------------------------------------------------------------------------- fsutil's other-OS paths
def test_the_named_temporary_path_leaves_no_debris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The path macOS and Windows take (no O_TMPFILE), forced here: hidden named temporaries while writing, the
    targets replaced at commit, nothing else left; a discarded set leaves nothing at all."""
    monkeypatch.setattr(fsutil, "USE_O_TMPFILE", False)
    (tmp_path / "b.json").write_text("old")
    with OutputSet([("a", tmp_path / "a.bin"), ("b", tmp_path / "b.json")]) as out:
        out.write_bytes("a", b"\r\n\x1a\x00binary")
        out.write_text("b", "new\n")
        during = sorted(os.listdir(tmp_path))
        assert len(during) == 3 and all(n.startswith((".a.bin.quantscope-tmp-", ".b.json.quantscope-tmp-"))
                                        for n in during if n != "b.json")
        out.commit()
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.json"]
    assert (tmp_path / "a.bin").read_bytes() == b"\r\n\x1a\x00binary" and (tmp_path / "b.json").read_text() == "new\n"
    with OutputSet([("c", tmp_path / "c.bin")]) as out:
        out.write_bytes("c", b"x")
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.json"]


def test_the_windows_write_path_replaces_and_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsutil's Windows branches, forced here (the OS calls are this machine's, the logic is Windows'): named
    temporaries, hard-link backups without ``follow_symlinks``, no folder sync; a failed second rename restores
    the first target, and nothing is left beside the targets."""
    monkeypatch.setattr(fsutil, "WINDOWS", True)
    monkeypatch.setattr(fsutil, "LINUX", False)
    synced: list[Path] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(Path(f"/fd/{fd}")))
    a, b = tmp_path / "a.gguf", tmp_path / "b.json"
    a.write_bytes(b"old a")
    write_atomic(a, b"new a")
    assert a.read_bytes() == b"new a" and sorted(os.listdir(tmp_path)) == ["a.gguf"] and len(synced) == 1
    real = os.replace

    def second_fails(src, dst):  # type: ignore[no-untyped-def]
        if Path(dst) == b:
            raise PermissionError(errno.EACCES, "Access is denied")
        return real(src, dst)

    b.write_text("old b")
    monkeypatch.setattr(os, "replace", second_fails)
    with OutputSet([("a", a), ("b", b)]) as out, pytest.raises(fsutil.TargetInUse, match="another program"):
        out.write_bytes("a", b"newer a")
        out.write_bytes("b", b"new b")
        out.commit()
    assert a.read_bytes() == b"new a" and b.read_text() == "old b"
    assert sorted(os.listdir(tmp_path)) == ["a.gguf", "b.json"]


def test_positional_io_without_pread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The seek-and-read path of systems without ``pread`` (Windows), forced here: same bytes as ``os.pread``,
    and the descriptor's position is left where it was."""
    p = tmp_path / "f.bin"
    p.write_bytes(bytes(range(256)) * 64)
    fd = os.open(p, fsutil.O_READWRITE)
    try:
        os.lseek(fd, 7, os.SEEK_SET)
        for use_os in (True, False):
            monkeypatch.setattr(fsutil, "USE_OS_PREAD", use_os)
            assert fsutil.pread(fd, 10, 1000) == bytes(range(256))[1000 % 256:1000 % 256 + 10]
            assert fsutil.pread(fd, 100, len(p.read_bytes()) - 4) == bytes([252, 253, 254, 255])
            buf = bytearray(5)
            assert fsutil.pread_into(fd, memoryview(buf), 256 + 3) == 5 and bytes(buf) == bytes([3, 4, 5, 6, 7])
            assert fsutil.pwrite(fd, b"\r\n\x1a", 16) == 3 and fsutil.pread(fd, 3, 16) == b"\r\n\x1a"
            assert os.lseek(fd, 0, os.SEEK_CUR) == 7
    finally:
        os.close(fd)


def test_release_mapped_pages_is_harmless(tmp_path: Path) -> None:
    p = tmp_path / "m.bin"
    p.write_bytes(b"\x01" * (4 * mmap.PAGESIZE))
    with open(p, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        fsutil.release_mapped_pages(m, 0, 2 * mmap.PAGESIZE)
        assert m[: mmap.PAGESIZE] == b"\x01" * mmap.PAGESIZE  # a file mapping reads back from the file


def test_kernel_copy_and_cache_advice_with_and_without_the_os_calls(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``copy_file_range`` copies where the OS has it and says ENOSYS where it has not (macOS, Windows: forced here
    by removing the call), so callers copy by hand; ``release_cached_pages`` is advice, a no-op without
    ``posix_fadvise``. Both leave the bytes as they were."""
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    src.write_bytes(bytes(range(256)) * 16)
    fd_in, fd_out = os.open(src, fsutil.O_READ), os.open(dst, fsutil.O_READWRITE | os.O_CREAT, 0o644)
    try:
        if fsutil.HAS_COPY_FILE_RANGE:
            copied = 0
            while copied < 1000:
                n = fsutil.copy_file_range(fd_in, fd_out, 1000 - copied, 100 + copied)
                assert n > 0
                copied += n
            assert dst.read_bytes() == src.read_bytes()[100:1100]
        fsutil.release_cached_pages(fd_in, 0, 4096)
        for name in ("copy_file_range", "posix_fadvise"):
            monkeypatch.delattr(os, name, raising=False)
        with pytest.raises(OSError) as exc:
            fsutil.copy_file_range(fd_in, fd_out, 10, 0)
        assert exc.value.errno == errno.ENOSYS
        fsutil.release_cached_pages(fd_in, 0, 4096)
        assert src.read_bytes() == bytes(range(256)) * 16
    finally:
        os.close(fd_in)
        os.close(fd_out)


def test_convert_and_edit_without_kernel_copy_or_pread_write_the_same_bytes(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The bump conversion and the metadata edit as on Windows (no ``copy_file_range``, no ``pread``: forced
    here) write the same files as Linux's kernel-copy path."""
    from quantscope.core.bump import ConvertJob
    from quantscope.core.gguf import edit

    from .test_bump import write_model

    src = write_model(tmp_path / "m.gguf", types={"embd": "F32"})
    ConvertJob(src, tmp_path / "linux.bump").run()
    edit.save_edited(src, tmp_path / "linux.gguf", [])
    monkeypatch.setattr(fsutil, "HAS_COPY_FILE_RANGE", False)
    monkeypatch.setattr(edit, "USE_COPY_FILE_RANGE", False)
    monkeypatch.setattr(fsutil, "USE_OS_PREAD", False)
    ConvertJob(src, tmp_path / "windows.bump").run()
    edit.save_edited(src, tmp_path / "windows.gguf", [])
    assert (tmp_path / "linux.bump").read_bytes() == (tmp_path / "windows.bump").read_bytes()
    assert (tmp_path / "linux.gguf").read_bytes() == (tmp_path / "windows.gguf").read_bytes()


@pytest.mark.skipif(not hasattr(os, "preadv"), reason="POSIX's positional calls")
def test_positional_io_is_the_os_call_where_it_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the OS has them the hot paths (bump convert, edit copy) get ``os.pread``/``os.preadv``/``os.pwrite``
    themselves: no seek, hence no lock (the seek-and-read path would call ``lseek``, which fails here)."""
    p = tmp_path / "f.bin"
    p.write_bytes(bytes(range(256)))

    def no_seek(*a: object) -> int:
        raise AssertionError("lseek called")

    fd = os.open(p, fsutil.O_READWRITE)
    monkeypatch.setattr(os, "lseek", no_seek)
    try:
        buf = bytearray(4)
        assert fsutil.pread(fd, 3, 10) == bytes([10, 11, 12]) and fsutil.pread_into(fd, buf, 20) == 4
        assert bytes(buf) == bytes([20, 21, 22, 23]) and fsutil.pwrite(fd, b"xy", 0) == 2
    finally:
        os.close(fd)
    assert p.read_bytes()[:3] == b"xy\x02"


def test_every_flag_is_an_int_and_binary_descriptors_are_the_default() -> None:
    for name in ("O_BINARY", "O_CLOEXEC", "O_NONBLOCK", "O_NOCTTY", "O_NOFOLLOW", "O_DIRECTORY"):
        assert isinstance(getattr(fsutil, name), int)
    assert fsutil.O_BINARY == getattr(os, "O_BINARY", 0)
    assert fsutil.O_READ & fsutil.O_BINARY == fsutil.O_BINARY
    assert fsutil.O_READWRITE & os.O_RDWR == os.O_RDWR


# ------------------------------------------------------------------------------------------------ sysinfo
def _meminfo() -> dict[str, int]:
    return sysinfo.parse_meminfo(Path("/proc/meminfo").read_text())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compares with Linux's /proc")
def test_memory_figures_match_proc() -> None:
    info = _meminfo()
    assert sysinfo.memory_total() == info["MemTotal"]
    avail = sysinfo.memory_available()
    room = sysinfo.cgroup_room()
    assert avail is not None and 0 < avail <= info["MemTotal"]
    assert abs(avail - min(info["MemAvailable"], room if room is not None else 1 << 62)) < 256 << 20
    assert sysinfo.memory_total() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compares with Linux's /proc")
def test_descriptor_and_rss_figures_match_proc() -> None:
    import resource

    before = sysinfo.open_fd_count()
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(5)]
    try:
        assert sysinfo.open_fd_count() == len(os.listdir("/proc/self/fd")) and before is not None
        assert sysinfo.open_fd_count() == before + 5
    finally:
        for fd in fds:
            os.close(fd)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert sysinfo.open_fd_limits() == (None if soft == resource.RLIM_INFINITY else soft,
                                        None if hard == resource.RLIM_INFINITY else hard)
    assert sysinfo.raise_open_fd_limit(soft)
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    assert abs(sysinfo.rss_bytes() - int(status["VmRSS"].split()[0]) * 1024) < 64 << 20
    assert sysinfo.peak_rss_bytes() >= int(status["VmHWM"].split()[0]) * 1024
    assert bench.rss_bytes is sysinfo.rss_bytes and bench.peak_rss_bytes is sysinfo.peak_rss_bytes


def test_pid_running() -> None:

    assert sysinfo.pid_running(os.getpid()) and sysinfo.pid_running(sysinfo.PID_MAX + 1)
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not sysinfo.pid_running(p.pid)


def test_parse_meminfo_sample() -> None:
    text = ("MemTotal:       16315284 kB\nMemFree:         1033264 kB\nMemAvailable:   10248812 kB\n"
            "HugePages_Total:       0\n")
    assert sysinfo.parse_meminfo(text) == {"MemTotal": 16315284 * 1024, "MemFree": 1033264 * 1024,
                                           "MemAvailable": 10248812 * 1024, "HugePages_Total": 0}


VM_STAT = """Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                                9517.
Pages active:                            400000.
Pages inactive:                          396417.
Pages speculative:                         2043.
Pages throttled:                              0.
Pages wired down:                        160229.
Pages purgeable:                           8170.
"Translation faults":                 389172536.
Pages stored in compressor:              575104.
"""


def test_parse_vm_stat_sample() -> None:
    """macOS' ``vm_stat`` (Apple silicon: 16 KiB pages): free + inactive + speculative pages."""
    assert sysinfo.parse_vm_stat(VM_STAT) == (9517 + 396417 + 2043) * 16384
    assert sysinfo.parse_vm_stat(VM_STAT.replace("16384", "4096")) == (9517 + 396417 + 2043) * 4096
    assert sysinfo.parse_vm_stat("") is None and sysinfo.parse_vm_stat("vm_stat: command not found") is None


def test_win32_structures_are_laid_out_as_windows_headers_say() -> None:
    """``MEMORYSTATUSEX`` and ``PROCESS_MEMORY_COUNTERS`` as MinGW-w64's headers lay them out for 64-bit Windows
    (sizeof and offsetof printed by a program built with x86_64-w64-mingw32-gcc, run under Wine, which also
    answered GlobalMemoryStatusEx, K32GetProcessMemoryInfo, and error 87 from OpenProcess for a PID that does not
    exist). ctypes' sizes here are Win64's (LLP64: size_t 8 bytes, uint32 4)."""
    import ctypes

    assert ctypes.sizeof(ctypes.c_size_t) == 8, "a 64-bit interpreter"
    m, c = sysinfo.MemoryStatusEx, sysinfo.ProcessMemoryCounters
    assert (ctypes.sizeof(m), m.ullTotalPhys.offset, m.ullAvailPhys.offset) == (64, 8, 16)
    assert (ctypes.sizeof(c), c.PeakWorkingSetSize.offset, c.WorkingSetSize.offset,
            c.PeakPagefileUsage.offset) == (72, 8, 16, 64)


def test_descriptor_limits_drive_the_server_and_split() -> None:
    from quantscope.core.gguf.split import SplitError, _enough_descriptors
    from quantscope.core.server.connections import FD_RESERVE, default_max_connections

    soft, hard = sysinfo.open_fd_limits()
    used = sysinfo.open_fd_count()
    if soft is not None and used is not None:
        assert abs(default_max_connections() - max(4, min(1024, soft - used - FD_RESERVE))) <= 2
    _enough_descriptors(1)  # nothing to raise
    assert sysinfo.open_fd_limits() == (soft, hard)
    if hard is not None:
        with pytest.raises(SplitError, match=f"more than this system allows \\({hard:,}\\)") as exc:
            _enough_descriptors(hard + 1)
        assert "\n" not in str(exc.value)


@pytest.mark.parametrize("os_flag", ["LINUX", "MACOS", "WINDOWS"])
def test_display_and_user_folders_per_os(os_flag: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each OS's branch (plain Python: run here with the flags set): macOS and Windows always have a window
    system and keep caches and data in their own folders; Linux asks the environment (XDG)."""
    for flag in ("LINUX", "MACOS", "WINDOWS"):
        monkeypatch.setattr(sysinfo, flag, flag == os_flag)
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM", "XDG_CACHE_HOME", "XDG_DATA_HOME", "LOCALAPPDATA",
                "APPDATA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    home = Path.home()
    want = {"LINUX": (False, home / ".cache", home / ".local" / "share"),
            "MACOS": (True, home / "Library" / "Caches", home / "Library" / "Application Support"),
            "WINDOWS": (True, home / "AppData" / "Local", home / "AppData" / "Roaming")}[os_flag]
    assert (sysinfo.has_display(), sysinfo.user_cache_dir(), sysinfo.user_data_dir()) == want
    monkeypatch.setenv("WAYLAND_DISPLAY", "wayland-0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xc"))
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "la"))
    assert sysinfo.has_display()
    assert sysinfo.user_cache_dir() == {"LINUX": tmp_path / "xc", "MACOS": want[1], "WINDOWS": tmp_path / "la"}[os_flag]


@pytest.mark.parametrize("os_flag", ["LINUX", "MACOS", "WINDOWS"])
def test_the_gui_start_checks_per_os(os_flag: str, monkeypatch: pytest.MonkeyPatch,
                                     request: pytest.FixtureRequest) -> None:
    """Wayland without X11 (Qt's ``wayland`` plugin) exists on Linux only; the Qt library check (ldd, Debian's
    packages) runs on Linux only: elsewhere the wheel or bundle carries Qt and there is no ``ldd``."""
    pytest.importorskip("PySide6")
    from quantscope.gui import qtdeps

    for flag in ("LINUX", "MACOS", "WINDOWS"):
        monkeypatch.setattr(sysinfo, flag, flag == os_flag)
    monkeypatch.setattr(qtdeps, "LINUX", os_flag == "LINUX")
    monkeypatch.setenv("WAYLAND_DISPLAY", "wayland-0")
    monkeypatch.delenv("DISPLAY", raising=False)
    assert sysinfo.wayland_without_x11() == (os_flag == "LINUX")
    monkeypatch.setenv("DISPLAY", ":0")
    assert not sysinfo.wayland_without_x11()
    if not sys.platform.startswith("linux") or not (shutil.which("gcc") or shutil.which("cc")):
        return
    plugin = request.getfixturevalue("plugin_missing_a_library")
    problem = qtdeps.startup_problem("xcb", plugin)
    if os_flag == "LINUX":
        assert problem is not None and "sudo apt-get install libqsgone3" in problem
    else:
        assert problem is None


def test_the_app_folders_come_from_the_seam(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The model cache, the cost cache (CLI and GUI default) and the conversation store: under
    ``$XDG_CACHE_HOME``/``$XDG_DATA_HOME`` on Linux as before, under ``%LOCALAPPDATA%``/``%APPDATA%`` on Windows
    (its branch forced here); ``QUANTSCOPE_MODELS``/``QUANTSCOPE_DATA`` win everywhere."""
    from quantscope.cli.main import build_parser
    from quantscope.core import catalog
    from quantscope.core.chat.store import data_dir

    def cost_default() -> str:
        return build_parser("sensitivity").parse_args(["sensitivity", "m.gguf", "-f", "t.txt"]).cost_cache

    for var in ("QUANTSCOPE_MODELS", "QUANTSCOPE_DATA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xc"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xd"))
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "la"))
    monkeypatch.setenv("APPDATA", str(tmp_path / "ad"))
    if sysinfo.LINUX:
        assert catalog.cache_dir() == tmp_path / "xc" / "quantscope" / "models"
        assert data_dir() == tmp_path / "xd" / "quantscope"
        assert cost_default() == str(tmp_path / "xc" / "quantscope" / "costs")
    for flag in ("LINUX", "MACOS", "WINDOWS"):
        monkeypatch.setattr(sysinfo, flag, flag == "WINDOWS")
    assert catalog.cache_dir() == tmp_path / "la" / "quantscope" / "models"
    assert data_dir() == tmp_path / "ad" / "quantscope"
    assert cost_default() == str(tmp_path / "la" / "quantscope" / "costs")
    pytest.importorskip("PySide6")
    from quantscope.gui.views.quant_lab_budget import default_cost_dir

    assert default_cost_dir() == tmp_path / "la" / "quantscope" / "costs"
    monkeypatch.setenv("QUANTSCOPE_MODELS", str(tmp_path / "m"))
    monkeypatch.setenv("QUANTSCOPE_DATA", str(tmp_path / "d"))
    assert (catalog.cache_dir(), data_dir()) == (tmp_path / "m", tmp_path / "d")


def test_maxrss_units() -> None:
    assert sysinfo.maxrss_bytes(1000) == (1000 if sys.platform == "darwin" else 1024000)


# ---------------------------------------------------------------------------------------------------- cpu
def test_cpu_name_padding_is_removed() -> None:
    """Windows' ProcessorNameString of some Intel CPUs, as the registry holds it."""
    assert cpu.clean_name("       Intel(R) Core(TM) i7-4770 CPU @ 3.40GHz  ") == \
        "Intel(R) Core(TM) i7-4770 CPU @ 3.40GHz"
    assert cpu.clean_name("   ") is None and cpu.clean_name("") is None
    assert cpu._windows_cpu_name() is None or sys.platform == "win32"
    assert cpu.cpu_name().strip() == cpu.cpu_name() and cpu.cpu_name()
