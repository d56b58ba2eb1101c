"""Verbs on the Hugging Face hub: pull (download a quantization into the Hugging Face cache), hub search, hub files.
``inspect hf://org/repo/file.gguf`` (cli/files.py) peeks at a remote header through core/hub.py as well."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quantscope.core import hub
from quantscope.core.fsutil import printable

from .common import MAX_CTX, Bar, CLIError, dump_json, int_arg


def _size(n: int | None) -> str:
    from quantscope.core.summary import human_bytes

    return "?" if n is None else human_bytes(n)


def _run(fn: Any, *a: Any, **k: Any) -> Any:
    hub.quiet_client()
    try:
        return fn(*a, **k)
    except hub.HubError as exc:
        raise CLIError(str(exc)) from None


def _sets(repo: str) -> list[hub.QuantSet]:
    files = hub.cached_files(repo) if hub.offline() else hub.repo_files(repo)
    if hub.offline() and not files:
        raise hub.HubError(f"{repo}: HF_HUB_OFFLINE is set and nothing of it is in the cache")
    return hub.gguf_sets(files)


def cmd_pull(args: argparse.Namespace) -> int:
    repo, quant = _run(hub.parse_repo_ref, args.ref)
    qset = _run(lambda: hub.select(_sets(repo), quant, repo))
    what = f"{repo}: {qset.name}" + (f" ({qset.shards} shards)" if qset.shards > 1 else "")
    print(f"{what}, {_size(qset.size)}", file=sys.stderr)
    bars: dict[str, Bar] = {}

    def progress(name: str, done: int, total: int) -> None:
        bar = bars.get(name)
        if bar is None:
            bar = bars[name] = Bar(f"download {Path(name).name}")
        bar(done, total)

    def verify(name: str, done: int, total: int) -> None:
        key = "sha256 " + name
        bar = bars.get(key)
        if bar is None:
            bar = bars[key] = Bar(f"verify {Path(name).name}")
        bar(done, total)

    try:
        paths = _run(hub.download, repo, qset, progress, verify)
    finally:
        for b in bars.values():
            b.close()
    for p in paths:
        print(printable(str(p)))
    return 0


def cmd_hub(args: argparse.Namespace) -> int:
    if args.action == "search":
        return _search(args)
    return _files(args)


def _search(args: argparse.Namespace) -> int:
    hits = _run(hub.search, " ".join(args.text), args.sort, args.limit)
    if args.json:
        dump_json([h.__dict__ for h in hits])
        return 0
    if not hits:
        print("no GGUF repositories found")
        return 0
    w = max(len(h.id) for h in hits)
    print(f"{'REPOSITORY':<{w}}  {'DOWNLOADS':>10}  {'LIKES':>6}  UPDATED")
    for h in hits:
        gated = "  (gated)" if h.gated else ""
        print(printable(f"{h.id:<{w}}  {h.downloads or 0:>10,}  {h.likes or 0:>6,}  "
                        f"{(h.last_modified or '')[:10]}{gated}"))
    return 0


def _kv(repo: str, sets: list[hub.QuantSet], ctx: int) -> tuple[int | None, str]:
    """The KV cache (and recurrent state) for ``ctx`` tokens, from the header of the smallest model's first file
    (every quantization of a repository shares the hyperparameters)."""
    from quantscope.core.gguf import GGUFError
    from quantscope.core.model.memory import memory_plan

    ok = [s for s in sets if not s.problem]
    if not ok or hub.offline():
        return None, "KV cache unknown"
    try:
        p = hub.peek(repo, ok[0].files[0].path)
        plan = memory_plan(p.gguf, min(ctx, MAX_CTX))
    except (hub.HubError, GGUFError, ValueError) as exc:
        return None, f"KV cache unknown ({' '.join(str(exc).split())[:120]})"
    kv = plan.kv_bytes + plan.state_bytes
    return kv, f"KV cache {_size(kv)} at context {ctx:,}"


def _gpu_free() -> tuple[str, int] | None:
    """The CUDA device's name and free memory now, or None without one (or without the CUDA backend)."""
    try:
        from quantscope.core.engine import cuda_library as cl

        props = cl.device_properties()
    except Exception:  # no backend, no driver, no device: the table shows RAM only
        return None
    return str(props["name"]), int(props["free_mem"])


def _files(args: argparse.Namespace) -> int:
    from quantscope.core.sysinfo import memory_available, memory_total

    if not args.text or len(args.text) != 1:
        raise CLIError("hub files: give one repository (org/repo)")
    repo, _ = _run(hub.parse_repo_ref, args.text[0])
    sets = _run(_sets, repo)
    kv, kv_text = _run(_kv, repo, sets, args.ctx)
    room = memory_available() or memory_total()
    gpu = _gpu_free()
    rows = []
    for s in sets:
        need = s.size + (kv or 0)
        rows.append({"quant": s.quant, "name": s.name, "size": s.size, "shards": s.shards,
                     "files": [f.path for f in s.files], "needs": need, "fits": hub.fit_text(need, room),
                     "fits_gpu": hub.fit_text(need, gpu[1]) if gpu else None, "problem": s.problem})
    if args.json:
        dump_json({"repo": repo, "context": args.ctx, "kv_bytes": kv, "memory_available": room,
                   "gpu": {"name": gpu[0], "free": gpu[1]} if gpu else None, "models": rows})
        return 0
    if not rows:
        print(f"{repo} has no GGUF files")
        return 0
    gpu_text = f"; {gpu[0]}: {_size(gpu[1])} free" if gpu else ""
    print(printable(f"{repo}: {len(rows)} GGUF model{'s' * (len(rows) != 1)}; {kv_text}; "
                    f"memory available {_size(room)}{gpu_text}"))
    print(f"  {'QUANT':<12} {'SIZE':>10} {'SHARDS':>6}  {'RAM':<9}  " + ("GPU        " if gpu else "") + "FILE")
    for r in rows:
        note = f"  ({r['problem']})" if r["problem"] else ""
        on_gpu = f"{r['fits_gpu']:<9}  " if gpu else ""
        print(printable(f"  {r['quant'] or '-':<12} {_size(r['size']):>10} {r['shards']:>6}  {r['fits']:<9}  "
                        f"{on_gpu}{r['name']}{note}"))
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from quantscope.core import publish as pub

    from .common import check_file, open_gguf, read_text_file

    repo, tag = _run(hub.parse_repo_ref, args.repo)
    if tag is not None:
        raise CLIError(f"publish: give the repository as org/repo, not {args.repo!r}")
    with open_gguf(args.file) as f:
        files = [Path(p) for p in f.paths] if f.is_split else [Path(args.file)]
        rules = read_text_file(args.tensor_type_file, "--tensor-type-file") if args.tensor_type_file else None
        if args.calibration:
            check_file(args.calibration)
        target = None
        if args.target_report:
            try:
                target = pub.target_summary(read_text_file(args.target_report, "--target-report"))
            except pub.PublishError as exc:
                raise CLIError(f"--target-report {args.target_report}: {exc}") from None
        inputs = pub.CardInputs(base_model=args.base_model, quantized_by=args.quantized_by,
                                calibration=Path(args.calibration) if args.calibration else None, rules=rules,
                                target=target)
        card = pub.model_card(f, repo, [p.name for p in files], inputs)
    if args.dry_run:
        print(card)
        print(printable(f"(dry run: would upload {', '.join(p.name for p in files)} and this README.md to {repo})"),
              file=sys.stderr)
        return 0
    url = _run(pub.publish, repo, files, card, private=args.private,
               progress=lambda m: print(printable(m), file=sys.stderr))
    print(printable(url))
    return 0


def register(sub: Any) -> None:
    """Add this module's sub-commands to ``sub``."""
    s = sub.add_parser("pull", help="download a GGUF from the Hugging Face hub into its cache (org/repo:QUANT; "
                       "every shard of a split set; resumes a cut connection, checks SHA-256; HF_TOKEN or a saved "
                       "token for gated repos; HF_HUB_OFFLINE=1 uses the cache)")
    s.add_argument("ref", help="org/repo or org/repo:QUANT (Q4_K_M, Q8_0, … case-insensitive)")
    s.set_defaults(func=cmd_pull)
    s = sub.add_parser("hub", help="the Hugging Face hub: search GGUF repositories, or a repository's GGUF files "
                       "by quantization with sizes, shards and whether each fits this machine")
    s.add_argument("action", choices=("search", "files"))
    s.add_argument("text", nargs="*", help="search: words of the name; files: org/repo")
    s.add_argument("--sort", choices=tuple(hub.SORTS), default="downloads", help="search order (default downloads)")
    s.add_argument("--limit", type=int_arg(1, 1000), default=20, help="search: at most this many (default 20)")
    s.add_argument("-c", "--ctx", type=int_arg(1, MAX_CTX), default=4096,
                   help="files: the context the memory estimate allows for (default 4096)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_hub)
    s = sub.add_parser("publish", help="upload a quantized GGUF (every shard of a set) to org/repo on the hub with a "
                       "model card written from its header (base model, architecture, parameters, tensor types, "
                       "imatrix, rules); --dry-run prints the card")
    s.add_argument("file", help="the GGUF (or any shard of a set)")
    s.add_argument("repo", help="org/repo (created if missing; needs a token with write access)")
    s.add_argument("--base-model", help="the base model's hub id (default: the header's general.base_model.*)")
    s.add_argument("--quantized-by", default="quantscope", help="the card's quantized_by (default quantscope)")
    s.add_argument("--calibration", help="the calibration text the imatrix was made from (named, sized, hashed)")
    s.add_argument("--tensor-type-file", help="the --tensor-type rule file used, shown in the card")
    s.add_argument("--target-report", help="the JSON `quantscope quantize --target-size … --json` printed: its "
                   "predicted and measured KLD in the card")
    s.add_argument("--private", action="store_true", help="create the repository private")
    s.add_argument("--dry-run", action="store_true", help="print the card and what would be uploaded; upload nothing")
    s.set_defaults(func=cmd_publish)
