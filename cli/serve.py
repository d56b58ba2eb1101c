"""``quantscope serve``: the model behind a local OpenAI-compatible HTTP server (quantscope.core.server)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import MAX_CTX, MAX_THREADS, CLIError, add_gpu_layers, int_arg, read_text_file

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _api_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file is not None:
        key = read_text_file(args.api_key_file, "--api-key-file").strip()
        if not key:
            raise CLIError(f"--api-key-file: {args.api_key_file} is empty")
    else:
        key = args.api_key
    if key is not None and (not key or any(c.isspace() for c in key) or not key.isprintable()):
        raise CLIError("the API key must be printable text without spaces")
    return key


def cmd_serve(args: argparse.Namespace) -> int:
    from quantscope.core.engine.cuda_backend import CudaError
    from quantscope.core.server import Server, model_id_of
    from quantscope.core.server.resources import NotEnoughMemory

    from .model import load_engine

    key = _api_key(args)
    eng = load_engine(args, args.ctx)
    try:
        try:
            server = Server(eng, model_id_of(args.file), host=args.host, port=args.port, parallel=args.parallel,
                            api_key=key, max_queue=args.max_queue, special_in_content=args.special_in_content)
        except OSError as exc:
            raise CLIError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
        except NotEnoughMemory as exc:
            raise CLIError(f"{exc}; lower --parallel or -c") from None
        except MemoryError:
            raise CLIError(f"not enough memory for {args.parallel} slots of {eng.n_ctx} tokens; lower --parallel "
                           "or -c") from None
        except CudaError as exc:
            raise CLIError(f"cannot make {args.parallel} slots of {eng.n_ctx} tokens on the GPU: {exc}; lower "
                           "--parallel or -c, or use --backend cpu") from None
        print(f"serving {server.app.config.model_id} ({eng.model.config.arch}, context {eng.n_ctx}, "
              f"{args.parallel} slot{'s' if args.parallel > 1 else ''}) at {server.url}/v1"
              f"{' (API key required)' if key else ''}; Ctrl-C stops", file=sys.stderr)
        if args.host not in LOOPBACK and not key:
            print(f"warning: listening on {args.host} without an API key: anyone who can reach this machine can "
                  "use the model", file=sys.stderr)
        try:
            server.serve_forever()
        except KeyboardInterrupt:  # uvicorn shut down gracefully, then passed Ctrl-C on
            pass
        print("quantscope: server stopped", file=sys.stderr)
    finally:
        eng.close()
    return 0


def register(sub: Any) -> None:
    """Add ``serve`` to ``sub``."""
    s = sub.add_parser("serve", help="serve the model over a local OpenAI-compatible HTTP API")
    s.add_argument("file", metavar="MODEL")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int_arg(0, 65535), default=8080, help="port (default 8080; 0: any free port)")
    s.add_argument("-np", "--parallel", type=int_arg(1, 64), default=1,
                   help="requests served at once, each in its own slot with the full context (default 1)")
    s.add_argument("--max-queue", type=int_arg(0, 65536), default=64,
                   help="requests that may wait for a slot; beyond, 503 with Retry-After (default 64)")
    s.add_argument("-c", "--ctx", type=int_arg(16, MAX_CTX), default=4096, help="context size of each slot")
    k = s.add_mutually_exclusive_group()
    k.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (visible to other users in ps: "
                   "prefer --api-key-file)")
    k.add_argument("--api-key-file", metavar="F", help="read the API key from file F")
    s.add_argument("-t", "--threads", type=int_arg(0, MAX_THREADS), default=0, help="0 = one per core")
    s.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    add_gpu_layers(s)
    s.add_argument("--special-in-content", action="store_true",
                   help="read control tokens' texts (<|im_end|>) in chat messages and tool descriptions as control "
                   "tokens, as llama-server does (default: as text; only the chat template's markup is special)")
    s.add_argument("--no-repack", action="store_true",
                   help="keep the weights mapped from the file (zero-copy) instead of repacking them for the CPU")
    s.set_defaults(func=cmd_serve)
