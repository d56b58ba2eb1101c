"""Verbs that run the model: generate, chat, tokenize, perplexity (and KL divergence) and compare."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

from quantscope.core.filestate import FileChangedError
from quantscope.core.fsutil import PathRefused, printable
from quantscope.core.gguf import GGUFError, GGUFFile

from .common import (
    MAX_CTX,
    MAX_THREADS,
    CLIError,
    add_cache_types,
    add_gpu_layers,
    add_sampling,
    add_speculative,
    cache_types,
    check_file,
    dump_json,
    exit_cleanly_if_file_changes,
    int_arg,
    open_gguf,
    read_text_file,
    speculation_note,
    start_speculation,
)


def load_engine(args: argparse.Namespace, n_ctx: int = 4096) -> Any:
    from quantscope.core.engine.generate import Engine
    from quantscope.core.model import UnsupportedModel
    from quantscope.core.tokenizer import TokenizerError

    check_file(args.file)
    from quantscope.core.engine.cuda_library import CudaError

    types = cache_types(args)
    if types != ("f16", "f16") and (getattr(args, "backend", "auto") == "cuda" or getattr(args, "gpu_layers", None)):
        raise CLIError(f"--cache-type-k/-v {'/'.join(types)}: the CUDA backend holds an F16 KV cache only; use "
                       "--backend cpu (and no --gpu-layers) for another cache type")
    try:
        eng = Engine(args.file, n_ctx=n_ctx, threads=args.threads, backend=getattr(args, "backend", "auto"),
                     repack=not getattr(args, "no_repack", False), gpu_layers=getattr(args, "gpu_layers", None),
                     cache_types=types)
    except (UnsupportedModel, TokenizerError) as exc:
        raise CLIError(f"{args.file}: {exc}") from None
    except CudaError as exc:
        raise CLIError(f"--backend cuda: {exc}") from None
    except GGUFError as exc:
        raise CLIError(f"{args.file}: not a readable GGUF file: {exc}") from None
    except ValueError as exc:  # the layers cannot be split there, or GPU layers with --backend cpu, or a cache
        if types != ("f16", "f16") and "KV cache" in str(exc):  # type the model's head size cannot hold
            raise CLIError(f"--cache-type-k/-v {'/'.join(types)}: {exc}") from None
        if getattr(args, "gpu_layers", None) is None:
            raise
        raise CLIError(f"--gpu-layers {args.gpu_layers}: {exc}") from None
    kv = "" if types == ("f16", "f16") else f", KV cache {'/'.join(types)}"
    print(f"backend: {eng.backend} ({eng.backend_reason}){kv}", file=sys.stderr)
    return eng


def _params(args: argparse.Namespace) -> Any:
    from quantscope.core.chat import SamplerParams

    seed = None if args.seed is None or args.seed < 0 else args.seed  # -1: a random seed, as in llama.cpp
    return SamplerParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                         repeat_penalty=args.repeat_penalty, seed=seed, max_tokens=args.n_predict,
                         stop=list(args.stop or []), special=args.special,
                         alternatives=getattr(args, "alternatives", 0))


def _stream(eng: Any, prompt: Any, args: argparse.Namespace, **kw: Any) -> Any:
    """``eng.generate`` with its refusals (template, context, empty prompt) as :class:`CLIError`."""
    from quantscope.core.chat import ChatTemplateError
    from quantscope.core.engine.generate import EmptyPrompt
    from quantscope.core.engine.session import ContextFull

    try:
        yield from eng.generate(prompt, _params(args), **kw)
    except ContextFull as exc:
        raise CLIError(f"{exc}") from None
    except ChatTemplateError as exc:
        raise CLIError(f"{args.file}: {exc}") from None
    except EmptyPrompt as exc:
        raise CLIError(str(exc)) from None


def _choice_line(eng: Any, c: Any) -> str:
    """``[p 0.8312 (T 0.9120) H 0.61] 'Hello' | 'Hi' 0.1021 …``: one generated token and its alternatives."""
    def piece(tid: int) -> str:
        return "'" + printable(eng.tokenizer.token_bytes(tid, True).decode("utf-8", "replace")) + "'"

    alts = "  ".join(f"{piece(t)} {p:.4f}" for t, p, _s in c.alternatives)
    return f"[p {c.prob:.4f} (T {c.scaled_prob:.4f}) H {c.entropy:.2f}] {piece(c.token)} | {alts}"


def cmd_generate(args: argparse.Namespace) -> int:
    if args.prompt is not None:
        prompt = args.prompt
    else:
        try:
            prompt = sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise CLIError(f"the prompt on standard input is not UTF-8 text: {exc}") from None
    eng = load_engine(args, args.ctx)
    start_speculation(eng, args)
    if args.echo:
        sys.stdout.write(prompt)
    last = None

    def on_prompt(done: int, total: int) -> None:  # long prompts: show progress on a terminal
        if total > 512 and sys.stderr.isatty():
            end = "\n" if done == total else ""
            print(f"\r[prompt {done:,}/{total:,} tokens]", end=end, file=sys.stderr, flush=True)

    for d in _stream(eng, prompt, args, on_prompt=on_prompt):
        sys.stdout.write(d.text)
        sys.stdout.flush()
        if d.choice is not None:
            print(_choice_line(eng, d.choice), file=sys.stderr, flush=True)
        last = d
    sys.stdout.write("\n")
    if last is not None:
        print(f"[{last.n_prompt} prompt tokens at {last.prompt_tps:.1f} t/s, ttft {last.ttft_s * 1e3:.0f} ms; "
              f"{last.n_generated} generated at {last.gen_tps:.1f} t/s{speculation_note(last)}; "
              f"stop: {last.stop_reason}]", file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from quantscope.core.chat import ChatTemplateError
    from quantscope.core.chat.conversation import ContextTooSmall, prepare_prompt, reply_reserve

    eng = load_engine(args, args.ctx)
    if eng.template_error is not None:
        raise CLIError(f"{args.file}: {eng.template_error}")
    start_speculation(eng, args)
    system = args.system
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    print(f"chatting with {Path(args.file).name} ({eng.model.config.arch}, context {eng.n_ctx}); "
          "/reset clears, /system TEXT sets the system prompt, /quit or Ctrl-D leaves", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/quit", "/exit"):
            return 0
        if line.strip() == "/reset":
            messages = [{"role": "system", "content": system}] if system else []
            print("(conversation cleared)", file=sys.stderr)
            continue
        if line.startswith("/system"):
            system = line[len("/system"):].strip()
            messages = [{"role": "system", "content": system}] if system else []
            print("(system prompt set; conversation cleared)", file=sys.stderr)
            continue
        messages.append({"role": "user", "content": line})
        # the GUI's context policy: past the context the oldest turns are left out (a base model without a
        # template continues each line as plain text)
        try:
            prep = prepare_prompt(messages if eng.template is not None else line, eng, eng.n_ctx,
                                  reply_reserve(args.n_predict, eng.n_ctx), hint="raise -c")
        except ChatTemplateError as exc:
            raise CLIError(f"{args.file}: {exc}") from None
        except ContextTooSmall as exc:
            raise CLIError(str(exc)) from None
        if prep.dropped:
            print(f"(the {prep.dropped} oldest messages are left out: the conversation outgrew the context)",
                  file=sys.stderr)
        prompt = prep.prompt
        reply = ""
        last = None
        thinking = False  # a harmony model's thinking goes to stderr (dimmed on a terminal), the answer to stdout
        dim = ("\x1b[2m", "\x1b[0m") if sys.stderr.isatty() else ("", "")
        try:
            for d in _stream(eng, prompt, args):
                last = d
                if d.channel and d.text:
                    if not thinking:
                        sys.stderr.write(f"{dim[0]}[thinking] ")
                        thinking = True
                    sys.stderr.write(d.text)
                    sys.stderr.flush()
                    continue
                if thinking and d.text:
                    sys.stderr.write(f"{dim[1]}\n")
                    thinking = False
                sys.stdout.write(d.text)
                sys.stdout.flush()
                reply += d.text
        except KeyboardInterrupt:
            print("\n(interrupted)", file=sys.stderr)
        if thinking:
            sys.stderr.write(f"{dim[1]}\n")
        print()
        messages.append({"role": "assistant", "content": reply})
        if last is not None:
            print(f"[{last.n_generated} tokens, {last.gen_tps:.1f} t/s, context {last.context_used}/{eng.n_ctx}"
                  f"{speculation_note(last)}]", file=sys.stderr)


def cmd_tokenize(args: argparse.Namespace) -> int:
    from quantscope.core.tokenizer import Tokenizer, TokenizerError

    check_file(args.file)
    try:
        with GGUFFile(args.file) as f:
            tok = Tokenizer(f)
    except (TokenizerError, GGUFError, OSError) as exc:
        raise CLIError(f"{args.file}: {exc}") from None
    ids = tok.encode(args.text, add_special=None if not args.no_bos else False)
    if args.ids:
        print(" ".join(str(i) for i in ids))
    elif args.pieces:
        print(" ".join(repr(tok.pieces[i]) for i in ids))
    else:
        for i in ids:
            print(f"{i:>8}  {tok.pieces[i]!r}  {tok.token_bytes(i)!r}")
    return 0


def cmd_perplexity(args: argparse.Namespace) -> int:
    from quantscope.core.engine.tools import perplexity

    if args.kl_divergence:
        return _kl_divergence(args)
    if not args.text_file:
        raise CLIError("perplexity needs the text: -f FILE (or --kl-divergence-base FILE --kl-divergence)")
    text = read_text_file(args.text_file, "-f")
    if args.kl_divergence_base:
        return _write_kld_base(args, text)
    eng = load_engine(args, args.ctx)
    try:
        r = perplexity(eng.model, eng.tokenizer, text, args.ctx, args.chunks, make_session=eng.new_session,
                       progress=lambda c, n, p: print(f"[{c}/{n}] running ppl {p:.4f}", file=sys.stderr))
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    print(f"perplexity {r.ppl:.4f} over {r.n_chunks} chunks of {r.n_ctx} tokens ({r.n_tokens_scored} scored) "
          f"in {r.seconds:.1f} s")
    return 0


def _check_kld_context(path: str, n_ctx: int, what: str) -> None:
    """Refuse a KLD context beyond the model's trained context or this machine's memory before loading it."""
    from quantscope.core.engine import kld
    from quantscope.core.model import UnsupportedModel, read_config

    with open_gguf(path) as f:
        try:
            cfg = read_config(f)
        except UnsupportedModel:
            return  # loading the model says why
    try:
        kld.check_context(cfg, n_ctx, what)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def _write_kld_base(args: argparse.Namespace, text: str) -> int:
    """``--kl-divergence-base FILE`` without ``--kl-divergence``: write llama-perplexity's log-probability file."""
    from quantscope.core.engine import kld
    from quantscope.core.fsutil import OutputSet, PathRefused

    try:  # refused before the model loads: an input of this command (a shard, the text), a FIFO, a folder
        OutputSet([("--kl-divergence-base", args.kl_divergence_base)], inputs=(args.file, args.text_file))
    except PathRefused as exc:
        raise CLIError(str(exc)) from None
    _check_kld_context(args.file, args.ctx, "-c: a context")
    eng = load_engine(args, args.ctx)
    try:
        n, ppl = kld.write_base(args.kl_divergence_base, eng.model, eng.tokenizer, text, args.ctx, args.chunks,
                                make_session=eng.new_session, inputs=(args.file, args.text_file),
                                progress=lambda c, n: print(f"[{c}/{n}]", file=sys.stderr))
    except (ValueError, PathRefused, OSError) as exc:
        raise CLIError(str(exc)) from None
    print(f"perplexity {ppl:.4f} over {n} chunks of {args.ctx} tokens; log-probabilities written to "
          f"{args.kl_divergence_base}")
    return 0


def _kl_divergence(args: argparse.Namespace) -> int:
    """``--kl-divergence-base FILE --kl-divergence``: compare with a base written by either tool."""
    from quantscope.core.engine import kld
    from quantscope.core.fsutil import PathRefused

    if not args.kl_divergence_base:
        raise CLIError("--kl-divergence needs --kl-divergence-base FILE (the base model's log-probabilities)")
    try:
        base = kld.KLDBase(args.kl_divergence_base)
    except (ValueError, PathRefused, OSError) as exc:
        raise CLIError(str(exc)) from None
    _check_kld_context(args.file, base.n_ctx, f"{args.kl_divergence_base}: its context")
    eng = load_engine(args, base.n_ctx)

    def tell(c: int, n: int, r: kld.KLDResult) -> None:
        print(f"[{c}/{n}] PPL {r.ppl()[0]:.4f}  KLD {r.mean_kld()[0]:.6f}  same top {100 * r.top1():.2f} %",
              file=sys.stderr)

    try:
        r = kld.kl_divergence(base, eng.model, eng.tokenizer, make_session=eng.new_session, progress=tell)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    print(f"{r.n_chunks} chunks of {r.n_ctx} tokens, {r.count} positions compared with {base.path}")
    print(r.report())
    return 0


#: ``compare``'s colour scale: upper KLD bounds (nats) and the ANSI 256-colour backgrounds, green to red
KLD_BINS = (0.001, 0.01, 0.05, 0.1, 0.5, 1.0)


KLD_COLOURS = (34, 70, 148, 184, 214, 202, 196)


def _kld_colour(k: float) -> int:
    return KLD_COLOURS[next((i for i, b in enumerate(KLD_BINS) if k < b), len(KLD_BINS))]


def _paint(text: str, sgr: str) -> str:
    """``text`` made safe for the terminal (newlines and tabs kept) inside the SGR ``sgr``, reset before each
    newline so a background does not run to the end of the line."""
    lines = ["\t".join(printable(p) for p in line.split("\t")) for line in text.split("\n")]
    return "\n".join(f"\x1b[{sgr}m{line}\x1b[0m" if line else "" for line in lines)


def _compare_text(r: Any) -> str:
    """The compared text, the scored tokens on a background coloured by KLD, the unscored ones dimmed."""
    score = {t.position: t.kld for t in r.tokens}
    out = [_paint(piece, f"48;5;{_kld_colour(score[i])};38;5;16") if i in score else _paint(piece, "2")
           for i, (_tid, piece) in enumerate(r.context)]
    bounds = ["0", *(f"{b:g}" for b in KLD_BINS)]
    legend = " ".join(f"\x1b[48;5;{c};38;5;16m {'<' + bounds[i + 1] if i < len(KLD_BINS) else '≥' + bounds[-1]} "
                      "\x1b[0m" for i, c in enumerate(KLD_COLOURS))
    return f"{''.join(out)}\n\nKLD (nats): {legend}  \x1b[2mdimmed: context, not scored\x1b[0m"


def _compare_worst(r: Any, n: int) -> list[str]:
    """The ``n`` positions of largest KLD, each with the text before it and what each model expected."""
    lines = [f"the {min(n, r.n_scored)} positions of largest KLD (nats), with the text before them:"]
    for t in r.worst(n):
        start = (t.position // r.n_ctx) * r.n_ctx
        before = "".join(p for _, p in r.context[max(start, t.position - 12) : t.position])[-48:]
        tops = (f"top base {printable(repr(r.token_text.get(t.base_top1, '')))} quant "
                f"{printable(repr(r.token_text.get(t.quant_top1, '')))}")
        lines.append(f"  {t.kld:9.6f}  @{t.position:<7} {printable(repr(t.piece)):<12} p base "
                     f"{math.exp(t.base_logp):.3g} quant {math.exp(t.quant_logp):.3g}  {tops}")
        lines.append(f"             …{printable(before)}[{printable(t.piece)}]")
    return lines


def cmd_compare(args: argparse.Namespace) -> int:
    """``compare BASE QUANT``: perplexity of each, KL divergence and top-1 agreement token by token."""
    from quantscope.core.engine.compare import CompareError, compare_models
    from quantscope.core.engine.cuda_library import CudaError

    check_file(args.base)
    check_file(args.quant)
    exit_cleanly_if_file_changes(f"{args.base} or {args.quant}")
    if args.text_file is not None:
        text = read_text_file(args.text_file, "-f")
    elif args.prompt is not None:
        text = args.prompt
    elif args.base_kld:
        text = ""  # the base file's tokens
    else:
        raise CLIError("compare needs the text: -f FILE or -p TEXT (with --base-kld the base file's tokens serve)")
    if args.base_kld and args.ctx is not None:
        from quantscope.core.engine import kld

        try:
            with kld.KLDBase(args.base) as kb:
                if kb.n_ctx != args.ctx:
                    raise CLIError(f"--ctx {args.ctx}: {args.base} was written with a context of {kb.n_ctx}")
        except (ValueError, OSError) as exc:
            raise CLIError(str(exc)) from None

    def tell(done: int, total: int, message: str) -> None:
        if not message.startswith("loading") and done:
            print(f"[{done}/{total}] {message.split(': ', 1)[-1]}", file=sys.stderr)

    try:
        r = compare_models(args.base, args.quant, text, n_ctx=args.ctx or 512, max_chunks=args.chunks,
                           threads=args.threads, base_is_kld=args.base_kld, progress=tell, backend=args.backend,
                           repack=not args.no_repack)
    except CudaError as exc:
        raise CLIError(f"--backend cuda: {exc}") from None
    except FileChangedError as exc:
        raise CLIError(f"{args.base} or {args.quant} changed while it was being read ({exc})") from None
    except (CompareError, ValueError, PathRefused, OSError) as exc:
        raise CLIError(str(exc)) from None
    if args.json:
        dump_json({"summary": r.summary(), "worst": [t.position for t in r.worst(args.worst)],
                    "tokens": r.token_rows()})
        return 0
    print(printable(f"base   {r.base_name}{' (KL-divergence base file)' if r.base_is_kld else ''}"))
    print(printable(f"quant  {r.quant_name}"))
    print(f"text   {r.n_chunks} chunk{'s' if r.n_chunks != 1 else ''} of {r.n_ctx} tokens, {r.n_scored} positions "
          f"scored in {r.seconds:.1f} s")
    print(f"PPL    base {r.ppl_base:.4f}  quant {r.ppl_quant:.4f}  ratio {r.ppl_ratio:.6f} "
          f"(ln {math.log(r.ppl_ratio):+.6f})")
    print(f"KLD    mean {r.kld_mean:.6f}  median {r.kld_median:.6f}  p90 {r.kld_p90:.6f}  p99 {r.kld_p99:.6f}  "
          f"max {r.kld_max:.6f}  (nats)")
    print(f"top-1  {100 * r.top1_agreement:.2f} % of the positions agree")
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty()
                                        and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb")
    print()
    print(_compare_text(r) if colour else "\n".join(_compare_worst(r, args.worst)))
    return 0



def register(sub: Any) -> None:
    """Add this module's sub-commands to ``sub``."""
    s = sub.add_parser("generate", help="continue a prompt (stdout: the generated text)")
    s.add_argument("file")
    s.add_argument("-p", "--prompt", help="prompt text (default: stdin)")
    s.add_argument("--echo", action="store_true", help="print the prompt before the continuation")
    s.add_argument("--alternatives", type=int_arg(0, 100), default=0, metavar="N",
                   help="on stderr, per generated token: its probability (after the repetition penalty; raw and at "
                   "the temperature), the entropy, and the N most likely tokens")
    add_sampling(s)
    add_speculative(s)
    s.set_defaults(func=cmd_generate)
    s = sub.add_parser("chat", help="interactive chat with the model's template")
    s.add_argument("file")
    s.add_argument("--system", help="system prompt")
    add_sampling(s)
    add_speculative(s)
    s.set_defaults(func=cmd_chat)
    s = sub.add_parser("tokenize", help="token ids and pieces of a text")
    s.add_argument("file")
    s.add_argument("text")
    s.add_argument("--ids", action="store_true", help="only the ids")
    s.add_argument("--pieces", action="store_true", help="only the pieces")
    s.add_argument("--no-bos", action="store_true", help="do not add BOS/EOS")
    s.set_defaults(func=cmd_tokenize)
    s = sub.add_parser("perplexity", help="perplexity of a text (llama-perplexity's procedure)")
    s.add_argument("file")
    s.add_argument("-f", "--text-file", help="the text (not needed with --kl-divergence: the base holds the tokens)")
    s.add_argument("-c", "--ctx", type=int_arg(2, MAX_CTX), default=512)
    s.add_argument("--kl-divergence-base", metavar="FILE",
                   help="write the log-probabilities to FILE in llama-perplexity's format (with --kl-divergence: "
                        "read them from FILE)")
    s.add_argument("--kl-divergence", action="store_true",
                   help="compare with the base log-probabilities of --kl-divergence-base: mean KLD, same-top "
                        "fraction, PPL ratio (as llama-perplexity reports them)")
    s.add_argument("--chunks", type=int_arg(0), default=0, help="at most this many chunks (0 = all)")
    s.add_argument("-t", "--threads", type=int_arg(0, MAX_THREADS), default=0)
    s.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    add_gpu_layers(s)
    add_cache_types(s)
    s.add_argument("--no-repack", action="store_true",
                   help="keep the weights mapped from the file (zero-copy) instead of repacking them for the CPU")
    s.set_defaults(func=cmd_perplexity)
    s = sub.add_parser("compare", help="compare two GGUFs of the same model on a text: perplexity of each, KL "
                       "divergence and top-1 agreement, the text coloured token by token by KLD")
    s.add_argument("base", help="the reference GGUF (e.g. F16 or Q8_0), or with --base-kld a llama-perplexity "
                   "KL-divergence base file")
    s.add_argument("quant", help="the GGUF to measure (same vocabulary)")
    t = s.add_mutually_exclusive_group()
    t.add_argument("-f", "--text-file", help="the text (UTF-8)")
    t.add_argument("-p", "--prompt", help="the text itself")
    s.add_argument("-c", "--ctx", type=int_arg(4, MAX_CTX), default=None,
                   help="chunk size in tokens (default 512; a base file sets its own)")
    s.add_argument("--chunks", type=int_arg(0), default=0, help="at most this many chunks (0 = all)")
    s.add_argument("--base-kld", action="store_true",
                   help="BASE is a log-probability file of llama-perplexity --kl-divergence-base (or quantscope "
                        "perplexity --kl-divergence-base); the text may then be left out")
    s.add_argument("-t", "--threads", type=int_arg(0, MAX_THREADS), default=0)
    s.add_argument("--json", action="store_true", help="print strict JSON: the summary and every scored position")
    s.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the text token by token by KLD (auto: on a terminal); without colour the worst "
                        "positions are listed")
    s.add_argument("--worst", type=int_arg(0), default=10, help="positions to list without colour (default 10)")
    s.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    s.add_argument("--no-repack", action="store_true",
                   help="keep the weights mapped from the file (zero-copy) instead of repacking them for the CPU")
    s.set_defaults(func=cmd_compare)
