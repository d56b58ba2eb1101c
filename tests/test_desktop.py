"""Packaging: `quantscope desktop install|uninstall` (Linux: XDG menu entry, icons, MIME type; macOS: the app
bundle, its Info.plist and .icns; Windows: the HKCU association as data, the .ico), the PyInstaller spec's hidden
imports, and where a frozen app finds the CUDA library."""

from __future__ import annotations

import configparser
import importlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from quantscope.cli.main import main
from quantscope.core import desktop, desktop_icons, desktop_macos, desktop_windows
from quantscope.core import desktop_xdg as xdg
from quantscope.core.engine import cuda_library as cl

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "resources"
TOOLS = ("update-mime-database", "update-desktop-database", "gtk-update-icon-cache")
NS = xdg.MIME_NS
#: tests that run /bin/sh scripts or make symbolic links (neither is there on a stock Windows)
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="needs /bin/sh scripts and symbolic links")


def snapshot(base: Path) -> dict[str, bytes | None]:
    """Every path under ``base``: file contents, None for directories."""
    if not base.exists():
        return {}
    return {str(p.relative_to(base)): (None if p.is_dir() else p.read_bytes()) for p in sorted(base.rglob("*"))}


def read_entry(path: Path) -> configparser.SectionProxy:
    cp = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    cp.optionxform = str  # type: ignore[assignment,method-assign]  (keys are case-sensitive)
    cp.read_string(path.read_text("utf-8"))
    return cp["Desktop Entry"]


@pytest.fixture
def no_tools(tmp_path, monkeypatch) -> None:
    """A PATH without update-mime-database and friends."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.fixture
def fake_exe(tmp_path) -> Path:
    exe = tmp_path / "opt" / "quantscope"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return exe


# ------------------------------------------------------------------------------------------------------ install
def test_install_writes_entry_icons_and_mime(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    rep = xdg.install(base, [str(fake_exe)])

    entry = read_entry(base / "applications" / "quantscope.desktop")
    assert entry["Type"] == "Application" and entry["Name"] == "Quantscope"
    assert entry["Exec"] == f"{fake_exe} %f"
    assert entry["TryExec"] == str(fake_exe)
    assert entry["Icon"] == "quantscope"
    assert "application/x-gguf" in entry["MimeType"].split(";")
    # the rest of the entry is the shipped one, line for line
    shipped = [ln for ln in (RES / "quantscope.desktop").read_text().splitlines() if not ln.startswith(("Exec=",
                                                                                                       "TryExec="))]
    installed = (base / "applications" / "quantscope.desktop").read_text().splitlines()
    assert [ln for ln in installed if not ln.startswith(("Exec=", "TryExec="))] == shipped

    # icons in hicolor under the name the entry's Icon key uses
    svg = base / "icons/hicolor/scalable/apps" / f"{entry['Icon']}.svg"
    png = base / "icons/hicolor/256x256/apps" / f"{entry['Icon']}.png"
    assert svg.read_bytes() == (RES / "icons" / "quantscope.svg").read_bytes()
    assert ET.parse(svg).getroot().tag.endswith("svg")
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (256, 256)

    # the MIME package: valid shared-mime-info XML for the type the entry claims
    root = ET.parse(base / "mime" / "packages" / "quantscope-gguf.xml").getroot()
    assert root.tag == f"{NS}mime-info"
    mt = root.find(f"{NS}mime-type[@type='application/x-gguf']")
    assert mt is not None
    assert mt.find(f"{NS}glob").get("pattern") == "*.gguf"
    match = mt.find(f"{NS}magic/{NS}match")
    assert (match.get("type"), match.get("offset"), match.get("value")) == ("string", "0", "GGUF")

    assert rep.tools == [f"{t}: not installed (skipped)" for t in TOOLS]
    assert set(rep.written) == {*xdg.SOURCES, xdg.MANIFEST}
    for p in base.rglob("*"):  # regular files and folders only, nothing else, no temporaries left
        assert (p.is_file() or p.is_dir()) and not p.is_symlink() and ".tmp-" not in p.name


def test_exec_is_quoted_as_the_desktop_entry_spec_says(tmp_path, no_tools):
    assert xdg.exec_arg("/usr/bin/quantscope") == "/usr/bin/quantscope"
    # reserved characters: quoted, `$` escaped inside the quotes, `%` doubled, then backslashes doubled
    assert xdg.exec_arg("/home/a b/q$s%") == '"/home/a b/q\\\\$s%%"'
    assert xdg.exec_arg('/x/"q"') == '"/x/\\\\"q\\\\""'
    with pytest.raises(xdg.DesktopError):
        xdg.exec_arg("/x/a\nExec=/bin/evil")
    with pytest.raises(xdg.DesktopError):
        xdg.install(tmp_path / "share", ["/x/a\nExec=/bin/evil"])
    assert not (tmp_path / "share").exists()

    exe = tmp_path / "my apps" / "quantscope"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    xdg.install(tmp_path / "share", [str(exe)])
    text = (tmp_path / "share" / "applications" / "quantscope.desktop").read_text()
    assert f'\nExec="{exe}" %f\n' in text and f"\nTryExec={exe}\n" in text


def test_reinstall_is_idempotent(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    xdg.install(base, [str(fake_exe)])
    first = snapshot(base)
    xdg.install(base, [str(fake_exe)])
    assert snapshot(base) == first


def test_uninstall_leaves_nothing_of_ours(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    rep = xdg.install(base, [str(fake_exe)])
    assert (base / "applications" / "quantscope.desktop").is_file()
    rep = xdg.uninstall(base)
    assert set(rep.removed) == {*xdg.SOURCES, xdg.MANIFEST} and not rep.kept
    assert not base.exists()  # install created it: nothing is left, not even empty folders
    assert xdg.uninstall(base).removed == []


def test_uninstall_keeps_what_was_there_before(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    for rel, text in {"applications/other.desktop": "[Desktop Entry]\n", "mime/packages/other.xml": "<x/>",
                      "icons/hicolor/256x256/apps/other.png": "png", "quantscope/chats.sqlite3": "db"}.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text)
    before = snapshot(base)
    xdg.install(base, [str(fake_exe)])
    assert snapshot(base) != before
    xdg.uninstall(base)
    assert snapshot(base) == before


def test_uninstall_keeps_a_file_changed_since_install(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    xdg.install(base, [str(fake_exe)])
    entry = base / "applications" / "quantscope.desktop"
    entry.write_text(entry.read_text() + "NoDisplay=true\n")
    rep = xdg.uninstall(base)
    assert entry.is_file() and "NoDisplay=true" in entry.read_text()
    assert rep.kept == [f"{entry}: changed since it was installed (left in place)"]
    assert snapshot(base).keys() == {"applications", "applications/quantscope.desktop"}


@posix_only
def test_install_refuses_a_symlink_target_and_writes_nothing(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (base / "applications").mkdir(parents=True)
    (base / "applications" / "quantscope.desktop").symlink_to(victim)
    with pytest.raises(xdg.DesktopError, match="symbolic link"):
        xdg.install(base, [str(fake_exe)])
    assert victim.read_text() == "keep me"
    assert snapshot(base).keys() == {"applications", "applications/quantscope.desktop"}
    # uninstall does not follow or remove it either
    rep = xdg.uninstall(base)
    assert (base / "applications" / "quantscope.desktop").is_symlink() and victim.read_text() == "keep me"
    assert rep.kept and "not a regular file" in rep.kept[0]


def test_uninstall_without_a_manifest_removes_nothing(tmp_path, no_tools, fake_exe, capsys):
    """A hand-made launcher, icon and MIME XML at our paths but no manifest: nothing is ours to remove."""
    base = tmp_path / "share"
    for rel in xdg.SOURCES:
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(f"made by hand: {rel}")
    before = snapshot(base)
    rep = xdg.uninstall(base)
    assert rep.removed == [] and snapshot(base) == before
    assert any("no install manifest" in k and "nothing was removed" in k for k in rep.kept)
    assert main(["desktop", "uninstall", "--prefix", str(tmp_path / "x")]) == 0  # the CLI says so too
    assert "no install manifest" in capsys.readouterr().out


def test_uninstall_removes_only_files_the_manifest_lists(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    xdg.install(base, [str(fake_exe)])
    man = base / xdg.MANIFEST
    raw = man.read_text()
    import json

    doc = json.loads(raw)
    del doc["files"][str(xdg.ICON_PNG)]  # a manifest that does not list the PNG icon
    man.write_text(json.dumps(doc))
    rep = xdg.uninstall(base)
    assert (base / xdg.ICON_PNG).is_file() and xdg.ICON_PNG not in rep.removed
    assert any("not listed" in k for k in rep.kept)
    assert not (base / xdg.DESKTOP).exists()  # the listed, unchanged ones go


@posix_only
def test_uninstall_never_follows_a_symlinked_folder(tmp_path, no_tools, fake_exe):
    """Install, then the applications folder is swapped for a link to elsewhere holding an identical entry: the
    file beyond the link is not under the data directory and stays."""
    base = tmp_path / "share"
    xdg.install(base, [str(fake_exe)])
    elsewhere = tmp_path / "elsewhere"
    shutil.move(base / "applications", elsewhere)
    (base / "applications").symlink_to(elsewhere)
    rep = xdg.uninstall(base)
    assert (elsewhere / "quantscope.desktop").is_file()
    assert any("symbolic link to a folder" in k for k in rep.kept)
    assert (base / "applications").is_symlink()


@posix_only
def test_tools_run_on_their_folders_and_a_failing_tool_is_reported(tmp_path, monkeypatch, fake_exe):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    for name in TOOLS:
        tool = bindir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\necho "{name}: broken" >&2\nexit 3\n')
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    base = tmp_path / "share"
    rep = xdg.install(base, [str(fake_exe)])  # never fails because of a tool
    assert (base / "applications" / "quantscope.desktop").is_file()
    assert rep.tools == [f"{t}: failed (exit status 3): {t}: broken" for t in TOOLS]
    assert log.read_text().splitlines() == [f"update-mime-database {base}/mime",
                                            f"update-desktop-database {base}/applications",
                                            f"gtk-update-icon-cache -q -f -t {base}/icons/hicolor"]


@pytest.mark.skipif(shutil.which("update-mime-database") is None, reason="update-mime-database is not installed")
def test_real_mime_database_knows_gguf_until_uninstalled(tmp_path, fake_exe):
    base = tmp_path / "share"
    other = base / "mime" / "packages" / "other.xml"  # someone else's type keeps the database alive
    other.parent.mkdir(parents=True)
    other.write_text('<?xml version="1.0"?><mime-info xmlns="http://www.freedesktop.org/standards/shared-mime-info">'
                     '<mime-type type="application/x-other"><glob pattern="*.other"/></mime-type></mime-info>')
    rep = xdg.install(base, [str(fake_exe)])
    assert f"update-mime-database: updated {base}/mime" in rep.tools
    assert "application/x-gguf:*.gguf" in (base / "mime" / "globs2").read_text()
    assert "application/x-gguf" in (base / "mime" / "magic").read_bytes().decode("latin-1")
    xdg.uninstall(base)
    assert "x-gguf" not in (base / "mime" / "globs2").read_text()
    assert "application/x-other:*.other" in (base / "mime" / "globs2").read_text()
    assert not (base / "mime" / "application" / "x-gguf.xml").exists()
    for p in base.rglob("*"):
        assert "quantscope" not in p.name and "gguf" not in p.name
        assert p.is_dir() or b"gguf" not in p.read_bytes().lower()


def test_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert xdg.data_dir() == tmp_path / "xdg"
    assert xdg.data_dir(tmp_path / "prefix") == tmp_path / "prefix" / "share"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # the XDG spec: relative paths are invalid
    assert xdg.data_dir() == tmp_path / "home" / ".local" / "share"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert xdg.data_dir() == tmp_path / "home" / ".local" / "share"


def test_launcher(monkeypatch, tmp_path, fake_exe):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "dist" / "quantscope" / "quantscope"))
    assert xdg.launcher() == [str(tmp_path / "dist" / "quantscope" / "quantscope")]
    monkeypatch.delattr(sys, "frozen")
    monkeypatch.setattr(sys, "argv", [str(fake_exe), "desktop", "install"])
    assert xdg.launcher() == [str(fake_exe)]
    python = tmp_path / "bin" / "python3"  # no quantscope script beside this Python: run the module
    monkeypatch.setattr(sys, "argv", ["-c"])
    monkeypatch.setattr(sys, "executable", str(python))
    assert xdg.launcher() == [str(python), "-m", "quantscope.cli"]


def test_module_fallback_command_runs():
    r = subprocess.run([sys.executable, "-m", "quantscope.cli", "desktop", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "uninstall" in r.stdout


def test_cli_install_and_uninstall(tmp_path):
    script = Path(sys.executable).parent / "quantscope"
    if not script.is_file():
        pytest.skip(f"no quantscope script beside {sys.executable}")
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"), "PATH": str(tmp_path)}
    r = subprocess.run([str(script), "desktop", "install"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"Installed the desktop entry, icons and application/x-gguf under {tmp_path}/xdg, "
                               f"starting: {script}\n")
    assert "  applications/quantscope.desktop\n" in r.stdout
    assert "  update-mime-database: not installed (skipped)\n" in r.stdout
    assert read_entry(tmp_path / "xdg" / "applications" / "quantscope.desktop")["Exec"] == f"{script} %f"
    r = subprocess.run([str(script), "desktop", "uninstall"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("Removed the desktop integration under")
    assert not (tmp_path / "xdg").exists()


def test_cli_prefix_and_errors(tmp_path, no_tools, capsys):
    assert main(["desktop", "install", "--prefix", str(tmp_path / "pfx")]) == 0
    assert (tmp_path / "pfx" / "share" / "applications" / "quantscope.desktop").is_file()
    assert main(["desktop", "uninstall", "--prefix", str(tmp_path / "pfx")]) == 0
    assert not (tmp_path / "pfx").exists() or not any((tmp_path / "pfx").iterdir())
    capsys.readouterr()
    (tmp_path / "file").write_text("x")  # the data directory's parent is a file: one error line
    assert main(["desktop", "install", "--prefix", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantscope: error: ") and err.count("\n") == 1
    assert main(["desktop", "reinstall"]) == 2


# -------------------------------------------------------------------------------------------- PyInstaller spec
def load_hidden_imports():
    spec = importlib.util.spec_from_file_location("qs_hidden_imports", ROOT / "packaging" / "hidden_imports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_spec_hidden_imports_all_import():
    hi = load_hidden_imports()
    names = hi.hidden_imports()
    templates = hi.pyqtgraph_templates()
    assert len(templates) >= 3 and all(n.startswith("pyqtgraph.") for n in templates)
    # the templates the app's plots use (context menus of ViewBox and PlotItem, the export dialog)
    assert "pyqtgraph.graphicsItems.ViewBox.axisCtrlTemplate_generic" in templates
    assert "pyqtgraph.graphicsItems.PlotItem.plotConfigTemplate_generic" in templates
    for name in names:
        importlib.import_module(name)
    spec_text = (ROOT / "packaging" / "quantscope.spec").read_text()
    assert "hiddenimports=hidden_imports()" in spec_text
    # every file the spec bundles from the repository exists
    for parts in re.findall(r'ROOT((?: / "[^"]+")+)', spec_text):
        rel = Path(*re.findall(r'"([^"]+)"', parts))
        assert rel.parts[0] == "build" or (ROOT / rel).exists(), rel


def test_template_rename_fails_loudly(tmp_path, monkeypatch):
    hi = load_hidden_imports()
    fake = tmp_path / "pyqtgraph"
    (fake / "graphicsItems" / "ViewBox").mkdir(parents=True)
    (fake / "graphicsItems" / "ViewBox" / "axisCtrlTemplate_pyside7.py").write_text("")
    (fake / "examples").mkdir()
    (fake / "examples" / "VideoTemplate_generic.py").write_text("")
    spec = importlib.machinery.ModuleSpec("pyqtgraph", None, is_package=True)
    spec.submodule_search_locations = [str(fake)]
    monkeypatch.setattr(hi.importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(RuntimeError, match="renamed its templates"):
        hi.pyqtgraph_templates()
    (fake / "graphicsItems" / "ViewBox" / "axisCtrlTemplate_generic.py").write_text("")
    assert hi.pyqtgraph_templates() == ["pyqtgraph.graphicsItems.ViewBox.axisCtrlTemplate_generic"]


# ---------------------------------------------------------------------------------- CUDA library, frozen app
def test_frozen_app_finds_the_bundled_cuda_library(tmp_path, monkeypatch):
    monkeypatch.delenv(cl.LIB_ENV, raising=False)
    assert cl.library_path() == cl.DEFAULT_LIB  # source tree: build/cuda/
    bundle, exe_dir = tmp_path / "dist" / "quantscope" / "_internal", tmp_path / "dist" / "quantscope"
    bundle.mkdir(parents=True)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(bundle), raising=False)
    monkeypatch.setattr(sys, "executable", str(exe_dir / "quantscope"))
    assert cl.library_path() == bundle / cl.LIB_NAME  # none there: the bundle's place is named
    ok, why = cl.probe()
    assert not ok and str(bundle / cl.LIB_NAME) in why and "not built" in why
    (exe_dir / cl.LIB_NAME).write_bytes(b"")  # dropped next to the executable
    assert cl.library_path() == exe_dir / cl.LIB_NAME
    (bundle / cl.LIB_NAME).write_bytes(b"")  # bundled by the spec: preferred
    assert cl.library_path() == bundle / cl.LIB_NAME
    monkeypatch.setenv(cl.LIB_ENV, str(tmp_path / "elsewhere.so"))
    assert cl.library_path() == tmp_path / "elsewhere.so"


# ------------------------------------------------------------------------------------------- the backend seam
def test_backend_per_os_and_a_plain_refusal_elsewhere(monkeypatch, capsys):
    assert desktop.backend("linux") is xdg
    assert desktop.backend("macos") is desktop_macos and desktop.backend("windows") is desktop_windows
    with pytest.raises(desktop.DesktopError, match="nothing is installed on freebsd14"):
        desktop.backend("freebsd14")
    monkeypatch.setattr(sys, "platform", "freebsd14")
    assert desktop.host_os() == "freebsd14"
    assert main(["desktop", "install"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantscope: error: desktop integration exists for Linux") and err.count("\n") == 1
    for plat, name in (("linux", "linux"), ("darwin", "macos"), ("win32", "windows")):
        monkeypatch.setattr(sys, "platform", plat)
        assert desktop.host_os() == name


def test_dry_run_shows_each_systems_plan_and_writes_nothing(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("USERPROFILE", str(home))  # Path.home() on Windows
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    for var in ("LOCALAPPDATA", "APPDATA"):
        monkeypatch.delenv(var, raising=False)
    outs = {}
    for name in ("linux", "macos", "windows"):
        assert main(["desktop", "install", "--dry-run", "--os", name]) == 0
        outs[name] = capsys.readouterr().out
        assert outs[name].startswith(f"Would install the desktop integration for {name} under ")
    assert not home.exists()  # nothing written for any system
    assert "  applications/quantscope.desktop\n" in outs["linux"]
    assert f"under {home / 'Applications' / 'Quantscope.app'}," in outs["macos"]
    assert "  Contents/Info.plist\n" in outs["macos"] and "  Contents/Resources/quantscope.icns\n" in outs["macos"]
    assert "  HKCU\\Software\\Classes\\.gguf (default) = Quantscope.gguf\n" in outs["windows"]
    assert "  HKCU\\Software\\Classes\\.gguf\\OpenWithProgids Quantscope.gguf = (empty)\n" in outs["windows"]
    assert f"  {home / 'AppData' / 'Roaming' / 'Microsoft' / 'Windows' / 'Start Menu' / 'Programs'}" \
           f"{os.sep}Quantscope.lnk\n" in outs["windows"]
    # another system's plan only as a dry run; --prefix means nothing on Windows
    assert main(["desktop", "install", "--os", "windows"]) == 2
    assert "only shown, with --dry-run" in capsys.readouterr().err
    assert main(["desktop", "install", "--dry-run", "--os", "windows", "--prefix", str(tmp_path)]) == 2
    assert "--prefix is not used on Windows" in capsys.readouterr().err
    assert main(["desktop", "uninstall", "--dry-run"]) == 2
    assert not home.exists()


# ---------------------------------------------------------------------------------------- icons (.icns, .ico)
PNG_SIG = b"\x89PNG\r\n\x1a\n"
#: icns type -> pixels a side (Apple's icns types holding PNG data)
ICNS_SIZES = {b"icp4": 16, b"icp5": 32, b"icp6": 64, b"ic07": 128, b"ic08": 256, b"ic09": 512, b"ic10": 1024,
              b"ic11": 32, b"ic12": 64, b"ic13": 256, b"ic14": 512}


def png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the decompressed image data of an 8-bit RGBA PNG, every chunk's CRC checked."""
    import zlib

    assert data[:8] == PNG_SIG
    pos, idat, w, h = 8, b"", 0, 0
    kinds = []
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + body)
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert (depth, ctype) == (8, 6)
        idat += body if kind == b"IDAT" else b""
        kinds.append(kind)
        pos += 12 + n
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND"
    raw = zlib.decompress(idat)
    assert len(raw) == h * (4 * w + 1)
    return w, h, raw


def test_icns_holds_a_png_of_each_size_its_type_names(tmp_path):
    out = tmp_path / "quantscope.icns"
    desktop_icons.write_icns([RES / "icons" / "quantscope.png"], out)
    data = out.read_bytes()
    assert data[:4] == b"icns" and struct.unpack(">I", data[4:8])[0] == len(data)
    pos, found = 8, {}
    while pos < len(data):
        kind, n = struct.unpack(">4sI", data[pos:pos + 8])
        assert n > 8 and pos + n <= len(data)
        w, h, _ = png_pixels(data[pos + 8:pos + n])
        assert w == h == ICNS_SIZES[kind], kind
        found[kind] = data[pos + 8:pos + n]
        pos += n
    assert pos == len(data)
    # the shipped 256 px icon as it is, and every smaller size down to 16 made from it
    assert set(found) == {b"icp4", b"icp5", b"icp6", b"ic07", b"ic08", b"ic11", b"ic12", b"ic13"}
    assert found[b"ic08"] == found[b"ic13"] == (RES / "icons" / "quantscope.png").read_bytes()


def test_ico_holds_png_entries_from_16_to_256(tmp_path):
    out = tmp_path / "quantscope.ico"
    desktop_icons.write_ico([RES / "icons" / "quantscope.png"], out)
    data = out.read_bytes()
    reserved, kind, count = struct.unpack("<HHH", data[:6])
    assert (reserved, kind) == (0, 1)
    sizes, end = [], 6 + 16 * count
    for i in range(count):
        w, h, colours, res, planes, bpp, n, off = struct.unpack("<BBBBHHII", data[6 + 16 * i:22 + 16 * i])
        side = w or 256
        assert (h or 256) == side and (colours, res, planes, bpp) == (0, 0, 1, 32)
        assert off >= 6 + 16 * count and off + n <= len(data)
        pw, ph, _ = png_pixels(data[off:off + n])
        assert pw == ph == side
        sizes.append(side)
        end = max(end, off + n)
    assert sizes == [16, 32, 64, 128, 256] and end == len(data)


def _encode_filtered(w: int, h: int, rgba: bytes, ftype: int) -> bytes:
    """An RGBA PNG with every row filtered with ``ftype`` (the PNG specification's filters, written here)."""
    import zlib

    stride, rows, prev = w * 4, b"", bytes(w * 4)
    for y in range(h):
        row = rgba[y * stride:(y + 1) * stride]
        out = bytearray()
        for i, x in enumerate(row):
            a = row[i - 4] if i >= 4 else 0
            b, c = prev[i], (prev[i - 4] if i >= 4 else 0)
            p = a + b - c
            paeth = min((abs(p - a), 0, a), (abs(p - b), 1, b), (abs(p - c), 2, c))[2]
            out.append((x - (0, a, b, (a + b) // 2, paeth)[ftype]) & 255)
        rows += bytes([ftype]) + bytes(out)
        prev = row

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return (PNG_SIG + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_png_decoding_undoes_every_row_filter_and_halving_weights_by_alpha():
    import random

    rnd = random.Random(46)
    w, h = 6, 4
    rgba = bytes(rnd.randrange(256) for _ in range(w * h * 4))
    for ftype in range(5):
        assert desktop_icons.decode_png(_encode_filtered(w, h, rgba, ftype)) == (w, h, bytearray(rgba))
    assert desktop_icons.decode_png(desktop_icons.encode_png(w, h, rgba)) == (w, h, bytearray(rgba))
    # a 2x2 block: opaque red, transparent green (ignored), half-transparent blue, opaque red
    block = bytes([255, 0, 0, 255, 0, 255, 0, 0, 0, 0, 255, 128, 255, 0, 0, 255])
    assert desktop_icons.halve(2, 2, block) == (1, 1, bytearray([(2 * 255 * 255 + 319) // 638, 0,
                                                               (255 * 128 + 319) // 638, (638 + 2) // 4]))


# ------------------------------------------------------------------------------------------------------ macOS
def test_info_plist_declares_and_owns_the_gguf_type():
    import plistlib

    info = plistlib.loads(plistlib.dumps(desktop_macos.macos_info_plist("quantscope", "1.2.3")))
    assert info["CFBundleIdentifier"] == "io.quantscope.Quantscope" and info["CFBundleExecutable"] == "quantscope"
    assert info["CFBundleIconFile"] == "quantscope.icns" and info["CFBundlePackageType"] == "APPL"
    assert info["CFBundleShortVersionString"] == info["CFBundleVersion"] == "1.2.3"
    assert info["NSHighResolutionCapable"] is True and info["LSMinimumSystemVersion"]
    (doc,) = info["CFBundleDocumentTypes"]
    (uti,) = info["UTExportedTypeDeclarations"]
    assert doc["LSHandlerRank"] == "Owner" and doc["LSItemContentTypes"] == [uti["UTTypeIdentifier"]]
    assert uti["UTTypeConformsTo"] == ["public.data"]
    assert uti["UTTypeTagSpecification"]["public.filename-extension"] == ["gguf"]


@posix_only
def test_macos_bundle_install_runs_and_uninstall_leaves_nothing(tmp_path, monkeypatch):
    import plistlib

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    rep = desktop_macos.install_for_user()
    app = home / "Applications" / "Quantscope.app"
    assert rep.data_dir == app
    if os.path.isfile(desktop_macos.LSREGISTER):  # on macOS: registered with LaunchServices for real
        assert rep.tools == [f"lsregister: registered {app}"]
    else:
        assert rep.tools == [f"lsregister: not found at {desktop_macos.LSREGISTER} (skipped; Finder registers the "
                             "app when it sees it)"]
    info = plistlib.loads((app / "Contents" / "Info.plist").read_bytes())
    assert info == desktop_macos.macos_info_plist("quantscope", desktop.version())
    assert (app / "Contents" / "PkgInfo").read_bytes() == b"APPL????"
    icns = (app / "Contents" / "Resources" / info["CFBundleIconFile"]).read_bytes()
    assert icns[:4] == b"icns" and struct.unpack(">I", icns[4:8])[0] == len(icns)
    exe = app / "Contents" / "MacOS" / info["CFBundleExecutable"]
    assert os.access(exe, os.X_OK)
    # the bundle's executable starts this quantscope with its arguments
    r = subprocess.run([str(exe), "desktop", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--dry-run" in r.stdout
    first = snapshot(home)
    desktop_macos.install_for_user()  # again: the same bundle
    assert snapshot(home) == first
    rep = desktop_macos.uninstall_for_user()
    assert len(rep.removed) == 5 and not rep.kept
    assert list(home.iterdir()) == []  # ~/Applications too: install created it


def test_macos_leaves_a_bundle_it_did_not_make(tmp_path):
    apps = tmp_path / "Applications"
    foreign = apps / "Quantscope.app" / "Contents"
    foreign.mkdir(parents=True)
    (foreign / "Info.plist").write_text("someone else's")
    before = snapshot(tmp_path)
    with pytest.raises(desktop.DesktopError, match="was not made by `quantscope desktop install`"):
        desktop_macos.install(apps, ["/bin/true"], lsregister=str(tmp_path / "none"))
    rep = desktop_macos.uninstall(apps, lsregister=str(tmp_path / "none"))
    assert rep.removed == [] and "left in place" in rep.kept[0] and snapshot(tmp_path) == before


@posix_only
def test_macos_uninstall_keeps_a_changed_file_and_runs_lsregister(tmp_path):
    apps, log = tmp_path / "Applications", tmp_path / "calls.log"
    tool = tmp_path / "lsregister"
    tool.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n')
    tool.chmod(0o755)
    rep = desktop_macos.install(apps, ["/opt/q s/quantscope"], lsregister=str(tool))
    app = apps / "Quantscope.app"
    assert rep.tools == [f"lsregister: registered {app}"]
    assert (app / desktop_macos.SCRIPT).read_text().endswith("\nexec '/opt/q s/quantscope' \"$@\"\n")
    plist = app / "Contents" / "Info.plist"
    plist.write_bytes(plist.read_bytes() + b"\n")
    rep = desktop_macos.uninstall(apps, lsregister=str(tool))
    assert log.read_text().splitlines() == [f"-f {app}", f"-u {app}"]
    assert rep.kept[0] == f"{plist}: changed since it was installed (left in place)"
    assert snapshot(tmp_path).keys() >= {"Applications/Quantscope.app/Contents/Info.plist"}
    assert not (app / "Contents" / "MacOS").exists()


@posix_only
def test_macos_frozen_app_is_registered_and_linked(tmp_path, monkeypatch):
    home, bundle = tmp_path / "home", tmp_path / "Downloads" / "Quantscope.app"
    (bundle / "Contents" / "MacOS").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(bundle / "Contents" / "MacOS" / "quantscope"))
    assert desktop_macos.frozen_bundle() == bundle
    rep = desktop_macos.install_for_user()
    link = home / "Applications" / "Quantscope.app"
    assert rep.written == [link] and link.is_symlink() and link.resolve() == bundle
    rep = desktop_macos.uninstall_for_user()
    assert rep.removed == [link] and not os.path.lexists(link) and bundle.is_dir()


# ---------------------------------------------------------------------------------------------------- Windows
class MemoryRegistry:
    """HKEY_CURRENT_USER as a dict: key -> {value name: value}; a key exists once created (its parents too)."""

    def __init__(self, keys: dict[str, dict[str, str]] | None = None) -> None:
        self.keys: dict[str, dict[str, str]] = {}
        for k, values in (keys or {}).items():
            for n, v in values.items():
                self.set(k, n, v)

    def get(self, key, name):
        return self.keys.get(key, {}).get(name)

    def set(self, key, name, value):
        parts = key.split("\\")
        for n in range(1, len(parts) + 1):
            self.keys.setdefault("\\".join(parts[:n]), {})
        self.keys[key][name] = value

    def delete_value(self, key, name):
        del self.keys[key][name]

    def delete_key_if_empty(self, key):
        if key not in self.keys or self.keys[key] or any(k.startswith(key + "\\") for k in self.keys):
            return False
        del self.keys[key]
        return True


def test_windows_registry_plan():
    argv = ["C:\\Program Files\\Quantscope\\quantscopew.exe"]
    cmd = '"C:\\Program Files\\Quantscope\\quantscopew.exe" "%1"'
    ico = "C:\\Users\\a\\AppData\\Local\\Quantscope\\quantscope.ico"
    plan = desktop_windows.registry_plan(argv, ico)
    c = "Software\\Classes\\"
    assert plan == [
        (c + ".gguf", "", "Quantscope.gguf"), (c + ".gguf", "Content Type", "application/x-gguf"),
        (c + ".gguf\\OpenWithProgids", "Quantscope.gguf", ""),
        (c + "Quantscope.gguf", "", "GGUF model file"), (c + "Quantscope.gguf", "FriendlyTypeName", "GGUF model file"),
        (c + "Quantscope.gguf\\DefaultIcon", "", ico),
        (c + "Quantscope.gguf\\shell\\open\\command", "", cmd),
        (c + "Applications\\quantscopew.exe", "FriendlyAppName", "Quantscope"),
        (c + "Applications\\quantscopew.exe\\SupportedTypes", ".gguf", ""),
        (c + "Applications\\quantscopew.exe\\DefaultIcon", "", ico),
        (c + "Applications\\quantscopew.exe\\shell\\open\\command", "", cmd)]
    # from a virtual environment: pythonw runs the module, and no Applications\pythonw.exe is claimed
    venv = desktop_windows.registry_plan(["C:\\v env\\Scripts\\pythonw.exe", "-m", "quantscope.cli"], "i.ico")
    assert dict(((k, n), v) for k, n, v in venv)[(c + "Quantscope.gguf\\shell\\open\\command", "")] == \
        '"C:\\v env\\Scripts\\pythonw.exe" -m quantscope.cli "%1"'
    assert not any("Applications" in k for k, _, _ in venv)
    with pytest.raises(desktop.DesktopError):
        desktop_windows.command_line(['C:\\a"b.exe'])


def test_windows_install_then_uninstall_restores_the_registry(tmp_path, no_tools):
    local, menu = tmp_path / "Local" / "Quantscope", tmp_path / "Programs"
    argv = ["C:\\Quantscope\\quantscopew.exe"]
    other = {"Software\\Classes\\.gguf": {"": "Other.gguf"}, "Software\\Classes\\.txt": {"": "txtfile"}}
    reg = MemoryRegistry(other)
    before = {k: dict(v) for k, v in reg.keys.items()}
    rep = desktop_windows.install(reg, argv, local, menu)
    plan = desktop_windows.registry_plan(argv, str(local / "quantscope.ico"))
    assert all(reg.get(k, n) == v for k, n, v in plan)
    assert rep.tools == ["powershell: not installed (Start-menu shortcut skipped)",
                         "SHChangeNotify: not on Windows (skipped)"]
    ico = (local / "quantscope.ico").read_bytes()
    assert struct.unpack("<HHH", ico[:6]) == (0, 1, 5)
    desktop_windows.install(reg, argv, local, menu)  # again: still restores the value before the first install
    rep = desktop_windows.uninstall(reg, local=local)
    assert "HKCU\\Software\\Classes\\.gguf (default) (set back to 'Other.gguf')" in rep.removed and not rep.kept
    assert reg.keys == before and not local.exists()


def test_windows_uninstall_leaves_values_changed_since(tmp_path, no_tools):
    local = tmp_path / "Quantscope"
    argv = ["C:\\Python\\pythonw.exe", "-m", "quantscope.cli"]
    reg = MemoryRegistry()
    desktop_windows.install(reg, argv, local, tmp_path / "Programs")
    reg.set("Software\\Classes\\.gguf", "", "Another.gguf")  # another program took .gguf since
    (local / "quantscope.ico").write_bytes(b"changed")
    rep = desktop_windows.uninstall(reg, local=local)
    assert rep.kept == ["HKCU\\Software\\Classes\\.gguf (default): changed since it was installed (left as "
                        "'Another.gguf')", f"{local / 'quantscope.ico'}: not the file install wrote (left in place)"]
    assert reg.keys == {"Software": {}, "Software\\Classes": {}, "Software\\Classes\\.gguf": {"": "Another.gguf"}}
    assert (local / "quantscope.ico").read_bytes() == b"changed"
    # without a manifest, the values matching this quantscope's association are removed, nothing else
    reg2 = MemoryRegistry({"Software\\Classes\\Quantscope.gguf\\shell\\open\\command": {"": "someone else"}})
    desktop_windows.apply(desktop_windows.registry_plan(argv, str(tmp_path / "none" / "quantscope.ico")), reg2, {})
    reg2.set("Software\\Classes\\Quantscope.gguf\\shell\\open\\command", "", "someone else")
    desktop_windows.uninstall(reg2, argv, tmp_path / "none")
    assert {k: v for k, v in reg2.keys.items() if v} == {
        "Software\\Classes\\Quantscope.gguf\\shell\\open\\command": {"": "someone else"}}


@pytest.mark.skipif(sys.platform != "win32", reason="the Windows registry")
def test_winreg_registry_sets_reads_and_prunes_under_hkcu():
    reg = desktop_windows.WinRegistry()
    key = "Software\\QuantscopeTest46\\sub\\key"
    reg.set(key, "", "value")
    reg.set(key, "Named", "other")
    assert reg.get(key, "") == "value" and reg.get(key, "Named") == "other" and reg.get(key, "none") is None
    assert not reg.delete_key_if_empty(key)
    reg.delete_value(key, "")
    reg.delete_value(key, "Named")
    assert not reg.delete_key_if_empty("Software\\QuantscopeTest46")  # has a subkey
    for k in (key, "Software\\QuantscopeTest46\\sub", "Software\\QuantscopeTest46"):
        assert reg.delete_key_if_empty(k)
    assert reg.get(key, "") is None


@posix_only
def test_cli_install_and_uninstall_as_on_macos(tmp_path, monkeypatch, capsys):
    """`quantscope desktop install|uninstall` where sys.platform says darwin: the bundle in ~/Applications."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(sys, "platform", "darwin")
    app = home / "Applications" / "Quantscope.app"
    assert main(["desktop", "install"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Installed the app bundle (document type .gguf) {app}, starting: ")
    assert "  Contents/Info.plist\n" in out and "  lsregister: " in out
    assert (app / "Contents" / "Info.plist").is_file()
    assert main(["desktop", "uninstall"]) == 0
    assert capsys.readouterr().out.startswith(f"Removed the desktop integration under {app}\n")
    assert list(home.iterdir()) == []
