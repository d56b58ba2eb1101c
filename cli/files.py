"""Verbs on a file's structure: inspect, dump-block, convert (to bump) and verify (a bump file)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quantscope.core.fsutil import PathRefused, printable
from quantscope.core.gguf import GGUFError, GGUFFile

from .common import Bar, CLIError, check_file, default_model_path, dump_json, open_gguf


def cmd_inspect(args: argparse.Namespace) -> int:
    from quantscope.core.bump import BumpError, describe, is_bump, open_bump, render_bump
    from quantscope.core.summary import render_text, summarize

    if args.file and args.file.startswith("hf://"):
        return _inspect_remote(args)
    path = args.file or str(default_model_path())
    check_file(path)
    if is_bump(path):
        try:
            b = open_bump(path)
            d = describe(b, None if args.no_checksum else b.checksum_ok())
        except BumpError as exc:
            raise CLIError(str(exc)) from None
        if args.json:
            dump_json(d)
        else:
            print(render_bump(d))
        return 0 if d["checksum_ok"] is not False else 1
    with open_gguf(path) as f:
        s = summarize(f, max_items=args.items)
        if args.json:
            dump_json(s)
        else:
            print(render_text(f, s))
    return 0


def _peek(url: str) -> Any:
    """``hf://org/repo/file.gguf``'s header, read over range requests (core/hub.py :func:`peek`)."""
    from quantscope.core import hub
    from quantscope.core.gguf import GGUFError

    hub.quiet_client()
    try:
        repo, name = hub.parse_hf_url(url)
        return hub.peek(repo, name)
    except hub.HubError as exc:
        raise CLIError(str(exc)) from None
    except GGUFError as exc:
        raise CLIError(f"{url}: not a readable GGUF file: {exc}") from None


def _open_any(path: str) -> Any:
    """A local GGUF, or a remote one (``hf://``) whose blocks are fetched one by one as they are asked for."""
    if path.startswith("hf://"):
        return _peek(path).gguf
    return open_gguf(path)


def _inspect_remote(args: argparse.Namespace) -> int:
    """``inspect hf://org/repo/file.gguf``: the header read over range requests, the file not downloaded."""
    from quantscope.core.summary import render_text, summarize

    p = _peek(args.file)
    s = summarize(p.gguf, max_items=args.items)
    s["path"] = args.file
    s["fetched_bytes"] = p.fetched
    if args.json:
        dump_json(s)
    else:
        print(render_text(p.gguf, s))
        print(f"Fetched     {p.fetched:,} of {p.size:,} bytes (the header; nothing was downloaded)")
    return 0


def cmd_dump_block(args: argparse.Namespace) -> int:
    from quantscope.core.blockdump import block_to_json, locate_and_decode, render_block
    from quantscope.core.quant import can_decode

    with _open_any(args.file) as f:
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
        from quantscope.core.hub import HubError

        try:
            b, off = locate_and_decode(f, t.name, args.row, args.block)
        except (IndexError, HubError) as exc:  # (HubError: a remote file's block could not be fetched)
            raise CLIError(str(exc)) from None
        if args.element is not None and not 0 <= args.element < t.type.block_elems:
            raise CLIError(f"element {args.element} out of range 0..{t.type.block_elems - 1}")
        if args.json:
            dump_json(block_to_json(b, tensor=t.name, row=args.row, block=args.block, file_offset=off))
        else:
            print(render_block(b, tensor=t.name, row=args.row, block=args.block, file_offset=off,
                               element=args.element))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from quantscope.core.bump import BumpRefusal, BumpWriteError, Cancelled, CancelToken, ConvertJob, ConvertProgress

    src = Path(args.file)
    check_file(args.file)
    job = ConvertJob(src, args.output, profile=args.profile, context=args.context, config_path=args.config,
                     manifest_path=args.manifest, drop_untied_head=args.drop_untied_head,
                     labels=("-o", "--config", "--manifest"))
    try:
        job.check()  # outputs aliasing the input or each other, FIFOs, devices: refused before any work
    except PathRefused as exc:
        raise CLIError(str(exc)) from None
    bar = Bar("convert")
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


def cmd_verify(args: argparse.Namespace) -> int:
    from quantscope.core.bump import BumpError, BumpRefusal, verify_against

    check_file(args.file)
    if args.against is not None:  # a missing or non-GGUF source is refused before any hashing
        check_file(args.against)
        try:
            GGUFFile(args.against).close()
        except GGUFError as exc:
            raise CLIError(f"--against {args.against}: not a readable GGUF file: {exc}") from None
    bar = Bar("verify")
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



def register(sub: Any) -> None:
    """Add this module's sub-commands to ``sub``."""
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
    s = sub.add_parser("verify", help="check a bump file's checksum and (with --against) every section")
    s.add_argument("file")
    s.add_argument("--against", help="the GGUF file it was converted from")
    s.set_defaults(func=cmd_verify)
