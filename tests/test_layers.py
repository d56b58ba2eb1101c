"""The layers, enforced: gui -> core -> native. core/ never imports Qt (nor the GUI or the CLI), gui/ never reaches
into quantscope.core.native, every module imports only modules of its own rank or below (``LAYERS``), and no two
modules import each other, directly or around a circle (function-level and typing-only imports count too: a circle
of types is a circle of modules). Read from the source with ``ast``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "quantscope"
TOPS = ("core", "gui", "cli")
QT = frozenset({"PySide6", "PySide2", "PyQt5", "PyQt6", "shiboken6", "pyqtgraph", "qtpy"})
#: circles still to break (issue 35); a circle not listed here fails, and so does a listed one that is gone
KNOWN_CYCLES: set[frozenset[str]] = set()
#: The layers, lowest first: a module may import modules of its own rank or below, never above. Each entry ranks
#: a package (or a top-level module) with everything in it; the longest entry that names a module wins, so the
#: applications that live beside the code they drive (quant.lab, gguf.diff) rank above their package. Every
#: module needs a rank: a new package or top-level module goes into this table.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("core.base",)),  # the ggml type table and the GGUF vocabulary: imports nothing of ours
    ("platform", ("core.fsutil", "core.sysinfo", "core.shardnames", "core.filestate", "core.jobs",
                  "core.userregex", "core.desktop", "core.desktop_icons", "core.desktop_macos",
                  "core.desktop_windows", "core.desktop_xdg")),
    ("kernels", ("core.native", "core.cpu")),
    ("container", ("core.gguf", "core.bump")),
    ("codecs", ("core.quant",)),
    ("model", ("core.model", "core.tokenizer")),
    ("engine", ("core.engine", "core.chat")),
    ("applications", ("core.quant.lab", "core.quant.sensitivity", "core.quant.target", "core.gguf.diff",
                      "core.analysis", "core.blockdump", "core.export", "core.summary", "core.bench",
                      "core.synthetic", "core.catalog", "core.library", "core.hub", "core.publish",
                      "core.server")),
    ("front ends", ("cli", "gui")),
)


def modules(root: Path = ROOT, tops: tuple[str, ...] = TOPS) -> dict[str, Path]:
    """``quantscope.core.gguf.reader`` -> its file, for every module under the top folders."""
    out: dict[str, Path] = {}
    for top in tops:
        for p in sorted((root / top).rglob("*.py")):
            parts = list(p.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([PACKAGE, *parts])] = p
    return out


def imports(name: str, path: Path) -> tuple[tuple[str, int], ...]:
    """Every module name ``path`` imports (anywhere in it, relative imports resolved), with its line;
    ``from X import y`` yields ``X.y`` as well, in case ``y`` is a module."""
    return tuple(_imports(name, path, path.stat().st_mtime_ns))


@cache
def _imports(name: str, path: Path, _mtime: int) -> list[tuple[str, int]]:
    return list(_walk(name, path))


def _walk(name: str, path: Path) -> Iterator[tuple[str, int]]:
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod, node.lineno
            for a in node.names:
                yield f"{mod}.{a.name}", node.lineno


def edges(m: str, p: Path, mods: dict[str, Path]) -> dict[str, int]:
    """The project modules ``m`` (at ``p``) depends on, each with the first line importing it. ``from . import x``
    depends on ``x``, not on the package; a package's ``__init__`` re-exporting its own submodules is its facade,
    not a dependency of theirs."""
    found: dict[str, int] = {}
    for t, line in imports(m, p):
        if t in mods and t != m:
            found.setdefault(t, line)
    for t in list(found):
        if any(o.startswith(t + ".") for o in found):  # ``from pkg import sub``: the submodule, not pkg
            del found[t]
    if p.name == "__init__.py":
        found = {t: line for t, line in found.items() if not t.startswith(m + ".")}
    return found


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Project module -> the project modules it imports (see :func:`edges`)."""
    return {m: set(edges(m, p, mods)) for m, p in mods.items()}


def rank(m: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> tuple[int, str] | None:
    """``(rank, layer name)`` of module ``m``: the longest ``layers`` entry naming it or a package above it
    (``quantscope.core`` itself, an empty ``__init__``, is the bottom); ``None`` when no entry does."""
    if m == f"{PACKAGE}.core":
        return 0, layers[0][0]
    best: tuple[int, int, str] | None = None
    for r, (layer, names) in enumerate(layers):
        for n in names:
            full = f"{PACKAGE}.{n}"
            if (m == full or m.startswith(full + ".")) and (best is None or len(full) > best[0]):
                best = (len(full), r, layer)
    return None if best is None else (best[1], best[2])


def rank_violations(mods: dict[str, Path],
                    layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    """Modules without a rank, and imports from a lower rank to a higher one, as ``file:line: what``."""
    bad = []
    for m, p in mods.items():
        mine = rank(m, layers)
        if mine is None:
            bad.append(f"{_where(p, 1)}: {m} has no rank (add it to LAYERS)")
            continue
        for t, line in edges(m, p, mods).items():
            theirs = rank(t, layers)
            if theirs is not None and theirs[0] > mine[0]:
                bad.append(f"{_where(p, line)}: {m} ({mine[1]}) imports {t} ({theirs[1]}), a higher layer")
    return sorted(bad)


def cycles(g: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []
    for start in g:
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def _where(p: Path, line: int) -> str:
    return f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}:{line}"


def violations(mods: dict[str, Path]) -> list[str]:
    """Imports that break the layers, as ``file:line: what``."""
    bad = []
    for m, p in mods.items():
        for t, line in imports(m, p):
            top = t.split(".")[0]
            if m.startswith(f"{PACKAGE}.core") and top in QT:
                bad.append(f"{_where(p, line)}: core imports Qt ({t})")
            if m.startswith(f"{PACKAGE}.core") and t.startswith((f"{PACKAGE}.gui", f"{PACKAGE}.cli")):
                bad.append(f"{_where(p, line)}: core imports {t}")
            if m.startswith(f"{PACKAGE}.gui") and (t == f"{PACKAGE}.core.native"
                                                  or t.startswith(f"{PACKAGE}.core.native.")):
                bad.append(f"{_where(p, line)}: gui reaches into the native layer ({t})")
    return sorted(set(bad))


def test_layers_hold() -> None:
    assert violations(modules()) == []


def test_every_module_imports_downward() -> None:
    assert rank_violations(modules()) == []


def test_the_base_is_the_bottom() -> None:
    """The type table and the GGUF vocabulary import nothing of the project; the container, the kernels and the
    codecs import them from the base (they used to live in quant and gguf: native and gguf imported quant)."""
    mods = modules()
    g = graph(mods)
    base = [m for m in mods if m.startswith(f"{PACKAGE}.core.base")]
    assert {f"{PACKAGE}.core.base.ggml_types", f"{PACKAGE}.core.base.gguf_constants"} <= set(base)
    assert [t for m in base for t in g[m] if not t.startswith(f"{PACKAGE}.core.base")] == []
    for user in ("native.kernels", "gguf.reader", "bump.reader", "quant.blocks"):
        assert f"{PACKAGE}.core.base.ggml_types" in g[f"{PACKAGE}.core.{user}"], user


def test_no_import_cycles() -> None:
    found = set(cycles(graph(modules())))
    assert found - KNOWN_CYCLES == set(), "new import circles"
    assert KNOWN_CYCLES - found == set(), "these circles are gone: remove them from KNOWN_CYCLES"


def test_the_named_circles_are_broken() -> None:
    g = graph(modules())
    for a, b in (("core.quant.blocks", "core.quant.iq_blocks"), ("gui.views.metadata", "gui.views.metadata_edit")):
        a, b = f"{PACKAGE}.{a}", f"{PACKAGE}.{b}"
        assert not (b in g[a] and a in g[b]), f"{a} and {b} import each other"


def test_the_chat_view_is_composed_not_mixed_in() -> None:
    """The chat view's pieces (its controllers and widgets) never import the view that composes them: the view
    hands them what they need. (Its loading, reply and persistence mixins did, typed against ChatView: a circle.)"""
    g = graph(modules())
    view = f"{PACKAGE}.gui.views.chat"
    pieces = [m for m in g if m.startswith(f"{view}_")]
    assert {f"{view}_{p}" for p in ("loading", "reply", "persist")} <= set(pieces)
    assert [m for m in pieces if view in g[m]] == []
    assert {f"{view}_{p}" for p in ("loading", "reply", "persist")} <= g[view]  # and the view composes them
    tree = ast.parse((ROOT / "gui" / "views" / "chat.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ChatView"]
    assert [ast.unparse(b) for b in cls.bases] == ["QWidget"]  # no mixins


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    def put(rel: str, text: str) -> None:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    put("core/__init__.py", "")
    put("core/a.py", "from . import b\n")
    put("core/b.py", "def f():\n    from .c import x\n")
    put("core/c.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from quantscope.core.a import y\n"
        "x = 1\n")
    put("core/qt.py", "def f():\n    from PySide6.QtCore import Qt\n")
    put("core/up.py", "from ..gui import w\n")
    put("core/pkg/__init__.py", "from .leaf import z\n")
    put("core/pkg/leaf.py", "from . import other\nz = 1\n")
    put("core/pkg/other.py", "")
    put("gui/__init__.py", "")
    put("gui/w.py", "import quantscope.core.native.kernels as K\nfrom ..core import pkg\n")
    return tmp_path


def test_the_checks_can_fail(fake_tree: Path) -> None:
    mods = modules(fake_tree)
    assert cycles(graph(mods)) == [frozenset({f"{PACKAGE}.core.{x}" for x in "abc"})]  # function- and typing-level
    assert graph(mods)[f"{PACKAGE}.core.pkg.leaf"] == {f"{PACKAGE}.core.pkg.other"}  # no edge to the package
    bad = violations(mods)
    assert [b.split(": ", 1)[1] for b in bad] == [
        "core imports Qt (PySide6.QtCore)", "core imports Qt (PySide6.QtCore.Qt)",
        "core imports quantscope.gui", "core imports quantscope.gui.w",
        "gui reaches into the native layer (quantscope.core.native.kernels)"]


def test_the_rank_check_can_fail(tmp_path: Path) -> None:
    """A planted tree: base < container < codecs, with an application inside the container ranked above all."""
    for rel, text in {
        "core/__init__.py": "",
        "core/base/__init__.py": "",
        "core/base/types.py": "from ..gguf import reader\n",  # base -> container: up
        "core/gguf/__init__.py": "from .reader import r\n",  # a facade: its own submodule, no edge
        "core/gguf/reader.py": "from ..base import types\nfrom ..quant.codec import c\n",  # down; up (line 2)
        "core/gguf/diff.py": "from ..quant import codec\n",  # an application: above the codecs, allowed
        "core/quant/__init__.py": "",
        "core/quant/codec.py": "def f():\n    from ..gguf.diff import d\n",  # codecs -> application: up
        "core/stray.py": "",  # in no layer
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    layers = (("base", ("core.base",)), ("container", ("core.gguf",)), ("codecs", ("core.quant",)),
              ("applications", ("core.gguf.diff",)))
    mods = modules(tmp_path, ("core",))
    assert rank(f"{PACKAGE}.core.gguf.diff", layers) == (3, "applications")
    assert rank(f"{PACKAGE}.core.gguf.reader", layers) == (1, "container")
    assert rank(f"{PACKAGE}.core.stray", layers) is None
    assert [b.split(": ", 1)[1] for b in rank_violations(mods, layers)] == [
        f"{PACKAGE}.core.base.types (base) imports {PACKAGE}.core.gguf.reader (container), a higher layer",
        f"{PACKAGE}.core.gguf.reader (container) imports {PACKAGE}.core.quant.codec (codecs), a higher layer",
        f"{PACKAGE}.core.quant.codec (codecs) imports {PACKAGE}.core.gguf.diff (applications), a higher layer",
        f"{PACKAGE}.core.stray has no rank (add it to LAYERS)"]
    assert [b.split(": ", 1)[0].rsplit(":", 1)[1] for b in rank_violations(mods, layers)] == ["1", "2", "2", "1"]


def test_every_package_folder_is_in_the_wheel() -> None:
    """A package folder missing from pyproject's list is absent from every non-editable install (wheel, app
    bundle): core/model/arch was, and `import quantscope.core.engine` failed there while the editable tree worked."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    cfg = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    dirs = {name: root / path for name, path in cfg["package-dir"].items()}
    found = set()
    for name, folder in dirs.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            found.add(".".join((name, *rel)))
    assert found - set(cfg["packages"]) == set(), "package folders missing from pyproject.toml's packages"
