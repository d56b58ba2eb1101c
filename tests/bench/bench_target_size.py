"""Quantize to a size vs the preset at the same size (issue 39): a benchmark with figures, not a test.

For each model: the catalogue file (already quantized) requantized to F16 is the reference; an imatrix is computed on
the calibration text; each preset (Q3_K_M, Q4_K_M and Q5_K_M by default) is written with it, then the target-size mix
at that preset's file size with the same imatrix (with --refine N: the N largest chosen estimates measured, solved
again, and the whole mix's divergence measured on the calibration text); both are scored against the reference on
a HELD-OUT text (a licence text, not the calibration text) as llama-perplexity scores KL divergence (chunks of --ctx
tokens, the second half of each scored).
It also checks the cost model: on --rank-tensors tensors it measures the KL divergence of every candidate type and
reports the Spearman rank correlation of the weighted-error extension with the measurement.

    .venv/bin/python tests/bench/bench_target_size.py [--models smollm2] [--presets Q3_K_M,Q4_K_M,Q5_K_M]
        [--threads 2] [--refine 8]

``--models fixture`` (a 4-layer synthetic llama whose rows take every type, written on the fly) is a smoke run of
the whole pipeline in about a minute; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CALIB = ROOT / "resources" / "sample-text.txt"
HELDOUT = next((p for p in (Path("/usr/share/common-licenses/GPL-3"), Path("/usr/share/common-licenses/Apache-2.0"))
                if p.is_file()), None)
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf",
          "qwen-coder": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "fixture": "(tests/quantize_models.py llama)"}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def spearman(a: list[float], b: list[float]) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    ra -= ra.mean()
    rb -= rb.mean()
    return float((ra * rb).sum() / math.sqrt((ra * ra).sum() * (rb * rb).sum()))


def score(paths: dict[str, Path], ref: Path, text: str, n_ctx: int, max_chunks: int, threads: int) -> dict:
    """Per model: KL(ref || model) and top-token agreement at the scored positions of the held-out chunks."""
    from quantscope.core.engine.kld import chunk_ids, score_positions
    from quantscope.core.engine.session import Model
    from quantscope.core.gguf import GGUFFile
    from quantscope.core.tokenizer import Tokenizer

    with GGUFFile(ref) as f:
        tok = Tokenizer(f)
        chunks = chunk_ids(tok.encode(text), n_ctx, max_chunks)
    models = {k: Model.load(str(p), threads=threads) for k, p in {"ref": ref, **paths}.items()}
    sessions = {k: m.session(n_ctx) for k, m in models.items()}
    kl: dict[str, list[np.ndarray]] = {k: [] for k in paths}
    top: dict[str, list[np.ndarray]] = {k: [] for k in paths}
    for chunk in chunks:
        ids = [int(t) for t in chunk]
        if tok.add_bos and tok.bos_id is not None:
            ids[0] = tok.bos_id
        logits = {}
        for k, s in sessions.items():
            s.reset()
            logits[k] = s.forward(ids, all_logits=True)[n_ctx // 2 : n_ctx - 1]
        targets = chunk[n_ctx // 2 + 1 :]
        for k in paths:
            sc = score_positions(logits[k], targets, base_logits=logits["ref"])
            kl[k].append(sc.kld)
            top[k].append(sc.same)
    out = {}
    for k in paths:
        x = np.concatenate(kl[k])
        t = np.concatenate(top[k])
        out[k] = {"mean_kld": float(x.mean()), "kld_unc": float(x.std(ddof=1) / math.sqrt(x.size)),
                  "p99_9_kld": float(np.percentile(x, 99.9)), "same_top": float(t.mean()),
                  "positions": int(x.size), "chunks": int(chunks.shape[0])}
    return out


def bench_model(key: str, args: argparse.Namespace, work: Path) -> dict:
    from quantscope.core import catalog
    from quantscope.core.engine.imatrix import compute_imatrix
    from quantscope.core.engine.kld import chunk_ids
    from quantscope.core.gguf import GGUFFile
    from quantscope.core.quant.quantize import QuantizeOptions, quantize_file, write_quantized
    from quantscope.core.quant.sensitivity import tensor_costs
    from quantscope.core.quant.target import DEFAULT_TYPES, _candidates, plan_target
    from quantscope.core.tokenizer import Tokenizer

    if key == "fixture":
        sys.path.insert(0, str(ROOT))
        from tests import quantize_models

        src = quantize_models.write_model("llama", work / "fixture-src.gguf")
    else:
        src = catalog.cache_dir() / MODELS[key]
    ref = work / f"{key}-F16.gguf"
    if not ref.exists():
        quantize_file(src, ref, QuantizeOptions("F16", allow_requantize=True, threads=args.threads))
    calib = CALIB.read_text(encoding="utf-8")
    t0 = time.perf_counter()
    im = compute_imatrix(ref, calib, n_ctx=args.ctx, max_chunks=args.imatrix_chunks, threads=args.threads,
                         dataset=CALIB.name)
    t_imatrix = time.perf_counter() - t0
    cache = work / "costs"
    res: dict = {"model": MODELS[key], "imatrix_seconds": t_imatrix, "presets": {}}
    with GGUFFile(ref) as f:
        chunks = chunk_ids(Tokenizer(f).encode(calib), args.calib_ctx, args.calib_chunks, min_chunks=1)
        # the cost model against the measurement, on a few tensors spread over the model
        cands = _candidates(f, list(DEFAULT_TYPES), True)
        pick = [cands[i] for i in np.linspace(0, len(cands) - 1, args.rank_tensors).astype(int)]
        t0 = time.perf_counter()
        exact = tensor_costs(f, pick, chunks, imatrix=im, cache_dir=cache, exact=True, threads=args.threads)
        est = tensor_costs(f, pick, chunks, imatrix=im, cache_dir=cache, exact=False, threads=args.threads)
        pairs = [(e.costs[q], p.costs[q]) for e, p in zip(exact, est, strict=True) for q in e.costs
                 if q != e.anchor and e.measured.get(q)]
        within = [spearman([e.costs[q] for q in e.costs], [p.costs[q] for q in e.costs])
                  for e, p in zip(exact, est, strict=True) if len(e.costs) > 2]
        res["rank"] = {"tensors": [e.name for e in exact], "pairs": len(pairs),
                       "spearman_all": spearman([a for a, _ in pairs], [b for _, b in pairs]),
                       "spearman_within_tensor_mean": float(np.mean(within)) if within else None,
                       "median_ratio_est_over_measured": float(np.median([b / a for a, b in pairs if a > 0])),
                       "seconds": time.perf_counter() - t0}
        for preset in args.presets:
            pf = work / f"{key}-{preset}.gguf"
            plan = quantize_file(ref, pf, QuantizeOptions(preset, im, "imatrix", threads=args.threads))
            t0 = time.perf_counter()
            tp = plan_target(f, chunks, size=plan.file_bytes, imatrix=im, imatrix_label="imatrix",
                             cache_dir=cache, threads=args.threads)
            search = time.perf_counter() - t0
            refine: dict = {}
            if args.refine:
                from quantscope.core.quant.target import refine_target, target_space

                t0 = time.perf_counter()
                space = target_space(f, imatrix=im, imatrix_label="imatrix", threads=args.threads)
                r = refine_target(tp, space, chunks, top=args.refine, cache_dir=cache)
                refine = {"refine": {"measured_calib_kld": r.measured_kld, "predicted_before": r.predicted_before,
                                     "predicted_after": r.plan.predicted_cost, "newly_measured": r.newly_measured,
                                     "swapped": len(r.swapped), "seconds": time.perf_counter() - t0}}
                tp = r.plan
            mf = work / f"{key}-target-{preset}.gguf"
            write_quantized(f, tp.plan, mf, tp.options)
            scores = score({"preset": pf, "target": mf}, ref, args.heldout.read_text(encoding="utf-8"), args.ctx,
                           args.eval_chunks, args.threads)
            res["presets"][preset] = {"preset_bytes": plan.file_bytes, "target_bytes": tp.plan.file_bytes,
                                      "preset_types": plan.type_counts(), "target_types": tp.plan.type_counts(),
                                      "predicted_kld": tp.predicted_cost, "search_seconds": search,
                                      "timings": tp.timings, **refine, **{k: v for k, v in scores.items()}}
            print(json.dumps({key: {preset: res["presets"][preset]}}, indent=1), flush=True)
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2", help=f"comma-separated: {', '.join(MODELS)}")
    p.add_argument("--presets", default="Q3_K_M,Q4_K_M,Q5_K_M")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--calib-ctx", type=int, default=64, help="calibration chunk length for the costs")
    p.add_argument("--calib-chunks", type=int, default=1)
    p.add_argument("--imatrix-chunks", type=int, default=4)
    p.add_argument("--eval-chunks", type=int, default=16)
    p.add_argument("--rank-tensors", type=int, default=8)
    p.add_argument("--refine", type=int, default=0, help="after each solve: measure the N largest chosen "
                   "estimates, solve again, measure the whole mix on the calibration text")
    p.add_argument("--heldout", type=Path, default=HELDOUT)
    p.add_argument("--work", type=Path, default=Path("/tmp/quantscope-bench-target"))
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    args.presets = args.presets.split(",")
    if args.heldout is None:
        print("no held-out text: pass --heldout FILE", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    out = {"cpu": cpu_name(), "threads": args.threads, "ctx": args.ctx, "calib_ctx": args.calib_ctx,
           "calibration": str(CALIB), "heldout": str(args.heldout), "models": {}}
    for key in args.models.split(","):
        out["models"][key] = bench_model(key, args, args.work)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
