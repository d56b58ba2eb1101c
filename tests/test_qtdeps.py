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
    ("libbrotlicommon.so.1", "libbrotli1"),
    ("libbrotlidec.so.1", "libbrotli1"),
    ("libz.so.1", "zlib1g"),
    ("libm.so.6", "libc6"),
    ("libgcc_s.so.1", "libgcc-s1"),
    ("libgssapi_krb5.so.2", "libgssapi-krb5-2"),
    ("libcom_err.so.2", "libcom-err2"),
    ("libicuuc.so.72.1", "libicu72"),
])
def test_debian_package_names(soname, deb):
    assert qtdeps.debian_package(soname) == deb


@pytest.mark.parametrize(("soname", "bookworm", "trixie"), [
    ("libglib-2.0.so.0", "libglib2.0-0", "libglib2.0-0t64"),
    ("libpng16.so.16", "libpng16-16", "libpng16-16t64"),
    ("libasound.so.2", "libasound2", "libasound2t64"),
    ("libbrotlidec.so.1", "libbrotli1", "libbrotli1"),
    ("libxcb-cursor.so.0", "libxcb-cursor0", "libxcb-cursor0"),
])
def test_debian_13_names_have_the_t64_suffix(soname, bookworm, trixie):
    assert qtdeps.debian_package(soname) == bookworm
    assert qtdeps.debian_package(soname, t64=True) == trixie


@pytest.mark.parametrize(("info", "t64"), [
    ({"ID": "debian", "VERSION_ID": "12", "VERSION_CODENAME": "bookworm"}, False),
    ({"ID": "debian", "VERSION_ID": "13", "VERSION_CODENAME": "trixie"}, True),
    ({"ID": "debian", "VERSION_CODENAME": "forky"}, True),
    ({"ID": "ubuntu", "VERSION_ID": "22.04", "VERSION_CODENAME": "jammy", "UBUNTU_CODENAME": "jammy"}, False),
    ({"ID": "ubuntu", "VERSION_ID": "24.04", "VERSION_CODENAME": "noble", "UBUNTU_CODENAME": "noble"}, True),
    ({"ID": "linuxmint", "VERSION_CODENAME": "wilma", "UBUNTU_CODENAME": "noble"}, True),
    ({"ID": "debian", "VERSION_ID": "12"}, False),
])
def test_release_uses_t64(info, t64):
    assert qtdeps.release_uses_t64(info) is t64


def test_apt_picks_the_spelling_it_knows(monkeypatch):
    sonames = ["libglib-2.0.so.0", "libgio-2.0.so.0", "libxcb-cursor.so.0"]
    monkeypatch.setattr(qtdeps, "installable", lambda names: {"libglib2.0-0t64", "libxcb-cursor0"})
    assert qtdeps.debian_packages(sonames, t64=False) == ["libglib2.0-0t64", "libxcb-cursor0"]
    monkeypatch.setattr(qtdeps, "installable", lambda names: None)  # no apt-cache, or no package lists
    assert qtdeps.debian_packages(sonames, t64=False) == ["libglib2.0-0", "libxcb-cursor0"]
    assert qtdeps.debian_packages(sonames, t64=True) == ["libglib2.0-0t64", "libxcb-cursor0"]


def _plugin_sonames() -> list[str]:
    """Every library the installed PySide6's platform plugins link, found or not (``ldd``)."""
    root = qtdeps.pyside_dir()
    assert root is not None
    out = []
    for plugin in sorted((root / "Qt" / "plugins" / "platforms").glob("libq*.so")):
        text = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, timeout=120).stdout
        out += [ln.split()[0] for ln in text.splitlines() if "=>" in ln and str(root) not in ln]
    return list(dict.fromkeys(out))


def test_every_mapped_name_exists_on_this_release():
    if shutil.which("apt-cache") is None:
        pytest.skip("apt-cache is not available (not Debian or Ubuntu)")
    t64 = qtdeps.release_uses_t64()
    sonames = [*qtdeps._DEB_EXCEPTIONS, *_plugin_sonames()]
    names = sorted({qtdeps.debian_package(s, t64) for s in sonames})
    known = qtdeps.installable(names)
    if known is None:
        pytest.skip("apt has no package lists (run apt-get update)")
    assert [n for n in names if n not in known] == []
    assert qtdeps.debian_packages(["libbrotlicommon.so.1", "libbrotlidec.so.1"]) == ["libbrotli1"]


def test_dev_installs_the_other_packages_when_one_name_is_unknown(tmp_path):
    """./dev's apt_install with a fake apt-get that refuses any line naming an unknown package."""
    dev = (Path(__file__).resolve().parent.parent / "dev").read_text()
    func = dev[dev.index("apt_install() {"):]
    func = func[: func.index("\n}\n") + 3]
    log = tmp_path / "installed"
    fake = tmp_path / "apt-get"
    fake.write_text(f"""#!/bin/sh
[ "$1" = install ] || exit 0
case " $* " in *" libnope1 "*) exit 100;; esac
shift 3
printf '%s\\n' "$@" >> {log}
""")
    fake.chmod(0o755)
    r = subprocess.run(["bash", "-c", f"set -euo pipefail\n{func}\napt_install libxcb1 libnope1 libbrotli1"],
                       capture_output=True, text=True, timeout=120, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert r.returncode == 1
    assert log.read_text().split() == ["libxcb1", "libbrotli1"]
    assert r.stderr.strip() == "dev: apt-get could not install: libnope1"


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
