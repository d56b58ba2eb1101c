"""Setting up: the test/demo models (models) and the desktop integration (desktop)."""

from __future__ import annotations

import argparse
from typing import Any

from quantscope.core import catalog
from quantscope.core.fsutil import printable

from .common import CLIError


def _list_local(args: argparse.Namespace) -> int:
    """Every GGUF already on this machine (core/library.py): a table, or JSON with --json."""
    import time

    from quantscope.core import library
    from quantscope.core.fsutil import json_text
    from quantscope.core.summary import human_bytes, params_text

    try:
        places = library.stores()
    except library.LibraryError as exc:
        raise CLIError(str(exc)) from None
    t0 = time.monotonic()
    rows = library.scan(places)
    took = time.monotonic() - t0
    if args.json:
        print(json_text({"stores": [{"kind": s.kind, "label": s.label, "root": str(s.root)} for s in places],
                         "models": [e.to_json() for e in rows]}))
        return 0
    if rows:
        width = min(60, max(len(printable(e.name)) for e in rows))
        print(f"{'name':<{width}}  {'source':<10} {'architecture':<13} {'params':>7} {'type':<14} {'size':>10}  shards")
    for e in rows:
        name = printable(e.name)
        name = name if len(name) <= width else "…" + name[-(width - 1):]
        if e.problem and e.architecture is None:
            print(f"{name:<{width}}  {e.source:<10} unreadable: {printable(e.problem)}")
            continue
        print(f"{name:<{width}}  {e.source:<10} {printable(e.architecture or '-'):<13} {params_text(e.parameters):>7} "
              f"{printable(e.file_type or '-'):<14} {human_bytes(e.size):>10}  {e.shards}"
              + (f"  ! {printable(e.problem)}" if e.problem else ""))
    where = ", ".join(f"{s.label} ({printable(s.root)})" for s in places) or "none of the usual places exists"
    print(f"{len(rows)} model{'s' * (len(rows) != 1)} in {where}; scanned in {took:.2f} s")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    if args.action in ("add-folder", "remove-folder"):
        from quantscope.core import library

        if len(args.names) != 1:
            raise CLIError(f"models {args.action} takes one folder")
        try:
            if args.action == "add-folder":
                print(f"added {printable(library.add_folder(args.names[0]))} to the library's folders")
            elif library.remove_folder(args.names[0]):
                print(f"removed {printable(args.names[0])} from the library's folders")
            else:
                raise CLIError(f"{args.names[0]} is not one of the library's folders")
        except (library.LibraryError, OSError) as exc:
            raise CLIError(str(exc)) from None
        return 0
    if args.action == "list" and (args.local or args.json):
        return _list_local(args)
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


def cmd_desktop(args: argparse.Namespace) -> int:
    from quantscope.core import desktop

    target = args.os or desktop.host_os()
    try:
        if target != desktop.host_os() and not args.dry_run:
            raise desktop.DesktopError(f"--os {target}: this system is {desktop.host_os()}; another system's plan "
                                       "is only shown, with --dry-run")
        if args.dry_run:
            if args.action == "uninstall":
                raise desktop.DesktopError("--dry-run shows what install would write (uninstall removes only that)")
            rep = desktop.plan(target, args.prefix)
        else:
            rep = desktop.install(args.prefix) if args.action == "install" else desktop.uninstall(args.prefix)
    except desktop.DesktopError as exc:
        raise CLIError(str(exc)) from None
    where = printable(rep.data_dir)
    if args.dry_run:
        print(f"Would install the desktop integration for {target} under {where}, starting: "
              f"{printable(' '.join(rep.command))} (nothing written)")
    elif args.action == "install":
        what = {"macos": "the app bundle (document type .gguf)", "windows": "the .gguf file association (icon in)"}
        print(f"Installed {what.get(target, f'the desktop entry, icons and {desktop.MIME_TYPE} under')} {where}, "
              f"starting: {printable(' '.join(rep.command))}")
    else:
        print(f"Removed the desktop integration under {where}" if rep.removed
              else f"Nothing of quantscope's desktop integration was found under {where}")
    for rel in rep.written or rep.removed:
        print(f"  {printable(rel)}")
    for line in rep.kept + rep.tools:
        print(f"  {printable(line)}")
    return 0


def register(sub: Any) -> None:
    """Add this module's sub-commands to ``sub``."""
    s = sub.add_parser("models", help="the models on this machine (list --local: every GGUF in the Hugging Face "
                       "cache, LM Studio, Ollama, llama.cpp's cache, GPT4All and the folders you add with "
                       "add-folder) and the demo/test models (list, fetch, path)")
    s.add_argument("action", choices=("list", "fetch", "path", "add-folder", "remove-folder"))
    s.add_argument("names", nargs="*", help=f"model names ({', '.join(catalog.MODELS)}; default all), or the folder "
                   "to add or remove")
    s.add_argument("--verify", action="store_true", help="re-hash cached files")
    s.add_argument("--local", action="store_true", help="list: every GGUF already on this machine, read from its "
                   "header only (rescans read only new or changed files)")
    s.add_argument("--json", action="store_true", help="list --local as JSON")
    s.set_defaults(func=cmd_models)
    s = sub.add_parser("desktop", help="add quantscope to this user's application menu, with its icon and the GGUF "
                       "file type (install), or take it out again (uninstall): an XDG menu entry and MIME type on "
                       "Linux, ~/Applications/Quantscope.app on macOS, the .gguf association under HKCU and a "
                       "Start-menu shortcut on Windows")
    s.add_argument("action", choices=("install", "uninstall"))
    s.add_argument("--prefix", help="Linux: use DIR/share instead of $XDG_DATA_HOME (default ~/.local/share); "
                   "macOS: DIR/Applications instead of ~/Applications", metavar="DIR")
    s.add_argument("--dry-run", action="store_true", help="print what install would write, write nothing")
    s.add_argument("--os", choices=("linux", "macos", "windows"),
                   help="with --dry-run: show another system's plan (default: this system)")
    s.set_defaults(func=cmd_desktop)
