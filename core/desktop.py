"""Per-user desktop integration (``quantscope desktop install|uninstall``): the one place that picks the backend
for an operating system, and what the backends share.

Backends (each a module with ``plan``, ``install_for_user`` and ``uninstall_for_user`` taking the ``--prefix``
value and returning a :class:`Report`):

- ``linux``: :mod:`.desktop_xdg`, a menu entry, icons and the ``application/x-gguf`` type under the XDG data
  directory;
- ``macos``: :mod:`.desktop_macos`, ``~/Applications/Quantscope.app`` (or the running app bundle) registered with
  LaunchServices as the owner of ``.gguf``;
- ``windows``: :mod:`.desktop_windows`, the ``.gguf`` file association under ``HKCU\\Software\\Classes`` and a
  Start-menu shortcut.

Other systems get :class:`DesktopError` saying nothing is installed there.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from .fsutil import OutputSet, PathRefused

#: operating system -> the module implementing its integration
BACKENDS = {"linux": "desktop_xdg", "macos": "desktop_macos", "windows": "desktop_windows"}
APP_NAME = "Quantscope"
MIME_TYPE = "application/x-gguf"
TYPE_NAME = "GGUF model file"
TOOL_TIMEOUT_S = 120


class DesktopError(Exception):
    """Installing or removing the desktop integration is not possible as asked; the message says why."""


@dataclass
class Report:
    """What an install or uninstall did (or, for :func:`plan`, would do), for the command line to print.

    ``data_dir``: where it happens (XDG data directory, app bundle, per-user data folder); ``written`` and
    ``removed``: files (relative to ``data_dir`` when under it) and registry values as text; ``kept``: what was
    left in place and why; ``tools``: one line per system tool run or skipped."""

    data_dir: Path
    command: list[str] = field(default_factory=list)
    written: list[Any] = field(default_factory=list)
    removed: list[Any] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)


def host_os() -> str:
    """``linux``, ``macos``, ``windows``, or ``sys.platform`` for any other system."""
    if sys.platform.startswith("linux"):
        return "linux"
    return {"darwin": "macos", "win32": "windows", "cygwin": "windows"}.get(sys.platform, sys.platform)


def backend(os_name: str | None = None) -> ModuleType:
    """The integration module for ``os_name`` (default: this system); :class:`DesktopError` for a system without
    one."""
    os_name = os_name or host_os()
    if os_name not in BACKENDS:
        raise DesktopError(f"desktop integration exists for Linux (XDG menu entry and MIME type), macOS (app bundle) "
                           f"and Windows (file association); nothing is installed on {os_name}")
    return importlib.import_module(f"{__package__}.{BACKENDS[os_name]}")


def plan(os_name: str | None = None, prefix: str | None = None) -> Report:
    """What ``install`` would write on ``os_name`` (any of :data:`BACKENDS`, from any system); nothing is
    written."""
    return backend(os_name).plan(prefix)


def install(prefix: str | None = None) -> Report:
    """Install this system's integration (see the backends)."""
    return backend().install_for_user(prefix)


def uninstall(prefix: str | None = None) -> Report:
    """Remove what :func:`install` made on this system (only that)."""
    return backend().uninstall_for_user(prefix)


# --------------------------------------------------------------------------------- shared by the backends
def resources_dir(needed: str = "quantscope.desktop") -> Path:
    """The folder with the .desktop entry, MIME package and icons (the first holding ``needed``): beside the
    package, or in a frozen app's bundle."""
    places = [Path(__file__).resolve().parents[1] / "resources"]
    if getattr(sys, "_MEIPASS", None):
        places.append(Path(sys._MEIPASS) / "resources")  # type: ignore[attr-defined]
    for p in places:
        if (p / needed).is_file():
            return p
    raise DesktopError(f"the desktop entry and icons are not installed with this quantscope (looked in "
                       f"{', '.join(map(str, places))})")


def icon_pngs() -> list[Path]:
    """The PNG application icons shipped in resources/icons (the other sizes are made from the largest)."""
    return sorted((resources_dir("icons/quantscope.png") / "icons").glob("quantscope*.png"))


def version() -> str:
    """The installed quantscope's version, or ``0`` when it is not installed as a distribution."""
    from importlib import metadata

    try:
        return metadata.version("quantscope")
    except metadata.PackageNotFoundError:
        return "0"


def launcher(script: str = "quantscope") -> list[str]:
    """The command that starts this quantscope: the frozen binary, the ``script`` being run or the one beside
    this Python (a virtual environment's), else ``python -m quantscope.cli``."""
    if getattr(sys, "frozen", False):
        return [os.path.abspath(sys.executable)]
    argv0 = sys.argv[0] if sys.argv else ""
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), script)
    for cand in (argv0, beside):
        if os.path.basename(cand) == script and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return [os.path.abspath(cand)]
    return [os.path.abspath(sys.executable), "-m", "quantscope.cli"]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_files(base: Path, contents: dict[Path, bytes] | dict[str, bytes], what: str) -> None:
    """Write ``contents`` (paths relative to ``base``) as one set, each through a temporary and a rename, making
    folders; a refused or failing write is :class:`DesktopError` ``"{what}: {reason}"``."""
    try:
        with OutputSet([(str(rel), base / rel) for rel in contents], make_dirs=True) as out:
            for rel, data in contents.items():
                out.write_bytes(str(rel), data)
            out.commit()
    except (PathRefused, OSError) as exc:
        raise DesktopError(f"{what}: {exc}") from None


#: larger than any file install writes: a file this big is not ours
MAX_OURS = 1 << 22


def read_ours(path: Path) -> bytes | None:
    """The bytes of the regular file ``path`` (not through a final symlink, never blocking), or None."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        if os.path.islink(path):
            return None
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_OURS:
            return None
        with os.fdopen(os.dup(fd), "rb") as fp:
            return fp.read(MAX_OURS + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def tool_env() -> dict[str, str]:
    """The environment for system tools: a frozen app's bootloader points LD_LIBRARY_PATH at the bundle, which
    must not leak into them (it keeps the original in LD_LIBRARY_PATH_ORIG)."""
    env = dict(os.environ)
    if getattr(sys, "frozen", False):
        for var in ("LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH"):
            orig = env.pop(var + "_ORIG", None)
            if orig is None:
                env.pop(var, None)
            else:
                env[var] = orig
    return env


def run_tool(name: str, argv: list[str], done: str, exe: str | None = None, env: dict[str, str] | None = None) -> str:
    """Run the system tool ``name`` (``exe``, else found on PATH) with ``argv`` and ``env`` added to the
    environment; one line saying what happened (``done`` on success), never raises."""
    exe = exe if exe is not None else shutil.which(name)
    if exe is None or not os.path.isfile(exe):
        return f"{name}: not installed (skipped)"
    try:
        r = subprocess.run([exe, *argv], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S,
                           env={**tool_env(), **(env or {})},
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{name}: could not run: {exc}"
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [""])[-1]
        return f"{name}: failed (exit status {r.returncode}){': ' + why if why else ''}"
    return f"{name}: {done}"
