"""Desktop integration on macOS: an application bundle that owns the ``.gguf`` document type.

Run from a virtual environment or pip install, :func:`install` writes ``~/Applications/Quantscope.app``:
``Contents/Info.plist`` (:func:`macos_info_plist`: bundle id, icon, the ``io.quantscope.gguf`` type it exports
and opens as Owner), ``Contents/PkgInfo``, ``Contents/MacOS/quantscope`` (a shell script exec'ing the running
quantscope with its arguments), ``Contents/Resources/quantscope.icns`` (made from the PNG icons) and
``Contents/Resources/quantscope-install.json``, the marker listing what was written with its SHA-256. It then
registers the bundle with LaunchServices (``lsregister -f``) where that tool exists. Run frozen inside an app
bundle, it registers that bundle and links it into ``~/Applications`` when it lies elsewhere. :func:`uninstall`
unregisters and removes only a bundle with our marker, only files whose content is still what was written, and
the folders install created once empty; a bundle without the marker is never touched.
"""

from __future__ import annotations

import json
import os
import plistlib
import shlex
import sys
from pathlib import Path
from typing import Any

from . import desktop as dt
from .desktop import APP_NAME, MIME_TYPE, TYPE_NAME, DesktopError, Report
from .desktop_icons import ICNS_TYPES, icns_bytes, icon_images

BUNDLE = f"{APP_NAME}.app"
BUNDLE_ID = "io.quantscope.Quantscope"
GGUF_UTI = "io.quantscope.gguf"
EXECUTABLE = "quantscope"
ICNS = "quantscope.icns"
INFO_PLIST = Path("Contents/Info.plist")
PKGINFO = Path("Contents/PkgInfo")
SCRIPT = Path("Contents/MacOS") / EXECUTABLE
ICON = Path("Contents/Resources") / ICNS
MARKER = Path("Contents/Resources/quantscope-install.json")
FILES = (INFO_PLIST, PKGINFO, SCRIPT, ICON)
#: folders install may create, relative to the Applications folder ("." is that folder itself)
_OUR_DIRS = frozenset({".", BUNDLE, f"{BUNDLE}/Contents", f"{BUNDLE}/Contents/MacOS", f"{BUNDLE}/Contents/Resources"})
LSREGISTER = ("/System/Library/Frameworks/CoreServices.framework/Frameworks/LaunchServices.framework/Support/"
              "lsregister")
MIN_MACOS = "11.0"


def macos_info_plist(executable: str = EXECUTABLE, version: str = "0") -> dict[str, Any]:
    """The Info.plist of Quantscope.app (for :mod:`plistlib` or PyInstaller's ``BUNDLE(info_plist=...)``):
    ``executable`` is the file name in Contents/MacOS, ``version`` the bundle version."""
    return {
        "CFBundleName": APP_NAME,
        "CFBundleDisplayName": APP_NAME,
        "CFBundleIdentifier": BUNDLE_ID,
        "CFBundleExecutable": executable,
        "CFBundleIconFile": ICNS,
        "CFBundlePackageType": "APPL",
        "CFBundleInfoDictionaryVersion": "6.0",
        "CFBundleShortVersionString": version,
        "CFBundleVersion": version,
        "LSMinimumSystemVersion": MIN_MACOS,
        "LSApplicationCategoryType": "public.app-category.developer-tools",
        "NSHighResolutionCapable": True,
        "CFBundleDocumentTypes": [{
            "CFBundleTypeName": TYPE_NAME,
            "CFBundleTypeRole": "Viewer",
            "CFBundleTypeIconFile": ICNS,
            "LSHandlerRank": "Owner",
            "LSItemContentTypes": [GGUF_UTI],
        }],
        "UTExportedTypeDeclarations": [{
            "UTTypeIdentifier": GGUF_UTI,
            "UTTypeDescription": TYPE_NAME,
            "UTTypeConformsTo": ["public.data"],
            "UTTypeIconFile": ICNS,
            "UTTypeTagSpecification": {"public.filename-extension": ["gguf"], "public.mime-type": [MIME_TYPE]},
        }],
    }


def launcher_script(command: list[str]) -> str:
    """The bundle's executable: a shell script exec'ing ``command`` with the arguments it was given."""
    if not command or any(not a or "\0" in a for a in command):
        raise DesktopError(f"cannot start {command!r} from a script (empty, or a NUL character)")
    return ("#!/bin/sh\n# Quantscope.app, written by `quantscope desktop install`\n"
            f"exec {' '.join(shlex.quote(a) for a in command)} \"$@\"\n")


def frozen_bundle() -> Path | None:
    """The ``.app`` this quantscope runs from when frozen inside one (``X.app/Contents/MacOS/exe``), else None."""
    if not getattr(sys, "frozen", False):
        return None
    exe = Path(os.path.abspath(sys.executable))
    app = exe.parents[2] if len(exe.parents) > 2 else exe
    if exe.parent.name == "MacOS" and exe.parents[1].name == "Contents" and app.suffix == ".app":
        return app
    return None


def apps_dir(prefix: str | os.PathLike[str] | None = None) -> Path:
    """``PREFIX/Applications`` when given, else ``~/Applications``."""
    return (Path(prefix).expanduser().absolute() if prefix is not None else Path.home()) / "Applications"


def bundle_contents(command: list[str]) -> dict[Path, bytes]:
    """The files of the wrapper bundle (relative to the .app) for ``command``, the marker aside."""
    images = icon_images(dt.icon_pngs(), sorted(ICNS_TYPES))
    return {INFO_PLIST: plistlib.dumps(macos_info_plist(EXECUTABLE, dt.version())),
            PKGINFO: b"APPL????",
            SCRIPT: launcher_script(command).encode("utf-8"),
            ICON: icns_bytes(images)}


def _lsregister(args: list[str], what: str, lsregister: str) -> str:
    if not os.path.isfile(lsregister):
        return f"lsregister: not found at {lsregister} (skipped; Finder registers the app when it sees it)"
    return dt.run_tool("lsregister", [*args], what, exe=lsregister)


def _read_marker(app: Path) -> dict[str, Any] | None:
    data = dt.read_ours(app / MARKER)
    try:
        doc = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("bundle") == BUNDLE_ID else None


def install(apps: Path, command: list[str] | None = None, lsregister: str = LSREGISTER) -> Report:
    """Write ``apps/Quantscope.app`` starting ``command`` (default: this quantscope) and register it."""
    apps = Path(apps)
    app = apps / BUNDLE
    command = command or dt.launcher()
    if app.is_symlink():
        raise DesktopError(f"{app}: is a symbolic link; remove it first")
    if app.exists() and _read_marker(app) is None:
        raise DesktopError(f"{app}: exists and was not made by `quantscope desktop install` (no "
                           f"{MARKER.name}); it is left alone: remove or rename it first")
    for d in sorted(_OUR_DIRS):
        p = apps / d
        if (d != "." and p.is_symlink()) or (p.exists() and not p.is_dir()):
            raise DesktopError(f"{p}: is not a folder; remove it first")
    contents = bundle_contents(command)
    old = _read_marker(app) or {}
    created = {d for d in old.get("created_dirs", []) if d in _OUR_DIRS} | {
        d for d in _OUR_DIRS if not (apps / d).exists()}
    marker = {"bundle": BUNDLE_ID, "format": 1, "command": command, "created_dirs": sorted(created),
              "files": {str(rel): dt.sha256(data) for rel, data in contents.items()}}
    contents[MARKER] = (json.dumps(marker, indent=1) + "\n").encode("utf-8")
    dt.write_files(app, contents, f"cannot install {app}")
    try:
        os.chmod(app / SCRIPT, 0o755)
    except OSError as exc:
        raise DesktopError(f"cannot install {app}: {exc}") from None
    rep = Report(app, command, written=list(contents))
    rep.tools.append(_lsregister(["-f", str(app)], f"registered {app}", lsregister))
    return rep


def uninstall(apps: Path, lsregister: str = LSREGISTER) -> Report:
    """Unregister and remove the ``apps/Quantscope.app`` that :func:`install` wrote (only what it wrote)."""
    apps = Path(apps)
    app = apps / BUNDLE
    rep = Report(app)
    if app.is_symlink() or not app.is_dir():
        if app.is_symlink() or app.exists():
            rep.kept.append(f"{app}: not a folder (left in place)")
        return rep
    marker = _read_marker(app)
    if marker is None:
        rep.kept.append(f"{app}: was not made by `quantscope desktop install` (no {MARKER.name}): left in place")
        return rep
    rep.tools.append(_lsregister(["-u", str(app)], f"unregistered {app}", lsregister))
    files = marker.get("files") if isinstance(marker.get("files"), dict) else {}
    for rel in FILES:
        path = app / rel
        if not os.path.lexists(path):
            continue
        data = dt.read_ours(path)
        if str(rel) not in files or data is None or dt.sha256(data) != files[str(rel)]:
            rep.kept.append(f"{path}: changed since it was installed (left in place)")
            continue
        path.unlink()
        rep.removed.append(rel)
    (app / MARKER).unlink()
    rep.removed.append(MARKER)
    created = [d for d in marker.get("created_dirs", []) if d in _OUR_DIRS]
    for d in sorted(created, key=lambda d: -len(Path(d).parts)):
        try:
            (apps / d).rmdir()  # only when empty
        except OSError:
            pass
    if app.exists():
        rep.kept.append(f"{app}: still holds files install did not write (left in place)")
    return rep


def install_frozen(bundle: Path, apps: Path, lsregister: str = LSREGISTER) -> Report:
    """Register the running app ``bundle``; link it into ``apps`` when it lies outside the Applications folders."""
    rep = Report(bundle, [str(bundle)])
    link = apps / BUNDLE
    if bundle.parent not in (apps, Path("/Applications")):
        if os.path.lexists(link) and not (link.is_symlink() and link.resolve() == bundle.resolve()):
            rep.kept.append(f"{link}: exists (not replaced by a link to {bundle})")
        elif not os.path.lexists(link):
            try:
                apps.mkdir(parents=True, exist_ok=True)
                link.symlink_to(bundle)
            except OSError as exc:
                raise DesktopError(f"cannot link {link} to {bundle}: {exc.strerror}") from None
            rep.written.append(link)
    rep.tools.append(_lsregister(["-f", str(bundle)], f"registered {bundle}", lsregister))
    return rep


def uninstall_frozen(bundle: Path, apps: Path, lsregister: str = LSREGISTER) -> Report:
    """Unregister the running app ``bundle`` and remove the link :func:`install_frozen` made (the bundle stays)."""
    rep = Report(bundle)
    link = apps / BUNDLE
    if link.is_symlink() and link.resolve() == bundle.resolve():
        link.unlink()
        rep.removed.append(link)
    rep.tools.append(_lsregister(["-u", str(bundle)], f"unregistered {bundle}", lsregister))
    rep.kept.append(f"{bundle}: the app itself stays (move it to the Trash to remove it)")
    return rep


# ------------------------------------------------------------------------------------- the backend interface
def plan(prefix: str | None = None) -> Report:
    """What :func:`install_for_user` would write (nothing is written)."""
    apps, bundle = apps_dir(prefix), frozen_bundle()
    if bundle is not None:
        return Report(bundle, [str(bundle)], written=[] if bundle.parent == apps else [apps / BUNDLE],
                      tools=[f"then lsregister -f {bundle} (where present)"])
    command = dt.launcher()
    return Report(apps / BUNDLE, command, written=[*bundle_contents(command), MARKER],
                  tools=[f"then lsregister -f {apps / BUNDLE} (where present)"])


def install_for_user(prefix: str | None = None) -> Report:
    """:func:`install_frozen` when running from an app bundle, else :func:`install` into ~/Applications."""
    bundle = frozen_bundle()
    return install_frozen(bundle, apps_dir(prefix)) if bundle else install(apps_dir(prefix))


def uninstall_for_user(prefix: str | None = None) -> Report:
    """Undo :func:`install_for_user`."""
    bundle = frozen_bundle()
    return uninstall_frozen(bundle, apps_dir(prefix)) if bundle else uninstall(apps_dir(prefix))

