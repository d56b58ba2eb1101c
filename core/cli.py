"""The ``quantscope`` command line: every feature the GUI shows is reachable from here."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from . import catalog
from .filestate import FileChangedError
from .fsutil import PathRefused, check_input, json_text, printable
from .gguf import GGUFError, GGUFFile

COMMANDS = ("inspect", "dump-block", "models", "bench", "convert", "verify", "generate", "chat", "tokenize",
            "perplexity", "desktop", "quantize", "imatrix", "compare", "quant-stats")
BENCH_KINDS = ("open", "kernels", "convert", "model", "synthetic")
SYNTHETIC_SHAPES = ("tiny", "1b", "3b", "8b", "moe", "moe-k4", "moe-k2", "oss", "q35")  # core.synthetic.SHAPES
KERNEL_TYPES_HELP = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32")


class CLIError(Exception):
    """A user-facing error: printed as one message, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``quantscope: error: …``, exit 2), not usage + message."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        where = self.prog.removeprefix("quantscope").strip()  # the sub-command, if any (the line already names us)
        raise CLIError(f"{where + ': ' if where else ''}{message} (see {self.prog} --help)")


def _int_arg(lo: int, hi: int | None = None, what: str = "") -> Any:
    """An argparse type: an integer in ``lo..hi``."""

    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo or (hi is not None and v > hi):
            rng = f"{lo}..{hi:,}" if hi is not None else f"at least {lo}"
            raise argparse.ArgumentTypeError(f"{v} is out of range ({rng}{what})")
        return v

    return conv


def _float_arg(lo: float, hi: float | None = None, lo_open: bool = False) -> Any:
    """An argparse type: a finite number in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``)."""

    def conv(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if v < lo or (lo_open and v == lo) or (hi is not None and v > hi):
            rng = f"{'(' if lo_open else '['}{lo:g}, {'inf' if hi is None else f'{hi:g}'}]"
            raise argparse.ArgumentTypeError(f"{v:g} is out of range {rng}")
        return v

    return conv


#: the largest context the command line accepts (the model's trained context bounds it further)
MAX_CTX = 1 << 24
MAX_THREADS = 1024


def _check_file(path: str) -> None:
    """Refuse a missing path, a directory, FIFO, device or socket before anything opens it."""
    try:
        check_input(path)
    except PathRefused as exc:
        raise CLIError(str(exc)) from None


def _open(path: str) -> GGUFFile:
    _check_file(path)
    try:
        return GGUFFile(Path(path), strict=False)
    except GGUFError as exc:
        raise CLIError(f"{path}: not a readable GGUF file: {exc}") from None


def _dump_json(obj: Any) -> None:
    """Strict JSON on stdout: NaN and infinities are written as the strings "nan", "inf", "-inf"."""
    sys.stdout.write(json_text(obj) + "\n")


def _default_model_path() -> Path:
    name = catalog.DEFAULT_MODEL
    if not catalog.is_present(name):
        print(f"Default model {name!r} is not cached yet; fetching it (once).", file=sys.stderr)
        catalog.fetch(name, progress=lambda m: print(m, file=sys.stderr))
    return catalog.model_path(name)


def cmd_inspect(args: argparse.Namespace) -> int:
    from .bump import BumpError, describe, is_bump, open_bump, render_bump
    from .summary import render_text, summarize

    path = args.file or str(_default_model_path())
    _check_file(path)
    if is_bump(path):
        try:
            b = open_bump(path)
            d = describe(b, None if args.no_checksum else b.checksum_ok())
        except BumpError as exc:
            raise CLIError(str(exc)) from None
        if args.json:
            _dump_json(d)
        else:
            print(render_bump(d))
        return 0 if d["checksum_ok"] is not False else 1
    with _open(path) as f:
        s = summarize(f, max_items=args.items)
        if args.json:
            _dump_json(s)
        else:
            print(render_text(f, s))
    return 0


def cmd_dump_block(args: argparse.Namespace) -> int:
    from .blockdump import block_to_json, locate_and_decode, render_block
    from .quant import can_decode

    with _open(args.file) as f:
        try:
            t = f.tensor(args.tensor)
        except KeyError:
            near = [n for n in (x.name for x in f.tensors) if args.tensor.split(".")[-2:] == n.split(".")[-2:]][:5]
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise CLIError(f"no tensor named {args.tensor!r} in {args.file}{printable(hint)}") from None
        if t.type is None or t.problem:
            raise CLIError(f"{t.name}: cannot decode: {t.problem or t.type_name}")
        if not can_decode(t.type):
            raise CLIError(f"{t.name}: no block decoder for {t.type.name} yet")
        try:
            b, off = locate_and_decode(f, t.name, args.row, args.block)
        except IndexError as exc:
            raise CLIError(str(exc)) from None
        if args.element is not None and not 0 <= args.element < t.type.block_elems:
            raise CLIError(f"element {args.element} out of range 0..{t.type.block_elems - 1}")
        if args.json:
            _dump_json(block_to_json(b, tensor=t.name, row=args.row, block=args.block, file_offset=off))
        else:
            print(render_block(b, tensor=t.name, row=args.row, block=args.block, file_offset=off,
                               element=args.element))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    if args.action == "list":
        for spec in catalog.MODELS.values():
            state = "cached" if catalog.is_present(spec.name) else "not fetched"
            print(f"{spec.name:<14} {spec.title:<36} {spec.size / 2**20:7.1f} MiB  {state:<11}  {spec.description}")
        d = catalog.LLAMA_DATA
        state = "cached" if catalog.data_present() else "not fetched"
        print(f"{d.name:<14} {d.requirement:<36} {d.size / 2**20:7.1f} MiB  {state:<11}  {d.description}")
        print(f"cache: {catalog.cache_dir()}")
        return 0
    if args.action == "path":
        if not args.names:
            print(catalog.cache_dir())
            return 0
        for n in args.names:
            try:
                print(catalog.model_path(n))
            except catalog.FetchError as exc:
                raise CLIError(str(exc)) from None
        return 0
    names = args.names or [*catalog.MODELS, catalog.LLAMA_DATA.name]
    for n in names:
        try:
            if n == catalog.LLAMA_DATA.name:
                catalog.fetch_data(progress=print)
            else:
                catalog.fetch(n, progress=print, verify_existing=args.verify)
        except (catalog.FetchError, OSError) as exc:
            raise CLIError(str(exc)) from None
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import bench_kernels, bench_open, render_kernels

    if args.what == "convert":
        import tempfile

        from .bench import bench_convert
        from .bump import BumpRefusal

        src = Path(args.file)
        if not src.is_file():
            raise CLIError(f"{src}: no such file")
        with tempfile.TemporaryDirectory(dir=args.out_dir) as tmp:
            try:
                r = bench_convert(src, Path(tmp), args.repeat, args.context)
            except BumpRefusal as exc:
                raise CLIError(f"cannot convert {src.name}: {exc}") from None
        print(f"{src.name}: {r['size']:,} bytes (median of {args.repeat})")
        print(f"  convert      {r['convert_s']:.3f} s  {r['mb_s']:.0f} MB/s  "
              f"peak RSS growth {r['peak_rss_growth_mb']:.1f} MB")
        print(f"  sha256 only  {r['hash_s']:.3f} s")
        print(f"  copy+fsync   {r['copy_s']:.3f} s")
        print(f"  convert / max(hash, copy) = {r['ratio']:.2f}")
        return 0
    if args.what == "kernels":
        types = tuple(x.strip().upper() for x in args.types.split(",") if x.strip())
        from .bench import EXTRA_KERNEL_TYPES

        bad = [x for x in types if x not in KERNEL_TYPES_HELP + EXTRA_KERNEL_TYPES]
        if bad:
            raise CLIError(f"unsupported types {', '.join(bad)}; choose from "
                           f"{', '.join(KERNEL_TYPES_HELP + EXTRA_KERNEL_TYPES)}")
        threads = tuple(int(x) for x in args.threads.split(",") if x.strip())
        r = bench_kernels(types, threads, big=not args.no_big, dequant=not args.no_dequant)
        if args.json:
            json.dump(r, sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            print(render_kernels(r))
        return 0

    if args.what == "open":
        cached = [catalog.model_path(n) for n in catalog.MODELS if catalog.is_present(n)]
        paths = [Path(p) for p in args.files] or cached
        if not paths:
            raise CLIError("no files given and no catalogue model is cached (quantscope models fetch)")
        for p in paths:
            if not p.is_file():
                raise CLIError(f"{p}: no such file")
        rows = bench_open(paths, repeat=args.repeat)
        print(f"{'file':<48} {'size MiB':>9} {'tensors':>8} {'kv':>4} {'median ms':>10} {'min ms':>8} {'RSS +MiB':>9}")
        for r in rows:
            print(f"{Path(r['file']).name:<48} {r['size'] / 2**20:9.1f} {r['tensors']:8d} {r['kv']:4d} "
                  f"{r['median_ms']:10.2f} {r['min_ms']:8.2f} {r['rss_growth_mb']:9.2f}")
    return 0


class _Bar:
    """Progress on stderr: a redrawn bar on a terminal, a line every 10% otherwise. ``unit``: "bytes" (shown in
    MiB) or a word for a count (chunks, …)."""

    def __init__(self, label: str, unit: str = "bytes") -> None:
        self.label = label
        self.unit = unit
        self.tty = sys.stderr.isatty()
        self.last = -1

    def __call__(self, done: int, total: int, detail: str = "") -> None:
        if total <= 0:
            return
        pct = int(100 * done / total)
        amount = (f"{done / 2**20:8.1f}/{total / 2**20:.1f} MiB" if self.unit == "bytes"
                  else f"{done:,}/{total:,} {self.unit}")
        if self.tty:
            filled = pct * 30 // 100
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] {pct:3d}% "
                             f"{amount} {detail[:28]:<28}")
            sys.stderr.flush()
        elif pct // 10 != self.last // 10:
            what = f"{done:,} of {total:,} bytes" if self.unit == "bytes" else f"{done:,} of {total:,} {self.unit}"
            sys.stderr.write(f"{self.label}: {pct}% ({what}) {detail}\n")
        self.last = pct

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def cmd_convert(args: argparse.Namespace) -> int:
    from .bump import BumpRefusal, BumpWriteError, Cancelled, CancelToken, ConvertJob, ConvertProgress

    src = Path(args.file)
    _check_file(args.file)
    job = ConvertJob(src, args.output, profile=args.profile, context=args.context, config_path=args.config,
                     manifest_path=args.manifest, drop_untied_head=args.drop_untied_head,
                     labels=("-o", "--config", "--manifest"))
    try:
        job.check()  # outputs aliasing the input or each other, FIFOs, devices: refused before any work
    except PathRefused as exc:
        raise CLIError(str(exc)) from None
    bar = _Bar("convert")
    token = CancelToken()

    def progress(p: ConvertProgress) -> None:
        if p.phase == "planning":
            print(f"planning {src.name} ({args.profile} profile; checking the lm_head)...", file=sys.stderr)
        else:
            bar(p.done, p.total, f"{p.section_index + 1}/{p.n_sections} {p.section}")

    try:
        res = job.run(progress, token)
    except PathRefused as exc:
        raise CLIError(str(exc)) from None
    except BumpRefusal as exc:
        raise CLIError(f"cannot convert {src.name}: {exc}") from None
    except (BumpWriteError, OSError) as exc:
        raise CLIError(str(exc)) from None
    except (KeyboardInterrupt, Cancelled):
        bar.close()
        print("quantscope: conversion cancelled; nothing was written at the target path", file=sys.stderr)
        return 130
    except GGUFError as exc:
        raise CLIError(f"{src}: not a readable GGUF file: {exc}") from None
    bar.close()
    plan = res.plan
    h = plan.hyper
    types: dict[str, set[str]] = {}
    for s in plan.sections:
        types.setdefault(s.name.split(".")[-1], set()).add(s.type_name)
    print(printable(f"wrote {res.path} ({res.size:,} bytes) in {res.seconds:.2f} s, {res.mb_per_s:.0f} MB/s"))
    print(f"profile   {plan.profile}")
    print(f"model     {printable(h.arch)}: {h.n_layers} layers, embed {h.embed}, heads {h.heads}/{h.kv_heads} x "
          f"{h.head_dim}, ffn {h.ffn}, vocab {h.vocab}, context {h.context}")
    print("sections  " + ", ".join(f"{k} {'/'.join(sorted(v))}" for k, v in types.items()))
    print(f"biases    {len(plan.biases)} real q/k/v bias tensors carried" if plan.biases else "biases    none (zeros)")
    print(printable(f"lm_head   {plan.lm_head.decision}: {plan.lm_head.message}"))
    print(f"sha256    {res.sha256}")
    for label, p in (("config", res.config_path), ("manifest", res.manifest_path)):
        if p:
            print(printable(f"{label:<9} {p}"))
    return 0


def _tensor_type_arg(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not PATTERN=TYPE")
    pat, typ = text.split("=", 1)
    if not pat or not typ:
        raise argparse.ArgumentTypeError(f"{text!r}: both the pattern and the type are needed")
    return pat, typ


def _imatrix_arg(path: str | None) -> Any:
    """The --imatrix file read (None without one); a bad file is one CLIError line."""
    from .quant.imatrix import ImatrixError, read_imatrix

    if not path:
        return None
    _check_file(path)
    try:
        return read_imatrix(path)
    except (ImatrixError, OSError) as exc:
        raise CLIError(str(exc)) from None
    except GGUFError as exc:
        raise CLIError(f"--imatrix {path}: {exc}") from None


def cmd_quantize(args: argparse.Namespace) -> int:
    from .quant.quantize import (
        QuantizeCancelled,
        QuantizeError,
        QuantizeOptions,
        QuantizeProgress,
        plan_quantize,
        write_quantized,
    )

    _check_file(args.file)
    if not args.type and args.output and not args.dry_run:
        raise CLIError("quantize: give OUTPUT and TYPE (or --dry-run with TYPE)")
    if args.dry_run and args.output and not args.type:
        args.type, args.output = args.output, None  # `quantize IN TYPE --dry-run`
    if not args.type:
        raise CLIError("quantize: the preset TYPE is missing (e.g. Q4_K_M; see quantscope quantize --help)")
    if not args.output and not args.dry_run:
        raise CLIError("quantize: the OUTPUT path is missing")
    im = _imatrix_arg(args.imatrix)
    tt = list(args.tensor_type or [])
    for path in args.tensor_type_file or []:
        _check_file(path)
        try:
            words = Path(path).read_text(encoding="utf-8").split()
            tt += [_tensor_type_arg(w) for w in words]
        except (OSError, UnicodeDecodeError, argparse.ArgumentTypeError) as exc:
            raise CLIError(f"--tensor-type-file {path}: {exc}") from None
    opts = QuantizeOptions(args.type, im, args.imatrix or "", tuple(tt), args.output_tensor_type,
                           args.token_embedding_type, args.allow_requantize, args.pure, args.leave_output_tensor,
                           args.threads)
    f = _open(args.file)
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
                _dump_json({"summary": summary, "tensors": rows})
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
            from .fsutil import OutputSet

            OutputSet([("output", args.output)], inputs=[args.file])  # refuse an aliasing/odd output before work
        except PathRefused as exc:
            raise CLIError(str(exc)) from None
        import time

        bar = _Bar("quantize")
        t0 = time.perf_counter()

        def progress(p: QuantizeProgress) -> None:
            bar(p.done_bytes, p.total_bytes, f"{p.index + 1}/{p.count} {p.tensor}" if p.tensor else "")

        try:
            out = write_quantized(f, plan, args.output, opts, progress)
        except QuantizeError as exc:
            raise CLIError(f"cannot quantize {Path(args.file).name}: {exc}") from None
        except PathRefused as exc:
            raise CLIError(str(exc)) from None
        except OSError as exc:
            raise CLIError(f"cannot write {args.output}: {exc.strerror or exc}") from None
        except (KeyboardInterrupt, QuantizeCancelled):
            bar.close()
            print("quantscope: quantization cancelled; nothing was written at the target path", file=sys.stderr)
            return 130
        bar.close()
        secs = time.perf_counter() - t0
        if args.json:
            _dump_json({"summary": {**summary, "output": str(out), "seconds": secs}, "tensors": rows})
            return 0
        print(printable(f"wrote {out} ({plan.file_bytes:,} bytes) in {secs:.2f} s"))
        _print_plan_summary(plan)
        return 0
    finally:
        f.close()


def _print_plan_summary(plan: Any) -> None:
    print(f"preset    {plan.preset.name} (general.file_type {int(plan.preset.ftype)})")
    print(f"size      {plan.in_bytes / 2**20:.2f} MiB ({plan.bits_per_weight(False):.2f} bpw) -> "
          f"{plan.out_bytes / 2**20:.2f} MiB ({plan.bits_per_weight(True):.2f} bpw)")
    print("types     " + ", ".join(f"{k} x{v}" for k, v in plan.type_counts().items()))
    for w in plan.warnings:
        print(printable(f"warning   {w}"), file=sys.stderr)


def _compute_imatrix(args: argparse.Namespace) -> int:
    from .engine.imatrix import compute_imatrix
    from .fsutil import OutputSet
    from .quant.imatrix import write_imatrix

    if args.text_file and args.prompt is not None:
        raise CLIError("imatrix: give -f TEXT or -p TEXT, not both")
    out = args.output or "imatrix.gguf"
    inputs = [args.file] + ([args.text_file] if args.text_file else [])
    try:
        OutputSet([("-o", out)], inputs=inputs)
    except PathRefused as exc:
        raise CLIError(str(exc)) from None
    if args.text_file:
        _check_file(args.text_file)
        try:
            text = Path(args.text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CLIError(f"{args.text_file}: cannot read the text: {exc}") from None
    else:
        text = args.prompt
    bar = _Bar("imatrix", "chunks")
    try:
        im = compute_imatrix(args.file, text, n_ctx=args.ctx, max_chunks=args.chunks, threads=args.threads,
                             dataset=args.text_file or "", progress=lambda d, t, m: bar(d, t, m) if t > 1 else None)
    except ValueError as exc:
        raise CLIError(f"{args.file}: {exc}") from None
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
    from .quant.imatrix import ImatrixError, read_imatrix

    _check_file(args.file)
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
        _dump_json({"imatrix": im.summary(), "entries": rows})
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

    from .quant import lab

    try:
        types = lab.candidate_types(t for t in args.types.split(",") if t.strip()) if args.types else \
            list(lab.CANDIDATE_TYPES)
    except ValueError as exc:
        raise CLIError(f"--types: {exc}") from None
    if not types:
        raise CLIError("--types: no type given (e.g. --types Q4_K,Q5_K,Q8_0)")
    _check_file(args.file)
    im = _imatrix_arg(args.imatrix)
    with _open(args.file) as f:
        ref = _open(args.reference) if args.reference else None
        try:
            try:
                if not lab.quantizable_tensors(f, args.tensor):
                    raise CLIError(f"no quantizable 2-D/3-D weight in {args.file}"
                                   + (f" matches --tensor {args.tensor!r}" if args.tensor else ""))
            except ValueError as exc:
                raise CLIError(f"--tensor: {exc}") from None
            bar = _Bar("quant-stats")
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
        _dump_json({"file": args.file, "reference": args.reference, "imatrix": args.imatrix,
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


def cmd_verify(args: argparse.Namespace) -> int:
    from .bump import BumpError, BumpRefusal, verify_against

    _check_file(args.file)
    if args.against is not None:  # a missing or non-GGUF source is refused before any hashing
        _check_file(args.against)
        try:
            GGUFFile(args.against).close()
        except GGUFError as exc:
            raise CLIError(f"--against {args.against}: not a readable GGUF file: {exc}") from None
    bar = _Bar("verify")
    try:
        rep = verify_against(args.file, args.against, progress=lambda d, t: bar(d, t))
    except (BumpError, BumpRefusal, PathRefused) as exc:
        bar.close()
        raise CLIError(str(exc)) from None
    except GGUFError as exc:
        bar.close()
        raise CLIError(f"--against {args.against}: not a readable GGUF file: {exc}") from None
    bar.close()
    b = rep.bump
    print(printable(f"{b.path}: profile {b.profile} ({b.profile_source}), {len(b.sections)} sections"))
    print(f"checksum  {'ok' if rep.checksum_ok else 'MISMATCH'}")
    if args.against:
        print(printable(f"sections  {rep.sections_checked} compared with {args.against}"))
    for p in rep.problems:
        print(f"problem   {printable(p)}")
    print("verified" if rep.ok else "NOT VERIFIED")
    return 0 if rep.ok else 1


def _engine(args: argparse.Namespace, n_ctx: int = 4096) -> Any:
    from .engine.generate import Engine
    from .model import UnsupportedModel
    from .tokenizer import TokenizerError

    _check_file(args.file)
    from .engine.cuda_backend import CudaError

    try:
        eng = Engine(args.file, n_ctx=n_ctx, threads=args.threads, backend=getattr(args, "backend", "auto"),
                     repack=not getattr(args, "no_repack", False))
    except (UnsupportedModel, TokenizerError) as exc:
        raise CLIError(f"{args.file}: {exc}") from None
    except CudaError as exc:
        raise CLIError(f"--backend cuda: {exc}") from None
    except GGUFError as exc:
        raise CLIError(f"{args.file}: not a readable GGUF file: {exc}") from None
    print(f"backend: {eng.backend} ({eng.backend_reason})", file=sys.stderr)
    return eng


def _params(args: argparse.Namespace) -> Any:
    from .chat import SamplerParams

    seed = None if args.seed is None or args.seed < 0 else args.seed  # -1: a random seed, as in llama.cpp
    return SamplerParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                         repeat_penalty=args.repeat_penalty, seed=seed, max_tokens=args.n_predict,
                         stop=list(args.stop or []), special=args.special)


def _stream(eng: Any, prompt: Any, args: argparse.Namespace, **kw: Any) -> Any:
    """``eng.generate`` with its refusals (template, context, empty prompt) as :class:`CLIError`."""
    from .chat import ChatTemplateError
    from .engine.generate import EmptyPrompt
    from .engine.session import ContextFull

    try:
        yield from eng.generate(prompt, _params(args), **kw)
    except ContextFull as exc:
        raise CLIError(f"{exc}") from None
    except ChatTemplateError as exc:
        raise CLIError(f"{args.file}: {exc}") from None
    except EmptyPrompt as exc:
        raise CLIError(str(exc)) from None


def cmd_generate(args: argparse.Namespace) -> int:
    if args.prompt is not None:
        prompt = args.prompt
    else:
        try:
            prompt = sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise CLIError(f"the prompt on standard input is not UTF-8 text: {exc}") from None
    eng = _engine(args, args.ctx)
    if args.echo:
        sys.stdout.write(prompt)
    last = None

    def on_prompt(done: int, total: int) -> None:  # long prompts: show progress on a terminal
        if total > 512 and sys.stderr.isatty():
            end = "\n" if done == total else ""
            print(f"\r[prompt {done:,}/{total:,} tokens]", end=end, file=sys.stderr, flush=True)

    for d in _stream(eng, prompt, args, on_prompt=on_prompt):
        sys.stdout.write(d.text)
        sys.stdout.flush()
        last = d
    sys.stdout.write("\n")
    if last is not None:
        print(f"[{last.n_prompt} prompt tokens at {last.prompt_tps:.1f} t/s, ttft {last.ttft_s * 1e3:.0f} ms; "
              f"{last.n_generated} generated at {last.gen_tps:.1f} t/s; stop: {last.stop_reason}]", file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from .chat import ChatTemplateError
    from .chat.conversation import ContextTooSmall, prepare_prompt, reply_reserve

    eng = _engine(args, args.ctx)
    if eng.template_error is not None:
        raise CLIError(f"{args.file}: {eng.template_error}")
    system = args.system
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    print(f"chatting with {Path(args.file).name} ({eng.model.config.arch}, context {eng.n_ctx}); "
          "/reset clears, /system TEXT sets the system prompt, /quit or Ctrl-D leaves", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/quit", "/exit"):
            return 0
        if line.strip() == "/reset":
            messages = [{"role": "system", "content": system}] if system else []
            print("(conversation cleared)", file=sys.stderr)
            continue
        if line.startswith("/system"):
            system = line[len("/system"):].strip()
            messages = [{"role": "system", "content": system}] if system else []
            print("(system prompt set; conversation cleared)", file=sys.stderr)
            continue
        messages.append({"role": "user", "content": line})
        # the GUI's context policy: past the context the oldest turns are left out (a base model without a
        # template continues each line as plain text)
        try:
            prep = prepare_prompt(messages if eng.template is not None else line, eng, eng.n_ctx,
                                  reply_reserve(args.n_predict, eng.n_ctx), hint="raise -c")
        except ChatTemplateError as exc:
            raise CLIError(f"{args.file}: {exc}") from None
        except ContextTooSmall as exc:
            raise CLIError(str(exc)) from None
        if prep.dropped:
            print(f"(the {prep.dropped} oldest messages are left out: the conversation outgrew the context)",
                  file=sys.stderr)
        prompt = prep.prompt
        reply = ""
        last = None
        thinking = False  # a harmony model's thinking goes to stderr (dimmed on a terminal), the answer to stdout
        dim = ("\x1b[2m", "\x1b[0m") if sys.stderr.isatty() else ("", "")
        try:
            for d in _stream(eng, prompt, args):
                last = d
                if d.channel and d.text:
                    if not thinking:
                        sys.stderr.write(f"{dim[0]}[thinking] ")
                        thinking = True
                    sys.stderr.write(d.text)
                    sys.stderr.flush()
                    continue
                if thinking and d.text:
                    sys.stderr.write(f"{dim[1]}\n")
                    thinking = False
                sys.stdout.write(d.text)
                sys.stdout.flush()
                reply += d.text
        except KeyboardInterrupt:
            print("\n(interrupted)", file=sys.stderr)
        if thinking:
            sys.stderr.write(f"{dim[1]}\n")
        print()
        messages.append({"role": "assistant", "content": reply})
        if last is not None:
            print(f"[{last.n_generated} tokens, {last.gen_tps:.1f} t/s, context {last.context_used}/{eng.n_ctx}]",
                  file=sys.stderr)


def cmd_tokenize(args: argparse.Namespace) -> int:
    from .gguf import GGUFFile
    from .tokenizer import Tokenizer, TokenizerError

    _check_file(args.file)
    try:
        with GGUFFile(args.file) as f:
            tok = Tokenizer(f)
    except (TokenizerError, GGUFError, OSError) as exc:
        raise CLIError(f"{args.file}: {exc}") from None
    ids = tok.encode(args.text, add_special=None if not args.no_bos else False)
    if args.ids:
        print(" ".join(str(i) for i in ids))
    elif args.pieces:
        print(" ".join(repr(tok.pieces[i]) for i in ids))
    else:
        for i in ids:
            print(f"{i:>8}  {tok.pieces[i]!r}  {tok.token_bytes(i)!r}")
    return 0


def cmd_perplexity(args: argparse.Namespace) -> int:
    from .engine.tools import perplexity

    if args.kl_divergence:
        return _kl_divergence(args)
    if not args.text_file:
        raise CLIError("perplexity needs the text: -f FILE (or --kl-divergence-base FILE --kl-divergence)")
    try:
        text = Path(args.text_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"{args.text_file}: cannot read the text: {exc}") from None
    if args.kl_divergence_base:
        return _write_kld_base(args, text)
    eng = _engine(args, args.ctx)
    try:
        r = perplexity(eng.model, eng.tokenizer, text, args.ctx, args.chunks, make_session=eng.new_session,
                       progress=lambda c, n, p: print(f"[{c}/{n}] running ppl {p:.4f}", file=sys.stderr))
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    print(f"perplexity {r.ppl:.4f} over {r.n_chunks} chunks of {r.n_ctx} tokens ({r.n_tokens_scored} scored) "
          f"in {r.seconds:.1f} s")
    return 0


def _write_kld_base(args: argparse.Namespace, text: str) -> int:
    """``--kl-divergence-base FILE`` without ``--kl-divergence``: write llama-perplexity's log-probability file."""
    from .engine import kld
    from .fsutil import PathRefused

    eng = _engine(args, args.ctx)
    try:
        n, ppl = kld.write_base(args.kl_divergence_base, eng.model, eng.tokenizer, text, args.ctx, args.chunks,
                                make_session=eng.new_session, inputs=(args.file, args.text_file),
                                progress=lambda c, n: print(f"[{c}/{n}]", file=sys.stderr))
    except (ValueError, PathRefused, OSError) as exc:
        raise CLIError(str(exc)) from None
    print(f"perplexity {ppl:.4f} over {n} chunks of {args.ctx} tokens; log-probabilities written to "
          f"{args.kl_divergence_base}")
    return 0


def _kl_divergence(args: argparse.Namespace) -> int:
    """``--kl-divergence-base FILE --kl-divergence``: compare with a base written by either tool."""
    from .engine import kld
    from .fsutil import PathRefused

    if not args.kl_divergence_base:
        raise CLIError("--kl-divergence needs --kl-divergence-base FILE (the base model's log-probabilities)")
    try:
        base = kld.KLDBase(args.kl_divergence_base)
    except (ValueError, PathRefused, OSError) as exc:
        raise CLIError(str(exc)) from None
    eng = _engine(args, base.n_ctx)

    def tell(c: int, n: int, r: kld.KLDResult) -> None:
        print(f"[{c}/{n}] PPL {r.ppl()[0]:.4f}  KLD {r.mean_kld()[0]:.6f}  same top {100 * r.top1():.2f} %",
              file=sys.stderr)

    try:
        r = kld.kl_divergence(base, eng.model, eng.tokenizer, make_session=eng.new_session, progress=tell)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    print(f"{r.n_chunks} chunks of {r.n_ctx} tokens, {r.count} positions compared with {base.path}")
    print(r.report())
    return 0


#: ``compare``'s colour scale: upper KLD bounds (nats) and the ANSI 256-colour backgrounds, green to red
KLD_BINS = (0.001, 0.01, 0.05, 0.1, 0.5, 1.0)
KLD_COLOURS = (34, 70, 148, 184, 214, 202, 196)


def _kld_colour(k: float) -> int:
    return KLD_COLOURS[next((i for i, b in enumerate(KLD_BINS) if k < b), len(KLD_BINS))]


def _paint(text: str, sgr: str) -> str:
    """``text`` made safe for the terminal (newlines and tabs kept) inside the SGR ``sgr``, reset before each
    newline so a background does not run to the end of the line."""
    lines = ["\t".join(printable(p) for p in line.split("\t")) for line in text.split("\n")]
    return "\n".join(f"\x1b[{sgr}m{line}\x1b[0m" if line else "" for line in lines)


def _compare_text(r: Any) -> str:
    """The compared text, the scored tokens on a background coloured by KLD, the unscored ones dimmed."""
    score = {t.position: t.kld for t in r.tokens}
    out = [_paint(piece, f"48;5;{_kld_colour(score[i])};38;5;16") if i in score else _paint(piece, "2")
           for i, (_tid, piece) in enumerate(r.context)]
    bounds = ["0", *(f"{b:g}" for b in KLD_BINS)]
    legend = " ".join(f"\x1b[48;5;{c};38;5;16m {'<' + bounds[i + 1] if i < len(KLD_BINS) else '≥' + bounds[-1]} "
                      "\x1b[0m" for i, c in enumerate(KLD_COLOURS))
    return f"{''.join(out)}\n\nKLD (nats): {legend}  \x1b[2mdimmed: context, not scored\x1b[0m"


def _compare_worst(r: Any, n: int) -> list[str]:
    """The ``n`` positions of largest KLD, each with the text before it and what each model expected."""
    lines = [f"the {min(n, r.n_scored)} positions of largest KLD (nats), with the text before them:"]
    for t in r.worst(n):
        start = (t.position // r.n_ctx) * r.n_ctx
        before = "".join(p for _, p in r.context[max(start, t.position - 12) : t.position])[-48:]
        tops = (f"top base {printable(repr(r.token_text.get(t.base_top1, '')))} quant "
                f"{printable(repr(r.token_text.get(t.quant_top1, '')))}")
        lines.append(f"  {t.kld:9.6f}  @{t.position:<7} {printable(repr(t.piece)):<12} p base "
                     f"{math.exp(t.base_logp):.3g} quant {math.exp(t.quant_logp):.3g}  {tops}")
        lines.append(f"             …{printable(before)}[{printable(t.piece)}]")
    return lines


def cmd_compare(args: argparse.Namespace) -> int:
    """``compare BASE QUANT``: perplexity of each, KL divergence and top-1 agreement token by token."""
    from .engine.compare import CompareError, compare_models
    from .engine.cuda_backend import CudaError

    _check_file(args.base)
    _check_file(args.quant)
    _exit_cleanly_if_file_changes(f"{args.base} or {args.quant}")
    if args.text_file is not None:
        _check_file(args.text_file)
        try:
            text = Path(args.text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CLIError(f"{args.text_file}: cannot read the text: {exc}") from None
    elif args.prompt is not None:
        text = args.prompt
    elif args.base_kld:
        text = ""  # the base file's tokens
    else:
        raise CLIError("compare needs the text: -f FILE or -p TEXT (with --base-kld the base file's tokens serve)")
    if args.base_kld and args.ctx is not None:
        from .engine import kld

        try:
            with kld.KLDBase(args.base) as kb:
                if kb.n_ctx != args.ctx:
                    raise CLIError(f"--ctx {args.ctx}: {args.base} was written with a context of {kb.n_ctx}")
        except (ValueError, OSError) as exc:
            raise CLIError(str(exc)) from None

    def tell(done: int, total: int, message: str) -> None:
        if not message.startswith("loading") and done:
            print(f"[{done}/{total}] {message.split(': ', 1)[-1]}", file=sys.stderr)

    try:
        r = compare_models(args.base, args.quant, text, n_ctx=args.ctx or 512, max_chunks=args.chunks,
                           threads=args.threads, base_is_kld=args.base_kld, progress=tell, backend=args.backend,
                           repack=not args.no_repack)
    except CudaError as exc:
        raise CLIError(f"--backend cuda: {exc}") from None
    except FileChangedError as exc:
        raise CLIError(f"{args.base} or {args.quant} changed while it was being read ({exc})") from None
    except (CompareError, ValueError, PathRefused, OSError) as exc:
        raise CLIError(str(exc)) from None
    if args.json:
        _dump_json({"summary": r.summary(), "worst": [t.position for t in r.worst(args.worst)],
                    "tokens": r.token_rows()})
        return 0
    print(printable(f"base   {r.base_name}{' (KL-divergence base file)' if r.base_is_kld else ''}"))
    print(printable(f"quant  {r.quant_name}"))
    print(f"text   {r.n_chunks} chunk{'s' if r.n_chunks != 1 else ''} of {r.n_ctx} tokens, {r.n_scored} positions "
          f"scored in {r.seconds:.1f} s")
    print(f"PPL    base {r.ppl_base:.4f}  quant {r.ppl_quant:.4f}  ratio {r.ppl_ratio:.6f} "
          f"(ln {math.log(r.ppl_ratio):+.6f})")
    print(f"KLD    mean {r.kld_mean:.6f}  median {r.kld_median:.6f}  p90 {r.kld_p90:.6f}  p99 {r.kld_p99:.6f}  "
          f"max {r.kld_max:.6f}  (nats)")
    print(f"top-1  {100 * r.top1_agreement:.2f} % of the positions agree")
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty()
                                        and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb")
    print()
    print(_compare_text(r) if colour else "\n".join(_compare_worst(r, args.worst)))
    return 0


def cmd_bench_model(args: argparse.Namespace) -> int:
    from .bench import rss_bytes
    from .engine.tools import bench_model

    eng = _engine(args, max(args.n_prompt, args.n_gen) + 16)
    rows = bench_model(eng.model, args.n_prompt, args.n_gen, args.repetitions, make_session=eng.new_session)
    peak = _peak_rss_mb()
    for r in rows:
        r.update({"model": Path(args.file).name, "isa": _isa(), "backend": eng.backend, "peak_rss_mb": peak,
                  "rss_mb": rss_bytes() / 2**20})
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(f"{'model':<42} {'threads':>7} {'test':>6} {'t/s':>16}")
        for r in rows:
            print(f"{r['model']:<42} {r['threads']:>7} {r['test']:>6} {r['tokens_per_s']:9.2f} ± {r['stddev']:5.2f}")
        print(f"peak RSS {peak:.0f} MiB")
    return 0


def cmd_bench_synthetic(args: argparse.Namespace) -> int:
    from . import synthetic

    if args.path_only:
        print(synthetic.synthetic_path(args.shape, args.seed))
        return 0
    bar = _Bar(f"synthetic {args.shape}")
    try:
        path = synthetic.ensure_synthetic(args.shape, args.seed, lambda p: bar(p.done, p.total, p.tensor),
                                          say=lambda m: print(m, file=sys.stderr))
    except (OSError, PathRefused) as exc:
        raise CLIError(f"cannot write the synthetic {args.shape} model: {exc}") from None
    finally:
        bar.close()
    print(path)
    return 0


def _peak_rss_mb() -> float:
    import resource

    from .bench import peak_rss_bytes

    peak = peak_rss_bytes()
    return peak / 2**20 if peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _isa() -> str:
    from .native import kernels

    return kernels.isa()


def _add_sampling(s: argparse.ArgumentParser) -> None:
    s.add_argument("-n", "--n-predict", type=_int_arg(1), default=256, help="tokens to generate (at least 1)")
    s.add_argument("--temp", type=_float_arg(0.0), default=0.8, help="temperature (0 = greedy)")
    s.add_argument("--top-k", type=_int_arg(0), default=40, help="0 = all tokens")
    s.add_argument("--top-p", type=_float_arg(0.0, 1.0), default=0.95)
    s.add_argument("--min-p", type=_float_arg(0.0, 1.0), default=0.05)
    s.add_argument("--repeat-penalty", type=_float_arg(0.0, lo_open=True), default=1.0)
    s.add_argument("--seed", type=_int_arg(-1), help="same seed, same text (-1 or none: a random seed)")
    s.add_argument("--stop", action="append", help="stop string (repeatable)")
    s.add_argument("--special", action="store_true",
                   help="print control tokens (<|im_end|>, <start_of_image>, …) instead of leaving them out")
    s.add_argument("-c", "--ctx", type=_int_arg(1, MAX_CTX), default=4096, help="context size")
    s.add_argument("-t", "--threads", type=_int_arg(0, MAX_THREADS), default=0, help="0 = one per core")
    s.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    s.add_argument("--no-repack", action="store_true",
                   help="keep the weights mapped from the file (zero-copy) instead of repacking them for the CPU")


def cmd_desktop(args: argparse.Namespace) -> int:
    from . import desktop

    try:
        base = desktop.data_dir(args.prefix)
        rep = desktop.install(base) if args.action == "install" else desktop.uninstall(base)
    except desktop.DesktopError as exc:
        raise CLIError(str(exc)) from None
    if args.action == "install":
        print(f"Installed the desktop entry, icons and {desktop.MIME_TYPE} under {printable(base)}, starting: "
              f"{printable(' '.join(rep.command))}")
    else:
        print(f"Removed the desktop integration under {printable(base)}" if rep.removed
              else f"Nothing of quantscope's desktop integration was found under {printable(base)}")
    for rel in rep.written or rep.removed:
        print(f"  {printable(rel)}")
    for line in rep.kept + rep.tools:
        print(f"  {printable(line)}")
    return 0


class _Skipped:
    """Stands in for the parser of a sub-command that is not being run: every call on it does nothing (building all
    of them is a noticeable share of a short command's start-up)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: self


class _OnlySubparsers:
    """``add_subparsers``' action restricted to one command (``None``: all of them)."""

    def __init__(self, action: Any, only: str | None) -> None:
        self._action = action
        self._only = only

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if self._only is not None and name != self._only:
            return _Skipped()
        return self._action.add_parser(name, **kwargs)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command-line parser; with ``only``, just that sub-command's (what ``main`` builds to run one)."""
    p = _Parser(
        prog="quantscope",
        description="Explore quantized LLM files (GGUF). `quantscope FILE` opens FILE; with no arguments the "
        "default demo model is opened.",
    )
    sub = _OnlySubparsers(p.add_subparsers(dest="command"), only)

    s = sub.add_parser("inspect", help="header, metadata, tensor table and per-type summary of a GGUF or bump file")
    s.add_argument("file", nargs="?", help="GGUF or BUMPWGT3 file (default: the demo model)")
    s.add_argument("--json", action="store_true", help="print strict JSON instead of text (NaN and infinities "
                   "are written as the strings \"nan\", \"inf\", \"-inf\")")
    s.add_argument("--no-checksum", action="store_true", help="bump files: skip verifying the checksum")
    s.add_argument("--items", type=int, default=8, help="array elements to preview (default 8)")
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("dump-block", help="decode one quantization block of a tensor")
    s.add_argument("file")
    s.add_argument("tensor")
    s.add_argument("--row", type=int, default=0, help="row (flattened over ne[1:], default 0)")
    s.add_argument("--block", type=int, default=0, help="block within the row (default 0)")
    s.add_argument("--element", type=int, help="also explain the dequantization of this element of the block")
    s.add_argument("--json", action="store_true", help="print strict JSON (NaN/infinities as \"nan\", \"inf\", "
                   "\"-inf\")")
    s.set_defaults(func=cmd_dump_block)

    s = sub.add_parser("convert", help="convert a GGUF file to the C-Kernel-Engine BUMPWGT3 layout")
    s.add_argument("file")
    s.add_argument("-o", "--output", required=True, help="output .bump path")
    s.add_argument("--profile", choices=("ckernel", "seed"), default="ckernel",
                   help="dtype code table (default ckernel)")
    s.add_argument("--context", type=int, help="context length to record (default: the model's)")
    s.add_argument("--config", help="also write config.json here")
    s.add_argument("--manifest", help="also write a manifest JSON here")
    s.add_argument("--drop-untied-head", action="store_true",
                   help="convert even when output.weight is a genuinely different lm_head (it is dropped)")
    s.set_defaults(func=cmd_convert)

    s = sub.add_parser("quantize", help="quantize a GGUF like llama-quantize (same presets, rules and bytes)")
    s.add_argument("file", help="input GGUF (F32/F16/BF16; quantized with --allow-requantize)")
    s.add_argument("output", nargs="?", help="output GGUF (not needed with --dry-run)")
    s.add_argument("type", nargs="?", help="preset: Q4_K_M, Q5_K_S, Q6_K, Q8_0, IQ4_XS, ... (llama-quantize's names)")
    s.add_argument("--imatrix", help="importance matrix (llama-imatrix's GGUF or legacy .dat)")
    s.add_argument("--tensor-type", action="append", type=_tensor_type_arg, metavar="REGEX=TYPE",
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
    s.add_argument("--threads", type=_int_arg(0, 1024), default=0, help="worker threads (default: all cores)")
    s.set_defaults(func=cmd_quantize)

    s = sub.add_parser("imatrix", help="show an importance-matrix file (llama-imatrix's GGUF or legacy .dat), or "
                       "with -f/-p compute one for the model FILE (llama-imatrix's GGUF format)")
    s.add_argument("file", help="an imatrix file to show, or (with -f/-p) the model")
    s.add_argument("-f", "--file-text", dest="text_file", metavar="TEXT", help="compute over this text file")
    s.add_argument("-p", "--prompt", help="compute over this text")
    s.add_argument("-o", "--output", help="where to write the computed matrix (default: imatrix.gguf)")
    s.add_argument("-c", "--ctx", type=_int_arg(16, 1 << 20), default=512, help="chunk size in tokens (default 512)")
    s.add_argument("--chunks", type=_int_arg(0, 1 << 30), default=0, help="at most this many chunks (0: all)")
    s.add_argument("-t", "--threads", type=_int_arg(0, 1024), default=0, help="threads (default: all cores)")
    s.add_argument("--json", action="store_true", help="print strict JSON")
    s.set_defaults(func=cmd_imatrix)

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
    s.add_argument("--max-rows", type=_int_arg(1), metavar="N", help="measure at most N evenly spaced rows per "
                   "tensor (per expert: N / experts)")
    s.add_argument("--threads", type=_int_arg(0, MAX_THREADS), default=0, help="worker threads (default: all "
                   "cores)")
    s.add_argument("--json", action="store_true", help="print strict JSON (infinities as \"inf\")")
    s.set_defaults(func=cmd_quant_stats)

    s = sub.add_parser("generate", help="continue a prompt (stdout: the generated text)")
    s.add_argument("file")
    s.add_argument("-p", "--prompt", help="prompt text (default: stdin)")
    s.add_argument("--echo", action="store_true", help="print the prompt before the continuation")
    _add_sampling(s)
    s.set_defaults(func=cmd_generate)

    s = sub.add_parser("chat", help="interactive chat with the model's template")
    s.add_argument("file")
    s.add_argument("--system", help="system prompt")
    _add_sampling(s)
    s.set_defaults(func=cmd_chat)

    s = sub.add_parser("tokenize", help="token ids and pieces of a text")
    s.add_argument("file")
    s.add_argument("text")
    s.add_argument("--ids", action="store_true", help="only the ids")
    s.add_argument("--pieces", action="store_true", help="only the pieces")
    s.add_argument("--no-bos", action="store_true", help="do not add BOS/EOS")
    s.set_defaults(func=cmd_tokenize)

    s = sub.add_parser("perplexity", help="perplexity of a text (llama-perplexity's procedure)")
    s.add_argument("file")
    s.add_argument("-f", "--text-file", help="the text (not needed with --kl-divergence: the base holds the tokens)")
    s.add_argument("-c", "--ctx", type=_int_arg(2, MAX_CTX), default=512)
    s.add_argument("--kl-divergence-base", metavar="FILE",
                   help="write the log-probabilities to FILE in llama-perplexity's format (with --kl-divergence: "
                        "read them from FILE)")
    s.add_argument("--kl-divergence", action="store_true",
                   help="compare with the base log-probabilities of --kl-divergence-base: mean KLD, same-top "
                        "fraction, PPL ratio (as llama-perplexity reports them)")
    s.add_argument("--chunks", type=_int_arg(0), default=0, help="at most this many chunks (0 = all)")
    s.add_argument("-t", "--threads", type=_int_arg(0, MAX_THREADS), default=0)
    s.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    s.add_argument("--no-repack", action="store_true",
                   help="keep the weights mapped from the file (zero-copy) instead of repacking them for the CPU")
    s.set_defaults(func=cmd_perplexity)

    s = sub.add_parser("compare", help="compare two GGUFs of the same model on a text: perplexity of each, KL "
                       "divergence and top-1 agreement, the text coloured token by token by KLD")
    s.add_argument("base", help="the reference GGUF (e.g. F16 or Q8_0), or with --base-kld a llama-perplexity "
                   "KL-divergence base file")
    s.add_argument("quant", help="the GGUF to measure (same vocabulary)")
    t = s.add_mutually_exclusive_group()
    t.add_argument("-f", "--text-file", help="the text (UTF-8)")
    t.add_argument("-p", "--prompt", help="the text itself")
    s.add_argument("-c", "--ctx", type=_int_arg(4, MAX_CTX), default=None,
                   help="chunk size in tokens (default 512; a base file sets its own)")
    s.add_argument("--chunks", type=_int_arg(0), default=0, help="at most this many chunks (0 = all)")
    s.add_argument("--base-kld", action="store_true",
                   help="BASE is a log-probability file of llama-perplexity --kl-divergence-base (or quantscope "
                        "perplexity --kl-divergence-base); the text may then be left out")
    s.add_argument("-t", "--threads", type=_int_arg(0, MAX_THREADS), default=0)
    s.add_argument("--json", action="store_true", help="print strict JSON: the summary and every scored position")
    s.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the text token by token by KLD (auto: on a terminal); without colour the worst "
                        "positions are listed")
    s.add_argument("--worst", type=_int_arg(0), default=10, help="positions to list without colour (default 10)")
    s.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    s.add_argument("--no-repack", action="store_true",
                   help="keep the weights mapped from the file (zero-copy) instead of repacking them for the CPU")
    s.set_defaults(func=cmd_compare)

    s = sub.add_parser("verify", help="check a bump file's checksum and (with --against) every section")
    s.add_argument("file")
    s.add_argument("--against", help="the GGUF file it was converted from")
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("models", help="the demo/test models: list, fetch, path")
    s.add_argument("action", choices=("list", "fetch", "path"))
    s.add_argument("names", nargs="*", help=f"model names ({', '.join(catalog.MODELS)}); default all")
    s.add_argument("--verify", action="store_true", help="re-hash cached files")
    s.set_defaults(func=cmd_models)

    s = sub.add_parser("desktop", help="add quantscope to this user's application menu, with its icon and the GGUF "
                       "file type (install), or take it out again (uninstall)")
    s.add_argument("action", choices=("install", "uninstall"))
    s.add_argument("--prefix", help="use DIR/share instead of $XDG_DATA_HOME (default ~/.local/share)",
                   metavar="DIR")
    s.set_defaults(func=cmd_desktop)

    s = sub.add_parser("bench", help="benchmarks (figures only)")
    bsub = s.add_subparsers(dest="what", required=True)
    b = bsub.add_parser("open", help="time to read header, metadata and tensor index; RSS growth")
    b.add_argument("files", nargs="*", help="GGUF files (default: every cached catalogue model)")
    b.add_argument("--repeat", type=int, default=7)
    b.set_defaults(func=cmd_bench)
    b = bsub.add_parser("model", help="prefill/decode tokens per second of a model (like llama-bench)")
    b.add_argument("file")
    b.add_argument("-p", "--n-prompt", type=_int_arg(1, MAX_CTX), default=128)
    b.add_argument("-n", "--n-gen", type=_int_arg(1, MAX_CTX), default=64)
    b.add_argument("-t", "--threads", type=_int_arg(0, MAX_THREADS), default=0)
    b.add_argument("-r", "--repetitions", type=_int_arg(1), default=3)
    b.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    b.add_argument("--no-repack", action="store_true",
                   help="keep the weights mapped from the file (zero-copy) instead of repacking them for the CPU")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bench_model)
    b = bsub.add_parser("synthetic", help="write (once, into the model cache) and print a random-weight model of a "
                        "named shape (llama, qwen3moe experts: moe*, gpt-oss: oss, qwen35: q35), Q4_K_M "
                        "(oss: MXFP4_MOE) mix, "
                        "SmolLM2 vocabulary: the file to compare engines on")
    b.add_argument("shape", choices=tuple(SYNTHETIC_SHAPES))
    b.add_argument("--path-only", action="store_true", help="print where it is (or would be); write nothing")
    b.add_argument("--seed", type=_int_arg(0), default=0)
    b.set_defaults(func=cmd_bench_synthetic)
    b = bsub.add_parser("convert", help="GGUF -> bump conversion vs hashing and copying the same bytes")
    b.add_argument("file")
    b.add_argument("--repeat", type=int, default=3)
    b.add_argument("--context", type=int, help="context override (default: the model's)")
    b.add_argument("--out-dir", help="where to write (default: a temporary directory)")
    b.set_defaults(func=cmd_bench)
    b = bsub.add_parser("kernels", help="native GEMV and dequantization throughput, memory bandwidth")
    b.add_argument("--types", default=",".join(KERNEL_TYPES_HELP), help="comma-separated weight types")
    b.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    b.add_argument("--no-big", action="store_true", help="skip the 151936x896 memory-bound matrix")
    b.add_argument("--no-dequant", action="store_true", help="skip the dequantization comparison")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bench)
    return p


NO_DISPLAY_MESSAGE = ("quantscope: no display: set DISPLAY, run under xvfb-run, or use --screenshot / "
                      "quantscope inspect")


def launch_gui(argv: list[str]) -> int:
    """`quantscope [FILE] [--screenshot PNG] [--view NAME]`: the desktop app. Without a display (and no
    QT_QPA_PLATFORM) a screenshot renders offscreen; anything else exits 2 with a clear message instead of
    letting Qt abort."""
    import os

    headless = not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or os.environ.get("QT_QPA_PLATFORM"))
    wants_shot = any(a == "--screenshot" or a.startswith("--screenshot=") for a in argv)
    wants_help = any(a in ("-h", "--help") for a in argv)
    if headless and not wants_shot and not wants_help:
        print(NO_DISPLAY_MESSAGE, file=sys.stderr)
        return 2
    if os.environ.get("QT_QPA_PLATFORM") in ("offscreen", "minimal") and not wants_shot and not wants_help:
        print(f"quantscope: QT_QPA_PLATFORM={os.environ['QT_QPA_PLATFORM']} shows no window: use --screenshot PNG, "
              "or unset it to open the app", file=sys.stderr)
        return 2
    if headless:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    try:
        from quantscope.gui.app import main as gui_main
    except ImportError as exc:
        print(f"quantscope: the desktop app cannot start: {exc} (pip install -e . installs PySide6 and pyqtgraph; "
              "`quantscope inspect FILE` works without them)", file=sys.stderr)
        return 2
    try:
        return gui_main(argv)
    except catalog.FetchError as exc:
        print(f"quantscope: error: {exc}", file=sys.stderr)
        return 2


def _exit_cleanly_if_file_changes(file: str) -> None:
    """Reads of ``file``'s mapping outside the guarded kernels (numpy views) die by SIGBUS when it is truncated
    under us: make that one error line and exit status 2 instead."""
    try:
        from .native.mapped import exit_on_unguarded_fault
    except ImportError:  # no native library: commands that need it say so themselves
        return
    exit_on_unguarded_fault(f"quantscope: error: {file} changed while it was being read (its memory-mapped "
                            "bytes are gone: the file was truncated or replaced)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        return launch_gui(argv)
    if len(argv) > 1 and argv[0] == "bench" and argv[1] not in BENCH_KINDS and not argv[1].startswith("-"):
        argv = ["bench", "model", *argv[1:]]  # `quantscope bench FILE …` benchmarks a model
    elif len(argv) > 1 and argv[0] == "bench" and argv[1].startswith("--synthetic"):  # = `bench synthetic SHAPE`
        argv = ["bench", "synthetic", *argv[1].split("=", 1)[1:], *argv[2:]]
    parser = build_parser(argv[0] if argv[0] in COMMANDS else None)
    file = None
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        file = getattr(args, "file", None)
        if file:
            _exit_cleanly_if_file_changes(file)
        return int(args.func(args))
    except CLIError as exc:
        print(f"quantscope: error: {printable(exc)}", file=sys.stderr)
        return 2
    except FileChangedError as exc:  # a native kernel read a mapping the file no longer backs
        print(f"quantscope: error: {file} changed while it was being read ({exc})", file=sys.stderr)
        return 2
    except catalog.FetchError as exc:
        print(f"quantscope: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("quantscope: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the safety net: never a traceback (QUANTSCOPE_DEBUG=1 shows it)
        if os.environ.get("QUANTSCOPE_DEBUG") == "1":
            import traceback

            traceback.print_exc()
        msg = " ".join(str(exc).split())
        print(f"quantscope: error: internal error: {type(exc).__name__}: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
