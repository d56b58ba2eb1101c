"""The ``edit`` verb: change a GGUF file's metadata and write the result (docs/edit.md)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from quantscope.core.fsutil import PathRefused, printable

from .common import Bar, CLIError, check_file, dump_json, read_text_file

_OPTIONS = {"set": "--set", "set_typed": "--set-typed", "delete": "--delete", "chat_template_file":
            "--chat-template-file", "special_token": "--special-token"}


class _Edit(argparse.Action):
    """Collect every edit option into one list, in command-line order (edits apply in that order)."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, value: Any,
                 option_string: str | None = None) -> None:
        edits = list(getattr(ns, "edits", None) or [])
        edits.append((self.metavar_kind, value))
        ns.edits = edits

    def __init__(self, *args: Any, kind: str, **kwargs: Any) -> None:
        self.metavar_kind = kind
        super().__init__(*args, **kwargs)


def _pair(text: str, option: str, shape: str) -> tuple[str, str]:
    key, sep, rest = text.partition("=")
    if not sep or not key:
        raise CLIError(f"edit: {option} {printable(text)!r} is not {shape}")
    return key, rest


def _read_template(path: str) -> str:
    return read_text_file(path, "--chat-template-file")  # \r\n and \r become \n, as gguf_new_metadata.py reads it


def _op(kind: str, text: str, state: Any) -> Any:
    """The edit operation one option asks for (typed against the edits before it)."""
    from quantscope.core.base.gguf_constants import ValueType
    from quantscope.core.gguf.edit import (
        DeleteKey,
        SetChatTemplate,
        SetSpecialToken,
        SetValue,
        known_type,
        parse_type,
        parse_value,
    )

    if kind == "set":
        key, val = _pair(text, "--set", "KEY=VALUE")
        typ = state.type_of(key) or known_type(key, state.architecture) or (ValueType.STRING, None)
        return SetValue(key, parse_value(val, typ[0], typ[1], what=key))
    if kind == "set_typed":
        key, rest = _pair(text, "--set-typed", "KEY=TYPE:VALUE")
        tname, sep, val = rest.partition(":")
        if not sep:
            raise CLIError(f"edit: --set-typed {printable(text)!r} is not KEY=TYPE:VALUE (e.g. foo.bar=UINT32:7)")
        vtype, elem = parse_type(tname)
        return SetValue(key, parse_value(val, vtype, elem, what=key))
    if kind == "delete":
        return DeleteKey(text)
    if kind == "chat_template_file":
        return SetChatTemplate(_read_template(text))
    name, tok = _pair(text, "--special-token", "NAME=TOKEN")
    is_id = tok.isdecimal() and tok.isascii() and len(tok) <= 20  # longer: no id, and int() would refuse it
    token: int | str = int(tok) if is_id else tok.removeprefix("text:")
    return SetSpecialToken(name, token)


def _type_hint(kind: str, text: str, state: Any) -> str:
    """For a refused ``--set`` of a key the file holds with another type than llama.cpp reads: how to give it that
    type (``--set`` keeps the type a key has)."""
    from quantscope.core.gguf.edit import known_type, type_label

    key = text.partition("=")[0]
    have = state.type_of(key) if kind == "set" else None
    want = known_type(key, state.architecture) if have is not None else None
    if want is None or want == have:
        return ""
    return (f" (--set keeps the type {type_label(*have)} the file gives {printable(key)}; llama.cpp reads "
            f"{type_label(*want)}: --set-typed {printable(key)}={type_label(*want)}:VALUE)")


def _open(path: str) -> Any:
    """The input alone (a shard of a split model is edited as one file; the first holds the metadata)."""
    from quantscope.core.gguf import GGUFError, GGUFFile

    try:
        return GGUFFile(Path(path), strict=False, whole_set=False)
    except GGUFError as exc:
        raise CLIError(f"{path}: not a readable GGUF file: {exc}") from None


def cmd_edit(args: argparse.Namespace) -> int:
    from quantscope.core.fsutil import OutputSet
    from quantscope.core.gguf import sibling_shards
    from quantscope.core.gguf.edit import EditCancelled, EditError, EditList, plan_edit, save_edited

    check_file(args.file)
    if not args.output and not args.dry_run:
        raise CLIError("edit: the output path is missing (-o OUT.gguf, or --dry-run)")
    if args.output:
        out = Path(args.output)
        same = False
        others = [p for p in sibling_shards(args.file) if p != Path(args.file)]
        try:
            OutputSet([("-o", out)], inputs=others, replaces=[args.file])
        except PathRefused as exc:
            if "is the input file" not in str(exc):
                raise CLIError(str(exc)) from None
            raise CLIError(f"-o {printable(out)}: is another file of the split model {printable(args.file)} "
                           "belongs to; choose another output path") from None
        try:
            OutputSet([("-o", out)], inputs=[args.file])
        except PathRefused as exc:
            if "is the input file" not in str(exc):
                raise CLIError(str(exc)) from None
            same = True
            if not args.force:
                raise CLIError(f"{exc} (or pass --force to replace the input: the new file is written beside it "
                               "and renamed over it)") from None
        if not same and os.path.lexists(out) and not args.force:
            raise CLIError(f"{printable(out)} exists; pass --force to replace it")
    f = _open(args.file)
    try:
        edits = EditList(f)
        for kind, text in args.edits or []:
            try:
                edits.apply(_op(kind, text, edits.state))
            except EditError as exc:
                raise CLIError(f"{_OPTIONS[kind]} {printable(text)[:120]!s}: {exc}{_type_hint(kind, text, edits.state)}"
                               ) from None
        try:
            plan = plan_edit(f, edits)
        except EditError as exc:
            raise CLIError(f"cannot edit {printable(args.file)}: {exc}") from None
        secs = 0.0
        written = None
        if not args.dry_run:
            bar = Bar("edit")
            t0 = time.perf_counter()
            try:
                res = save_edited(f, args.output, edits, progress=bar, overwrite_source=args.force)
            except EditError as exc:
                raise CLIError(f"cannot edit {printable(args.file)}: {exc}") from None
            except PathRefused as exc:
                raise CLIError(str(exc)) from None
            except OSError as exc:
                raise CLIError(f"cannot write {printable(args.output)}: {exc.strerror or exc}") from None
            except (KeyboardInterrupt, EditCancelled):
                bar.close()
                print("quantscope: edit cancelled; nothing was written at the target path", file=sys.stderr)
                return 130
            bar.close()
            secs = time.perf_counter() - t0
            written = str(res.path)
    finally:
        f.close()
    _report(args, plan, written, secs)
    return 0


def _report(args: argparse.Namespace, plan: Any, written: str | None, secs: float) -> None:
    changes = plan.changes()
    if args.json:
        dump_json({"input": args.file, "output": written or args.output, "dry_run": bool(args.dry_run),
                   "changes": changes, "metadata_count": len(plan.entries), "tensor_count": len(plan.tensors),
                   "alignment": {"before": plan.source_alignment, "after": plan.alignment},
                   "realigned": plan.realigned, "file_bytes": plan.file_bytes, "tensor_bytes": plan.tensor_bytes,
                   "warnings": plan.warnings, "seconds": secs})
        return
    w = max((len(printable(c["key"])) for c in changes), default=0)
    for c in changes:
        line = f"{c['status']:<8} {printable(c['key'])}"
        if c["status"] != "deleted":
            old = f" (was {c['old_type']})" if c["old_type"] and c["old_type"] != c["type"] else ""
            line = f"{line:<{w + 9}}  {c['type']}{old} = {_value_text(c['value'])}"
        print(line)
    if not changes:
        print("no metadata changes")
    for warning in plan.warnings:
        print(printable(f"warning: {warning}"), file=sys.stderr)
    counts = {s: sum(1 for c in changes if c["status"] == s) for s in ("added", "changed", "deleted")}
    layout = (f"realigned from {plan.source_alignment} to {plan.alignment} bytes" if plan.realigned
              else f"alignment {plan.alignment}")
    print(f"metadata  {len(plan.entries)} keys ({counts['added']} added, {counts['changed']} changed, "
          f"{counts['deleted']} deleted)")
    print(f"tensors   {len(plan.tensors)} copied unchanged, {plan.tensor_bytes:,} bytes, {layout}")
    if written is None:
        print(f"dry run: {plan.file_bytes:,} bytes would be written" + (f" to {printable(args.output)}"
                                                                         if args.output else ""))
    else:
        print(printable(f"wrote {written} ({plan.file_bytes:,} bytes) in {secs:.2f} s"))


def _value_text(v: Any) -> str:
    if isinstance(v, dict) and "count" in v:
        more = ", …" if v["count"] > len(v["first"]) else ""
        return printable(f"[{v['count']:,} elements] " + ", ".join(repr(x) for x in v["first"]) + more)
    return printable(repr(v))


def register(sub: Any) -> None:
    """Add this module's sub-commands to ``sub``."""
    s = sub.add_parser("edit", help="change metadata (set, add, delete keys; chat template; special tokens) and "
                       "write a new GGUF; tensors are copied unchanged")
    s.add_argument("file", help="input GGUF")
    s.add_argument("-o", "--output", help="output GGUF (refused when it is the input, unless --force)")
    s.add_argument("--set", action=_Edit, kind="set", metavar="KEY=VALUE", dest="edits",
                   help="set KEY (an existing key keeps its type; a new one takes the type llama.cpp reads it "
                   "with when Quantscope knows it, else STRING); arrays as a JSON list (repeatable)")
    s.add_argument("--set-typed", action=_Edit, kind="set_typed", metavar="KEY=TYPE:VALUE", dest="edits",
                   help="set KEY with an explicit type: UINT8..INT64, FLOAT32, FLOAT64, BOOL, STRING, ARRAY[T] "
                   "(repeatable)")
    s.add_argument("--delete", action=_Edit, kind="delete", metavar="KEY", dest="edits",
                   help="delete KEY (repeatable; general.architecture cannot be deleted)")
    s.add_argument("--chat-template-file", action=_Edit, kind="chat_template_file", metavar="FILE", dest="edits",
                   help="replace the chat template(s) with this file's text (as gguf_new_metadata.py does)")
    s.add_argument("--special-token", action=_Edit, kind="special_token", metavar="NAME=TOKEN", dest="edits",
                   help="set a special token (bos, eos, eot, eom, pad, unk, sep, cls, mask, fim_*) to a token id "
                   "or a token text from the vocabulary (text:TEXT for a text made of digits; repeatable)")
    s.add_argument("--dry-run", action="store_true", help="show what would change; write nothing")
    s.add_argument("--json", action="store_true", help="print the changes and the result as JSON")
    s.add_argument("--force", action="store_true",
                   help="replace OUT if it exists, even when it is the input (through a temporary and a rename)")
    s.set_defaults(func=cmd_edit, edits=None)
