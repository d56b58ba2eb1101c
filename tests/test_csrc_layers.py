"""The C files call each other in layers, never in a circle: codecs at the bottom, the type table above them, the
drivers (matmat, GEMM, repack, quantize) above it, the block on top.

Every csrc/*.c is compiled on its own (no optimisation, so nothing is inlined away) and ``nm`` names the global
functions and data each object defines and the ones it needs; a file that needs a symbol another file defines
depends on that file. The test fails on any cycle in that graph (naming it and the symbols behind each step) and
on a file below the drivers calling the table, a driver or the block."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parent.parent / "csrc"


def file_graph(src: Path, tmp: Path) -> tuple[dict[str, set[str]], dict[tuple[str, str], set[str]]]:
    """``{file: files it uses}`` and, per edge, the symbols behind it."""
    def symbols(c: Path) -> str:
        obj = tmp / (c.stem + ".o")
        subprocess.run(["cc", "-O0", "-std=gnu11", "-w", "-c", str(c), "-I", str(src), "-o", str(obj)], check=True)
        return subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout

    sources = sorted(src.glob("*.c"))
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        listings = list(pool.map(symbols, sources))
    defines: dict[str, str] = {}
    needs: dict[str, set[str]] = {}
    for c, out in zip(sources, listings, strict=True):
        needs[c.name] = set()
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBRC":
                defines[parts[2]] = c.name
            elif len(parts) == 2 and parts[0] == "U":
                needs[c.name].add(parts[1])
    graph: dict[str, set[str]] = {f: set() for f in needs}
    why: dict[tuple[str, str], set[str]] = {}
    for f, syms in needs.items():
        for s in syms:
            g = defines.get(s)
            if g and g != f:
                graph[f].add(g)
                why.setdefault((f, g), set()).add(s)
    return graph, why


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of files (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m):], m]
            if m not in state and (cyc := visit(m)):
                return cyc
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (cyc := visit(n)):
            return cyc
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


DRIVERS = {"qs_matmat.c", "qs_gemm.c", "qs_repack.c", "qs_quantize.c"}
TOP = {"qs_block.c"}


@pytest.mark.skipif(not (shutil.which("cc") and shutil.which("nm")), reason="needs a C compiler and nm")
def test_no_call_cycle_among_csrc_files(tmp_path):
    graph, why = file_graph(CSRC, tmp_path)
    assert {"qs_traits.c", *DRIVERS, *TOP} <= set(graph)
    cyc = find_cycle(graph)
    if cyc:
        detail = "; ".join(f"{a} -> {b} ({', '.join(sorted(why[a, b])[:3])})" for a, b in itertools.pairwise(cyc))
        pytest.fail(f"call cycle among csrc files: {detail}")
    # the layers: the table calls no driver, the drivers not the block, nothing else calls the table or above
    above = {"qs_traits.c": DRIVERS | TOP, **dict.fromkeys(DRIVERS, TOP)}
    for f, uses in graph.items():
        up = uses & above.get(f, {"qs_traits.c", *DRIVERS, *TOP})
        assert f in TOP or not up, f"{f} calls up into {sorted(up)} ({sorted(why[f, sorted(up)[0]])[:3]})"


def test_type_table_rows_are_consistent():
    """Every ISA slot of a row has a scalar reference beneath it; every job has what its driver reads."""
    from quantscope.core.native import lib

    assert lib.qs_traits_check() == -1
