"""Hidden imports of the PyInstaller build (packaging/quantscope.spec), derived from what is installed.

Importable without PyInstaller, so tests/test_desktop.py checks that every name here imports. pyqtgraph's Qt
Designer templates are found by their file names (``*Template_generic.py``; pyqtgraph 0.13 named them
``*_pyside6``): a rename that leaves none raises instead of silently building an app without them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

#: imported from C or by name at run time, invisible to PyInstaller's analysis of the entry script
STATIC = (
    "_cffi_backend",  # cffi's API-mode extension imports it from C
    "quantscope.gui.launch",  # the CLI imports the GUI lazily
    "quantscope.gui.app",
    "quantscope.gui.mainwindow",
    "quantscope.core.native._quantscope_native",
    # quantscope serve: uvicorn imports its loop, protocol and lifespan modules by name from its config
    "uvicorn.loops.auto",
    "uvicorn.loops.asyncio",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.lifespan.off",
    "uvicorn.logging",
)
TEMPLATE_SUFFIX = "Template_generic"
#: pyqtgraph's examples import their templates as top-level modules; flowcharts are unused (pyqtgraph does not
#: import them either) and would pull in their node library
SKIPPED_PARTS = frozenset({"examples", "flowchart"})


def pyqtgraph_templates() -> list[str]:
    """Module names of the installed pyqtgraph's ``*Template_generic`` modules (sorted); raises if none."""
    spec = importlib.util.find_spec("pyqtgraph")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pyqtgraph is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    names = sorted(
        ".".join(("pyqtgraph", *f.relative_to(root).with_suffix("").parts))
        for f in root.rglob(f"*{TEMPLATE_SUFFIX}.py")
        if not SKIPPED_PARTS.intersection(f.relative_to(root).parts)
    )
    if not names:
        raise RuntimeError(f"no *{TEMPLATE_SUFFIX}.py modules under {root}: pyqtgraph renamed its templates; "
                           "update packaging/hidden_imports.py")
    return names


def cli_modules() -> list[str]:
    """The command line's verb modules, which ``quantscope.cli.main`` imports by name."""
    from quantscope.cli.main import COMMANDS

    return [f"quantscope.cli.{m}" for m in dict.fromkeys(COMMANDS.values())]


def desktop_backends() -> list[str]:
    """The per-OS desktop-integration modules, which ``quantscope.core.desktop`` imports by name (all of them:
    ``desktop install --dry-run --os`` shows any system's plan)."""
    from quantscope.core.desktop import BACKENDS

    return [f"quantscope.core.{m}" for m in dict.fromkeys(BACKENDS.values())]


def hidden_imports() -> list[str]:
    """Every hidden import the spec passes to ``Analysis``."""
    return [*STATIC, *cli_modules(), *desktop_backends(), *pyqtgraph_templates()]


if __name__ == "__main__":
    print("\n".join(hidden_imports()))
