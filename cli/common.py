"""What every verb module shares: the one-line error, argument types, opening a file, JSON output, progress."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from quantscope.core import catalog
from quantscope.core.fsutil import PathRefused, check_input, json_text, read_text_input
from quantscope.core.gguf import GGUFError, GGUFFile


class CLIError(Exception):
    """A user-facing error: printed as one message, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``quantscope: error: …``, exit 2), not usage + message."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        where = self.prog.removeprefix("quantscope").strip()  # the sub-command, if any (the line already names us)
        raise CLIError(f"{where + ': ' if where else ''}{message} (see {self.prog} --help)")


def int_arg(lo: int, hi: int | None = None, what: str = "") -> Any:
    """An argparse type: an integer in ``lo..hi``."""

    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo or (hi is not None and v > hi):
            rng = f"{lo}..{hi:,}" if hi is not None else f"at least {lo}"
            raise argparse.ArgumentTypeError(f"{v} is out of range ({rng}{what})")
        return v

    return conv


def float_arg(lo: float, hi: float | None = None, lo_open: bool = False) -> Any:
    """An argparse type: a finite number in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``)."""

    def conv(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if v < lo or (lo_open and v == lo) or (hi is not None and v > hi):
            rng = f"{'(' if lo_open else '['}{lo:g}, {'inf' if hi is None else f'{hi:g}'}]"
            raise argparse.ArgumentTypeError(f"{v:g} is out of range {rng}")
        return v

    return conv


#: the largest context the command line accepts (the model's trained context bounds it further)
MAX_CTX = 1 << 24


MAX_THREADS = 1024


def check_file(path: str) -> None:
    """Refuse a missing path, a directory, FIFO, device or socket before anything opens it."""
    try:
        check_input(path)
    except PathRefused as exc:
        raise CLIError(str(exc)) from None


def read_text_file(path: str, label: str = "") -> str:
    """A text file a verb reads whole (``-f``, rule files, templates): a regular file, bounded in size, UTF-8;
    anything else is one CLIError line."""
    try:
        return read_text_input(path, label)
    except PathRefused as exc:
        raise CLIError(str(exc)) from None


def open_gguf(path: str) -> GGUFFile:
    check_file(path)
    try:
        return GGUFFile(Path(path), strict=False)
    except GGUFError as exc:
        raise CLIError(f"{path}: not a readable GGUF file: {exc}") from None


def dump_json(obj: Any) -> None:
    """Strict JSON on stdout: NaN and infinities are written as the strings "nan", "inf", "-inf"."""
    sys.stdout.write(json_text(obj) + "\n")


def default_model_path() -> Path:
    name = catalog.DEFAULT_MODEL
    if not catalog.is_present(name):
        print(f"Default model {name!r} is not cached yet; fetching it (once).", file=sys.stderr)
        catalog.fetch(name, progress=lambda m: print(m, file=sys.stderr))
    return catalog.model_path(name)


class Bar:
    """Progress on stderr: a redrawn bar on a terminal, a line every 10% otherwise. ``unit``: "bytes" (shown in
    MiB) or a word for a count (chunks, …)."""

    def __init__(self, label: str, unit: str = "bytes") -> None:
        self.label = label
        self.unit = unit
        self.tty = sys.stderr.isatty()
        self.last = -1

    def __call__(self, done: int, total: int, detail: str = "") -> None:
        if total <= 0:
            return
        pct = int(100 * done / total)
        amount = (f"{done / 2**20:8.1f}/{total / 2**20:.1f} MiB" if self.unit == "bytes"
                  else f"{done:,}/{total:,} {self.unit}")
        if self.tty:
            filled = pct * 30 // 100
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] {pct:3d}% "
                             f"{amount} {detail[:28]:<28}")
            sys.stderr.flush()
        elif pct // 10 != self.last // 10:
            what = f"{done:,} of {total:,} bytes" if self.unit == "bytes" else f"{done:,} of {total:,} {self.unit}"
            sys.stderr.write(f"{self.label}: {pct}% ({what}) {detail}\n")
        self.last = pct

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def tensor_type_arg(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not PATTERN=TYPE")
    pat, typ = text.split("=", 1)
    if not pat or not typ:
        raise argparse.ArgumentTypeError(f"{text!r}: both the pattern and the type are needed")
    return pat, typ


def imatrix_arg(path: str | None) -> Any:
    """The --imatrix file read (None without one); a bad file is one CLIError line."""
    from quantscope.core.quant.imatrix import ImatrixError, read_imatrix

    if not path:
        return None
    check_file(path)
    try:
        return read_imatrix(path)
    except (ImatrixError, OSError) as exc:
        raise CLIError(str(exc)) from None
    except GGUFError as exc:
        raise CLIError(f"--imatrix {path}: {exc}") from None


def peak_rss_mb() -> float:
    from quantscope.core.bench import peak_rss_bytes

    return peak_rss_bytes() / 2**20


def isa() -> str:
    from quantscope.core.native import kernels

    return kernels.isa()


def add_sampling(s: argparse.ArgumentParser) -> None:
    s.add_argument("-n", "--n-predict", type=int_arg(1), default=256, help="tokens to generate (at least 1)")
    s.add_argument("--temp", type=float_arg(0.0), default=0.8, help="temperature (0 = greedy)")
    s.add_argument("--top-k", type=int_arg(0), default=40, help="0 = all tokens")
    s.add_argument("--top-p", type=float_arg(0.0, 1.0), default=0.95)
    s.add_argument("--min-p", type=float_arg(0.0, 1.0), default=0.05)
    s.add_argument("--repeat-penalty", type=float_arg(0.0, lo_open=True), default=1.0)
    s.add_argument("--seed", type=int_arg(-1), help="same seed, same text (-1 or none: a random seed)")
    s.add_argument("--stop", action="append", help="stop string (repeatable)")
    s.add_argument("--special", action="store_true",
                   help="print control tokens (<|im_end|>, <start_of_image>, …) instead of leaving them out")
    s.add_argument("-c", "--ctx", type=int_arg(1, MAX_CTX), default=4096, help="context size")
    s.add_argument("-t", "--threads", type=int_arg(0, MAX_THREADS), default=0, help="0 = one per core")
    s.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    add_gpu_layers(s)
    add_cache_types(s)
    s.add_argument("--no-repack", action="store_true",
                   help="keep the weights mapped from the file (zero-copy) instead of repacking them for the CPU")


def add_speculative(s: argparse.ArgumentParser) -> None:
    """Speculative decoding's options (llama.cpp's names): ``--draft``, ``--draft-max``, ``--draft-p-min``,
    ``--lookup``."""
    g = s.add_argument_group("speculative decoding (docs/speculative.md)")
    g.add_argument("--draft", "-md", "--model-draft", metavar="FILE",
                   help="a draft model with the same vocabulary: it proposes tokens that the model checks in one "
                   "batched pass (greedy output unchanged; sampling keeps the model's distribution)")
    g.add_argument("--draft-max", type=int_arg(1, 256), default=16, metavar="N",
                   help="the most tokens proposed per pass (default 16)")
    g.add_argument("--draft-p-min", "--draft-min-p", type=float_arg(0.0, 1.0), default=0.75, metavar="P",
                   help="the draft stops proposing where its most likely token is below P (default 0.75)")
    g.add_argument("--lookup", type=int_arg(0, 16), default=0, metavar="N",
                   help="prompt lookup: propose what followed the latest earlier occurrence of the context's last "
                   "N..1 tokens (no draft model; for edits and summaries that repeat their input; 0: off)")


def start_speculation(eng: Any, args: argparse.Namespace) -> None:
    """Turn on the speculative decoding that ``args`` asks for (:func:`add_speculative`) on engine ``eng``; the
    refusals (an unreadable draft, another vocabulary) as one :class:`CLIError` line."""
    draft, lookup = getattr(args, "draft", None), getattr(args, "lookup", 0)
    if not draft and not lookup:
        return
    from quantscope.core.engine.speculative import VocabularyMismatch
    from quantscope.core.model import UnsupportedModel
    from quantscope.core.tokenizer import TokenizerError

    if draft:
        try:
            check_file(draft)
        except CLIError as exc:
            raise CLIError(f"--draft: {exc}") from None
    try:
        eng.speculate(draft or None, lookup, args.draft_max, args.draft_p_min,
                      draft_backend="cpu" if eng.backend == "cpu" else "auto")
    except (VocabularyMismatch, UnsupportedModel, TokenizerError) as exc:
        raise CLIError(f"--draft {draft}: {exc}") from None
    except GGUFError as exc:
        raise CLIError(f"--draft {draft}: not a readable GGUF file: {exc}") from None


def speculation_note(d: Any) -> str:
    """``; 41/52 drafted tokens accepted (79%)`` for a reply's last delta when it was decoded speculatively."""
    if not getattr(d, "drafted", 0):
        return ""
    return f"; {d.accepted}/{d.drafted} drafted tokens accepted ({100 * d.accepted / d.drafted:.0f}%)"


#: llama.cpp's KV cache types, as its -ctk / -ctv take them (core.native.nn.KV_CACHE_TYPES)
CACHE_TYPES = ("f16", "f32", "bf16", "q8_0", "q4_0")


def add_cache_types(s: argparse.ArgumentParser) -> None:
    """``-ctk/--cache-type-k`` and ``-ctv/--cache-type-v`` (llama.cpp's names): the KV cache's element types."""
    for short, long, what in (("-ctk", "--cache-type-k", "K"), ("-ctv", "--cache-type-v", "V")):
        s.add_argument(short, long, type=str.lower, choices=CACHE_TYPES, default="f16", metavar="TYPE",
                       help=f"the KV cache's {what} type: {', '.join(CACHE_TYPES)} (default f16; q8_0 / q4_0 take "
                            "about a half / a quarter of f16's memory; not on the CUDA backend)")


def cache_types(args: argparse.Namespace) -> tuple[str, str]:
    """The (K, V) cache types of a command's arguments (f16 for a command without the options)."""
    return getattr(args, "cache_type_k", "f16"), getattr(args, "cache_type_v", "f16")


def add_gpu_layers(s: argparse.ArgumentParser) -> None:
    """``--gpu-layers N`` (llama.cpp's ``-ngl``) beside ``--backend``."""
    s.add_argument("-ngl", "--gpu-layers", type=int_arg(0), default=None, metavar="N",
                   help="run the first N layers on the GPU and the rest on the CPU (more than the model has: all; "
                        "default: all that fit with --backend auto, all with --backend cuda)")


def exit_cleanly_if_file_changes(file: str) -> None:
    """Reads of ``file``'s mapping outside the guarded kernels (numpy views) die by SIGBUS when it is truncated
    under us: make that one error line and exit status 2 instead."""
    try:
        from quantscope.core.native.mapped import exit_on_unguarded_fault
    except ImportError:  # no native library: commands that need it say so themselves
        return
    exit_on_unguarded_fault(f"quantscope: error: {file} changed while it was being read (its memory-mapped "
                            "bytes are gone: the file was truncated or replaced)")
