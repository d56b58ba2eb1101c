"""Qt's platform plugins' system libraries: found from the installed PySide6, named with their packages."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from quantscope.gui import qtdeps


@pytest.mark.parametrize(("soname", "deb"), [
    ("libxcb-icccm.so.4", "libxcb-icccm4"),
    ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
    ("libxcb-cursor.so.0", "libxcb-cursor0"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
    ("libX11-xcb.so.1", "libx11-xcb1"),
    ("libpng16.so.16", "libpng16-16"),
    ("libdbus-1.so.3", "libdbus-1-3"),
    ("libfontconfig.so.1.12.0", "libfontconfig1"),
    ("libglib-2.0.so.0", "libglib2.0-0"),
    ("libEGL.so.1", "libegl1"),
    ("libGL.so.1", "libgl1"),
])
def test_debian_package_names(soname, deb):
    assert qtdeps.debian_package(soname) == deb


def test_parse_ldd_lists_each_missing_library_once():
    text = ("\tlibGL.so.1 => /lib/x86_64-linux-gnu/libGL.so.1 (0x1)\n"
            "\tlibxcb-icccm.so.4 => not found\n"
            "\tlibxcb-keysyms.so.1 => not found\n"
            "\tlibxcb-icccm.so.4 => not found\n")
    assert qtdeps.parse_ldd(text) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]


def test_installed_plugins_are_found():
    assert qtdeps.platform_plugin("xcb") is not None
    assert qtdeps.platform_plugin("offscreen") is not None
    assert qtdeps.platform_plugin("no-such-platform") is None


@pytest.fixture
def plugin_missing_a_library(tmp_path: Path) -> Path:
    """A shared object that links a library which is then removed: what ldd shows on a bare desktop."""
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "a C compiler is needed (the kernels need one too)"
    (tmp_path / "dep.c").write_text("int qs_dep(void) { return 1; }\n")
    (tmp_path / "plugin.c").write_text("int qs_dep(void);\nint qs_plugin(void) { return qs_dep(); }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libqsgone.so.3"), str(tmp_path / "dep.c"),
                    "-Wl,-soname,libqsgone.so.3"], check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libqfake.so"), str(tmp_path / "plugin.c"),
                    str(tmp_path / "libqsgone.so.3")], check=True)
    (tmp_path / "libqsgone.so.3").unlink()
    return tmp_path / "libqfake.so"


def test_missing_library_is_named_with_its_package(plugin_missing_a_library):
    assert qtdeps.missing_libraries(plugin_missing_a_library) == ["libqsgone.so.3"]
    msg = qtdeps.startup_problem("xcb", plugin_missing_a_library)
    assert msg is not None and "\n" not in msg
    assert "libqsgone.so.3" in msg and "sudo apt-get install libqsgone3" in msg


def test_nothing_missing_for_the_installed_xcb_plugin():
    # ./dev installs what the plugin links (CI runs as root); a failure here names the packages to install
    assert qtdeps.startup_problem("xcb") is None


def test_app_says_what_is_missing_in_one_line_instead_of_qt_aborting(monkeypatch, capsys, tmp_path):
    from quantscope.gui import app

    monkeypatch.setattr(qtdeps, "startup_problem", lambda: "Qt's xcb platform needs system libraries that are "
                        "missing here: libxcb-cursor.so.0 (Debian/Ubuntu: sudo apt-get install libxcb-cursor0)")
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF")
    assert app.main([str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("quantscope: error: Qt's xcb platform needs")
    assert "apt-get install libxcb-cursor0" in err[0]


def test_module_lists_nothing_when_all_is_installed(capsys):
    assert qtdeps.main(["--debs", "xcb", "offscreen"]) == 0
    assert capsys.readouterr().out.strip() == ""
