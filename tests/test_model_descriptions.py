"""The model descriptions (core/model/arch/): the only place an architecture's name is tested; everything else
reads their flags and the ModelConfig switches."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from quantscope.core.model import ARCHITECTURES, SUPPORTED_ARCHS
from quantscope.core.model import arch as arch_pkg

CORE = Path(__file__).resolve().parents[1] / "core"
DESCRIPTIONS = CORE / "model" / "arch"
#: Where an architecture-named string is another namespace's value, not a test of the engine's architecture.
OTHER_NAMESPACES = {
    CORE / "tokenizer": "tokenizer.ggml.model / tokenizer.ggml.pre values ('llama' is SentencePiece)",
    CORE / "quant": "llama-quantize's type-choice rules, which name architectures as llama.cpp's do",
}
#: Folders where no architecture name may appear at all, not even as data.
ENGINE = (CORE / "engine", CORE / "model", CORE / "native")


def _names(node: ast.AST) -> list[str]:
    """The architecture names among a constant or a tuple/list/set of constants."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [x.value for x in items if isinstance(x, ast.Constant) and x.value in SUPPORTED_ARCHS]


def architecture_name_uses(path: Path, strict: bool) -> list[str]:
    """``line: name`` for every test of an architecture name in ``path`` (a comparison or a dict key), and with
    ``strict`` (the engine's folders) for every architecture-named string at all."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        found: list[str] = []
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                found += _names(side)
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                if key is not None:
                    found += _names(key)
        elif strict and isinstance(node, ast.Constant):
            found += _names(node)
        out += [f"{node.lineno}: {name!r}" for name in found]  # type: ignore[attr-defined]
    return list(dict.fromkeys(out))


def test_architecture_names_only_in_descriptions():
    """No module of core/ outside the descriptions tests an architecture's name: adding one is a description
    module, not edits wherever a switch is read."""
    bad = []
    for path in sorted(CORE.rglob("*.py")):
        if path.is_relative_to(DESCRIPTIONS) or any(path.is_relative_to(d) for d in OTHER_NAMESPACES):
            continue
        strict = any(path.is_relative_to(d) for d in ENGINE)
        bad += [f"{path.relative_to(CORE.parent)}:{use}" for use in architecture_name_uses(path, strict)]
    assert not bad, "architecture names outside core/model/arch/:\n" + "\n".join(bad)


def test_the_scan_finds_name_tests(tmp_path):
    """The scan sees comparisons, membership tests and dict keys, and strictly any architecture-named string."""
    f = tmp_path / "m.py"
    f.write_text("def f(cfg):\n    if cfg.arch == 'gemma4':\n        pass\n    x = cfg.arch in ('llama', 'x')\n"
                 "    ids = {'qwen2': 1}\n    y = 'phi3'\n    return x, ids, y, 'gemma'\n")
    assert architecture_name_uses(f, strict=False) == ["2: 'gemma4'", "4: 'llama'", "5: 'qwen2'"]
    assert sorted(architecture_name_uses(f, strict=True)) == ["2: 'gemma4'", "4: 'llama'", "5: 'qwen2'", "6: 'phi3'"]


def test_every_description_module_is_registered():
    """Each module of core/model/arch/ defines one DESCRIPTION and is in the registry; names are unique."""
    files = {p.stem for p in DESCRIPTIONS.glob("*.py")} - {"__init__", "base"}
    registered = {m.__name__.rsplit(".", 1)[1] for m in arch_pkg.MODULES}
    assert files == registered
    assert len(ARCHITECTURES) == len(arch_pkg.MODULES)
    for m in arch_pkg.MODULES:
        assert ARCHITECTURES[m.DESCRIPTION.name] is m.DESCRIPTION
        assert m.DESCRIPTION.configure.__module__ == m.__name__ or m.DESCRIPTION.name in m.__doc__


@pytest.mark.parametrize("name", SUPPORTED_ARCHS)
def test_description_docstring_names_its_architecture(name):
    mod = next(m for m in arch_pkg.MODULES if m.DESCRIPTION.name == name)
    assert mod.__doc__ and mod.__doc__.startswith(name + ":")
