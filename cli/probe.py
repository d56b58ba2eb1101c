"""``quantscope probe``: inside the model on one prompt: logit lens, attention weights, activations (docs/probe.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from .common import MAX_THREADS, CLIError, dump_json, int_arg

MAX_PROMPT_CHARS = 256 * 1024


def _layer_head(text: str) -> tuple[int, int | None]:
    """``LAYER`` or ``LAYER:HEAD`` (both >= 0)."""
    layer, _, head = text.partition(":")
    try:
        lv, hv = int(layer), int(head) if head else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LAYER or LAYER:HEAD, got {text!r}") from None
    if lv < 0 or (hv is not None and hv < 0):
        raise argparse.ArgumentTypeError(f"layer and head are numbers from 0, got {text!r}")
    return lv, hv


def _positions(spec: str, n: int) -> list[int]:
    """``last`` (default), ``all``, ``I`` or ``A:B`` (Python's slice, negatives from the end) over ``n`` tokens."""
    if spec == "last":
        return [n - 1]
    if spec == "all":
        return list(range(n))
    try:
        if ":" in spec:
            a, _, b = spec.partition(":")
            out = list(range(n))[slice(int(a) if a else None, int(b) if b else None)]
        else:
            i = int(spec)
            out = [i + n if i < 0 else i]
            if not 0 <= out[0] < n:
                out = []
    except ValueError:
        raise CLIError(f"--positions: expected last, all, I or A:B, got {spec!r}") from None
    if not out:
        raise CLIError(f"--positions {spec}: no position of the prompt's {n} tokens")
    return out


def _tok(text: str, width: int = 14) -> str:
    r = repr(text)
    return r if len(r) <= width else r[: width - 2] + "…'"


def _engine_session(eng: Any) -> Any:
    """run_probe's ``make_session``: the engine's own session, emptied (one upload of the weights to the GPU), or a
    new one where it is too short."""

    def make(n_ctx: int, _kv_dtype: type) -> Any:
        if n_ctx > eng.session.n_ctx:
            return eng.new_session(n_ctx)
        eng.session.reset()
        return eng.session

    return make


def cmd_probe(args: argparse.Namespace) -> int:
    from quantscope.core.engine import probe as P
    from quantscope.core.jobs import Cancelled

    from .model import load_engine

    text = args.prompt if args.prompt is not None else sys.stdin.read(MAX_PROMPT_CHARS + 1)
    if len(text) > MAX_PROMPT_CHARS:  # refused before tokenizing: no vocabulary packs 256 characters per token
        raise CLIError(f"the prompt is over {MAX_PROMPT_CHARS:,} characters; the probe takes at most "
                       "1024 tokens")
    # a GPU session for the probe is the engine's own, with room for the longest prompt
    eng = load_engine(args, n_ctx=64 if args.backend == "cpu" else P.MAX_PROBE_TOKENS)
    tok = eng.tokenizer
    ids = tok.encode(text, add_special=None if not args.no_bos else False)
    if not ids:
        raise CLIError("the prompt has no tokens")
    if len(ids) > P.MAX_PROBE_TOKENS:
        raise CLIError(f"the prompt has {len(ids)} tokens; the probe takes at most {P.MAX_PROBE_TOKENS}")
    cfg = eng.model.config
    want_lens, want_act = args.logit_lens, args.activations
    if not (want_lens or want_act or args.attention):
        want_lens = True
    if args.attention:
        layer, head = args.attention
        if layer >= cfg.n_layers:
            raise CLIError(f"--attention {layer}: the model has layers 0..{cfg.n_layers - 1}")
        if cfg.is_recurrent(layer):
            raise CLIError(f"--attention {layer}: a recurrent (delta-net) layer has no attention weights")
        if head is not None and head >= cfg.n_head:
            raise CLIError(f"--attention {layer}:{head}: the model has heads 0..{cfg.n_head - 1}")
    positions = _positions(args.positions, len(ids))
    pieces = [tok.decode([t]) for t in ids]
    try:
        whole_gpu = eng.backend != "cpu" and eng.gpu_layers == cfg.n_layers  # (a split session traces nothing)
        pr = P.run_probe(eng.model, ids, pieces, make_session=_engine_session(eng) if whole_gpu else None)
        out: dict[str, Any] = {"file": args.file, "arch": cfg.arch, "n_layers": cfg.n_layers,
                               "tokens": [{"id": t, "text": s} for t, s in zip(ids, pieces, strict=True)]}
        if want_lens:
            out["logit_lens"] = _lens(pr, P.logit_lens(pr, args.top, args.target), tok, positions, args.json)
        if args.attention:
            out["attention"] = _attention(pr, *args.attention, positions, args.json)
        if want_act:
            out["activations"] = _activations(pr, P.activations(pr), args.json)
    except Cancelled:  # (nothing cancels a CLI probe; kept for symmetry with the GUI's worker)
        raise CLIError("cancelled") from None
    if args.json:
        dump_json(out)
    return 0


def _r(a: np.ndarray, digits: int = 6) -> Any:
    return np.round(a.astype(np.float64), digits).tolist()


def _lens(pr: Any, lens: Any, tok: Any, positions: list[int], as_json: bool) -> dict[str, Any] | None:
    labels = [pr.resid_label(i) for i in range(len(pr.resid))]
    if as_json:
        return {"target": lens.target_kind, "rows": labels, "targets": lens.targets.tolist(),
                "top_ids": lens.top_ids.tolist(), "top_probs": _r(lens.top_probs),
                "target_rank": lens.target_rank.tolist(), "target_prob": _r(lens.target_prob),
                "entropy": _r(lens.entropy, 4)}
    what = "the model's final prediction" if lens.target_kind == "final" else "the prompt's next token"
    print(f"logit lens (target: {what}); rows: the residual stream after each layer ('emb': the embeddings); "
          "rank 1: the likeliest token")
    for t in positions:
        tg = int(lens.targets[t])
        print(f"\nposition {t} {_tok(pr.pieces[t])} -> target {_tok(tok.decode([tg]))} "
              f"(final p={lens.target_prob[-1, t]:.3f})")
        print(f"{'layer':>5}  {'rank':>6}  {'p':>6}  {'entropy':>7}  top {lens.top_ids.shape[2]}")
        for i, lab in enumerate(labels):
            tops = "  ".join(f"{_tok(tok.decode([int(k)]), 12)} {p:.2f}"
                             for k, p in zip(lens.top_ids[i, t], lens.top_probs[i, t], strict=True))
            print(f"{lab:>5}  {lens.target_rank[i, t] + 1:>6}  {lens.target_prob[i, t]:>6.3f}  "
                  f"{lens.entropy[i, t]:>7.2f}  {tops}")
    return None


def _attention(pr: Any, layer: int, head: int | None, positions: list[int], as_json: bool) -> dict[str, Any] | None:
    from quantscope.core.engine.probe import head_average

    w = pr.attention(layer)
    m = head_average(w) if head is None else w[head]
    window = pr.window(layer)
    if as_json:
        return {"layer": layer, "head": head, "n_head": int(w.shape[0]), "window": window,
                "weights": [[None if np.isnan(x) else round(float(x), 6) for x in row] for row in m]}
    which = "averaged over the heads" if head is None else f"head {head}"
    scope = f"a sliding window of {window} positions" if window else "the whole prefix"
    print(f"attention of layer {layer}, {which} (the layer sees {scope}); each query's 3 most attended keys")
    for t in positions:
        row = np.nan_to_num(m[t], nan=-1.0)
        best = np.argsort(-row, kind="stable")[:3]
        keys = " | ".join(f"{k} {_tok(pr.pieces[k])} {row[k]:.3f}" for k in best if row[k] >= 0)
        print(f"{t:>5} {_tok(pr.pieces[t]):>16} -> {keys}")
    return None


def _activations(pr: Any, act: Any, as_json: bool) -> dict[str, Any] | None:
    labels = [pr.resid_label(i) for i in range(len(pr.resid))]
    if as_json:
        return {"rows": labels, "rms": _r(act.rms, 5), "channel_rms": _r(act.channel_rms, 5),
                "top_channels": [[{"channel": c, "rms": round(r, 5), "max_abs": round(x, 5)}
                                  for c, r, x in act.top_channels(i)] for i in range(len(labels))],
                "outlier_ratio": [round(act.outlier_ratio(i), 3) for i in range(len(labels))]}
    print("residual stream: RMS over positions, the largest channels (RMS / max |x|) and the largest over the "
          "median channel's RMS")
    print(f"{'layer':>5}  {'RMS':>8}  {'max RMS':>8} {'at':>5}  {'ratio':>7}  largest channels")
    for i, lab in enumerate(labels):
        r = act.rms[i]
        tops = "  ".join(f"{c}: {rr:.3g}/{x:.3g}" for c, rr, x in act.top_channels(i, 4))
        print(f"{lab:>5}  {float(np.sqrt((r.astype(np.float64) ** 2).mean())):>8.3g}  {float(r.max()):>8.3g} "
              f"{int(r.argmax()):>5}  {act.outlier_ratio(i):>7.1f}  {tops}")
    return None


def register(sub: Any) -> None:
    """Add ``probe`` to ``sub``."""
    s = sub.add_parser("probe", help="inside the model on a prompt: logit lens, attention weights, activations")
    s.add_argument("file")
    s.add_argument("-p", "--prompt", help="the prompt text, at most 1024 tokens (default: stdin)")
    s.add_argument("--logit-lens", action="store_true",
                   help="each layer's residual stream through the final norm and the output head: top tokens, and "
                        "the rank and probability of the target (the default view)")
    s.add_argument("--attention", type=_layer_head, metavar="LAYER[:HEAD]",
                   help="a layer's attention weights over the prompt, of one head or averaged over the heads")
    s.add_argument("--activations", action="store_true",
                   help="the residual stream's RMS per layer and its largest (outlier) channels")
    s.add_argument("--json", action="store_true", help="everything as JSON on stdout (all positions)")
    s.add_argument("--top", type=int_arg(1, 100), default=5, help="logit lens: tokens per layer and position")
    s.add_argument("--target", choices=("final", "next"), default="final",
                   help="logit lens: follow the model's final prediction (default) or the prompt's next token")
    s.add_argument("--positions", default="last", metavar="last|all|I|A:B",
                   help="the positions printed (text output; default: the last)")
    s.add_argument("--no-bos", action="store_true", help="do not add BOS")
    s.add_argument("-t", "--threads", type=int_arg(0, MAX_THREADS), default=0)
    s.add_argument("--backend", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="where the layers run: the CPU engine (default), the GPU (cuda), or the GPU where it works")
    s.set_defaults(func=cmd_probe)
