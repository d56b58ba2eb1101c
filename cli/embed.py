"""``quantscope embed``: the vectors of an embedding model (BERT, bge, all-MiniLM …) for texts, as llama-embedding
gives them (pooling from the file unless ``--pooling``, Euclidean normalisation unless ``--normalize``)."""

from __future__ import annotations

import argparse
import io
import sys
from typing import Any

from .common import CLIError, check_file, dump_json, read_text_file


def _inputs(args: argparse.Namespace) -> list[str]:
    if args.prompt and args.text_file:
        raise CLIError("embed: give the texts with -p or with -f, not both")
    if args.text_file:
        texts = [line for line in read_text_file(args.text_file, "-f").splitlines() if line.strip()]
        if not texts:
            raise CLIError(f"-f: {args.text_file} has no non-empty line to embed")
        return texts
    if not args.prompt:
        raise CLIError("embed: give the texts: -p TEXT [TEXT …] or -f FILE (one text per line)")
    return list(args.prompt)


def cmd_embed(args: argparse.Namespace) -> int:
    import numpy as np

    from quantscope.core.engine.encoder import EmbedError, Encoder
    from quantscope.core.fsutil import PathRefused, printable, write_atomic
    from quantscope.core.gguf import GGUFError
    from quantscope.core.model import UnsupportedModel

    texts = _inputs(args)
    check_file(args.file)
    try:
        enc = Encoder(args.file, pooling=args.pooling)
    except (EmbedError, UnsupportedModel, GGUFError, OSError) as exc:
        raise CLIError(f"{args.file}: {exc}") from None
    with enc:
        try:
            ids = [enc.check_ids(enc.tokenize(t), f"text {i + 1}") for i, t in enumerate(texts)]
            vecs = enc.embed_ids(ids, enc.pooling, args.normalize)
        except EmbedError as exc:
            raise CLIError(str(exc)) from None
        pooling = enc.pooling
    if args.npy:  # one row per text, or with pooling none one row per token of every text in order
        arr = np.concatenate([v.reshape(-1, v.shape[-1]) for v in vecs]).astype(np.float32)
        buf = io.BytesIO()
        np.save(buf, arr)
        if args.npy == "-":
            sys.stdout.buffer.write(buf.getvalue())
            sys.stdout.buffer.flush()
        else:
            try:
                write_atomic(args.npy, buf.getvalue(), "--npy", [args.file])
            except PathRefused as exc:  # (it names --npy and the path already)
                raise CLIError(str(exc)) from None
            except OSError as exc:
                raise CLIError(f"--npy {args.npy}: {exc.strerror or exc}") from None
        return 0
    if args.json:
        dump_json({"object": "list", "pooling": pooling, "normalize": args.normalize,
                   "data": [{"object": "embedding", "index": i, "tokens": len(t), "embedding": v.tolist()}
                            for i, (t, v) in enumerate(zip(ids, vecs, strict=True))]})
        return 0
    for i, (text, t, v) in enumerate(zip(texts, ids, vecs, strict=True)):
        short = text if len(text) <= 60 else text[:57] + "…"
        print(printable(f"embedding {i} ({len(t)} tokens, {pooling} pooling): {short}"))
        rows = v.reshape(-1, v.shape[-1])
        for r in rows:
            print(" ".join(f"{x:9.6f}" for x in r))
    return 0


def register(sub: Any) -> None:
    """Add ``embed`` to ``sub``."""
    from quantscope.core.engine.encoder import POOLINGS

    s = sub.add_parser("embed", help="embedding vectors of texts with an embedding model (BERT, bge, MiniLM …), "
                       "like llama-embedding")
    s.add_argument("file", metavar="MODEL")
    s.add_argument("-p", "--prompt", nargs="+", metavar="TEXT", help="the texts, one vector each")
    s.add_argument("-f", "--text-file", metavar="FILE", help="the texts, one per non-empty line")
    s.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="how the rows become one vector (default: the file's pooling_type); none: one per token")
    s.add_argument("--normalize", type=int, default=2, metavar="N", choices=range(-1, 100),
                   help="-1 none, 0 max-abs to int16 range, 1 taxicab, 2 Euclidean (default), N a p-norm "
                   "(llama-embedding's --embd-normalize)")
    out = s.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="JSON on stdout (OpenAI's list of embeddings)")
    out.add_argument("--npy", metavar="FILE", help="write a float32 .npy array, one row per text (pooling none: per "
                     "token of every text), to FILE ('-': stdout)")
    s.set_defaults(func=cmd_embed)
