"""The quantization lab's verbs: quantize, imatrix (show or compute), sensitivity and quant-stats."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from quantscope.core import sysinfo
from quantscope.core.fsutil import PathRefused, printable
from quantscope.core.gguf import GGUFError

from .common import (
    MAX_THREADS,
    Bar,
    CLIError,
    check_file,
    dump_json,
    float_arg,
    imatrix_arg,
    int_arg,
    open_gguf,
    read_text_file,
    tensor_type_arg,
)


def cmd_quantize(args: argparse.Namespace) -> int:
    from quantscope.core.quant.quantize import (
        QuantizeError,
        QuantizeOptions,
        plan_quantize,
    )

    check_file(args.file)
    if args.target_size is not None or args.target_bpw is not None:
        return _quantize_to_target(args)
    for flag, v in (("-f", args.calibration), ("--types", args.types), ("--rules", args.rules)):
        if v is not None:
            raise CLIError(f"quantize: {flag} goes with --target-size or --target-bpw")
    if not args.type and args.output and not args.dry_run:
        raise CLIError("quantize: give OUTPUT and TYPE (or --dry-run with TYPE)")
    if args.dry_run and args.output and not args.type:
        args.type, args.output = args.output, None  # `quantize IN TYPE --dry-run`
    if not args.type:
        raise CLIError("quantize: the preset TYPE is missing (e.g. Q4_K_M; see quantscope quantize --help)")
    if not args.output and not args.dry_run:
        raise CLIError("quantize: the OUTPUT path is missing")
    im = imatrix_arg(args.imatrix)
    tt = list(args.tensor_type or [])
    for path in args.tensor_type_file or []:
        words = read_text_file(path, "--tensor-type-file").split()
        try:
            tt += [tensor_type_arg(w) for w in words]
        except argparse.ArgumentTypeError as exc:
            raise CLIError(f"--tensor-type-file {path}: {exc}") from None
    opts = QuantizeOptions(args.type, im, args.imatrix or "", tuple(tt), args.output_tensor_type,
                           args.token_embedding_type, args.allow_requantize, args.pure, args.leave_output_tensor,
                           args.threads)
    f = open_gguf(args.file)
    try:
        try:
            plan = plan_quantize(f, opts)
        except QuantizeError as exc:
            raise CLIError(f"cannot quantize {Path(args.file).name}: {exc}") from None
        if args.dry_run or args.json:
            rows = [{"name": j.info.name, "shape": list(j.info.ne), "from": j.choice.source, "to": j.choice.target,
                     "reason": j.choice.reason, "imatrix": j.has_imatrix, "bytes_in": j.info.n_bytes,
                     "bytes_out": j.out_bytes} for j in plan.jobs]
            summary = {"preset": plan.preset.name, "file_type": int(plan.preset.ftype), "bytes_in": plan.in_bytes,
                       "bytes_out": plan.out_bytes, "file_bytes": plan.file_bytes,
                       "bpw_in": plan.bits_per_weight(False), "bpw_out": plan.bits_per_weight(True),
                       "types": plan.type_counts(), "warnings": plan.warnings}
        if args.dry_run:
            if args.json:
                dump_json({"summary": summary, "tensors": rows})
                return 0
            w = max(len(r["name"]) for r in rows) if rows else 4
            for i, r in enumerate(rows):
                why = "" if r["reason"] in ("preset", "kept") else f"  ({r['reason']})"
                print(printable(f"[{i + 1:4d}/{len(rows)}] {r['name']:<{w}} {r['from']:>7} -> {r['to']:<7} "
                                f"{r['bytes_in'] / 2**20:9.2f} -> {r['bytes_out'] / 2**20:9.2f} MiB"
                                f"{' imatrix' if r['imatrix'] else ''}{why}"))
            _print_plan_summary(plan)
            return 0
        try:
            from quantscope.core.fsutil import OutputSet

            OutputSet([("output", args.output)], inputs=[args.file])  # refuse an aliasing/odd output before work
        except PathRefused as exc:
            raise CLIError(str(exc)) from None
        import time

        t0 = time.perf_counter()
        out = _write(f, plan, args, opts)
        if out is None:
            return 130
        secs = time.perf_counter() - t0
        if args.json:
            dump_json({"summary": {**summary, "output": str(out), "seconds": secs}, "tensors": rows})
            return 0
        print(printable(f"wrote {out} ({plan.file_bytes:,} bytes) in {secs:.2f} s"))
        _print_plan_summary(plan)
        return 0
    finally:
        f.close()


def _quantize_to_target(args: argparse.Namespace) -> int:
    """``quantize IN OUT --target-size S | --target-bpw B``: the least-KLD mix within the budget (docs/quantize.md)."""
    import time

    from quantscope.core.engine.kld import chunk_ids
    from quantscope.core.fsutil import OutputSet
    from quantscope.core.quant.quantize import QuantizeError
    from quantscope.core.quant.target import DEFAULT_TYPES, parse_size, plan_target, rules_text
    from quantscope.core.tokenizer import Tokenizer, TokenizerError

    if args.target_size is not None and args.target_bpw is not None:
        raise CLIError("quantize: give --target-size or --target-bpw, not both")
    if args.type:
        raise CLIError(f"quantize: a target size replaces the preset; drop {args.type!r}")
    if not args.output and not args.dry_run:
        raise CLIError("quantize: the OUTPUT path is missing")
    if args.dry_run and args.output and args.rules is None:
        raise CLIError("quantize: --dry-run writes nothing; drop OUTPUT (or give --rules to write the rule file)")
    size = None
    if args.target_size is not None:
        try:
            size = parse_size(args.target_size)
        except ValueError as exc:
            raise CLIError(f"--target-size: {exc}") from None
    if args.calibration is None:
        raise CLIError("quantize: a target size needs a calibration text (-f TEXT) to measure the costs on")
    text = read_text_file(args.calibration, "-f")
    _cost_cache(args.cost_cache)
    types = [t for t in (args.types.split(",") if args.types is not None else DEFAULT_TYPES)]
    im = imatrix_arg(args.imatrix)
    rules_path = args.rules
    if rules_path is None and args.output:
        rules_path = str(Path(args.output).with_suffix("")) + ".tensor-types.txt"
    inputs = [args.file, args.calibration] + ([args.imatrix] if args.imatrix else [])
    outs = ([("output", args.output)] if args.output and not args.dry_run else []) + \
        ([("--rules", rules_path)] if rules_path else [])
    try:
        OutputSet(outs, inputs=inputs)  # refuse an aliasing/odd output before any work
    except PathRefused as exc:
        raise CLIError(str(exc)) from None
    f = open_gguf(args.file)
    try:
        try:
            chunks = chunk_ids(Tokenizer(f).encode(text), args.ctx, args.chunks, min_chunks=1)
        except (ValueError, TokenizerError) as exc:
            raise CLIError(f"{args.calibration}: {exc}") from None
        bar = Bar("measure", "tensors")
        t0 = time.perf_counter()
        try:
            tp = plan_target(f, chunks, size=size, bpw=args.target_bpw, types=types, imatrix=im,
                             imatrix_label=args.imatrix or "", allow_requantize=args.allow_requantize,
                             cache_dir=args.cost_cache, exact=args.exact, threads=args.threads,
                             progress=lambda d, t, name: bar(d, t, name))
        except QuantizeError as exc:
            raise CLIError(f"cannot quantize {Path(args.file).name}: {exc}") from None
        except ValueError as exc:
            raise CLIError(f"cannot quantize {Path(args.file).name}: {exc}") from None
        finally:
            bar.close()
        refined = None
        if args.refine:
            from quantscope.core.quant.sensitivity import CostCancelled
            from quantscope.core.quant.target import refine_target, target_space

            bar = Bar("check", "tensors")
            try:
                space = target_space(f, types=types, imatrix=im, imatrix_label=args.imatrix or "",
                                     allow_requantize=args.allow_requantize, threads=args.threads)
                refined = refine_target(tp, space, chunks, top=args.refine, cache_dir=args.cost_cache,
                                        progress=lambda d, t, name: bar(d, t, name))
            except (QuantizeError, ValueError) as exc:
                raise CLIError(f"cannot quantize {Path(args.file).name}: {exc}") from None
            except (KeyboardInterrupt, CostCancelled):
                bar.close()
                print("quantscope: cancelled; nothing was written", file=sys.stderr)
                return 130
            finally:
                bar.close()
            tp = refined.plan
        search = time.perf_counter() - t0
        plan = tp.plan
        rows = [{"name": j.info.name, "shape": list(j.info.ne), "from": j.choice.source, "to": j.choice.target,
                 "bytes_out": j.out_bytes,
                 "cost": tp.costs[j.info.name].costs.get(j.choice.target) if j.info.name in tp.costs else None,
                 "measured": tp.costs[j.info.name].measured.get(j.choice.target) if j.info.name in tp.costs
                 else None,
                 # the sensitivity report: the cost of every candidate type, and whether it was measured
                 "costs": {q: {"kld": c, "measured": tp.costs[j.info.name].measured[q]}
                           for q, c in tp.costs[j.info.name].costs.items()} if j.info.name in tp.costs else None}
                for j in plan.jobs]
        summary = {"target_bytes": tp.budget, "smallest_bytes": tp.smallest, "file_bytes": plan.file_bytes,
                   "bytes_out": plan.out_bytes, "bpw_out": plan.bits_per_weight(True),
                   "predicted_kld": tp.predicted_cost, "preset": plan.preset.name, "types": plan.type_counts(),
                   "search_seconds": search, "timings": tp.timings, "rules": rules_path, "warnings": plan.warnings}
        if refined is not None:
            summary["refine"] = {"measured_kld": refined.measured_kld, "predicted_before": refined.predicted_before,
                                 "newly_measured": refined.newly_measured, "rounds": refined.rounds,
                                 "swapped": [{"tensor": n, "from": a, "to": b} for n, a, b in refined.swapped]}
        written = None
        if not args.dry_run:
            written = _write(f, plan, args, tp.options)
            if written is None:
                return 130
        if rules_path:
            try:
                with OutputSet([("--rules", rules_path)], inputs=inputs) as ro:
                    ro.open("--rules")
                    ro.write_bytes("--rules", rules_text(tp.rules).encode("utf-8"))
                    ro.commit()
            except PathRefused as exc:
                raise CLIError(str(exc)) from None
            except OSError as exc:
                raise CLIError(f"cannot write {rules_path}: {exc.strerror or exc}") from None
    finally:
        f.close()
    if args.json:
        dump_json({"summary": {**summary, "output": str(written) if written else None}, "tensors": rows})
        return 0
    w = max((len(r["name"]) for r in rows), default=4)
    for i, r in enumerate(rows):
        cost = "" if r["cost"] is None else f"  KLD {r['cost']:.3g}{'' if r['measured'] else ' (est.)'}"
        print(printable(f"[{i + 1:4d}/{len(rows)}] {r['name']:<{w}} {r['from']:>7} -> {r['to']:<7} "
                        f"{r['bytes_out'] / 2**20:9.2f} MiB{cost}"))
    if written:
        print(printable(f"wrote {written} ({plan.file_bytes:,} bytes)"))
    if rules_path:
        print(printable(f"rules     {rules_path} (llama-quantize --tensor-type, one per line; preset "
                        f"{plan.preset.name})"))
    print(f"target    {tp.budget:,} bytes; the mix takes {plan.file_bytes if size else plan.out_bytes:,} "
          f"(file {plan.file_bytes:,} bytes, {plan.bits_per_weight(True):.3f} bpw)")
    print(f"predicted mean KLD {tp.predicted_cost:.5f} (sum of the per-tensor costs)")
    if refined is not None:
        print(f"measured  mean KLD {refined.measured_kld:.5f} of the whole mix on the calibration text (before the "
              f"check the prediction was {refined.predicted_before:.5f}; {refined.newly_measured} estimates measured, "
              f"{len(refined.swapped)} tensors changed)")
    print("types     " + ", ".join(f"{k} x{v}" for k, v in plan.type_counts().items()))
    print(f"search    {search:.1f} s (" + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in tp.timings.items()) + ")")
    for warn in plan.warnings:
        print(printable(f"warning   {warn}"), file=sys.stderr)
    return 0


def _write(f: Any, plan: Any, args: argparse.Namespace, opts: Any) -> Path | None:
    """Write the quantize ``plan`` of ``f`` to ``args.output`` with a progress bar; ``None`` when cancelled (nothing
    is left at the target). Every failure is one CLIError line."""
    from quantscope.core.quant.quantize import QuantizeCancelled, QuantizeError, write_quantized

    bar = Bar("quantize")
    try:
        out = write_quantized(f, plan, args.output, opts,
                              lambda p: bar(p.done_bytes, p.total_bytes,
                                            f"{p.index + 1}/{p.count} {p.tensor}" if p.tensor else ""))
    except QuantizeError as exc:
        raise CLIError(f"cannot quantize {Path(args.file).name}: {exc}") from None
    except PathRefused as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    except (KeyboardInterrupt, QuantizeCancelled):
        bar.close()
        print("quantscope: quantization cancelled; nothing was written at the target path", file=sys.stderr)
        return None
    bar.close()
    return out


def cmd_sensitivity(args: argparse.Namespace) -> int:
    """``sensitivity FILE -f TEXT``: the KL divergence each type adds, per tensor and per layer (docs/quantize.md)."""
    from quantscope.core.engine.kld import chunk_ids
    from quantscope.core.quant.quantize import QuantizeError
    from quantscope.core.quant.sensitivity import CostCancelled, sensitivity_report, tensor_costs
    from quantscope.core.quant.target import DEFAULT_TYPES, target_space
    from quantscope.core.tokenizer import Tokenizer, TokenizerError

    check_file(args.file)
    text = read_text_file(args.calibration, "-f")
    _cost_cache(args.cost_cache)
    types = args.types.split(",") if args.types is not None else list(DEFAULT_TYPES)
    im = imatrix_arg(args.imatrix)
    f = open_gguf(args.file)
    bar = Bar("measure", "tensors")
    try:
        try:
            chunks = chunk_ids(Tokenizer(f).encode(text), args.ctx, args.chunks, min_chunks=1)
        except (ValueError, TokenizerError) as exc:
            raise CLIError(f"{args.calibration}: {exc}") from None
        try:
            space = target_space(f, types=types, imatrix=im, imatrix_label=args.imatrix or "",
                                 allow_requantize=args.allow_requantize, threads=args.threads)
            costs = tensor_costs(f, space.candidates, chunks, imatrix=space.imatrix, cache_dir=args.cost_cache,
                                 exact=args.exact, threads=args.threads, progress=lambda d, t, n: bar(d, t, n))
        except (QuantizeError, ValueError) as exc:
            raise CLIError(f"cannot measure {Path(args.file).name}: {exc}") from None
        except (KeyboardInterrupt, CostCancelled):
            bar.close()
            print("quantscope: cancelled", file=sys.stderr)
            return 130
        finally:
            bar.close()
        rep = sensitivity_report(f, costs)
    finally:
        f.close()
    if args.json:
        dump_json({"file": str(args.file), "calibration": str(args.calibration), "ctx": args.ctx,
                   "chunks": int(chunks.shape[0]), "imatrix": args.imatrix, "unit": "mean KL divergence, nats",
                   **rep})
        return 0
    types_all: list[str] = rep["types"]  # type: ignore[assignment]
    print(f"mean KL divergence each type adds on {Path(args.calibration).name} ({int(chunks.shape[0])} x "
          f"{args.ctx} tokens); ~ : extended from the measured type by the weighted error")
    head = "".join(f" {q:>9}" for q in types_all)
    if args.by in ("tensor", "both"):
        tensors: list[dict[str, Any]] = rep["tensors"]  # type: ignore[assignment]
        w = max((len(t["name"]) for t in tensors), default=6)
        print(f"\n{'tensor':<{w}} {'from':<6}{head}")
        for t in tensors:
            cells = "".join(f" {'' if q not in t['kld'] else _kld(t['kld'][q]['value'], t['kld'][q]['measured']):>9}"
                            for q in types_all)
            print(printable(f"{t['name']:<{w}} {t['type']:<6}{cells}"))
    if args.by in ("layer", "both"):
        print(f"\n{'layer':<6} {'tensors':>7}{head}")
        for r in rep["layers"]:  # type: ignore[union-attr]
            cells = "".join(f" {'' if q not in r['kld'] else _kld(r['kld'][q]['sum'], True):>9}" for q in types_all)
            print(f"{'other' if r['layer'] < 0 else r['layer']:<6} {r['tensors']:>7}{cells}")
    return 0


def _kld(v: float, measured: bool) -> str:
    return ("" if measured else "~") + ("0" if v == 0 else f"{v:.3g}")


def _print_plan_summary(plan: Any) -> None:
    print(f"preset    {plan.preset.name} (general.file_type {int(plan.preset.ftype)})")
    print(f"size      {plan.in_bytes / 2**20:.2f} MiB ({plan.bits_per_weight(False):.2f} bpw) -> "
          f"{plan.out_bytes / 2**20:.2f} MiB ({plan.bits_per_weight(True):.2f} bpw)")
    print("types     " + ", ".join(f"{k} x{v}" for k, v in plan.type_counts().items()))
    for w in plan.warnings:
        print(printable(f"warning   {w}"), file=sys.stderr)


def _cost_cache(path: str) -> None:
    """--cost-cache names a directory this user can write (made when missing): checked before any measuring."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise CLIError(f"--cost-cache: {path} is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CLIError(f"--cost-cache: cannot make the directory {path}: {exc.strerror or exc}") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise CLIError(f"--cost-cache: {path} is not writable")


def _compute_imatrix(args: argparse.Namespace) -> int:
    from quantscope.core.engine.imatrix import compute_imatrix
    from quantscope.core.fsutil import OutputSet
    from quantscope.core.quant.imatrix import write_imatrix

    if args.text_file and args.prompt is not None:
        raise CLIError("imatrix: give -f TEXT or -p TEXT, not both")
    out = args.output or "imatrix.gguf"
    inputs = [args.file] + ([args.text_file] if args.text_file else [])
    try:
        OutputSet([("-o", out)], inputs=inputs)
    except PathRefused as exc:
        raise CLIError(str(exc)) from None
    if args.text_file:
        text = read_text_file(args.text_file, "-f")
    else:
        text = args.prompt
    source = f"-f {args.text_file}" if args.text_file else "-p"
    if not text.strip():
        raise CLIError(f"-f: {args.text_file} is empty" if args.text_file else "-p: the text is empty")
    from quantscope.core.engine.cuda_library import CudaError

    bar = Bar("imatrix", "chunks")
    try:
        im = compute_imatrix(args.file, text, n_ctx=args.ctx, max_chunks=args.chunks, threads=args.threads,
                             dataset=args.text_file or "", progress=lambda d, t, m: bar(d, t, m) if t > 1 else None,
                             backend=args.backend)
    except CudaError as exc:
        raise CLIError(f"--backend {args.backend}: {exc}") from None
    except ValueError as exc:  # the text too short for a chunk is the text's fault, anything else the model's
        raise CLIError(f"{source if str(exc).startswith('the text ') else args.file}: {exc}") from None
    except GGUFError as exc:
        raise CLIError(f"{args.file}: not a readable GGUF file: {exc}") from None
    bar.close()
    try:
        path = write_imatrix(im, out, tuple(inputs))
    except PathRefused as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"cannot write {out}: {exc.strerror or exc}") from None
    print(printable(f"wrote {path}: {len(im.entries)} entries, {im.chunk_count} chunks of {im.chunk_size} tokens"))
    return 0


def cmd_imatrix(args: argparse.Namespace) -> int:
    from quantscope.core.quant.imatrix import ImatrixError, read_imatrix

    check_file(args.file)
    if args.text_file or args.prompt is not None:
        return _compute_imatrix(args)
    if args.output:
        raise CLIError("imatrix: -o writes a computed matrix; give the text with -f or -p")
    try:
        im = read_imatrix(args.file)
    except (ImatrixError, OSError) as exc:
        raise CLIError(str(exc)) from None
    except GGUFError as exc:
        raise CLIError(f"{args.file}: {exc}") from None
    rows = []
    for name, e in im.entries.items():
        w = im.weights(name)
        assert w is not None
        rows.append({"name": name, "n_cols": e.n_cols, "n_mat": e.n_mat, "count": int(e.counts.max()),
                     "mean": float(w.mean()) if w.size else 0.0, "max": float(w.max()) if w.size else 0.0,
                     "zeros": int((w == 0).sum())})
    if args.json:
        dump_json({"imatrix": im.summary(), "entries": rows})
        return 0
    s = im.summary()
    print(printable(f"{args.file}: {s['format']} imatrix, {s['entries']} entries, {s['chunk_count']} chunks"
                    + (f" of {s['chunk_size']}" if s["chunk_size"] else "")
                    + (f", dataset {', '.join(im.datasets)}" if im.datasets else "")))
    w = max((len(r["name"]) for r in rows), default=4)
    print(f"{'tensor':<{w}} {'cols':>6} {'mats':>4} {'count':>8} {'mean':>11} {'max':>11} {'zeros':>6}")
    for r in rows:
        print(printable(f"{r['name']:<{w}} {r['n_cols']:>6} {r['n_mat']:>4} {r['count']:>8} {r['mean']:>11.4g} "
                        f"{r['max']:>11.4g} {r['zeros']:>6}"))
    return 0


def cmd_quant_stats(args: argparse.Namespace) -> int:
    import time

    from quantscope.core.quant import lab

    try:
        types = lab.candidate_types(t for t in args.types.split(",") if t.strip()) if args.types else \
            list(lab.CANDIDATE_TYPES)
    except ValueError as exc:
        raise CLIError(f"--types: {exc}") from None
    if not types:
        raise CLIError("--types: no type given (e.g. --types Q4_K,Q5_K,Q8_0)")
    check_file(args.file)
    im = imatrix_arg(args.imatrix)
    with open_gguf(args.file) as f:
        ref = open_gguf(args.reference) if args.reference else None
        try:
            try:
                if not lab.quantizable_tensors(f, args.tensor):
                    raise CLIError(f"no quantizable 2-D/3-D weight in {args.file}"
                                   + (f" matches --tensor {args.tensor!r}" if args.tensor else ""))
            except ValueError as exc:
                raise CLIError(f"--tensor: {exc}") from None
            bar = Bar("quant-stats")
            t0 = time.perf_counter()
            try:
                stats = lab.file_stats(f, types, pattern=args.tensor, imatrix=im, reference=ref,
                                       max_rows=args.max_rows, threads=args.threads,
                                       progress=lambda d, tot, name: bar(4 * d, 4 * tot, name))
            except ValueError as exc:
                raise CLIError(str(exc)) from None
            finally:
                bar.close()
            secs = time.perf_counter() - t0
        finally:
            if ref is not None:
                ref.close()
    summary = lab.summarize(stats, types)
    if args.json:
        dump_json({"file": args.file, "reference": args.reference, "imatrix": args.imatrix,
                    "max_rows": args.max_rows, "types": types, "seconds": secs,
                    "tensors": [{"name": s.name, "shape": list(s.shape), "source_type": s.source_type,
                                 "n_elements": s.n_elements, "rows_measured": s.rows_measured,
                                 "skipped": list(s.skipped), "errors": [lab.stats_json(e) for e in s.errors]}
                                for s in stats],
                    "summary": [{**lab.stats_json(u.stats), "n_tensors": u.n_tensors, "n_elements": u.n_elements}
                                for u in summary]})
        return 0
    weighted = im is not None
    src = f"values from {args.reference}" if args.reference else "values dequantized from the file"
    print(printable(f"{args.file}: {len(stats)} tensors x {len(types)} types, {src}"
                    + (f", at most {args.max_rows} rows per tensor" if args.max_rows else "")
                    + (f", importance weights from {args.imatrix}" if im is not None else "")
                    + f" ({secs:.2f} s)"))
    w = max((len(s.name) for s in stats), default=6)
    head = f"{'bpw':>6} {'rmse':>10} {'max|err|':>10} {'SNR dB':>7} {'cosine':>9}" + (
        f" {'w-rmse':>10}" if weighted else "")

    def cells(e: Any) -> str:
        wr = "" if not weighted else f" {'-' if e.weighted_rmse is None else f'{e.weighted_rmse:.4g}':>10}"
        return (f"{e.bits_per_weight:6.3f} {e.rmse:10.4g} {e.max_abs:10.4g} {e.snr_db:7.2f} {e.cosine:9.6f}"
                + wr)

    print(f"{'tensor':<{w}} {'from':<6} {'type':<7}{head}")
    for s in stats:
        if not s.errors:
            print(printable(f"{s.name:<{w}} {s.source_type:<6} (no requested type fits rows of {s.shape[0]})"))
        for e in s.errors:
            print(printable(f"{s.name:<{w}} {s.source_type:<6} {e.type:<7}{cells(e)}"))
    print()
    print(f"whole file (element-weighted)\n{'type':<7}{head} {'tensors':>8} {'elements':>14}")
    for u in summary:
        print(f"{u.stats.type:<7}{cells(u.stats)} {u.n_tensors:>8} {u.n_elements:>14,}")
    return 0



def register(sub: Any) -> None:
    """Add this module's sub-commands to ``sub``."""
    from quantscope.core.quant.target import DEFAULT_TYPES

    s = sub.add_parser("quantize", help="quantize a GGUF like llama-quantize (same presets, rules and bytes)")
    s.add_argument("file", help="input GGUF (F32/F16/BF16; quantized with --allow-requantize)")
    s.add_argument("output", nargs="?", help="output GGUF (not needed with --dry-run)")
    s.add_argument("type", nargs="?", help="preset: Q4_K_M, Q5_K_S, Q6_K, Q8_0, IQ4_XS, ... (llama-quantize's names)")
    s.add_argument("--imatrix", help="importance matrix (llama-imatrix's GGUF or legacy .dat)")
    s.add_argument("--tensor-type", action="append", type=tensor_type_arg, metavar="REGEX=TYPE",
                   help="give the tensors whose name matches REGEX this type (repeatable; the first match wins)")
    s.add_argument("--tensor-type-file", action="append", metavar="FILE",
                   help="REGEX=TYPE rules, separated by white space")
    s.add_argument("--output-tensor-type", metavar="TYPE", help="type of output.weight")
    s.add_argument("--token-embedding-type", metavar="TYPE", help="type of token_embd.weight")
    s.add_argument("--allow-requantize", action="store_true", help="accept quantized input tensors")
    s.add_argument("--leave-output-tensor", action="store_true", help="keep output.weight as it is")
    s.add_argument("--pure", action="store_true", help="the preset's default type everywhere (no mixture rules)")
    s.add_argument("--dry-run", action="store_true", help="print every tensor's type and the sizes; write nothing")
    s.add_argument("--json", action="store_true", help="print the plan (and result) as JSON")
    s.add_argument("--threads", type=int_arg(0, 1024), default=0, help="worker threads (default: all cores)")
    s.add_argument("--target-size", metavar="SIZE", help="instead of a preset: the best mix (least measured KL "
                   "divergence) whose file fits SIZE (4.2G, 900M, 1.5GiB, 4200MB; K/M/G binary)")
    s.add_argument("--target-bpw", type=float_arg(0, 32, lo_open=True), metavar="BPW",
                   help="instead of a preset: the best mix of at most BPW bits per weight (all tensors)")
    s.add_argument("-f", "--calibration", metavar="TEXT", help="with a target: the text the costs are measured on")
    s.add_argument("--types", metavar="T1,T2,...", help="with a target: the candidate types (default: "
                   f"{', '.join(DEFAULT_TYPES)})")
    s.add_argument("--rules", metavar="FILE", help="with a target: where to write the --tensor-type rules "
                   "(default: OUTPUT's name with .tensor-types.txt)")
    s.add_argument("--ctx", type=int_arg(8, 1 << 16), default=128, help="with a target: calibration chunk length "
                   "in tokens (default 128)")
    s.add_argument("--chunks", type=int_arg(1, 1 << 16), default=1, help="with a target: calibration chunks "
                   "(default 1)")
    s.add_argument("--exact", action="store_true", help="with a target: measure the KL divergence of every type "
                   "(slow), not one per tensor extended by the weighted error")
    s.add_argument("--cost-cache", metavar="DIR", default=str(sysinfo.user_cache_dir() / "quantscope" / "costs"),
                   help="with a target: where measured costs are kept for the next run")
    s.add_argument("--refine", type=int_arg(0, 1 << 16), default=0, metavar="N",
                   help="with a target: after the solve, measure the N largest chosen costs that were estimated, "
                   "solve again (up to 2 rounds), and measure the whole mix's KL divergence (default 0: off)")
    s.set_defaults(func=cmd_quantize)
    s = sub.add_parser("imatrix", help="show an importance-matrix file (llama-imatrix's GGUF or legacy .dat), or "
                       "with -f/-p compute one for the model FILE (llama-imatrix's GGUF format)")
    s.add_argument("file", help="an imatrix file to show, or (with -f/-p) the model")
    s.add_argument("-f", "--file-text", dest="text_file", metavar="TEXT", help="compute over this text file")
    s.add_argument("-p", "--prompt", help="compute over this text")
    s.add_argument("-o", "--output", help="where to write the computed matrix (default: imatrix.gguf)")
    s.add_argument("-c", "--ctx", type=int_arg(16, 1 << 20), default=512, help="chunk size in tokens (default 512)")
    s.add_argument("--chunks", type=int_arg(0, 1 << 30), default=0, help="at most this many chunks (0: all)")
    s.add_argument("-t", "--threads", type=int_arg(0, 1024), default=0, help="threads (default: all cores)")
    s.add_argument("--backend", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="where the statistics are collected (default cpu; cuda: the GPU sums them in the CPU's order, "
                        "except per-expert ones)")
    s.add_argument("--json", action="store_true", help="print strict JSON")
    s.set_defaults(func=cmd_imatrix)
    s = sub.add_parser("sensitivity", help="what each quantization type adds to the model's KL divergence on a "
                       "text, per tensor and per layer (to choose --tensor-type rules by hand)")
    s.add_argument("file", help="the model (its own values are the reference)")
    s.add_argument("-f", "--calibration", metavar="TEXT", required=True, help="the text the costs are measured on")
    s.add_argument("--types", metavar="T1,T2,...", help=f"the types (default: {', '.join(DEFAULT_TYPES)})")
    s.add_argument("--imatrix", help="importance matrix the types are quantized with")
    s.add_argument("--by", choices=("tensor", "layer", "both"), default="both", help="the tables to print")
    s.add_argument("--ctx", type=int_arg(8, 1 << 16), default=128, help="calibration chunk length in tokens")
    s.add_argument("--chunks", type=int_arg(1, 1 << 16), default=1, help="calibration chunks")
    s.add_argument("--exact", action="store_true", help="measure every type (slow), not one per tensor "
                   "extended by the weighted error")
    s.add_argument("--allow-requantize", action="store_true", help="accept quantized input tensors")
    s.add_argument("--cost-cache", metavar="DIR", default=str(sysinfo.user_cache_dir() / "quantscope" / "costs"),
                   help="where measured costs are kept (shared with quantize --target-size)")
    s.add_argument("--threads", type=int_arg(0, MAX_THREADS), default=0, help="worker threads (default: all cores)")
    s.add_argument("--json", action="store_true", help="print strict JSON")
    s.set_defaults(func=cmd_sensitivity)
    s = sub.add_parser("quant-stats", help="what each quantization type loses on every weight (like llama.cpp's "
                       "quantize-stats): RMSE, max |error|, SNR, cosine per tensor and type, and per type")
    s.add_argument("file", help="GGUF file (its weights are dequantized, unless --reference gives them)")
    s.add_argument("--types", metavar="T1,T2,...", help="types to measure (default: all with a quantizer, "
                   "TQ1_0 ... Q8_0, F16, BF16)")
    s.add_argument("--tensor", metavar="REGEX", help="only the weights whose name this regular expression finds")
    s.add_argument("--imatrix", metavar="FILE", help="importance matrix: quantize with it, and report the "
                   "importance-weighted RMSE")
    s.add_argument("--reference", metavar="FILE", help="a higher-precision GGUF of the same model to take the "
                   "values from (same tensor names and shapes)")
    s.add_argument("--max-rows", type=int_arg(1), metavar="N", help="measure at most N evenly spaced rows per "
                   "tensor (per expert: N / experts)")
    s.add_argument("--threads", type=int_arg(0, MAX_THREADS), default=0, help="worker threads (default: all "
                   "cores)")
    s.add_argument("--json", action="store_true", help="print strict JSON (infinities as \"inf\")")
    s.set_defaults(func=cmd_quant_stats)
