"""Split models: ``split`` (a GGUF into shards) and ``merge`` (shards into one GGUF), like llama-gguf-split."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from quantscope.core.fsutil import PathRefused, printable
from quantscope.core.gguf import GGUFError, ShardError

from .common import Bar, CLIError, check_file, int_arg


def _size_arg(text: str) -> int:
    from quantscope.core.gguf.split import SplitError, parse_size

    try:
        return parse_size(text)
    except SplitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run(args: argparse.Namespace, what: str, job: Any) -> int:
    """Run ``job(progress, cancel)`` (a split or merge), turning every failure into one error line."""
    from quantscope.core.gguf.split import SplitError
    from quantscope.core.jobs import Cancelled

    bar = Bar(what)
    try:
        plan = job(None if args.dry_run else bar)
    except (KeyboardInterrupt, Cancelled):
        bar.close()
        print(f"quantscope: {what} cancelled; nothing was written", file=sys.stderr)
        return 130
    except (ShardError, SplitError, PathRefused) as exc:
        bar.close()
        raise CLIError(str(exc)) from None
    except GGUFError as exc:
        bar.close()
        raise CLIError(f"{args.file}: not a readable GGUF file: {exc}") from None
    except OSError as exc:
        bar.close()
        raise CLIError(f"{what}: {exc.strerror or exc} ({exc.filename or ''}); nothing was written") from None
    if not args.dry_run:
        bar.close()
    if what == "split":
        for line in plan.report():  # llama-gguf-split's plan lines
            print(line)
    for s in plan.shards:
        verb = "would write" if args.dry_run else "wrote"
        print(printable(f"{verb} {s.path} ({s.size:,} bytes, {len(s.tensors)} tensors)"))
    return 0


def cmd_split(args: argparse.Namespace) -> int:
    from quantscope.core.gguf.split import split_gguf

    check_file(args.file)
    return _run(args, "split", lambda progress: split_gguf(
        args.file, args.prefix, max_tensors=args.split_max_tensors, max_size=args.split_max_size,
        no_tensor_first_split=args.no_tensor_first_split, dry_run=args.dry_run, progress=progress))


def cmd_merge(args: argparse.Namespace) -> int:
    from quantscope.core.gguf.split import merge_gguf

    check_file(args.file)
    return _run(args, "merge", lambda progress: merge_gguf(args.file, args.output, dry_run=args.dry_run,
                                                           progress=progress))


def register(sub: Any) -> None:
    """Add this module's sub-commands to ``sub``."""
    s = sub.add_parser("split", help="split a GGUF model into shards PREFIX-00001-of-0000N.gguf … (byte for byte "
                       "like llama-gguf-split --split)")
    s.add_argument("file", metavar="IN", help="GGUF file (or any shard of a split model: it is re-split)")
    s.add_argument("prefix", metavar="OUT_PREFIX", help="output name before -00001-of-0000N.gguf")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--split-max-tensors", type=int_arg(1, (1 << 31) - 1), metavar="N",
                   help="at most N tensors per shard")
    g.add_argument("--split-max-size", type=_size_arg, metavar="N(M|G)",
                   help="at most this many bytes of tensors per shard: 500M = 500,000,000, 2G = 2,000,000,000")
    s.add_argument("--no-tensor-first-split", action="store_true",
                   help="put only the metadata in the first shard")
    s.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    s.set_defaults(func=cmd_split)
    s = sub.add_parser("merge", help="merge a split model's shards into one GGUF (byte for byte like "
                       "llama-gguf-split --merge)")
    s.add_argument("file", metavar="SHARD", help="any shard of the split model (usually the first)")
    s.add_argument("output", metavar="OUT", help="the merged GGUF file")
    s.add_argument("--dry-run", action="store_true", help="print what would be written, write nothing")
    s.set_defaults(func=cmd_merge)
