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

#: Sonames whose Debian package does not follow the ``lib<name><version>`` rule.
_DEB_EXCEPTIONS = {
    "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
    "libgobject-2.0.so.0": "libglib2.0-0",
    "libgio-2.0.so.0": "libglib2.0-0",
    "libGL.so.1": "libgl1",
    "libEGL.so.1": "libegl1",
    "libGLX.so.0": "libglx0",
    "libOpenGL.so.0": "libopengl0",
    "libGLdispatch.so.0": "libglvnd0",
}

_NOT_FOUND = re.compile(r"^\s*(\S+)\s*=>\s*not found", re.MULTILINE)


def debian_package(soname: str) -> str:
    """Debian/Ubuntu package that ships ``soname`` (``libxcb-icccm.so.4`` -> ``libxcb-icccm4``)."""
    if soname in _DEB_EXCEPTIONS:
        return _DEB_EXCEPTIONS[soname]
    m = re.fullmatch(r"(lib[\w.+-]*?)\.so\.(\d+)(?:\.\d+)*", soname)
    if not m:
        return soname
    base, ver = m.group(1).lower(), m.group(2)
    return f"{base}-{ver}" if base[-1].isdigit() else f"{base}{ver}"


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
    """The platform Qt will start on: ``QT_QPA_PLATFORM`` (first of a ``;`` list), else by environment."""
    env = os.environ.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip()
    if env:
        return env
    if os.environ.get("WAYLAND_DISPLAY") and not os.environ.get("DISPLAY"):
        return "wayland"
    return "xcb"


def startup_problem(platform: str | None = None, plugin: Path | None = None) -> str | None:
    """One line saying which system libraries Qt's ``platform`` plugin lacks, with the install command; None if
    nothing is missing (or the plugin is not found, which Qt reports itself)."""
    platform = platform or chosen_platform()
    plugin = plugin or platform_plugin(platform)
    if plugin is None:
        return None
    missing = missing_libraries(plugin)
    if not missing:
        return None
    debs = " ".join(dict.fromkeys(debian_package(s) for s in missing))
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
    names = [debian_package(s) for s in found] if debs else found
    print(" ".join(dict.fromkeys(names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
