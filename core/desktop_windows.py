"""Desktop integration on Windows: the ``.gguf`` file association for this user, and a Start-menu shortcut.

:func:`registry_plan` is the association as data, ``(key under HKEY_CURRENT_USER, value name, value)`` with ""
naming a key's default value: ``Software\\Classes\\.gguf`` (default ``Quantscope.gguf``, ``Content Type``,
``OpenWithProgids``), the ProgID ``Software\\Classes\\Quantscope.gguf`` (type name, ``DefaultIcon``,
``shell\\open\\command``) and, when the program is ``quantscope.exe`` (the frozen app),
``Software\\Classes\\Applications\\quantscope.exe``. :func:`install` writes ``%LOCALAPPDATA%\\Quantscope\\
quantscope.ico`` (made from the PNG icons) and ``desktop-install.json`` (what was written, with each registry
value's previous content), sets the values through a :class:`Registry` (``winreg`` on Windows), makes
``Quantscope.lnk`` in the Start menu with PowerShell's ``WScript.Shell`` and tells Explorer
(``SHChangeNotify(SHCNE_ASSOCCHANGED)``). :func:`uninstall` deletes only values that still hold what install
wrote (restoring a value it replaced), then those keys once empty, and the icon and shortcut only when unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Protocol

from . import desktop as dt
from .desktop import APP_NAME, MIME_TYPE, TYPE_NAME, DesktopError, Report
from .desktop_icons import ICO_SIZES, ico_bytes, icon_images

CLASSES = "Software\\Classes"
PROGID = "Quantscope.gguf"
EXT = ".gguf"
FROZEN_EXE = "quantscopew.exe"  # the bundle's windowed twin of quantscope.exe (packaging/quantscope.spec)
ICO = "quantscope.ico"
MANIFEST = "desktop-install.json"
SHORTCUT = f"{APP_NAME}.lnk"
SHCNE_ASSOCCHANGED, SHCNF_IDLIST = 0x08000000, 0x0000

Entry = tuple[str, str, str]


class Registry(Protocol):
    """The registry operations install and uninstall need, on keys under HKEY_CURRENT_USER."""

    def get(self, key: str, name: str) -> str | None: ...

    def set(self, key: str, name: str, value: str) -> None: ...

    def delete_value(self, key: str, name: str) -> None: ...

    def delete_key_if_empty(self, key: str) -> bool: ...


class WinRegistry:
    """:class:`Registry` on ``winreg`` (Windows only; REG_SZ values)."""

    def __init__(self) -> None:
        import winreg  # type: ignore[import-not-found,unused-ignore]

        self.w: Any = winreg

    def get(self, key: str, name: str) -> str | None:
        try:
            with self.w.OpenKey(self.w.HKEY_CURRENT_USER, key) as k:
                value, _kind = self.w.QueryValueEx(k, name)
        except OSError:
            return None
        return value if isinstance(value, str) else None

    def set(self, key: str, name: str, value: str) -> None:
        with self.w.CreateKeyEx(self.w.HKEY_CURRENT_USER, key, 0, self.w.KEY_SET_VALUE) as k:
            self.w.SetValueEx(k, name, 0, self.w.REG_SZ, value)

    def delete_value(self, key: str, name: str) -> None:
        with self.w.OpenKey(self.w.HKEY_CURRENT_USER, key, 0, self.w.KEY_SET_VALUE) as k:
            self.w.DeleteValue(k, name)

    def delete_key_if_empty(self, key: str) -> bool:
        try:
            with self.w.OpenKey(self.w.HKEY_CURRENT_USER, key) as k:
                subkeys, values, _ = self.w.QueryInfoKey(k)
            if subkeys or values:
                return False
            self.w.DeleteKey(self.w.HKEY_CURRENT_USER, key)
        except OSError:
            return False
        return True


def local_dir() -> Path:
    """``%LOCALAPPDATA%\\Quantscope`` (the icon and the manifest)."""
    base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
    return Path(base) / APP_NAME


def start_menu_dir() -> Path:
    """This user's Start-menu programs folder."""
    base = os.environ.get("APPDATA") or str(Path.home() / "AppData" / "Roaming")
    return Path(base) / "Microsoft" / "Windows" / "Start Menu" / "Programs"


def windows_launcher() -> list[str]:
    """The frozen bundle's ``quantscopew.exe`` (the same program without a console window; ``quantscope.exe`` when
    the bundle lacks it), else ``pythonw.exe -m quantscope.cli`` (no console window) beside this Python."""
    if getattr(sys, "frozen", False):
        exe = os.path.abspath(sys.executable)
        windowed = os.path.join(os.path.dirname(exe), FROZEN_EXE)
        return [windowed if os.path.isfile(windowed) else exe]
    exe = os.path.abspath(sys.executable)
    pythonw = os.path.join(os.path.dirname(exe), "pythonw.exe")
    return [pythonw if os.path.isfile(pythonw) else exe, "-m", "quantscope.cli"]


def command_line(argv: list[str]) -> str:
    """``argv`` as a Windows command line opening ``"%1"`` (the program always quoted, other arguments when they
    hold a space)."""
    for a in argv:
        if not a or any(c in a for c in '"\0\r\n'):
            raise DesktopError(f"{a!r} cannot be written in a Windows command line (empty, or a quote)")
    rest = [f'"{a}"' if any(c in a for c in " \t") else a for a in argv[1:]]
    return " ".join([f'"{argv[0]}"', *rest, '"%1"'])


def registry_plan(argv: list[str], icon: str) -> list[Entry]:
    """The association for ``argv`` with the icon file ``icon``: ``[(key, value name, value)]``, "" naming the
    default value."""
    cmd = command_line(argv)
    ext, prog = f"{CLASSES}\\{EXT}", f"{CLASSES}\\{PROGID}"
    plan = [(ext, "", PROGID), (ext, "Content Type", MIME_TYPE), (f"{ext}\\OpenWithProgids", PROGID, ""),
            (prog, "", TYPE_NAME), (prog, "FriendlyTypeName", TYPE_NAME), (f"{prog}\\DefaultIcon", "", icon),
            (f"{prog}\\shell\\open\\command", "", cmd)]
    program = argv[0].replace("/", "\\").rsplit("\\", 1)[-1]
    if program.lower() == FROZEN_EXE:
        app = f"{CLASSES}\\Applications\\{FROZEN_EXE}"
        plan += [(app, "FriendlyAppName", APP_NAME), (f"{app}\\SupportedTypes", EXT, ""),
                 (f"{app}\\DefaultIcon", "", icon), (f"{app}\\shell\\open\\command", "", cmd)]
    return plan


def _keys_to_prune(entries: list[Any]) -> list[str]:
    """Every key of ``entries`` and its parents below Software\\Classes, deepest first."""
    keys: set[str] = set()
    for key, *_ in entries:
        parts = key.split("\\")
        for n in range(3, len(parts) + 1):
            keys.add("\\".join(parts[:n]))
    return sorted(keys, key=lambda k: (-k.count("\\"), k))


def show(key: str, name: str, value: str) -> str:
    """One registry value as the command line prints it."""
    return f"HKCU\\{key} {name or '(default)'} = {value or '(empty)'}"


def apply(plan: list[Entry], reg: Registry, before: dict[tuple[str, str], str | None]) -> list[str]:
    """Set every value of ``plan``; ``before`` gets each one's previous content. Lines saying what was set."""
    out = []
    for key, name, value in plan:
        before.setdefault((key, name), reg.get(key, name))
        reg.set(key, name, value)
        out.append(show(key, name, value))
    return out


def unapply(entries: list[Any], reg: Registry) -> tuple[list[str], list[str]]:
    """Undo :func:`apply` for ``[(key, name, value, previous)]``: a value still ``value`` is deleted, or set back to
    ``previous``; then the keys left empty go. ``(removed, kept)`` lines."""
    removed, kept = [], []
    for key, name, value, previous in entries:
        label = f"HKCU\\{key} {name or '(default)'}"
        cur = reg.get(key, name)
        if cur is None:
            continue
        if cur != value:
            kept.append(f"{label}: changed since it was installed (left as {cur!r})")
        elif previous is not None and previous != value:
            reg.set(key, name, previous)
            removed.append(f"{label} (set back to {previous!r})")
        else:
            reg.delete_value(key, name)
            removed.append(label)
    for key in _keys_to_prune(entries):
        reg.delete_key_if_empty(key)
    return removed, kept


def _shortcut(lnk: Path, argv: list[str], icon: Path) -> str:
    """Make the Start-menu shortcut with PowerShell's WScript.Shell (paths passed in the environment)."""
    ps = shutil.which("powershell") or shutil.which("pwsh")
    if ps is None:
        return "powershell: not installed (Start-menu shortcut skipped)"
    script = ("$s = (New-Object -ComObject WScript.Shell).CreateShortcut($env:QS_LNK); $s.TargetPath = "
              "$env:QS_TARGET; $s.Arguments = $env:QS_ARGS; $s.IconLocation = $env:QS_ICON; "
              f"$s.Description = '{TYPE_NAME} explorer'; $s.Save()")
    env = {"QS_LNK": str(lnk), "QS_TARGET": argv[0], "QS_ARGS": " ".join(argv[1:]), "QS_ICON": str(icon)}
    return dt.run_tool("powershell", ["-NoProfile", "-NonInteractive", "-Command", script],
                       f"made the Start-menu shortcut {lnk}", exe=ps, env=env)


def _notify() -> str:
    """Tell Explorer that associations changed (Windows only)."""
    if sys.platform != "win32":
        return "SHChangeNotify: not on Windows (skipped)"
    import ctypes

    ctypes.windll.shell32.SHChangeNotify(SHCNE_ASSOCCHANGED, SHCNF_IDLIST, None, None)  # type: ignore[attr-defined]
    return "SHChangeNotify: told Explorer that file associations changed"


def _read_manifest(local: Path) -> dict[str, Any]:
    data = dt.read_ours(local / MANIFEST)
    try:
        doc = json.loads(data) if data is not None else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) and doc.get("progid") == PROGID else {}


def _write_files(local: Path, files: dict[str, bytes]) -> None:
    dt.write_files(local, files, f"cannot write into {local}")


def install(reg: Registry | None = None, argv: list[str] | None = None, local: Path | None = None,
            start_menu: Path | None = None, shortcut: bool = True) -> Report:
    """Write the icon, the association and the Start-menu shortcut (see the module docstring)."""
    argv = argv or windows_launcher()
    local, start_menu = local or local_dir(), start_menu or start_menu_dir()
    ico = ico_bytes(icon_images(dt.icon_pngs(), ICO_SIZES))
    plan = registry_plan(argv, str(local / ICO))
    reg = reg or WinRegistry()
    old = _read_manifest(local)
    old_entries = [e for e in old.get("registry", []) if isinstance(e, list) and len(e) == 4]
    before: dict[tuple[str, str], str | None] = {(e[0], e[1]): e[3] for e in old_entries}
    # the manifest first (with each value's current content), so that an interrupted install can be undone;
    # values a previous install set that this one does not (another program) stay listed for uninstall
    before.update({(k, n): reg.get(k, n) for k, n, _ in plan if (k, n) not in before})
    ours = {(k, n) for k, n, _ in plan}
    manifest: dict[str, Any] = {"progid": PROGID, "format": 1, "command": argv, "files": {ICO: dt.sha256(ico)},
                                "registry": [[k, n, v, before[(k, n)]] for k, n, v in plan]
                                + [e for e in old_entries if (e[0], e[1]) not in ours]}
    _write_files(local, {ICO: ico, MANIFEST: (json.dumps(manifest, indent=1) + "\n").encode("utf-8")})
    rep = Report(local, argv, written=[ICO, MANIFEST])
    try:
        rep.written += apply(plan, reg, before)
    except OSError as exc:
        raise DesktopError(f"cannot write the file association in the registry: {exc}") from None
    if shortcut:
        lnk = start_menu / SHORTCUT
        rep.tools.append(_shortcut(lnk, argv, local / ICO))
        data = dt.read_ours(lnk)
        if data is not None:
            manifest["shortcut"] = [str(lnk), dt.sha256(data)]
            _write_files(local, {MANIFEST: (json.dumps(manifest, indent=1) + "\n").encode("utf-8")})
            rep.written.append(lnk)
    else:
        rep.tools.append("Start-menu shortcut: not made (asked not to)")
    rep.tools.append(_notify())
    return rep


def uninstall(reg: Registry | None = None, argv: list[str] | None = None, local: Path | None = None) -> Report:
    """Remove what :func:`install` made (see the module docstring); without a manifest, the values that match the
    association of ``argv`` (default: this quantscope)."""
    local = local or local_dir()
    reg = reg or WinRegistry()
    man = _read_manifest(local)
    rep = Report(local)
    entries = [e for e in man.get("registry", []) if isinstance(e, list) and len(e) == 4 and
               all(isinstance(x, str) for x in e[:3])]
    if not entries:
        entries = [[*e, None] for e in registry_plan(argv or windows_launcher(), str(local / ICO))]
    try:
        rep.removed, rep.kept = unapply(entries, reg)
    except OSError as exc:
        raise DesktopError(f"cannot change the registry: {exc}") from None
    files: dict[str, str] = man.get("files", {}) if isinstance(man.get("files"), dict) else {}
    lnk = man.get("shortcut")
    targets = [(local / ICO, files.get(ICO))]
    if isinstance(lnk, list) and len(lnk) == 2 and Path(lnk[0]).name == SHORTCUT:
        targets.append((Path(lnk[0]), lnk[1]))
    for path, digest in targets:
        data = dt.read_ours(path)
        if data is None:
            continue
        if digest is None or dt.sha256(data) != digest:
            rep.kept.append(f"{path}: not the file install wrote (left in place)")
            continue
        path.unlink()
        rep.removed.append(path)
    if man:
        (local / MANIFEST).unlink()
        rep.removed.append(local / MANIFEST)
        try:
            local.rmdir()  # only when empty
        except OSError:
            pass
    rep.tools.append(_notify())
    return rep


# ------------------------------------------------------------------------------------- the backend interface
def _no_prefix(prefix: str | None) -> None:
    if prefix is not None:
        raise DesktopError("--prefix is not used on Windows: the association is per user, under HKEY_CURRENT_USER")


def plan(prefix: str | None = None) -> Report:
    """What :func:`install_for_user` would write (nothing is written)."""
    _no_prefix(prefix)
    argv, local = windows_launcher(), local_dir()
    lines = [show(*e) for e in registry_plan(argv, str(local / ICO))]
    return Report(local, argv, written=[ICO, MANIFEST, *lines, start_menu_dir() / SHORTCUT],
                  tools=["then SHChangeNotify(SHCNE_ASSOCCHANGED)"])


def install_for_user(prefix: str | None = None) -> Report:
    """:func:`install` for this user."""
    _no_prefix(prefix)
    return install()


def uninstall_for_user(prefix: str | None = None) -> Report:
    """:func:`uninstall` for this user."""
    _no_prefix(prefix)
    return uninstall()
