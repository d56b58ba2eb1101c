"""Benchmarks: the reader, the native kernels, conversion, a model's speed and synthetic models."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from quantscope.core import catalog
from quantscope.core.fsutil import PathRefused

from .common import MAX_CTX, MAX_THREADS, Bar, CLIError, add_cache_types, add_gpu_layers, int_arg, isa, peak_rss_mb

SYNTHETIC_SHAPES = ("tiny", "1b", "3b", "8b", "moe", "moe-k4", "moe-k2", "oss", "q35")  # core.synthetic.SHAPES


def depth_list(text: str) -> list[int]:
    """An argparse type: llama-bench's ``-d``, comma-separated depths (tokens already in the cache), each 0..MAX_CTX,
    in the order given, repeats dropped."""
    conv = int_arg(0, MAX_CTX)
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of depths")
    return list(dict.fromkeys(conv(p) for p in parts))


KERNEL_TYPES_HELP = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32")


def cmd_bench(args: argparse.Namespace) -> int:
    from quantscope.core.bench import bench_kernels, bench_open, render_kernels

    if args.what == "convert":
        import tempfile

        from quantscope.core.bench import bench_convert
        from quantscope.core.bump import BumpRefusal

        src = Path(args.file)
        if not src.is_file():
            raise CLIError(f"{src}: no such file")
        with tempfile.TemporaryDirectory(dir=args.out_dir) as tmp:
            try:
                r = bench_convert(src, Path(tmp), args.repeat, args.context)
            except BumpRefusal as exc:
                raise CLIError(f"cannot convert {src.name}: {exc}") from None
        print(f"{src.name}: {r['size']:,} bytes (median of {args.repeat})")
        growth = r["peak_rss_growth_mb"]  # NaN where the peak cannot be reset (/proc/self/clear_refs: Linux only)
        print(f"  convert      {r['convert_s']:.3f} s  {r['mb_s']:.0f} MB/s  "
              f"peak RSS growth {f'{growth:.1f} MB' if growth == growth else 'unknown (Linux only)'}")
        print(f"  sha256 only  {r['hash_s']:.3f} s")
        print(f"  copy+fsync   {r['copy_s']:.3f} s")
        print(f"  convert / max(hash, copy) = {r['ratio']:.2f}")
        return 0
    if args.what == "kernels":
        types = tuple(x.strip().upper() for x in args.types.split(",") if x.strip())
        from quantscope.core.bench import EXTRA_KERNEL_TYPES

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


def cmd_bench_model(args: argparse.Namespace) -> int:
    from quantscope.core.bench import rss_bytes
    from quantscope.core.cpu import cpu_name
    from quantscope.core.engine.tools import bench_model

    from .model import load_engine

    eng = load_engine(args, max(args.depth) + max(args.n_prompt, args.n_gen) + 16)
    def say(test: str, rep: int, reps: int) -> None:  # like llama-bench --progress: what runs now, on stderr
        print(f"bench: {test} {'warm-up' if rep == 0 else f'run {rep}/{reps}'}", file=sys.stderr, flush=True)

    def session(n_ctx: int) -> Any:
        """The engine's own session when it holds n_ctx positions; else it is closed first (a CUDA session holds the
        weights on the device: one at a time), and a larger one made (past the model's trained context if a depth
        asks for it, as llama-bench does)."""
        if eng.session.n_ctx >= n_ctx:
            return eng.session
        eng.session.close()
        return eng.new_session(n_ctx)

    rows = bench_model(eng.model, args.n_prompt, args.n_gen, args.repetitions, make_session=session,
                       progress=None if args.json else say, depths=args.depth)
    peak = peak_rss_mb()
    for r in rows:
        r.update({"model": Path(args.file).name, "isa": isa(), "cpu": cpu_name(), "backend": eng.backend,
                  "type_k": eng.cache_types[0], "type_v": eng.cache_types[1],  # llama-bench's columns
                  "peak_rss_mb": peak, "rss_mb": rss_bytes() / 2**20})
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(f"CPU {cpu_name()}, KV cache {eng.cache_types[0]}/{eng.cache_types[1]}")
        print(f"{'model':<42} {'threads':>7} {'test':>15} {'t/s':>16}")
        for r in rows:
            print(f"{r['model']:<42} {r['threads']:>7} {r['test']:>15} {r['tokens_per_s']:9.2f} ± {r['stddev']:5.2f}")
        print(f"peak RSS {peak:.0f} MiB")
    return 0


def cmd_bench_synthetic(args: argparse.Namespace) -> int:
    from quantscope.core import synthetic

    if args.path_only:
        print(synthetic.synthetic_path(args.shape, args.seed))
        return 0
    bar = Bar(f"synthetic {args.shape}")
    try:
        path = synthetic.ensure_synthetic(args.shape, args.seed, lambda p: bar(p.done, p.total, p.tensor),
                                          say=lambda m: print(m, file=sys.stderr))
    except (OSError, PathRefused) as exc:
        raise CLIError(f"cannot write the synthetic {args.shape} model: {exc}") from None
    finally:
        bar.close()
    print(path)
    return 0



def register(sub: Any) -> None:
    """Add this module's sub-commands to ``sub``."""
    s = sub.add_parser("bench", help="benchmarks (figures only)")
    bsub = s.add_subparsers(dest="what", required=True)
    b = bsub.add_parser("open", help="time to read header, metadata and tensor index; RSS growth")
    b.add_argument("files", nargs="*", help="GGUF files (default: every cached catalogue model)")
    b.add_argument("--repeat", type=int, default=7)
    b.set_defaults(func=cmd_bench)
    b = bsub.add_parser("model", help="prefill/decode tokens per second of a model (like llama-bench)")
    b.add_argument("file")
    b.add_argument("-p", "--n-prompt", type=int_arg(0, MAX_CTX), default=128, help="prefill test tokens (0: none)")
    b.add_argument("-n", "--n-gen", type=int_arg(0, MAX_CTX), default=64, help="decode test tokens (0: none)")
    b.add_argument("-t", "--threads", type=int_arg(0, MAX_THREADS), default=0)
    b.add_argument("-r", "--repetitions", type=int_arg(1), default=3)
    b.add_argument("-d", "--n-depth", dest="depth", type=depth_list, default=[0], metavar="D[,D...]",
                   help="run every test after this many tokens already in the KV cache (filled by an untimed "
                   "prefill), like llama-bench -d; comma-separated for several depths (default 0)")
    b.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    add_gpu_layers(b)
    add_cache_types(b)
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
    b.add_argument("--seed", type=int_arg(0), default=0)
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
