"""llama.cpp (through llama-cpp-python) as an external oracle and peer, in the same run as Quantscope.

Compares, per model: token ids on hard strings, greedy continuations, perplexity on tests/data/english.txt, and
prefill/decode tokens/s (both engines at the same thread count, interleaved). Optional: needs llama-cpp-python
(`pip install llama-cpp-python`, a source build). Usage:
    python tests/bench/llama_oracle.py [--site /path/to/site-packages] [--threads 2] [--models smollm2,...]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from quantscope.core import catalog
from quantscope.core.chat import SamplerParams
from quantscope.core.engine.generate import Engine
from quantscope.core.engine.tools import perplexity

HARD = ["Hello world", "  two  spaces\n\n\tand tabs", "digits 1234567 and 3.14159", "日本語のテキスト",
        "emoji 🚀🔥 mix", "don't won't it's", "<|im_start|>user\nhi<|im_end|>", "ends with space ",
        "The capital of France is"]
TEXT = (Path(__file__).resolve().parents[1] / "data" / "english.txt").read_text(encoding="utf-8")


def llama_ppl(llm, ids: list[int], n_ctx: int, add_bos: bool, bos: int) -> float:
    nll, count = 0.0, 0
    first = n_ctx // 2
    for c in range(len(ids) // n_ctx):
        chunk = ids[c * n_ctx : (c + 1) * n_ctx]
        if add_bos:
            chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        lg = np.asarray(llm.scores[first : n_ctx - 1], dtype=np.float64)
        tg = np.asarray(chunk[first + 1 : n_ctx])
        mx = lg.max(1, keepdims=True)
        logz = mx[:, 0] + np.log(np.exp(lg - mx).sum(1))
        nll += float((logz - lg[np.arange(tg.size), tg]).sum())
        count += tg.size
    return math.exp(nll / count)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--site", help="site-packages holding llama_cpp (if not importable here)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(catalog.MODELS))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if args.site:
        sys.path.append(args.site)
    try:
        from llama_cpp import Llama
    except ImportError:
        print("llama-cpp-python is not installed: pip install llama-cpp-python (builds llama.cpp from source)")
        return
    for name in args.models.split(","):
        path = str(catalog.model_path(name))
        print(f"== {name}")
        ours = Engine(path, n_ctx=512, threads=args.threads)
        llm = Llama(model_path=path, n_ctx=512, n_threads=args.threads, n_threads_batch=args.threads,
                    logits_all=True, verbose=False, n_batch=512)
        tok = ours.tokenizer
        same = 0
        for s in HARD:
            a = tok.encode(s)
            b = llm.tokenize(s.encode("utf-8"), add_bos=tok.add_bos, special=True)
            same += a == b
            if a != b:
                print(f"  tokenize DIFF {s!r}: ours {a} llama.cpp {b}")
        print(f"  tokenizer: {same}/{len(HARD)} hard strings give identical ids")
        for prompt in ("The capital of France is", "Once upon a time"):
            ours.cached = []
            mine = "".join(d.text for d in ours.generate(prompt, SamplerParams(temperature=0, max_tokens=24)))
            llm.reset()
            theirs = llm.create_completion(prompt, max_tokens=24, temperature=0.0, top_k=1, repeat_penalty=1.0)
            ttext = theirs["choices"][0]["text"]
            common = next((i for i, (x, y) in enumerate(zip(mine, ttext, strict=False)) if x != y),
                          min(len(mine), len(ttext)))
            print(f"  greedy {prompt!r}: identical for {common} chars\n    ours     {mine!r}\n    llama.cpp {ttext!r}")
        ids = tok.encode(TEXT)
        p_ours = perplexity(ours.model, tok, TEXT, 256).ppl
        p_llama = llama_ppl(llm, list(ids), 256, tok.add_bos, tok.bos_id or 0)
        print(f"  perplexity (ctx 256): ours {p_ours:.3f}  llama.cpp {p_llama:.3f}  ratio {p_ours / p_llama:.3f}")
        del llm  # benchmark a peer that, like ours, computes logits for the last token only
        llm = Llama(model_path=path, n_ctx=512, n_threads=args.threads, n_threads_batch=args.threads,
                    logits_all=False, verbose=False, n_batch=512)
        rng = np.random.default_rng(0)
        pp_o, pp_l, tg_o, tg_l = [], [], [], []
        sess = ours.model.session(256)
        for _ in range(args.reps):  # interleaved
            toks = [int(t) for t in rng.integers(100, 10000, 128)]
            sess.reset()
            t0 = time.perf_counter()
            sess.forward(toks)
            pp_o.append(128 / (time.perf_counter() - t0))
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(toks)
            pp_l.append(128 / (time.perf_counter() - t0))
            sess.reset()
            t0 = time.perf_counter()
            for t in toks[:64]:
                sess.forward([t])
            tg_o.append(64 / (time.perf_counter() - t0))
            llm.reset()
            t0 = time.perf_counter()
            for t in toks[:64]:
                llm.eval([t])
            tg_l.append(64 / (time.perf_counter() - t0))
        mo, ml = statistics.median(pp_o), statistics.median(pp_l)
        do, dl = statistics.median(tg_o), statistics.median(tg_l)
        print(f"  pp128: ours {mo:.1f} t/s, llama.cpp {ml:.1f} t/s, ratio {mo / ml:.2f}")
        print(f"  tg64:  ours {do:.1f} t/s, llama.cpp {dl:.1f} t/s, ratio {do / dl:.2f}")


if __name__ == "__main__":
    main()
