"""Setting up: the test/demo models (models) and the desktop integration (desktop)."""

from __future__ import annotations

import argparse
from typing import Any

from quantscope.core import catalog
from quantscope.core.fsutil import printable

from .common import CLIError


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
    s = sub.add_parser("models", help="the demo/test models: list, fetch, path")
    s.add_argument("action", choices=("list", "fetch", "path"))
    s.add_argument("names", nargs="*", help=f"model names ({', '.join(catalog.MODELS)}); default all")
    s.add_argument("--verify", action="store_true", help="re-hash cached files")
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
