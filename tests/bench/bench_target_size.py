"""Quantize to a size vs the preset at the same size (issue 39): a benchmark with figures, not a test.

For each model: the reference is the catalogue file (already quantized) requantized to F16 -- with ``-degrid`` (the
default) then rescaled channel by channel so that it computes the same function off every quantization grid
(tests/bench/degrid.py: a dequantized file otherwise requantizes to its own types almost losslessly, which flatters
whichever mix gives a tensor its original type). An imatrix is computed on the calibration text; each preset
(Q3_K_M, Q4_K_M, Q5_K_M) is written with it, then the target-size mix at that preset's file size with the same
imatrix (the costs are measured once per model, on --calib-ctx tokens of the calibration text, and shared by the
three sizes; with --refine N the N largest chosen estimates are measured and the mix solved again). Every file is
then scored against the reference on a HELD-OUT text (the licence texts in /usr/share/common-licenses, or in the
folder --heldout names where there is none, as on macOS; not the calibration text) as llama-perplexity scores KL
divergence: chunks of --ctx tokens, the second half of each scored, every model run on the same chunk in turn so the
reference runs once.

    .venv/bin/python tests/bench/bench_target_size.py [--models smollm2-degrid,gemma3-degrid,qwen-coder-degrid,moe]
        [--presets Q3_K_M,Q4_K_M,Q5_K_M] [--threads 2] [--ctx 512] [--eval-chunks 100] [--refine 8] [--json F]

Models: ``smollm2``, ``gemma3``, ``qwen-coder`` (the catalogue files; add ``-degrid`` for the rescaled reference),
``moe`` (the 8-expert qwen3moe synthetic of tests/quantize_models.py, random weights, its 256-token context),
``fixture`` (the synthetic llama of the same module: a smoke run of the whole pipeline).
It also checks the cost model (--rank-tensors N): on N tensors it measures the KL divergence of every candidate type
and reports the Spearman rank correlation of the weighted-error extension with the measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CALIB = ROOT / "resources" / "sample-text.txt"
LICENCES = Path("/usr/share/common-licenses")
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf",
          "qwen-coder": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}
SYNTHETIC = {"moe": "qwen3moe", "fixture": "llama"}


def heldout_text(folder: Path = LICENCES) -> tuple[str, list[str]]:
    """Every licence text in ``folder`` (regular files, by name), one after another."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.is_symlink()) if folder.is_dir() else []
    return "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files), [p.name for p in files]


def spearman(a: list[float], b: list[float]) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    ra -= ra.mean()
    rb -= rb.mean()
    return float((ra * rb).sum() / math.sqrt((ra * ra).sum() * (rb * rb).sum()))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    y = x.astype(np.float64)
    y -= y.max(axis=1, keepdims=True)
    y -= np.log(np.exp(y).sum(axis=1, keepdims=True))
    return y


def score(paths: dict[str, Path], ref: Path, text: str, n_ctx: int, max_chunks: int, threads: int) -> dict:
    """KL(ref || model) and top-token agreement at the scored positions of the held-out chunks, for every model at
    once (each chunk: the first half as context, logits of the second half); per-position values are kept for the
    paired comparisons."""
    from quantscope.core.engine.kld import chunk_ids
    from quantscope.core.engine.session import Model
    from quantscope.core.gguf import GGUFFile
    from quantscope.core.tokenizer import Tokenizer

    with GGUFFile(ref) as f:
        tok = Tokenizer(f)
        chunks = chunk_ids(tok.encode(text), n_ctx, max_chunks)
    models = {k: Model.load(str(p), threads=threads) for k, p in {"ref": ref, **paths}.items()}
    sessions = {k: m.session(n_ctx) for k, m in models.items()}
    half = n_ctx // 2
    kl: dict[str, list[np.ndarray]] = {k: [] for k in paths}
    top: dict[str, list[np.ndarray]] = {k: [] for k in paths}
    t0 = time.perf_counter()
    for ci, chunk in enumerate(chunks):
        ids = [int(t) for t in chunk]
        if tok.add_bos and tok.bos_id is not None:
            ids[0] = tok.bos_id
        logits = {}
        for k, s in sessions.items():
            s.reset()
            s.forward(ids[:half], logits=False)
            logits[k] = s.forward(ids[half:n_ctx - 1], all_logits=True)
        for a in range(0, n_ctx - 1 - half, 32):
            b = min(a + 32, n_ctx - 1 - half)
            base = _log_softmax(logits["ref"][a:b])
            p = np.exp(base)
            best = base.argmax(axis=1)
            for k in paths:
                ours = _log_softmax(logits[k][a:b])
                kl[k].append(np.maximum((p * (base - ours)).sum(axis=1), 0.0))
                top[k].append(ours.argmax(axis=1) == best)
        if (ci + 1) % 10 == 0 or ci + 1 == len(chunks):
            print(f"  scored {ci + 1}/{len(chunks)} chunks ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
                  flush=True)
    out: dict = {"_kl": {}}
    for k in paths:
        x = np.concatenate(kl[k])
        t = np.concatenate(top[k])
        out[k] = {"mean_kld": float(x.mean()), "kld_95": float(1.96 * x.std(ddof=1) / math.sqrt(x.size)),
                  "p99_9_kld": float(np.percentile(x, 99.9)), "same_top": float(t.mean()),
                  "positions": int(x.size), "chunks": int(chunks.shape[0])}
        out["_kl"][k] = x
    out["seconds"] = time.perf_counter() - t0
    return out


def reference(key: str, args: argparse.Namespace, work: Path) -> tuple[Path, str]:
    """The F16 reference of ``key`` (and its source's name)."""
    from quantscope.core import catalog
    from quantscope.core.quant.quantize import QuantizeOptions, quantize_file

    base = key.removesuffix("-degrid")
    if base in SYNTHETIC:
        sys.path.insert(0, str(ROOT))
        from tests import quantize_models

        src = quantize_models.write_model(SYNTHETIC[base], work / f"{base}-src.gguf")
        name = f"synthetic {SYNTHETIC[base]} (tests/quantize_models.py)"
    else:
        src = catalog.cache_dir() / MODELS[base]
        name = MODELS[base]
    ref = work / f"{base}-F16.gguf"
    if not ref.exists():
        quantize_file(src, ref, QuantizeOptions("F16", allow_requantize=True, threads=args.threads))
    if key.endswith("-degrid"):
        from degrid import check, degrid  # type: ignore[import-not-found]

        out = work / f"{base}-F16-degrid.gguf"
        if not out.exists():
            degrid(ref, out)
            print(f"  {key}: degridded, KLD to the F16 on the calibration text "
                  f"{check(ref, out, CALIB.read_text(encoding='utf-8'), threads=args.threads):.2g}",
                  file=sys.stderr, flush=True)
        return out, name + ", channel-rescaled (degrid.py)"
    return ref, name


def bench_model(key: str, args: argparse.Namespace, work: Path, heldout: str) -> dict:
    from quantscope.core.engine.imatrix import compute_imatrix
    from quantscope.core.engine.kld import chunk_ids
    from quantscope.core.gguf import GGUFFile
    from quantscope.core.quant.quantize import QuantizeOptions, quantize_file, write_quantized
    from quantscope.core.quant.sensitivity import tensor_costs
    from quantscope.core.quant.target import DEFAULT_TYPES, _candidates, plan_target, refine_target, target_space
    from quantscope.core.tokenizer import Tokenizer

    ref, name = reference(key, args, work)
    calib = CALIB.read_text(encoding="utf-8")
    with GGUFFile(ref) as f:
        ctx_max = int(f.metadata.get(f"{f.architecture}.context_length").value)
    n_ctx = min(args.ctx, ctx_max)
    t0 = time.perf_counter()
    im = compute_imatrix(ref, calib, n_ctx=min(128, n_ctx), max_chunks=args.imatrix_chunks, threads=args.threads,
                         dataset=CALIB.name)
    t_imatrix = time.perf_counter() - t0
    cache = work / "costs"
    res: dict = {"model": name, "reference": ref.name, "ctx": n_ctx, "imatrix_seconds": t_imatrix, "presets": {}}
    files: dict[str, Path] = {}
    with GGUFFile(ref) as f:
        chunks = chunk_ids(Tokenizer(f).encode(calib), args.calib_ctx, args.calib_chunks, min_chunks=1)
        space = target_space(f, imatrix=im, imatrix_label="imatrix", threads=args.threads)
        for preset in args.presets:
            pf = work / f"{key}-{preset}.gguf"
            plan = quantize_file(ref, pf, QuantizeOptions(preset, im, "imatrix", threads=args.threads))
            files[preset] = pf
            t0 = time.perf_counter()
            tp = plan_target(f, chunks, size=plan.file_bytes, imatrix=im, imatrix_label="imatrix",
                             cache_dir=cache, threads=args.threads)
            row: dict = {"preset_bytes": plan.file_bytes, "preset_types": plan.type_counts(),
                         "search_seconds": time.perf_counter() - t0, "timings": tp.timings}
            if args.refine:
                t0 = time.perf_counter()
                r = refine_target(tp, space, chunks, top=args.refine, cache_dir=cache)
                row["refine"] = {"measured_calib_kld": r.measured_kld, "predicted_before": r.predicted_before,
                                 "predicted_after": r.plan.predicted_cost, "newly_measured": r.newly_measured,
                                 "swapped": len(r.swapped), "seconds": time.perf_counter() - t0}
                tp = r.plan
            mf = work / f"{key}-target-{preset}.gguf"
            write_quantized(f, tp.plan, mf, tp.options)
            files[f"target-{preset}"] = mf
            row.update({"target_bytes": tp.plan.file_bytes, "target_types": tp.plan.type_counts(),
                        "predicted_kld": tp.predicted_cost})
            res["presets"][preset] = row
            print(json.dumps({key: {preset: row}}), file=sys.stderr, flush=True)
        if args.rank_tensors:  # after the searches, so that their timings start from an empty cache
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
                           "spearman_all": spearman([a for a, _ in pairs], [b for _, b in pairs]) if pairs else None,
                           "spearman_within_tensor_mean": float(np.mean(within)) if within else None,
                           "median_ratio_est_over_measured":
                               float(np.median([b / a for a, b in pairs if a > 0])) if pairs else None,
                           "seconds": time.perf_counter() - t0}
    sc = score(files, ref, heldout, n_ctx, args.eval_chunks, args.threads)
    res["score_seconds"] = sc["seconds"]
    for preset in args.presets:
        row = res["presets"][preset]
        a, b = sc[preset], sc[f"target-{preset}"]
        d = sc["_kl"][f"target-{preset}"] - sc["_kl"][preset]
        row.update({"preset": a, "target": b, "change": b["mean_kld"] / a["mean_kld"] - 1 if a["mean_kld"] else None,
                    "diff_mean": float(d.mean()), "diff_95": float(1.96 * d.std(ddof=1) / math.sqrt(d.size))})
    return res


def table(out: dict) -> str:
    lines = ["| model | size of | file bytes (preset / mix) | mean KLD preset | mean KLD mix | change | "
             "99.9 % KLD (preset / mix) | same top (preset / mix) |", "|---|---|---|---|---|---|---|---|"]
    for key, m in out["models"].items():
        for preset, r in m["presets"].items():
            a, b = r["preset"], r["target"]
            lines.append(f"| {key} | {preset} | {r['preset_bytes']:,} / {r['target_bytes']:,} | "
                         f"{a['mean_kld']:.4f} ± {a['kld_95']:.4f} | {b['mean_kld']:.4f} ± {b['kld_95']:.4f} | "
                         f"{100 * r['change']:+.1f} % | {a['p99_9_kld']:.3f} / {b['p99_9_kld']:.3f} | "
                         f"{100 * a['same_top']:.1f} % / {100 * b['same_top']:.1f} % |")
    changes = [r["change"] for m in out["models"].values() for r in m["presets"].values()]
    for preset in out["presets"]:
        per = [m["presets"][preset]["change"] for m in out["models"].values() if preset in m["presets"]]
        if per:
            lines.append(f"\nat the {preset} size: median change {100 * float(np.median(per)):+.1f} % over "
                         f"{len(per)} models")
    if changes:
        lines.append(f"all sizes: median change {100 * float(np.median(changes)):+.1f} %")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2-degrid,gemma3-degrid,qwen-coder-degrid,moe",
                   help=f"comma-separated: {', '.join([*MODELS, *SYNTHETIC])}, a catalogue name with -degrid")
    p.add_argument("--presets", default="Q3_K_M,Q4_K_M,Q5_K_M")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=512, help="held-out chunk length (at most the model's context)")
    p.add_argument("--calib-ctx", type=int, default=64, help="calibration chunk length for the costs")
    p.add_argument("--calib-chunks", type=int, default=1)
    p.add_argument("--imatrix-chunks", type=int, default=4)
    p.add_argument("--eval-chunks", type=int, default=100)
    p.add_argument("--rank-tensors", type=int, default=0)
    p.add_argument("--refine", type=int, default=0, help="after each solve: measure the N largest chosen "
                   "estimates, solve again, measure the whole mix on the calibration text")
    p.add_argument("--work", type=Path, default=Path("/tmp/quantscope-bench-target"))
    p.add_argument("--json", type=Path, help="also write the figures here (after each model)")
    p.add_argument("--heldout", type=Path, default=LICENCES,
                   help=f"folder of held-out texts (default {LICENCES}: Debian/Ubuntu; elsewhere name one)")
    args = p.parse_args()
    args.presets = args.presets.split(",")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quantscope.core.cpu import cpu_name

    heldout, names = heldout_text(args.heldout)
    if not heldout:
        print(f"no held-out text: {args.heldout} has no text files (name a folder with --heldout)", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    out = {"cpu": cpu_name(), "threads": args.threads, "calib_ctx": args.calib_ctx,
           "calibration": str(CALIB), "heldout": f"{args.heldout}: {', '.join(names)} ({len(heldout):,} characters)",
           "presets": args.presets, "models": {}}
    for key in args.models.split(","):
        t0 = time.perf_counter()
        out["models"][key] = bench_model(key, args, args.work, heldout)
        out["models"][key]["seconds"] = time.perf_counter() - t0
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
        print(table({**out, "models": {key: out["models"][key]}}), flush=True)
    print(json.dumps(out, indent=1))
    print(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
