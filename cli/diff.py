"""``quantscope diff A B``: what changed between two GGUF files (metadata, tensor table, tensor values).

Exit status like diff(1): 0 when no difference was found, 1 when the files differ, 2 on an error.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from quantscope.core.filestate import FileChangedError
from quantscope.core.fsutil import printable

from .common import MAX_THREADS, Bar, CLIError, dump_json, exit_cleanly_if_file_changes, int_arg, open_gguf

EXIT_HELP = "exit status: 0 when no difference was found, 1 when the files differ, 2 on an error (like diff(1))"


def _regex(text: str) -> Any:
    from quantscope.core.userregex import PatternTooLarge, UserPattern

    try:
        return UserPattern(text, "--tensor")  # searched within a time budget
    except PatternTooLarge as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except ValueError:
        import re

        try:
            re.compile(text)
        except re.error as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {exc}") from None
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression") from None


def cmd_diff(args: argparse.Namespace) -> int:
    from quantscope.core.gguf.diff import diff_files
    from quantscope.core.userregex import RegexTimeout

    exit_cleanly_if_file_changes(f"{args.file} or {args.other}")
    with open_gguf(args.file) as a, open_gguf(args.other) as b:
        bar = Bar("diff")
        try:
            d = diff_files(a, b, values=not args.no_values, tensor=args.tensor, max_rows=args.max_rows,
                           threads=args.threads, progress=lambda done, total: bar(done, total))
        except FileChangedError as exc:
            raise CLIError(f"{args.file} or {args.other} changed while it was being read ({exc})") from None
        except RegexTimeout as exc:
            raise CLIError(str(exc)) from None
        finally:
            bar.close()
    if args.json:
        dump_json(d.to_dict())
    else:
        sys.stdout.write(render_diff(d))
    return 0 if d.identical else 1


# ------------------------------------------------------------------------------------------------ text
def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def _val(v: Any) -> str:
    """A preview as one line: strings quoted, arrays as ``[TYPE × n] a, b, …``."""
    if isinstance(v, dict) and "count" in v and "head" in v:
        more = ", …" if v["count"] > len(v["head"]) else ""
        return f"[{v['type']} × {v['count']:,}] " + ", ".join(_val(x) for x in v["head"]) + more
    if isinstance(v, dict) and "count" in v:
        return f"[× {v['count']:,}]"
    if isinstance(v, float):
        return f"{v:.9g}"
    if v is None:
        return "(none)"
    return repr(v)


def _shape(s: tuple[int, ...] | None) -> str:
    return "[" + ", ".join(str(x) for x in (s or ())) + "]"


def _meta_line(m: Any) -> str:
    if m.kind == "added":
        return f"  + {m.key}  {m.type_b}: {_val(m.value_b)}"
    if m.kind == "removed":
        return f"  - {m.key}  {m.type_a}: {_val(m.value_a)}"
    if m.kind == "type":
        return f"  ~ {m.key}  type {m.type_a} -> {m.type_b}: {_val(m.value_a)} -> {_val(m.value_b)}"
    if m.count_a is not None:  # an array
        n = f"{m.count_a:,}" if m.count_a == m.count_b else f"{m.count_a:,} -> {m.count_b:,}"
        at_a, at_b = ("(end)" if x is None else _val(x) for x in (m.at_a, m.at_b))
        return (f"  ~ {m.key}  {m.type_a} × {n}: first difference at [{m.first_diff:,}]: {at_a} -> {at_b} "
                f"(digests {m.digest_a[:12]}… / {m.digest_b[:12]}…)")
    if m.first_diff is not None and max(len(m.value_a), len(m.value_b)) > 60:  # a long string
        return (f"  ~ {m.key}  {m.type_a}: first difference at character {m.first_diff:,}: {_val(m.at_a)} -> "
                f"{_val(m.at_b)}")
    return f"  ~ {m.key}  {m.type_a}: {_val(m.value_a)} -> {_val(m.value_b)}"


def _fig(x: float, fmt: str = ".4g") -> str:
    return "nan" if math.isnan(x) else ("inf" if math.isinf(x) else format(x, fmt))


def render_diff(d: Any) -> str:
    """The text report: both files, then sections Metadata, Tensors, Values (by relative error, largest first)."""
    out: list[str] = []
    for tag, s in (("A", d.a), ("B", d.b)):
        out.append(f"{tag}  {s.path}  GGUF v{s.version}, {s.n_tensors:,} tensors, {s.n_metadata:,} metadata keys, "
                   f"{_size(s.file_size)}")
    scope = []
    if d.tensor_filter is not None:
        scope.append(f"tensors matching {d.tensor_filter!r}")
    if not d.values_compared:
        scope.append("headers only (--no-values: tensor data not read)")
    elif d.max_rows is not None:
        scope.append(f"value figures on at most {d.max_rows:,} rows per tensor")
    if scope:
        out.append("compared: " + "; ".join(scope))
    c = d.counts()

    out.append("")
    kinds = [(c.get("metadata_value", 0), "changed value"), (c.get("metadata_type", 0), "changed type"),
             (c.get("metadata_added", 0), "added"), (c.get("metadata_removed", 0), "removed")]
    parts = [f"{n} {what}" for n, what in kinds if n]
    out.append(f"Metadata: {', '.join(parts) if parts else 'no differences'}; {d.metadata_same:,} the same")
    out.extend(_meta_line(m) for m in d.metadata)

    out.append("")
    parts = [f"{n} {what}" for n, what in (
        (c.get("tensors_added", 0), "added"), (c.get("tensors_removed", 0), "removed"),
        (c["tensors_reshaped"], "reshaped"), (c["tensors_retyped"], "retyped"),
        (c["tensors_values_differ"], "with different values"), (c["tensors_exact"], "bit-identical"),
        (c.get("tensors_unchecked", 0), "not compared")) if n]
    out.append(f"Tensors: {', '.join(parts) if parts else 'none'}")
    for t in d.tensors:
        if t.status == "added":
            out.append(f"  + {t.name}  {t.type_b} {_shape(t.shape_b)}")
        elif t.status == "removed":
            out.append(f"  - {t.name}  {t.type_a} {_shape(t.shape_a)}")
        elif t.reshaped:
            out.append(f"  ~ {t.name}  {t.type_a} {_shape(t.shape_a)} -> {t.type_b} {_shape(t.shape_b)}")
        elif t.note and t.values is None:
            kind = f"{t.type_a} -> {t.type_b}" if t.retyped else t.type_a
            out.append(f"  ? {t.name}  {kind} {_shape(t.shape_a)}: {t.note}")
        elif t.retyped and t.values is None:
            out.append(f"  ~ {t.name}  {t.type_a} -> {t.type_b} {_shape(t.shape_a)}")

    rows = [t for t in d.tensors if t.values is not None and not t.values.exact]
    if rows:
        def key(t: Any) -> float:
            r = t.values.rel_error
            return -math.inf if math.isnan(r) else -r

        rows.sort(key=key)
        w = max(6, *(len(t.name) for t in rows))
        tw = max(4, *(len(f"{t.type_a} -> {t.type_b}" if t.retyped else t.type_a) for t in rows))
        out.append("")
        out.append("Values, by relative error (RMSE / RMS of A), largest first:")
        out.append(f"  {'tensor':<{w}}  {'type':<{tw}}  {'rel.err':>10}  {'RMSE':>10}  {'max|Δ|':>10}  "
                   f"{'at (row, col)':>14}  {'cosine':>10}")
        for t in rows:
            v = t.values
            ty = f"{t.type_a} -> {t.type_b}" if t.retyped else t.type_a
            at = f"({v.max_abs_at[0]}, {v.max_abs_at[1]})" if v.max_abs_at else "-"
            extra = []
            if v.sampled:
                extra.append(f"{v.rows_compared:,} of {v.rows_total:,} rows")
            if v.nonfinite_a or v.nonfinite_b:
                extra.append(f"non-finite values left out: {v.nonfinite_a:,} in A, {v.nonfinite_b:,} in B")
            out.append(f"  {t.name:<{w}}  {ty:<{tw}}  {_fig(v.rel_error):>10}  {_fig(v.rmse):>10}  "
                       f"{_fig(v.max_abs):>10}  {at:>14}  {_fig(v.cosine, '.6f'):>10}"
                       + (f"  ({'; '.join(extra)})" if extra else ""))
    elif d.values_compared and c["tensors_exact"]:
        out.append("")
        out.append("Values: every tensor compared is bit-identical")

    out.append("")
    out.append("Result: no differences" + (" in the headers" if not d.values_compared else "")
               if d.identical else "Result: the files differ")
    return "\n".join(printable(line) for line in out) + "\n"


def register(sub: Any) -> None:
    """Add ``diff`` to ``sub``."""
    s = sub.add_parser(
        "diff", help="compare two GGUF files: metadata keys, tensors added/removed/retyped/reshaped, and the values "
        "of tensors in both (RMSE, max |Δ|, cosine, relative error; bit-identical ones found by their bytes)",
        description="Compare B with A (the reference).", epilog=EXIT_HELP)
    s.add_argument("file", metavar="A", help="the reference GGUF")
    s.add_argument("other", metavar="B", help="the GGUF compared with it")
    s.add_argument("--json", action="store_true", help="print strict JSON (NaN and infinities as the strings "
                   "\"nan\", \"inf\", \"-inf\")")
    s.add_argument("--tensor", type=_regex, metavar="REGEX", help="only the tensors whose name this regular "
                   "expression finds (metadata is always compared)")
    s.add_argument("--max-rows", type=int_arg(1), metavar="N", help="compute the value figures on at most N evenly "
                   "spaced rows per tensor (the bit-identical check still reads every byte)")
    s.add_argument("--no-values", action="store_true", help="compare the headers only (metadata and tensor "
                   "table); tensor data is not read")
    s.add_argument("-t", "--threads", type=int_arg(0, MAX_THREADS), default=0,
                   help="dequantization threads (default 0: all cores)")
    s.set_defaults(func=cmd_diff)
