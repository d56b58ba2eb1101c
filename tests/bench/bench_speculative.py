"""Speculative decoding's speed-up (docs/speculative.md), interleaved with plain decoding, figures only (no
assertions), beside llama.cpp's ``llama-lookup`` and ``llama-speculative-simple`` where they are given.

1. Prompt lookup on Qwen2.5-Coder-0.5B (catalogue) with a code-rewrite prompt (a rename in a Python class the
   reply repeats): plain greedy decoding vs ``--lookup N``: generation t/s, speed-up, acceptance, and whether
   the texts are identical.
2. A draft model on the synthetic pair: ``synthetic:1b`` as the model and ``synthetic:tiny`` as its draft (the
   same SmolLM2 vocabulary; random weights, so the acceptance is what random weights give: this shows the cost
   side), at ``--draft-p-min`` 0.75 (the default: the draft stops where it is unsure) and 0 (it always drafts
   ``--draft-max`` tokens).

Both engines get the same text: the chat template rendered here, passed as a raw prompt. llama.cpp's plain
decode figure is llama-bench ``tg`` at the prompt's depth (``-d``). The example programs are not among the
pinned build's targets (tests/bench/llamacpp_build.py): ``--llama`` compiles them against its static libraries
(as tests/record_bert_fixtures.py does llama-embedding) into ``<build>/spec-examples``, once.

Usage: python tests/bench/bench_speculative.py [--tokens 200] [--reps 3] [--threads 2] [--lookup 4]
       [--draft-max 16] [--llama] [--skip-draft]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quantscope.core import catalog
from quantscope.core.chat import SamplerParams
from quantscope.core.cpu import cpu_name
from quantscope.core.engine.generate import Engine

CODE = '''class NGramLookup:
    """Prompt lookup: the continuation of the latest earlier occurrence of the context's last n tokens."""

    def __init__(self, n_max: int) -> None:
        self.n_max = n_max
        self._seen: list[int] = []
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_max + 1)]

    def _extend(self, history: list[int]) -> None:
        if self._seen != list(history[: len(self._seen)]):
            self._seen, self._index = [], [{} for _ in range(self.n_max + 1)]
        start = len(self._seen)
        self._seen.extend(int(t) for t in history[start:])
        h = self._seen
        for i in range(max(1, start), len(h)):
            for n in range(1, min(self.n_max, i) + 1):
                self._index[n][tuple(h[i - n : i])] = i

    def propose(self, history: list[int], k: int) -> list[int]:
        self._extend(history)
        h = self._seen
        for n in range(min(self.n_max, len(h) - 1), 0, -1):
            at = self._index[n].get(tuple(h[len(h) - n :]))
            if at is not None:
                return h[at : at + k]
        return []
'''
REWRITE = ("Rewrite this Python class with the attribute `_seen` renamed to `_tokens` everywhere. Output only the "
           "complete code, nothing else.\n\n```python\n" + CODE + "```")
STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


def rendered(eng: Engine, content: str) -> str:
    """The chat template's text for one user message (given to both engines as a raw prompt)."""
    assert eng.template is not None
    return eng.template.render([{"role": "user", "content": content}], add_generation_prompt=True)


def decode(eng: Engine, prompt: str, tokens: int) -> tuple[float, list[int], int, int]:
    """Generation t/s (prompt excluded), the tokens, drafted and accepted counts of one greedy reply."""
    eng.session.reset()
    eng.cached, eng._prompt_logits = [], None
    out = list(eng.generate(prompt, SamplerParams(temperature=0, max_tokens=tokens)))
    last = out[-1]
    return last.gen_tps, [d.token for d in out if d.token is not None], last.drafted, last.accepted


def interleaved(eng: Engine, prompt: str, tokens: int, reps: int, modes: dict[str, dict]) -> dict[str, dict]:
    """Each mode's median t/s over ``reps`` rounds (the modes alternate within a round), acceptance, tokens."""
    res: dict[str, dict] = {m: {"tps": [], "drafted": 0, "accepted": 0, "tokens": None} for m in modes}
    for _ in range(reps):
        for m, kw in modes.items():
            eng.speculate(**kw)
            tps, toks, d, a = decode(eng, prompt, tokens)
            r = res[m]
            r["tps"].append(tps)
            r["drafted"] += d
            r["accepted"] += a
            r["tokens"] = toks
    eng.speculate()
    for r in res.values():
        r["median"] = statistics.median(r["tps"])
    return res


def show(title: str, res: dict[str, dict]) -> None:
    base = res["plain"]
    print(f"\n{title}")
    for m, r in res.items():
        acc = f"{100 * r['accepted'] / r['drafted']:.0f}% of {r['drafted']} drafted" if r["drafted"] else "-"
        same = "" if m == "plain" else ("  identical text" if r["tokens"] == base["tokens"] else "  TEXT DIFFERS")
        print(f"  {m:<24} {r['median']:7.1f} t/s  x{r['median'] / base['median']:.2f}  "
              f"({', '.join(f'{t:.1f}' for t in r['tps'])})  accepted {acc}{same}  [{len(r['tokens'])} tokens]")


def build_examples(root: Path) -> Path:
    """``llama-lookup`` and ``llama-speculative-simple`` compiled against ``root``'s build (static libraries, CPU
    only), with a link to its llama-bench; the folder."""
    src, build = root / "src", root / "build"
    out = build / "spec-examples"
    out.mkdir(exist_ok=True)
    libs = ["common/libllama-common.a", "src/libllama.a", "ggml/src/libggml.a", "-ldl", "ggml/src/libggml-cpu.a",
            "ggml/src/libggml-base.a", "-lm", "-fopenmp", "-lpthread", "common/libllama-common-base.a",
            "vendor/cpp-httplib/libcpp-httplib.a", "-lssl", "-lcrypto"]
    for name, cpp in (("llama-lookup", "lookup/lookup.cpp"),
                      ("llama-speculative-simple", "speculative-simple/speculative-simple.cpp")):
        if not (out / name).exists():
            subprocess.run(["c++", "-O2", "-DNDEBUG", "-DGGML_USE_CPU", f"-I{src / 'common'}", f"-I{src / 'vendor'}",
                            f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}", str(src / "examples" / cpp),
                            "-o", str(out / name), *[str(build / x) if x.endswith(".a") else x for x in libs]],
                           check=True)
    if not (out / "llama-bench").exists():
        (out / "llama-bench").symlink_to(build / "bin" / "llama-bench")
    return out


def llama_run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    return r.stdout + r.stderr


def llama_spec(out: str) -> str:
    dec = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", out)
    acc = re.search(r"accept\s+=\s+([\d.]+)%", out)
    drafted = re.search(r"n_drafted\s+=\s+(\d+)", out)
    if not dec:
        return "no result: " + " | ".join(out.strip().splitlines()[-3:])
    return (f"{float(dec.group(3)):.1f} t/s over {dec.group(1)} tokens; accepted "
            f"{acc.group(1) if acc else '?'}% of {drafted.group(1) if drafted else '?'} drafted")


def llama_tg(bench: Path, model: Path, depth: int, threads: int) -> str:
    out = llama_run([str(bench), "-m", str(model), "-p", "0", "-n", "128", "-d", str(depth), "-t", str(threads),
                     "-r", "2", "-o", "csv"])
    rows = [line for line in out.splitlines() if line.count(",") > 10 and "avg_ts" not in line]
    if not rows:
        return "no result"
    header = next(line for line in out.splitlines() if "avg_ts" in line).split(",")
    v = rows[-1].split(",")
    return f"{float(v[header.index('avg_ts')].strip(chr(34))):.1f} t/s (llama-bench tg128 @ d{depth})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lookup", type=int, default=4)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--llama", action="store_true", help="beside llama.cpp (the pinned build)")
    ap.add_argument("--skip-draft", action="store_true")
    a = ap.parse_args()
    if a.llama:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from llamacpp_build import cache_root

        a.llama_bin = build_examples(cache_root())
    else:
        a.llama_bin = None
    print(f"CPU: {cpu_name()}, {a.threads} threads; {a.tokens} tokens, greedy, median of {a.reps} interleaved")
    t0 = time.perf_counter()
    path = catalog.fetch("qwen2.5-coder")
    eng = Engine(path, n_ctx=4096, threads=a.threads, backend="cpu")
    try:
        prompt = rendered(eng, REWRITE)
        n_prompt = len(eng.prompt_ids(prompt))
        res = interleaved(eng, prompt, a.tokens, a.reps, {
            "plain": {}, f"lookup {a.lookup}": {"lookup": a.lookup, "draft_max": a.draft_max}})
    finally:
        eng.close()
    show(f"1. Qwen2.5-Coder-0.5B Q4_K_M, code rewrite ({n_prompt} prompt tokens), prompt lookup", res)
    if a.llama_bin is not None:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
            fh.write(prompt)
        common = ["-m", str(path), "-f", fh.name, "-n", str(a.tokens), "--temp", "0", "-t", str(a.threads),
                  "-c", "4096", "--spec-draft-n-max", str(a.draft_max)]
        print(f"  llama.cpp plain          {llama_tg(a.llama_bin / 'llama-bench', path, n_prompt, a.threads)}")
        print(f"  llama-lookup             {llama_spec(llama_run([str(a.llama_bin / 'llama-lookup'), *common]))}")
        Path(fh.name).unlink()
    if not a.skip_draft:
        from quantscope.core.synthetic import ensure_synthetic

        target, draft = ensure_synthetic("1b"), ensure_synthetic("tiny")
        eng = Engine(target, n_ctx=1024, threads=a.threads, backend="cpu")
        try:
            tokens = min(a.tokens, 96)
            res = interleaved(eng, STORY, tokens, a.reps, {
                "plain": {},
                "draft p-min 0.75": {"draft": draft, "draft_max": a.draft_max, "p_min": 0.75},
                "draft p-min 0": {"draft": draft, "draft_max": a.draft_max, "p_min": 0.0}})
            n_prompt = len(eng.prompt_ids(STORY))
        finally:
            eng.close()
        show(f"2. synthetic:1b with synthetic:tiny as draft (random weights; {n_prompt} prompt tokens)", res)
        if a.llama_bin is not None:
            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
                fh.write(STORY)
            print(f"  llama.cpp plain          {llama_tg(a.llama_bin / 'llama-bench', target, n_prompt, a.threads)}")
            for p_min in ("0.75", "0"):
                cmd = [str(a.llama_bin / "llama-speculative-simple"), "-m", str(target), "-md", str(draft), "-f",
                       fh.name, "-n", str(tokens), "--temp", "0", "-t", str(a.threads), "-c", "1024",
                       "--spec-type", "draft-simple", "--spec-draft-n-max", str(a.draft_max),
                       "--spec-draft-p-min", p_min]
                print(f"  llama-spec.-simple p{p_min:<5}{llama_spec(llama_run(cmd))}")
            Path(fh.name).unlink()
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
