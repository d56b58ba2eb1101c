"""Desktop integration on Linux and other XDG desktops (``quantscope desktop install|uninstall``).

:func:`install` writes the menu entry (``applications/quantscope.desktop``, its ``Exec`` the running quantscope:
the console script, or the frozen binary), the icons (hicolor, scalable SVG and 256 px PNG) and the
``application/x-gguf`` MIME package under the XDG data directory (``$XDG_DATA_HOME``, default
``~/.local/share``), all at once through temporaries renamed into place, plus a manifest of what it wrote. It then
runs update-mime-database, update-desktop-database and gtk-update-icon-cache where installed (a missing or failing
tool is reported, never an error). :func:`uninstall` removes only what the manifest lists and whose content still
has the SHA-256 recorded there (a file changed since, one reached through a symlinked folder, and everything when
there is no manifest are left in place), the directories install created once empty, and the caches those tools
generated in directories install created; elsewhere it runs the tools again.
"""

from __future__ import annotations

import json
import os
import stat
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from .desktop import MIME_TYPE, DesktopError, Report, launcher, read_ours, run_tool, write_files
from .desktop import resources_dir as _resources_dir
from .desktop import sha256 as _sha256
from .fsutil import PathRefused, check_input, kind_of

DESKTOP = Path("applications/quantscope.desktop")
ICON_SVG = Path("icons/hicolor/scalable/apps/quantscope.svg")
ICON_PNG = Path("icons/hicolor/256x256/apps/quantscope.png")
MIME = Path("mime/packages/quantscope-gguf.xml")
MANIFEST = Path("quantscope/desktop-install.json")
#: installed path -> file under resources/
SOURCES = {DESKTOP: "quantscope.desktop", ICON_SVG: "icons/quantscope.svg", ICON_PNG: "icons/quantscope.png",
           MIME: "quantscope-gguf.xml"}
MIME_NS = "{http://www.freedesktop.org/standards/shared-mime-info}"


def _generated_mime(rel: Path) -> bool:  # the whole mime/ tree but packages/ is update-mime-database's output
    return rel.parts[0] != "packages"


#: directory -> (the tool that refreshes it, its arguments after the directory, which files in it it generates)
CACHES: dict[Path, tuple[str, tuple[str, ...], Callable[[Path], bool]]] = {
    Path("mime"): ("update-mime-database", (), _generated_mime),
    Path("applications"): ("update-desktop-database", (), lambda rel: rel == Path("mimeinfo.cache")),
    Path("icons/hicolor"): ("gtk-update-icon-cache", ("-q", "-f", "-t"), lambda rel: rel == Path("icon-theme.cache")),
}
#: every directory install may create (relative to the data directory; "." is the data directory itself)
_OUR_DIRS = frozenset(str(d) for p in (*SOURCES, MANIFEST) for d in p.parents)


def data_dir(prefix: str | os.PathLike[str] | None = None) -> Path:
    """``PREFIX/share`` when given, else ``$XDG_DATA_HOME`` when set to an absolute path, else ``~/.local/share``."""
    if prefix is not None:
        return Path(prefix).expanduser().absolute() / "share"
    xdg = os.environ.get("XDG_DATA_HOME", "")
    return Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share"


def resources_dir() -> Path:
    """The folder with the .desktop entry, MIME package and icons."""
    return _resources_dir(SOURCES[DESKTOP])


def _check_text(arg: str) -> None:
    if not arg or any(ord(c) < 0x20 or ord(c) == 0x7F for c in arg):
        raise DesktopError(f"{arg!r} cannot be written in a desktop entry (empty, or a control character)")


def exec_arg(arg: str) -> str:
    """One argument of an ``Exec`` key as the Desktop Entry specification writes it: quoted when it holds a
    reserved character, ``"`,$,\\`` escaped inside the quotes, ``%`` doubled, then backslashes doubled (the
    string-value escape)."""
    _check_text(arg)
    arg = arg.replace("%", "%%")
    if any(c in arg for c in " \t\n\"'\\><~|&;$*?#()`"):
        arg = '"' + "".join("\\" + c if c in '"`$\\' else c for c in arg) + '"'
    return arg.replace("\\", "\\\\")


def desktop_entry(template: str, command: list[str]) -> str:
    """The template's entry with ``Exec`` running ``command`` on the opened file and ``TryExec`` its program."""
    for arg in command:
        _check_text(arg)
    lines = []
    for line in template.splitlines():
        key = line.split("=", 1)[0].strip()
        if key == "Exec":
            line = "Exec=" + " ".join(exec_arg(a) for a in command) + " %f"
        elif key == "TryExec":
            line = "TryExec=" + command[0].replace("\\", "\\\\")
        lines.append(line)
    return "\n".join(lines) + "\n"


def _contents(command: list[str]) -> dict[Path, bytes]:
    res = resources_dir()
    out: dict[Path, bytes] = {}
    for rel, name in SOURCES.items():
        try:
            check_input(res / name)
        except PathRefused as exc:
            raise DesktopError(str(exc)) from None
        out[rel] = (res / name).read_bytes()
    out[DESKTOP] = desktop_entry(out[DESKTOP].decode("utf-8"), command).encode("utf-8")
    try:
        root = ET.fromstring(out[MIME])
    except ET.ParseError as exc:
        raise DesktopError(f"{res / SOURCES[MIME]}: not valid XML: {exc}") from None
    if root.find(f"{MIME_NS}mime-type[@type='{MIME_TYPE}']") is None:
        raise DesktopError(f"{res / SOURCES[MIME]}: does not define {MIME_TYPE}")
    return out


def _read_manifest(base: Path) -> tuple[dict[str, str], set[str]]:
    """``(file -> sha256, directories created)`` of a previous install, only entries naming our paths (empty when
    there is no readable manifest)."""
    try:
        check_input(base / MANIFEST)
        raw = json.loads((base / MANIFEST).read_text("utf-8"))
    except (PathRefused, OSError, ValueError):
        return {}, set()
    files = raw.get("files") if isinstance(raw, dict) else None
    dirs = raw.get("created_dirs") if isinstance(raw, dict) else None
    names = {str(p) for p in SOURCES}
    return ({k: v for k, v in files.items() if k in names and isinstance(v, str)} if isinstance(files, dict) else {},
            {d for d in dirs if isinstance(d, str) and d in _OUR_DIRS} if isinstance(dirs, list) else set())


def _refuse_non_regular(path: Path) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DesktopError(f"{path}: cannot use this path: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        what = "a symbolic link" if stat.S_ISLNK(mode) else kind_of(mode)
        raise DesktopError(f"{path}: is {what}, not a regular file; remove it first")


def _run_tool(base: Path, folder: Path) -> str:
    """Run the tool that refreshes ``base/folder``; one line saying what happened (never raises)."""
    name, args, _ = CACHES[folder]
    return run_tool(name, [*args, str(base / folder)], f"updated {base / folder}")


def install(base: Path, command: list[str] | None = None) -> Report:
    """Install the entry, icons and MIME package under the data directory ``base`` (see the module docstring)."""
    base = Path(base)
    command = command or launcher()
    contents = _contents(command)
    for rel in (*contents, MANIFEST):
        _refuse_non_regular(base / rel)
    created = _read_manifest(base)[1] | {d for d in _OUR_DIRS if not (base / d).exists()}
    manifest = {"format": 1, "command": command,
                "files": {str(rel): _sha256(data) for rel, data in contents.items()},
                "created_dirs": sorted(created)}
    contents[MANIFEST] = (json.dumps(manifest, indent=1) + "\n").encode("utf-8")
    write_files(base, contents, f"cannot install into {base}")
    rep = Report(base, command, written=list(contents))
    rep.tools = [_run_tool(base, folder) for folder in CACHES]
    return rep


def _files_under(root: Path) -> list[Path] | None:
    """Every non-directory entry under ``root`` (relative), or None when a symbolic link to a directory is met."""
    found: list[Path] = []
    for top, dirs, files in os.walk(root):
        if any(os.path.islink(os.path.join(top, d)) for d in dirs):
            return None
        found += [Path(top, f).relative_to(root) for f in files]
    return found


def _through_link(base: Path, rel: Path) -> bool:
    """Whether a folder between ``base`` and ``base/rel`` (``rel`` itself excluded) is a symbolic link: what lies
    beyond it is not under ``base`` and is never removed."""
    cur = base
    for part in rel.parts[:-1]:
        cur = cur / part
        if cur.is_symlink():
            return True
    return False


def uninstall(base: Path) -> Report:
    """Remove what :func:`install` wrote under ``base`` (see the module docstring): only files the manifest lists
    whose content still has the hash it recorded, never through a symlinked folder; without a manifest nothing is
    removed (``Report.kept`` says so)."""
    base = Path(base)
    rep = Report(base)
    have_manifest = (not _through_link(base, MANIFEST) and (base / MANIFEST).is_file()
                     and not (base / MANIFEST).is_symlink())
    hashes, created = _read_manifest(base) if have_manifest else ({}, set())
    for rel in SOURCES:
        path = base / rel
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if _through_link(base, rel):
            rep.kept.append(f"{path}: reached through a symbolic link to a folder (left in place)")
            continue
        if not stat.S_ISREG(mode):
            rep.kept.append(f"{path}: not a regular file (left in place)")
            continue
        if str(rel) not in hashes:
            rep.kept.append(f"{path}: not listed in an install manifest (left in place)")
            continue
        data = read_ours(path)
        if data is None or _sha256(data) != hashes[str(rel)]:
            rep.kept.append(f"{path}: changed since it was installed (left in place)")
            continue
        path.unlink()
        rep.removed.append(rel)
    if not have_manifest:
        rep.kept.append(f"no install manifest at {base / MANIFEST}: nothing was removed (files of a quantscope "
                        "install made elsewhere or by hand stay; remove them yourself)")
        return rep
    (base / MANIFEST).unlink()
    rep.removed.append(MANIFEST)
    refresh = []
    for folder, (_, _, generated) in CACHES.items():
        root = base / folder
        if not root.is_dir() or root.is_symlink() or _through_link(base, folder / "x"):
            continue
        left = _files_under(root)
        if str(folder) in created and left is not None and all(generated(f) for f in left):
            for f in left:  # only caches generated from what we installed: the folder was ours
                (root / f).unlink()
            for top, _dirs, _files in sorted(os.walk(root), key=lambda t: -len(Path(t[0]).parts)):
                if Path(top) != root:
                    Path(top).rmdir()
        else:
            refresh.append(folder)
    for d in sorted(created, key=lambda d: -len(Path(d).parts)):
        if d != "." and _through_link(base, Path(d) / "x"):
            continue
        try:
            (base / d).rmdir()  # only when empty
        except OSError:
            pass
    rep.tools = [_run_tool(base, folder) for folder in refresh if (base / folder).is_dir()]
    return rep


# ------------------------------------------------------------------------------------- the backend interface
def plan(prefix: str | None = None) -> Report:
    """What :func:`install_for_user` would write (nothing is written)."""
    base = data_dir(prefix)
    command = launcher()
    return Report(base, command, written=[*_contents(command), MANIFEST],
                  tools=[f"then {CACHES[f][0]} {base / f} (where installed)" for f in CACHES])


def install_for_user(prefix: str | None = None) -> Report:
    """:func:`install` into ``PREFIX/share`` or the XDG data directory."""
    return install(data_dir(prefix))


def uninstall_for_user(prefix: str | None = None) -> Report:
    """:func:`uninstall` from ``PREFIX/share`` or the XDG data directory."""
    return uninstall(data_dir(prefix))
