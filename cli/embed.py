"""``quantscope embed``: the vectors of an embedding model (BERT, bge, all-MiniLM …) for texts, as llama-embedding
gives them (pooling from the file unless ``--pooling``, Euclidean normalisation unless ``--normalize``); with
``--rerank QUERY`` a reranker's (a BERT cross-encoder's or Qwen3-Reranker's, rank pooling) relevance score of each
text as a document for the query, as llama-server's ``/v1/rerank`` gives them."""

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
    if args.rerank is not None:
        return _rerank(args, texts)
    if args.normalize is None:
        args.normalize = 2
    try:
        enc = Encoder(args.file, pooling=args.pooling)
    except (EmbedError, UnsupportedModel, GGUFError, OSError) as exc:
        raise CLIError(f"{args.file}: {exc}") from None
    with enc:
        if enc.pooling == "rank":
            raise CLIError(f"{args.file} is a reranker (rank pooling): it scores documents for a query; give "
                           "--rerank QUERY with the documents as -p DOC … or -f FILE (or --pooling mean|cls for "
                           "its body's vectors)")
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


def _rerank(args: argparse.Namespace, docs: list[str]) -> int:
    """``embed --rerank QUERY``: each document's score for the query (raw, as llama-server's /v1/rerank), in the
    documents' order as text, or /v1/rerank's shape (the best first) with ``--json``."""
    from quantscope.core.engine.encoder import RANK, EmbedError, Encoder
    from quantscope.core.fsutil import printable
    from quantscope.core.gguf import GGUFError
    from quantscope.core.model import UnsupportedModel

    if args.pooling not in (None, RANK):
        raise CLIError(f"--rerank scores with the reranker's head (rank pooling), not --pooling {args.pooling}")
    if args.normalize is not None or args.npy:
        raise CLIError("--rerank gives raw scores (as llama-server's /v1/rerank): no --normalize or --npy "
                       "(use --json)")
    if not args.rerank.strip():
        raise CLIError("--rerank: the query is empty")
    try:
        enc = Encoder(args.file, pooling=RANK)
    except (EmbedError, UnsupportedModel, GGUFError, OSError) as exc:
        raise CLIError(f"{args.file}: {exc}") from None
    with enc:
        assert enc.rank_head is not None
        labels = enc.rank_head.labels
        try:
            ids = [enc.check_ids(enc.rerank_tokens(args.rerank, d), f"document {i + 1} with the query")
                   for i, d in enumerate(docs)]
            scores = enc.rank_ids(ids)
        except EmbedError as exc:
            raise CLIError(str(exc)) from None
    if args.json:
        order = sorted(range(len(docs)), key=lambda i: -float(scores[i][0]))
        n = sum(len(t) for t in ids)
        results = []
        for i in order:
            r: dict[str, Any] = {"index": i, "relevance_score": float(scores[i][0]), "tokens": len(ids[i]),
                                 "document": {"text": docs[i]}}
            if len(labels) > 1:
                r["scores"] = {lab: float(v) for lab, v in zip(labels, scores[i], strict=True)}
            results.append(r)
        dump_json({"object": "list", "query": args.rerank, "results": results,
                   "usage": {"prompt_tokens": n, "total_tokens": n}})
        return 0
    for i, (d, t, s) in enumerate(zip(docs, ids, scores, strict=True)):
        short = d if len(d) <= 60 else d[:57] + "…"
        extra = "" if len(labels) <= 1 else " [" + ", ".join(f"{lab} {v:.6f}" for lab, v in
                                                            zip(labels, s, strict=True)) + "]"
        print(printable(f"rerank score {i}: {float(s[0]):10.6f}{extra} ({len(t)} tokens): {short}"))
    return 0


def register(sub: Any) -> None:
    """Add ``embed`` to ``sub``."""
    from quantscope.core.engine.encoder import POOLINGS, RANK

    s = sub.add_parser("embed", help="embedding vectors of texts with an embedding model (BERT, bge, MiniLM …), "
                       "like llama-embedding")
    s.add_argument("file", metavar="MODEL")
    s.add_argument("-p", "--prompt", nargs="+", metavar="TEXT", help="the texts, one vector each (with --rerank: "
                   "the documents)")
    s.add_argument("-f", "--text-file", metavar="FILE", help="the texts, one per non-empty line")
    s.add_argument("--rerank", metavar="QUERY", help="a reranker (BERT cross-encoder or Qwen3-Reranker, rank pooling): "
                   "score each text as a document for QUERY (the head's scores as llama-server's /v1/rerank: raw, "
                   "or Qwen3-Reranker's P(yes))")
    s.add_argument("--pooling", choices=(*POOLINGS, RANK), default=None,
                   help="how the rows become one vector (default: the file's pooling_type); none: one per token; "
                   "rank: a reranker's head (with --rerank)")
    s.add_argument("--normalize", type=int, default=None, metavar="N", choices=range(-1, 100),
                   help="-1 none, 0 max-abs to int16 range, 1 taxicab, 2 Euclidean (default), N a p-norm "
                   "(llama-embedding's --embd-normalize)")
    out = s.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="JSON on stdout (OpenAI's list of embeddings)")
    out.add_argument("--npy", metavar="FILE", help="write a float32 .npy array, one row per text (pooling none: per "
                     "token of every text), to FILE ('-': stdout)")
    s.set_defaults(func=cmd_embed)
