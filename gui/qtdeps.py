"""System libraries Qt's platform plugins need, read from the installed PySide6 (no Qt import here).

Qt aborts with its own multi-line message when its xcb plugin cannot load a library (libxcb-cursor0,
libxcb-icccm4, …), before any of our code runs. So before starting Qt the app asks the dynamic loader what the
plugin of the platform it will use cannot resolve (``ldd`` of the plugin, which lists its Qt libraries' needs
too) and says so in one line with the package names; ``./dev`` uses the same list to install them
(``python -m quantscope.gui.qtdeps --debs``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from quantscope.core import sysinfo

#: the checks here (``ldd``, Debian's packages) are Linux's: a macOS or Windows wheel or bundle carries its Qt whole
LINUX = sys.platform.startswith("linux")
_GLIBC = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libresolv.so.2", "libutil.so.1")
#: Sonames whose Debian package does not follow the ``lib<name><version>`` rule (checked against Debian 12 and 13;
#: ``dpkg -S`` on an installed one names its package). A name renamed for 64-bit time_t is also in :data:`_T64`.
_DEB_EXCEPTIONS = {
    **dict.fromkeys(_GLIBC, "libc6"),
    "libz.so.1": "zlib1g",
    "libbrotlicommon.so.1": "libbrotli1",
    "libbrotlidec.so.1": "libbrotli1",
    "libbrotlienc.so.1": "libbrotli1",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
    "libgobject-2.0.so.0": "libglib2.0-0",
    "libgio-2.0.so.0": "libglib2.0-0",
    "libgmodule-2.0.so.0": "libglib2.0-0",
    "libatk-1.0.so.0": "libatk1.0-0",
    "libatk-bridge-2.0.so.0": "libatk-bridge2.0-0",
    "libatspi.so.0": "libatspi2.0-0",
    "libharfbuzz.so.0": "libharfbuzz0b",
    "libcrypto.so.3": "libssl3",
    "libxml2.so.2": "libxml2",
    "libgtk-x11-2.0.so.0": "libgtk2.0-0",
    "libgdk-x11-2.0.so.0": "libgtk2.0-0",
    "libnspr4.so": "libnspr4",
    "libnss3.so": "libnss3",
    "libnssutil3.so": "libnss3",
    "libsmime3.so": "libnss3",
    "libjpeg.so.62": "libjpeg62-turbo",
    "libGL.so.1": "libgl1",
    "libEGL.so.1": "libegl1",
    "libGLX.so.0": "libglx0",
    "libOpenGL.so.0": "libopengl0",
    "libGLdispatch.so.0": "libglvnd0",
    "libGLESv2.so.2": "libgles2",
}
#: Packages Debian 13 (trixie) and Ubuntu 24.04 renamed with a ``t64`` suffix (64-bit time_t); Debian 12 has the
#: plain names.
_T64 = frozenset({"libglib2.0-0", "libpng16-16", "libasound2", "libcups2", "libssl3", "libgtk-3-0", "libgtk2.0-0",
                  "libatk1.0-0", "libatk-bridge2.0-0", "libatspi2.0-0"})
#: Releases before the t64 renaming (Debian and Ubuntu codenames).
_BEFORE_T64 = frozenset({"stretch", "buster", "bullseye", "bookworm", "bionic", "focal", "jammy", "kinetic",
                         "lunar", "mantic"})

_NOT_FOUND = re.compile(r"^\s*(\S+)\s*=>\s*not found", re.MULTILINE)


def debian_package(soname: str, t64: bool = False) -> str:
    """Debian/Ubuntu package that ships ``soname`` (``libxcb-icccm.so.4`` -> ``libxcb-icccm4``); ``t64``: the name
    on a release after the 64-bit time_t renaming (Debian 13, Ubuntu 24.04: ``libglib2.0-0t64``)."""
    name = _DEB_EXCEPTIONS.get(soname)
    icu = re.fullmatch(r"libicu\w+\.so\.(\d+)(?:\.\d+)*", soname)
    if icu:
        name = f"libicu{icu.group(1)}"
    if name is None:
        m = re.fullmatch(r"(lib[\w.+-]*?)\.so\.(\d+)(?:\.\d+)*", soname)
        if not m:
            return soname
        base, ver = m.group(1).lower().replace("_", "-"), m.group(2)  # no "_" in a package name
        name = f"{base}-{ver}" if base[-1].isdigit() else f"{base}{ver}"
    return name + "t64" if t64 and name in _T64 else name


def _os_release(path: Path = Path("/etc/os-release")) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return {k: v.strip().strip('"') for k, _, v in (ln.partition("=") for ln in text.splitlines()) if v}


def release_uses_t64(info: dict[str, str] | None = None) -> bool:
    """Whether this Debian/Ubuntu release has the ``t64`` package names (read from ``/etc/os-release``)."""
    info = _os_release() if info is None else info
    codename = info.get("UBUNTU_CODENAME") or info.get("VERSION_CODENAME", "")
    if codename:
        return codename not in _BEFORE_T64
    version = info.get("VERSION_ID", "")
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    return major >= (24 if info.get("ID") == "ubuntu" else 13)


def installable(names: list[str]) -> set[str] | None:
    """The ``names`` apt has a candidate version of (``apt-cache policy``); None without apt-cache or when it knows
    none of them (no package lists yet), so the caller keeps its own names."""
    try:
        out = subprocess.run(["apt-cache", "policy", *names], capture_output=True, text=True, timeout=60,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = set(re.findall(r"^(\S+):\n\s+Installed: .*\n\s+Candidate: (?!\(none\))", out, re.MULTILINE))
    return found or None


def debian_packages(sonames: list[str], t64: bool | None = None, apt: bool = True) -> list[str]:
    """The packages to install for ``sonames``, without repeats: this release's names (:func:`release_uses_t64`),
    and where apt knows only the other spelling (``libglib2.0-0`` or ``libglib2.0-0t64``), that one."""
    t64 = release_uses_t64() if t64 is None else t64
    choices = [(debian_package(s, t64), debian_package(s, not t64)) for s in sonames]
    known = installable(list(dict.fromkeys(n for pair in choices for n in pair))) if apt and choices else None
    names = [b if known is not None and a not in known and b in known else a for a, b in choices]
    return list(dict.fromkeys(names))


def pyside_dir() -> Path | None:
    """The installed PySide6 package folder, found without importing it."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def platform_plugin(platform: str = "xcb", root: Path | None = None) -> Path | None:
    """Path of Qt's platform plugin ``libq<platform>.so`` in the installed PySide6 (None if absent)."""
    base = root or pyside_dir()
    if base is None:
        return None
    p = base / "Qt" / "plugins" / "platforms" / f"libq{platform}.so"
    return p if p.is_file() else None


def parse_ldd(text: str) -> list[str]:
    """Sonames that ``ldd`` output reports as ``not found``, in order, without repeats."""
    return list(dict.fromkeys(_NOT_FOUND.findall(text)))


def missing_libraries(plugin: Path) -> list[str]:
    """Sonames the dynamic loader cannot find for ``plugin`` (empty when it loads). ``ldd`` rather than a
    trial ``dlopen``: it lists every missing library at once and loads nothing of Qt into this process."""
    try:
        out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_ldd(out)


def chosen_platform() -> str:
    """The platform Qt will start on: ``QT_QPA_PLATFORM`` (first of a ``;`` list), else the OS's own (``cocoa``,
    ``windows``), else by the session: ``wayland`` without an X11 server, ``xcb`` otherwise."""
    env = os.environ.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip()
    if env:
        return env
    if sys.platform == "darwin":
        return "cocoa"
    if sys.platform == "win32":
        return "windows"
    return "wayland" if sysinfo.wayland_without_x11() else "xcb"


def startup_problem(platform: str | None = None, plugin: Path | None = None) -> str | None:
    """One line saying which system libraries Qt's ``platform`` plugin lacks, with the install command; None if
    nothing is missing (or the plugin is not found, which Qt reports itself). Linux only (``ldd``, Debian's
    packages): None on every other OS."""
    if not LINUX:
        return None
    platform = platform or chosen_platform()
    plugin = plugin or platform_plugin(platform)
    if plugin is None:
        return None
    missing = missing_libraries(plugin)
    if not missing:
        return None
    debs = " ".join(debian_packages(missing))
    return (f"Qt's {platform} platform needs system libraries that are missing here: {', '.join(missing)} "
            f"(Debian/Ubuntu: sudo apt-get install {debs})")


def main(argv: list[str] | None = None) -> int:
    """``python -m quantscope.gui.qtdeps [--debs] [PLATFORM…]``: missing sonames (or their packages)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debs = "--debs" in args
    platforms = [a for a in args if not a.startswith("-")] or ["xcb", "offscreen"]
    found: list[str] = []
    for name in platforms:
        plugin = platform_plugin(name)
        if plugin is not None:
            found += missing_libraries(plugin)
    names = debian_packages(found) if debs else found
    print(" ".join(dict.fromkeys(names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
