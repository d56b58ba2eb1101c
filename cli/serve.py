"""``quantscope serve``: the model behind a local OpenAI-compatible HTTP server (quantscope.core.server)."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from collections.abc import Callable
from typing import Any

from .common import MAX_CTX, MAX_THREADS, CLIError, add_gpu_layers, check_file, float_arg, int_arg, read_text_file


def _api_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file is not None:
        key = read_text_file(args.api_key_file, "--api-key-file").strip()
        if not key:
            raise CLIError(f"--api-key-file: {args.api_key_file} is empty")
    else:
        key = args.api_key
    if key is not None and (not key or not all("!" <= c <= "~" for c in key)):
        raise CLIError("the API key must be printable ASCII without spaces (clients send it in an HTTP header)")
    return key


def is_loopback(address: str) -> bool:
    """Whether the bound ``address`` (an IP address) is this machine only: 127.0.0.0/8, ::1 or their IPv4-mapped
    forms."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _policy(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """--allowed-host and --cors-origin, checked and in their normal forms."""
    from quantscope.core.server.policy import host_name, normal_origin

    def normal(values: list[str] | None, norm: Callable[[str], str | None], what: str) -> tuple[str, ...]:
        out = []
        for v in values or []:
            n = norm(v)
            if n is None:
                raise CLIError(what.format(v=v))
            out.append(n)
        return tuple(out)

    return (normal(args.allowed_host, host_name, "--allowed-host: {v!r} is not a host name (e.g. llm.example.org)"),
            normal(args.cors_origin, normal_origin,
                   "--cors-origin: {v!r} is not an origin (scheme://host[:port], e.g. http://localhost:3000)"))


def cmd_serve(args: argparse.Namespace) -> int:
    from quantscope.core.engine.cuda_library import CudaError
    from quantscope.core.server import Server, listen, model_id_of
    from quantscope.core.server.resources import NotEnoughMemory

    from .model import load_engine

    key = _api_key(args)
    if not args.host.strip():
        raise CLIError("--host: give the address to listen on (127.0.0.1: this machine only; 0.0.0.0: all)")
    allowed_hosts, cors_origins = _policy(args)
    check_file(args.file)
    try:  # the port first: taken, it is said before the model loads
        sock = listen(args.host, args.port)
    except OSError as exc:
        raise CLIError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    loopback = is_loopback(sock.getsockname()[0])
    if _is_embedding(args.file):
        return _serve_embeddings(args, sock, key, loopback, allowed_hosts, cors_origins)
    if args.pooling:
        sock.close()
        raise CLIError("--pooling is for embedding models; this is a text generation model")
    try:
        eng = load_engine(args, args.ctx)
    except BaseException:
        sock.close()
        raise
    try:
        try:
            server = Server(eng, model_id_of(args.file), host=args.host, parallel=args.parallel, api_key=key,
                            max_queue=args.max_queue, special_in_content=args.special_in_content, sock=sock,
                            allowed_hosts=allowed_hosts, cors_origins=cors_origins, timeout=args.timeout,
                            max_connections=args.max_connections)
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
        if not loopback and not key:
            print(f"warning: listening on {args.host} without an API key: anyone who can reach this machine can "
                  "use the model", file=sys.stderr)
        server.serve_forever()  # until SIGINT/SIGTERM: open streams and queued requests are ended, not cut
        print("quantscope: server stopped", file=sys.stderr)
    finally:
        sock.close()
        eng.close()
    return 0


def _is_embedding(path: str) -> bool:
    from quantscope.core.engine.encoder import is_embedding_file
    from quantscope.core.gguf import GGUFError, GGUFFile

    try:
        with GGUFFile(path) as f:
            return is_embedding_file(f)
    except (GGUFError, OSError):
        return False  # the engine's loader says what is wrong with it


def _serve_embeddings(args: argparse.Namespace, sock: Any, key: str | None, loopback: bool,
                      allowed_hosts: tuple[str, ...], cors_origins: tuple[str, ...]) -> int:
    """``serve`` of an embedding model: /v1/embeddings (quantscope.core.server.embeddings)."""
    from quantscope.core.engine.encoder import EmbedError, Encoder
    from quantscope.core.model import UnsupportedModel
    from quantscope.core.server import EmbeddingServer, model_id_of

    try:
        if args.backend == "cuda" or args.gpu_layers:
            raise CLIError("embedding models run on the CPU: drop --backend cuda / GPU layers")
        try:
            enc = Encoder(args.file, pooling=args.pooling)
        except (EmbedError, UnsupportedModel) as exc:
            raise CLIError(f"{args.file}: {exc}") from None
        with enc:
            server = EmbeddingServer(enc, model_id_of(args.file), host=args.host, api_key=key, sock=sock,
                                     allowed_hosts=allowed_hosts, cors_origins=cors_origins, timeout=args.timeout,
                                     max_connections=args.max_connections)
            print(f"serving {server.app.config.model_id} ({enc.config.arch} embedding model, {enc.pooling} "
                  f"pooling, {enc.n_embd} dimensions) at {server.url}/v1/embeddings"
                  f"{' (API key required)' if key else ''}; Ctrl-C stops", file=sys.stderr)
            if not loopback and not key:
                print(f"warning: listening on {args.host} without an API key: anyone who can reach this machine "
                      "can use the model", file=sys.stderr)
            server.serve_forever()
            print("quantscope: server stopped", file=sys.stderr)
    finally:
        sock.close()
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
    s.add_argument("--allowed-host", action="append", metavar="NAME",
                   help="also answer requests whose Host header is NAME (a reverse proxy's name; repeatable). "
                   "Always answered: localhost, 127.0.0.1, [::1], the --host address and the address a request "
                   "came in on; any other Host is refused (421), against DNS rebinding")
    s.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                   help="let web pages from ORIGIN (scheme://host[:port]) call the API: CORS headers and preflights "
                   "for it (repeatable). Requests with any other Origin header are refused (403)")
    s.add_argument("--timeout", type=float_arg(0, 86400, lo_open=True), default=30.0, metavar="SECONDS",
                   help="a request must arrive whole (headers and body) within this many seconds of its "
                   "connection opening or of the previous reply, else the connection is closed (default 30)")
    s.add_argument("--max-connections", type=int_arg(1, 1 << 16), default=None, metavar="N",
                   help="open connections at most; beyond, the one waiting longest for its client is closed "
                   "(default: what the open-file limit leaves room for, at most 1024)")
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
    s.add_argument("--pooling", choices=("none", "mean", "cls", "last"), default=None,
                   help="embedding models: how a text's rows become its vector (default: the file's pooling_type)")
    s.set_defaults(func=cmd_serve)
