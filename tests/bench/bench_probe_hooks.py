"""Decode speed with the probe's hooks off and on, and against a build from before the hooks existed.

The probe (docs/probe.md) adds a query-buffer pointer to the native block (NULL when off) and a ``trace`` argument
to ``Session.forward`` (``None`` when off). This script shows what they cost:

- ``before``: a checkout of a commit before the hooks (``--baseline-tree``, built in place with
  ``python csrc/build_ffi.py`` there), imported instead of this tree;
- ``off``: this tree, ``forward`` without a trace (what generation does);
- ``on``: this tree, every decode step traced (residual stream and queries kept).

Each variant runs in its own process, the variants interleaved round by round on the same machine: load the model
(repacked, as the chat), prefill ``--prompt`` tokens, then time ``--gen`` single-token decode steps. Prints one JSON
line per run and a summary of the median tokens per second with the ratios to ``off``.

    python tests/bench/bench_probe_hooks.py MODEL.gguf --baseline-tree /tmp/qs_old --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import importlib.abc, importlib.util, json, sys, time
tree, model, n_prompt, n_gen, threads, trace_on = sys.argv[1:7]
if tree:
    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "quantscope.core":
                init = tree + "/core/__init__.py"
                return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[tree + "/core"])
            return None
    sys.meta_path.insert(0, Finder())
import numpy as np
import quantscope.core
from quantscope.core.engine import session as S
assert quantscope.core.__file__.startswith(tree or "/"), quantscope.core.__file__
m = S.Model.load(model, threads=int(threads))
m.repack()
s = m.session(int(n_prompt) + int(n_gen) + 1)
rng = np.random.default_rng(0)
ids = [int(t) for t in rng.integers(100, m.config.n_vocab - 1, int(n_prompt))]
s.forward(ids)
tok = ids[-1]
kw = {}
if trace_on == "1":
    kw = {"trace": S.ForwardTrace()}
t0 = time.perf_counter()
for _ in range(int(n_gen)):
    logits = s.forward([tok], **kw)
    tok = int(np.argmax(logits))
dt = time.perf_counter() - t0
print(json.dumps({"tok_s": int(n_gen) / dt, "seconds": dt}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--baseline-tree", help="a built checkout from before the hooks (the 'before' variant)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    variants = [("off", "", "0"), ("on", "", "1")]
    if a.baseline_tree:
        tree = str(Path(a.baseline_tree).resolve())
        if not (Path(tree) / "core" / "engine" / "session.py").is_file():
            print(f"bench_probe_hooks: {tree} is not a Quantscope checkout", file=sys.stderr)
            return 2
        variants.insert(0, ("before", tree, "0"))
    results: dict[str, list[float]] = {v[0]: [] for v in variants}
    for r in range(a.rounds):
        for name, tree, trace in variants:
            out = subprocess.run([sys.executable, "-c", CHILD, tree, a.model, str(a.prompt), str(a.gen),
                                  str(a.threads), trace], capture_output=True, text=True, check=False)
            if out.returncode:
                print(f"bench_probe_hooks: {name} failed:\n{out.stderr}", file=sys.stderr)
                return 1
            d = json.loads(out.stdout.strip().splitlines()[-1])
            results[name].append(d["tok_s"])
            print(json.dumps({"round": r, "variant": name, **d}))
    off = statistics.median(results["off"])
    for name, vals in results.items():
        med = statistics.median(vals)
        print(f"{name:>6}: median {med:.2f} tok/s (best {max(vals):.2f}), {med / off:.3f}x of off")
    return 0


if __name__ == "__main__":
    sys.exit(main())
