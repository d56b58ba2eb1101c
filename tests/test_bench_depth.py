"""``quantscope bench model -d``: llama-bench's depth, tests run after N tokens already in the KV cache (issue 48).

The option's parsing, the rows it adds (llama-bench's names: ``pp8 @ d64``), and that the timed part really starts
from a cache that holds the depth's tokens: a recording session around the real one sees every forward's position
and checks the cached keys of the depth's positions are the fill's, untouched by the timed runs. Nothing timed.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import pytest

from quantscope.cli.bench import depth_list
from quantscope.core.engine import Model
from quantscope.core.engine.tools import DEPTH_CHUNK, bench_model, bench_test_name


def test_depth_list_parses_like_llama_bench():
    assert depth_list("0") == [0]
    assert depth_list("0,4096") == [0, 4096]
    assert depth_list(" 64 , 0 ") == [64, 0]  # the order given
    assert depth_list("64,64,0") == [64, 0]  # repeats dropped
    for bad in ("", "a", "0,,1", "-1", "1,", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            depth_list(bad)


def test_test_names_are_llama_benchs():
    assert bench_test_name("pp", 512, 0) == "pp512"
    assert bench_test_name("tg", 64, 4096) == "tg64 @ d4096"


class Recording:
    """A real CPU session that records each forward's (n_past, tokens) and, once the cache is filled to the depth,
    checks that the depth's cached keys stay the fill's at every later forward."""

    def __init__(self, inner: Any, depth: int) -> None:
        self.inner, self.depth = inner, depth
        self.calls: list[tuple[int, int]] = []
        self.filled: np.ndarray | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def n_past(self) -> int:
        return self.inner.n_past

    def forward(self, tokens: Any, **kw: Any) -> np.ndarray:
        n = self.inner.n_past
        k0 = self.inner.k_cache[0]
        if self.filled is not None and n >= self.depth:
            assert np.array_equal(k0[: self.depth], self.filled), "the timed runs changed the depth's cache"
        self.calls.append((n, len(tokens)))
        out = self.inner.forward(tokens, **kw)
        if self.filled is None and self.inner.n_past == self.depth:
            self.filled = k0[: self.depth].copy()
            assert np.abs(self.filled.astype(np.float32)).sum(axis=(1, 2)).min() > 0  # every position written
        return out


@pytest.mark.parametrize("depth", [64, DEPTH_CHUNK + 40])
def test_timed_runs_start_from_a_cache_that_holds_the_depth(model_path, depth):
    model = Model.load(str(model_path("smollm2")), threads=1)
    rec: list[Recording] = []

    def make(n_ctx: int) -> Recording:
        rec.append(Recording(model.session(n_ctx), depth))
        return rec[-1]

    rows = bench_model(model, 8, 4, repetitions=1, make_session=make, depths=[depth])
    assert [(r["test"], r["n_depth"], r["n_tokens"]) for r in rows] == [(f"pp8 @ d{depth}", depth, 8),
                                                                      (f"tg4 @ d{depth}", depth, 4)]
    assert all(r["tokens_per_s"] > 0 for r in rows)
    (s,) = rec
    assert s.inner.n_ctx >= depth + 8
    fill = [(start, min(DEPTH_CHUNK, depth - start)) for start in range(0, depth, DEPTH_CHUNK)]
    timed = [(depth, 8)] * 2 + [(depth + i, 1) for i in range(4)] * 2  # warm-up and one repetition each
    assert s.calls == fill + timed
    assert s.filled is not None


def test_depth_zero_is_todays_bench(model_path):
    model = Model.load(str(model_path("smollm2")), threads=1)
    rows = bench_model(model, 8, 4, repetitions=1)
    assert [(r["test"], r["n_depth"]) for r in rows] == [("pp8", 0), ("tg4", 0)]
    with pytest.raises(ValueError, match="non-negative"):
        bench_model(model, 8, 4, repetitions=1, depths=[-1])


def test_cli_prints_a_row_per_test_and_depth(model_path, capsys):
    from quantscope.cli.main import main

    smol = str(model_path("smollm2"))
    assert main(["bench", "model", smol, "-p", "8", "-n", "4", "-r", "1", "-t", "1", "--backend", "cpu",
                 "-d", "0,64", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["test"], r["n_depth"]) for r in rows] == [("pp8", 0), ("tg4", 0), ("pp8 @ d64", 64),
                                                        ("tg4 @ d64", 64)]
    assert main(["bench", smol, "-p", "8", "-n", "4", "-r", "1", "-t", "1", "--backend", "cpu", "-d", "32"]) == 0
    out = capsys.readouterr().out
    assert "pp8 @ d32" in out and "tg4 @ d32" in out
    assert main(["bench", "model", smol, "-d", "0,x"]) == 2


def test_gpu_table_names_llama_benchs_rows_as_ours():
    """bench_gpu_vs_llama.py reads llama-bench's JSON rows (n_prompt, n_gen, n_depth) under our test names, and
    asks both engines for the same depths."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "bench"))
    import bench_gpu_vs_llama as g

    rows = [{"n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": 200.0},
            {"n_prompt": 0, "n_gen": 128, "n_depth": 4096, "avg_ts": 150.0},
            {"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 9000.0}]
    assert g.parse_llama_rows(json.dumps(rows)) == {"tg128": 200.0, "tg128 @ d4096": 150.0, "pp512": 9000.0}
    a = argparse.Namespace(n_prompt=[512, 4096], n_gen=128, depth=[0, 4096], backend="cuda")
    assert g.tests_of(a) == [("tg", 128, 0), ("tg", 128, 4096), ("pp", 512, 0), ("pp", 4096, 0)]
    ours, llama = g.ours_cmds(Path("m.gguf"), a), g.llama_cmds(Path("llama-bench"), Path("m.gguf"), a)
    assert [c[c.index("-d") + 1] for c in ours + llama if "-d" in c] == ["0,4096", "0,4096"]
    assert [c[c.index("-p") + 1] for c in ours] == ["0", "512", "4096"]
    assert [c[c.index("-p") + 1] for c in llama] == ["0", "512,4096"]
