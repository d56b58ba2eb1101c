"""``quantscope export``: a tensor as .npy (dequantized float32 or raw), a decoded block as CSV/JSON, the metadata
as JSON. Every output is written through a temporary and renamed into place."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from quantscope.core.fsutil import PathRefused, printable

from .common import MAX_THREADS, Bar, CLIError, int_arg, open_gguf


def _row_block(text: str) -> tuple[int, int]:
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        row, block = int(parts[0]), int(parts[1])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not ROW:BLOCK (two integers, e.g. 0:3)") from None
    if row < 0 or block < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the row and the block are counted from 0")
    return row, block


def _tensor_or_error(f: Any, name: str, path: str) -> Any:
    try:
        return f.tensor(name)
    except KeyError:
        near = [n for n in (x.name for x in f.tensors) if name.split(".")[-2:] == n.split(".")[-2:]][:5]
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise CLIError(f"no tensor named {name!r} in {path}{hint}") from None


def cmd_export(args: argparse.Namespace) -> int:
    from quantscope.core import export

    if args.metadata and args.tensor is not None:
        raise CLIError("export: --metadata writes the whole metadata; leave out TENSOR")
    if not args.metadata and args.tensor is None:
        raise CLIError("export: give a TENSOR to export (or --metadata)")
    if args.raw and (args.metadata or args.block is not None):
        raise CLIError("export: --raw applies to a tensor's .npy only")
    if args.format and args.block is None:
        raise CLIError("export: --format applies to --block only")
    if args.block is not None:
        try:
            export.block_format(args.output, args.format)
        except ValueError as exc:
            raise CLIError(f"-o {exc}") from None
    with open_gguf(args.file) as f:
        try:
            if args.metadata:
                path = export.export_metadata(f, args.output, label="-o")
                print(printable(f"wrote {path}: {len(f.metadata):,} metadata entries and {len(f.tensors):,} tensors"))
                return 0
            t = _tensor_or_error(f, args.tensor, args.file)
            if args.block is not None:
                row, block = args.block
                path = export.export_block(f, t, row, block, args.output, fmt=args.format, label="-o")
                print(printable(f"wrote {path}: {t.name} row {row} block {block} ({t.type_name})"))
                return 0
            bar = Bar("export")
            try:
                res = export.export_tensor_npy(f, t, args.output, raw=args.raw, threads=args.threads,
                                               progress=lambda d, n: bar(d, n), label="-o")
            finally:
                bar.close()
        except PathRefused as exc:
            raise CLIError(str(exc)) from None
        except (ValueError, IndexError) as exc:
            raise CLIError(str(exc)) from None
        except OSError as exc:
            raise CLIError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    what = "raw bytes" if args.raw and res.dtype == "|u1" else res.dtype
    print(printable(f"wrote {res.path}: {t.name} as {what} {list(res.shape)} ({res.data_bytes:,} bytes of data)"),
          file=sys.stdout)
    return 0


def register(sub: Any) -> None:
    """Add ``export`` to ``sub``."""
    s = sub.add_parser(
        "export", help="write a tensor as .npy (dequantized float32, or --raw), one decoded block as CSV/JSON "
        "(--block ROW:BLOCK), or the metadata as JSON (--metadata)",
        description="quantscope export FILE TENSOR -o x.npy [--raw] | quantscope export FILE TENSOR --block "
        "ROW:BLOCK -o b.csv|b.json | quantscope export FILE --metadata -o m.json")
    s.add_argument("file", help="GGUF file")
    s.add_argument("tensor", nargs="?", help="tensor name (not with --metadata)")
    s.add_argument("-o", "--output", required=True, help="output path (.npy, .csv or .json); written through a "
                   "temporary, never over the input")
    s.add_argument("--raw", action="store_true", help="the stored data instead of float32: a block type's bytes "
                   "as uint8 (rows, bytes per row), an element type in its own dtype (BF16 as uint16)")
    s.add_argument("--block", type=_row_block, metavar="ROW:BLOCK", help="decode this block (row flattened over "
                   "ne[1:], block within the row) and write its fields and values (CSV or JSON by the -o suffix)")
    s.add_argument("--format", choices=("csv", "json"), help="--block's format when -o has no .csv/.json suffix")
    s.add_argument("--metadata", action="store_true", help="write every metadata entry (arrays in full) and the "
                   "tensor index as JSON")
    s.add_argument("-t", "--threads", type=int_arg(0, MAX_THREADS), default=0,
                   help="dequantization threads (default 0: all cores)")
    s.set_defaults(func=cmd_export)
