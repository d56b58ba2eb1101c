"""Packaging: `quantscope desktop install|uninstall` (XDG menu entry, icons, MIME type), the PyInstaller spec's
hidden imports, and where a frozen app finds the CUDA library."""

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
from quantscope.core import desktop
from quantscope.core.engine import cuda_backend as cb

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "resources"
TOOLS = ("update-mime-database", "update-desktop-database", "gtk-update-icon-cache")
NS = desktop.MIME_NS


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
    rep = desktop.install(base, [str(fake_exe)])

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
    assert set(rep.written) == {*desktop.SOURCES, desktop.MANIFEST}
    for p in base.rglob("*"):  # regular files and folders only, nothing else, no temporaries left
        assert (p.is_file() or p.is_dir()) and not p.is_symlink() and ".tmp-" not in p.name


def test_exec_is_quoted_as_the_desktop_entry_spec_says(tmp_path, no_tools):
    assert desktop.exec_arg("/usr/bin/quantscope") == "/usr/bin/quantscope"
    # reserved characters: quoted, `$` escaped inside the quotes, `%` doubled, then backslashes doubled
    assert desktop.exec_arg("/home/a b/q$s%") == '"/home/a b/q\\\\$s%%"'
    assert desktop.exec_arg('/x/"q"') == '"/x/\\\\"q\\\\""'
    with pytest.raises(desktop.DesktopError):
        desktop.exec_arg("/x/a\nExec=/bin/evil")
    with pytest.raises(desktop.DesktopError):
        desktop.install(tmp_path / "share", ["/x/a\nExec=/bin/evil"])
    assert not (tmp_path / "share").exists()

    exe = tmp_path / "my apps" / "quantscope"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    desktop.install(tmp_path / "share", [str(exe)])
    text = (tmp_path / "share" / "applications" / "quantscope.desktop").read_text()
    assert f'\nExec="{exe}" %f\n' in text and f"\nTryExec={exe}\n" in text


def test_reinstall_is_idempotent(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    desktop.install(base, [str(fake_exe)])
    first = snapshot(base)
    desktop.install(base, [str(fake_exe)])
    assert snapshot(base) == first


def test_uninstall_leaves_nothing_of_ours(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    rep = desktop.install(base, [str(fake_exe)])
    assert (base / "applications" / "quantscope.desktop").is_file()
    rep = desktop.uninstall(base)
    assert set(rep.removed) == {*desktop.SOURCES, desktop.MANIFEST} and not rep.kept
    assert not base.exists()  # install created it: nothing is left, not even empty folders
    assert desktop.uninstall(base).removed == []


def test_uninstall_keeps_what_was_there_before(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    for rel, text in {"applications/other.desktop": "[Desktop Entry]\n", "mime/packages/other.xml": "<x/>",
                      "icons/hicolor/256x256/apps/other.png": "png", "quantscope/chats.sqlite3": "db"}.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text)
    before = snapshot(base)
    desktop.install(base, [str(fake_exe)])
    assert snapshot(base) != before
    desktop.uninstall(base)
    assert snapshot(base) == before


def test_uninstall_keeps_a_file_changed_since_install(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    desktop.install(base, [str(fake_exe)])
    entry = base / "applications" / "quantscope.desktop"
    entry.write_text(entry.read_text() + "NoDisplay=true\n")
    rep = desktop.uninstall(base)
    assert entry.is_file() and "NoDisplay=true" in entry.read_text()
    assert rep.kept == [f"{entry}: changed since it was installed (left in place)"]
    assert snapshot(base).keys() == {"applications", "applications/quantscope.desktop"}


def test_install_refuses_a_symlink_target_and_writes_nothing(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (base / "applications").mkdir(parents=True)
    (base / "applications" / "quantscope.desktop").symlink_to(victim)
    with pytest.raises(desktop.DesktopError, match="symbolic link"):
        desktop.install(base, [str(fake_exe)])
    assert victim.read_text() == "keep me"
    assert snapshot(base).keys() == {"applications", "applications/quantscope.desktop"}
    # uninstall does not follow or remove it either
    rep = desktop.uninstall(base)
    assert (base / "applications" / "quantscope.desktop").is_symlink() and victim.read_text() == "keep me"
    assert rep.kept and "not a regular file" in rep.kept[0]


def test_uninstall_without_a_manifest_removes_nothing(tmp_path, no_tools, fake_exe, capsys):
    """A hand-made launcher, icon and MIME XML at our paths but no manifest: nothing is ours to remove."""
    base = tmp_path / "share"
    for rel in desktop.SOURCES:
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(f"made by hand: {rel}")
    before = snapshot(base)
    rep = desktop.uninstall(base)
    assert rep.removed == [] and snapshot(base) == before
    assert any("no install manifest" in k and "nothing was removed" in k for k in rep.kept)
    assert main(["desktop", "uninstall", "--prefix", str(tmp_path / "x")]) == 0  # the CLI says so too
    assert "no install manifest" in capsys.readouterr().out


def test_uninstall_removes_only_files_the_manifest_lists(tmp_path, no_tools, fake_exe):
    base = tmp_path / "share"
    desktop.install(base, [str(fake_exe)])
    man = base / desktop.MANIFEST
    raw = man.read_text()
    import json

    doc = json.loads(raw)
    del doc["files"][str(desktop.ICON_PNG)]  # a manifest that does not list the PNG icon
    man.write_text(json.dumps(doc))
    rep = desktop.uninstall(base)
    assert (base / desktop.ICON_PNG).is_file() and desktop.ICON_PNG not in rep.removed
    assert any("not listed" in k for k in rep.kept)
    assert not (base / desktop.DESKTOP).exists()  # the listed, unchanged ones go


def test_uninstall_never_follows_a_symlinked_folder(tmp_path, no_tools, fake_exe):
    """Install, then the applications folder is swapped for a link to elsewhere holding an identical entry: the
    file beyond the link is not under the data directory and stays."""
    base = tmp_path / "share"
    desktop.install(base, [str(fake_exe)])
    elsewhere = tmp_path / "elsewhere"
    shutil.move(base / "applications", elsewhere)
    (base / "applications").symlink_to(elsewhere)
    rep = desktop.uninstall(base)
    assert (elsewhere / "quantscope.desktop").is_file()
    assert any("symbolic link to a folder" in k for k in rep.kept)
    assert (base / "applications").is_symlink()


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
    rep = desktop.install(base, [str(fake_exe)])  # never fails because of a tool
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
    rep = desktop.install(base, [str(fake_exe)])
    assert f"update-mime-database: updated {base}/mime" in rep.tools
    assert "application/x-gguf:*.gguf" in (base / "mime" / "globs2").read_text()
    assert "application/x-gguf" in (base / "mime" / "magic").read_bytes().decode("latin-1")
    desktop.uninstall(base)
    assert "x-gguf" not in (base / "mime" / "globs2").read_text()
    assert "application/x-other:*.other" in (base / "mime" / "globs2").read_text()
    assert not (base / "mime" / "application" / "x-gguf.xml").exists()
    for p in base.rglob("*"):
        assert "quantscope" not in p.name and "gguf" not in p.name
        assert p.is_dir() or b"gguf" not in p.read_bytes().lower()


def test_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert desktop.data_dir() == tmp_path / "xdg"
    assert desktop.data_dir(tmp_path / "prefix") == tmp_path / "prefix" / "share"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # the XDG spec: relative paths are invalid
    assert desktop.data_dir() == tmp_path / "home" / ".local" / "share"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert desktop.data_dir() == tmp_path / "home" / ".local" / "share"


def test_launcher(monkeypatch, tmp_path, fake_exe):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "dist" / "quantscope" / "quantscope"))
    assert desktop.launcher() == [str(tmp_path / "dist" / "quantscope" / "quantscope")]
    monkeypatch.delattr(sys, "frozen")
    monkeypatch.setattr(sys, "argv", [str(fake_exe), "desktop", "install"])
    assert desktop.launcher() == [str(fake_exe)]
    python = tmp_path / "bin" / "python3"  # no quantscope script beside this Python: run the module
    monkeypatch.setattr(sys, "argv", ["-c"])
    monkeypatch.setattr(sys, "executable", str(python))
    assert desktop.launcher() == [str(python), "-m", "quantscope.cli"]


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
    monkeypatch.delenv(cb.LIB_ENV, raising=False)
    assert cb.library_path() == cb.DEFAULT_LIB  # source tree: build/cuda/
    bundle, exe_dir = tmp_path / "dist" / "quantscope" / "_internal", tmp_path / "dist" / "quantscope"
    bundle.mkdir(parents=True)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(bundle), raising=False)
    monkeypatch.setattr(sys, "executable", str(exe_dir / "quantscope"))
    assert cb.library_path() == bundle / cb.LIB_NAME  # none there: the bundle's place is named
    ok, why = cb.probe()
    assert not ok and str(bundle / cb.LIB_NAME) in why and "not built" in why
    (exe_dir / cb.LIB_NAME).write_bytes(b"")  # dropped next to the executable
    assert cb.library_path() == exe_dir / cb.LIB_NAME
    (bundle / cb.LIB_NAME).write_bytes(b"")  # bundled by the spec: preferred
    assert cb.library_path() == bundle / cb.LIB_NAME
    monkeypatch.setenv(cb.LIB_ENV, str(tmp_path / "elsewhere.so"))
    assert cb.library_path() == tmp_path / "elsewhere.so"
