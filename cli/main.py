"""The ``quantscope`` command: a verb runs from the command line, anything else opens the desktop app.

Each verb group lives in its own module (files, quant, model, bench, install, …) with a ``register(sub)`` that adds
its sub-parsers; to run one verb only that module is imported and only that verb's parser built (start-up time).
The GUI is launched by :mod:`quantscope.gui.launch`, imported only when no verb is given.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from quantscope.core import catalog
from quantscope.core.filestate import FileChangedError
from quantscope.core.fsutil import input_scope, printable

from .common import CLIError, Parser, exit_cleanly_if_file_changes

#: every verb and the module (in this package) that registers it, in the order ``--help`` lists them
COMMANDS: dict[str, str] = {
    "inspect": "files", "dump-block": "files", "convert": "files", "verify": "files",
    "edit": "edit",
    "split": "shards", "merge": "shards",
    "quantize": "quant", "imatrix": "quant", "quant-stats": "quant", "sensitivity": "quant",
    "generate": "model", "chat": "model", "tokenize": "model", "perplexity": "model", "compare": "model",
    "models": "install", "desktop": "install",
    "bench": "bench",
    "diff": "diff",
    "export": "export",
    "probe": "probe",
    "serve": "serve",
    "embed": "embed",
    "pull": "hub", "hub": "hub", "publish": "hub",
}
BENCH_KINDS = ("open", "kernels", "convert", "model", "synthetic")
#: the options (argparse dests) that name files: any bytes are a valid Linux file name, so a non-UTF-8 name is
#: used as given; every other string argument is text and must be UTF-8 (checked once, in :func:`check_text_args`)
PATH_DESTS = frozenset({"file", "files", "other", "output", "base", "quant", "text_file", "prefix", "imatrix",
                        "tensor_type_file", "reference", "kl_divergence_base", "config", "manifest", "against",
                        "screenshot", "api_key_file", "calibration", "target_report", "npy"})


def _not_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_text_args(args: argparse.Namespace) -> None:
    """Refuse, in one line, a text argument (a prompt, a token, a pattern, an edit) that is not UTF-8: the shell
    passed bytes Python could only decode with surrogates (``tokenize``, ``generate -p``, ``probe -p``,
    ``edit --special-token`` … all go through here)."""

    def strings(value: Any) -> Any:
        if isinstance(value, str):
            yield value
        elif isinstance(value, (list, tuple)):
            if len(value) == 2 and value[0] == "chat_template_file":  # an edit naming a file
                return
            for v in value:
                yield from strings(v)

    for dest, value in vars(args).items():
        if dest in PATH_DESTS or dest == "func":
            continue
        for text in strings(value):
            if _not_utf8(text):
                shown = text.encode("utf-8", "surrogateescape" if all(
                    "\udc80" <= c <= "\udcff" for c in text if "\ud800" <= c <= "\udfff") else "backslashreplace")
                name = dest.replace("_", "-") if dest in ("text", "tensor", "type") else "--" + dest.replace("_", "-")
                raise CLIError(f"{argv_name(name)}: {ascii(shown)[2:-1][:80]} is not UTF-8 text; give it in UTF-8")


def argv_name(name: str) -> str:
    return {"--edits": "edit option", "--tensor-type": "--tensor-type", "--stop": "--stop"}.get(name, name)


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
    p = Parser(
        prog="quantscope",
        description="Explore quantized LLM files (GGUF). `quantscope FILE` opens FILE; with no arguments the "
        "default demo model is opened.",
    )
    sub = _OnlySubparsers(p.add_subparsers(dest="command"), only)
    modules = [COMMANDS[only]] if only is not None else list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        from quantscope.gui.launch import launch_gui

        return launch_gui(argv)
    if len(argv) > 1 and argv[0] == "bench" and argv[1] not in BENCH_KINDS and not argv[1].startswith("-"):
        argv = ["bench", "model", *argv[1:]]  # `quantscope bench FILE …` benchmarks a model
    elif len(argv) > 1 and argv[0] == "bench" and argv[1].startswith("--synthetic"):  # = `bench synthetic SHAPE`
        argv = ["bench", "synthetic", *argv[1].split("=", 1)[1:], *argv[2:]]
    parser = build_parser(argv[0] if argv[0] in COMMANDS else None)
    file = None
    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 is printed escaped, never a crash
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            pass
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # the verb's own help names its options (argparse would point at the top level)
            verb = f"quantscope {argv[0]}" if argv[0] in COMMANDS else "quantscope"
            raise CLIError(f"{argv[0] + ': ' if argv[0] in COMMANDS else ''}unrecognized arguments: "
                           f"{' '.join(extra)} (see {verb} --help)")
        check_text_args(args)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        file = getattr(args, "file", None)
        if file:
            exit_cleanly_if_file_changes(file)
        with input_scope():  # every file the verb reads: no writer of it may replace one
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
