"""Shared fixtures: the real test models (missing = failure, never a skip) and gguf-py oracles."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from quantscope.core import catalog

MODEL_NAMES = tuple(catalog.MODELS)


def require_model(name: str) -> Path:
    """Path of catalogue model ``name``; fails the test when it has not been fetched. Only tests/run_gpu.sh, on a
    device machine that cannot reach the registry nor receive the models, sets QUANTSCOPE_CATALOGUE_UNAVAILABLE: the
    tests that need one are then reported as skipped, with the reason, instead of failing."""
    if os.environ.get("QUANTSCOPE_CATALOGUE_UNAVAILABLE") and not catalog.is_present(name):
        pytest.skip(f"catalogue model {name!r} is not on this machine (QUANTSCOPE_CATALOGUE_UNAVAILABLE)")
    if not catalog.is_present(name):
        pytest.fail(
            f"test model {name!r} is missing from {catalog.cache_dir()}: run `quantscope models fetch` "
            "(./dev test does it)",
            pytrace=False,
        )
    return catalog.model_path(name)


@pytest.fixture(scope="session")
def model_path() -> Callable[[str], Path]:
    return require_model


@pytest.fixture(scope="module")
def gguf_py_reader() -> Iterator[Callable[[str], object]]:
    """gguf-py's GGUFReader on a catalogue model, opened once per module (it takes 6-45 s) and dropped after."""
    import gguf

    readers: dict[str, object] = {}

    def get(name: str) -> object:
        if name not in readers:
            readers[name] = gguf.GGUFReader(require_model(name))
        return readers[name]

    yield get
    readers.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    """A GUI test (one that uses ``qtbot``) runs, from its setup to its teardown, with Python's cyclic garbage
    collection where the app has it: never on another thread (gui/gc_thread.py; in the test's call the GUI thread
    collects on a timer, see :func:`pytest_runtest_call`). What is left is collected here, on the GUI thread."""
    if "qtbot" not in getattr(item, "fixturenames", ()):
        return (yield)
    was = gc.isenabled()
    gc.disable()
    try:
        return (yield)
    finally:
        gc.collect()
        if was:
            gc.enable()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):  # type: ignore[no-untyped-def]
    """Every GUI test runs under the event-loop watchdog (tests/watchdog.py): a blocked loop fails it; and cycles
    are collected on the GUI thread, as in the app (gui/gc_thread.py)."""
    from .watchdog import watch

    if "qtbot" not in getattr(item, "fixturenames", ()):
        return (yield from watch(item))
    from PySide6.QtWidgets import QApplication

    if QApplication.instance() is None:
        return (yield from watch(item))
    from quantscope.gui.gc_thread import GuiThreadCollector

    collector = GuiThreadCollector()
    try:
        return (yield from watch(item))
    finally:
        collector.stop()


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
