"""``quantscope serve``: the model behind a local OpenAI-compatible HTTP server (quantscope.core.server)."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from collections.abc import Callable
from typing import Any

from .common import (
    MAX_CTX,
    MAX_THREADS,
    CLIError,
    add_cache_types,
    add_gpu_layers,
    add_speculative,
    cache_types,
    check_file,
    float_arg,
    int_arg,
    read_text_file,
    start_speculation,
)

#: the scheduler's DEFAULT_PREFILL_CHUNK and MAX_PREFILL_CHUNK (core/server/scheduler.py; not imported here: the
#: parser is built for every command, the engine loaded for this one only; tests/test_server_chunks.py checks both)
DEFAULT_PREFILL_CHUNK, MAX_PREFILL_CHUNK = 256, 1 << 20

#: seconds a model of several stays loaded unused (Ollama's default keep-alive: five minutes)
DEFAULT_IDLE = 300.0


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


def _size_arg(text: str) -> int:
    from quantscope.core.quant.target import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _pool(args: argparse.Namespace, key: str | None, allowed_hosts: tuple[str, ...],
          cors_origins: tuple[str, ...]) -> Any:
    """The models of --models and --library, as a pool (warnings said for the files that cannot be served)."""
    from quantscope.core.server import LoadOptions, ModelPool, ServerConfig, model_id_of
    from quantscope.core.server.models import find_offers, gguf_files, library_paths
    from quantscope.core.server.resources import available_memory, size_text

    options = LoadOptions(n_ctx=args.ctx, parallel=args.parallel, max_queue=args.max_queue, threads=args.threads,
                          backend=args.backend, gpu_layers=args.gpu_layers, repack=not args.no_repack,
                          prefill_chunk=args.prefill_chunk, cache_types=cache_types(args))
    try:
        named = [(model_id_of(p), p) for p in gguf_files(args.models or [])]
        offers, broken = find_offers(named, options)
        if args.library:
            more, more_broken = find_offers(library_paths(), options, unique=False)
            taken = {o.id for o in offers}
            offers += [o for o in more if o.id not in taken]
            broken |= {n: why for n, why in more_broken.items() if n not in taken}
    except ValueError as exc:
        raise CLIError(f"--models: {exc}") from None
    for name, why in broken.items():
        print(f"warning: not serving {name}: {why}", file=sys.stderr)
    if not offers:
        where = " ".join(args.models or []) + (" and the library" if args.library else "")
        raise CLIError(f"no model to serve in {where.strip()}")
    budget = args.max_memory if args.max_memory is not None else available_memory()
    for o in offers:
        if budget is not None and o.need > budget:
            print(f"warning: {o.id} needs {size_text(o.need)} with {args.parallel} slot(s) of {o.n_ctx:,} tokens, "
                  f"more than the {size_text(budget)} budget: requests for it will be refused", file=sys.stderr)
    config = ServerConfig("", key, host=args.host, allowed_hosts=allowed_hosts, cors_origins=cors_origins,
                          special_in_content=args.special_in_content)
    idle = DEFAULT_IDLE if args.idle_unload is None else args.idle_unload
    return ModelPool(offers, options, config, broken=broken, idle_unload=idle or None,
                     max_loaded=args.max_loaded, budget=budget, say=lambda line: print(line, file=sys.stderr))


def _serve_until_stopped(server: Any, host: str, open_to_all: bool, what: str) -> None:
    """Warn when ``host`` is reachable from other machines without a key, then serve until SIGINT/SIGTERM (open
    streams and queued requests are ended, not cut)."""
    if open_to_all:
        print(f"warning: listening on {host} without an API key: anyone who can reach this machine can use {what}",
              file=sys.stderr)
    server.serve_forever()


def _serve_pool(args: argparse.Namespace, key: str | None, allowed_hosts: tuple[str, ...],
                cors_origins: tuple[str, ...], loopback: bool, sock: Any) -> int:
    from quantscope.core.server import PoolServer
    from quantscope.core.server.resources import size_text

    pool = _pool(args, key, allowed_hosts, cors_origins)
    server = PoolServer(pool, sock=sock, timeout=args.timeout, max_connections=args.max_connections)
    n = len(pool.offers)
    idle = pool.idle_unload
    limits = [f"idle ones unloaded after {idle:g} s" if idle is not None else "kept until room is needed"]
    if args.max_loaded is not None:
        limits.append(f"at most {args.max_loaded} loaded")
    if pool.budget is not None:
        limits.append(f"within {size_text(pool.budget)}")
    print(f"serving {n} model{'s' if n != 1 else ''} ({', '.join(pool.offers)}) at {server.url}/v1, each loaded on "
          f"first use ({'; '.join(limits)}){' (API key required)' if key else ''}; Ctrl-C stops", file=sys.stderr)
    _serve_until_stopped(server, args.host, open_to_all=not loopback and not key, what="the models")
    print("quantscope: server stopped", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from quantscope.core.engine.cuda_library import CudaError
    from quantscope.core.server import Server, listen, model_id_of
    from quantscope.core.server.resources import NotEnoughMemory

    from .model import load_engine

    key = _api_key(args)
    if not args.host.strip():
        raise CLIError("--host: give the address to listen on (127.0.0.1: this machine only; 0.0.0.0: all)")
    allowed_hosts, cors_origins = _policy(args)
    several = bool(args.models) or args.library
    if several and args.file is not None:
        raise CLIError("give one MODEL, or --models/--library for several, not both")
    if not several:
        if args.file is None:
            raise CLIError("give the MODEL to serve, or --models DIR|FILE... (or --library) for several")
        for opt, v in (("--idle-unload", args.idle_unload), ("--max-loaded", args.max_loaded),
                       ("--max-memory", args.max_memory)):
            if v is not None:
                raise CLIError(f"{opt} is for several models (--models or --library)")
        check_file(args.file)
    elif args.draft or args.lookup:
        raise CLIError("--draft and --lookup are for serving one model, not with --models or --library")
    try:  # the port first: taken, it is said before the model loads
        sock = listen(args.host, args.port)
    except OSError as exc:
        raise CLIError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    loopback = is_loopback(sock.getsockname()[0])
    if several:
        try:
            if args.pooling:
                raise CLIError("--pooling is for serving one embedding model, not with --models or --library")
            if args.slot_save_path is not None:
                raise CLIError("--slot-save-path is for serving one model, not with --models or --library")
            return _serve_pool(args, key, allowed_hosts, cors_origins, loopback, sock)
        finally:
            sock.close()
    if _is_embedding(args.file):
        if args.slot_save_path is not None:
            sock.close()
            raise CLIError("--slot-save-path is for text generation models; this is an embedding model")
        if args.draft or args.lookup:
            sock.close()
            raise CLIError("--draft and --lookup are for text generation models; this is an embedding model")
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
        start_speculation(eng, args)
    except BaseException:
        sock.close()
        eng.close()
        raise
    try:
        try:
            server = Server(eng, model_id_of(args.file), host=args.host, parallel=args.parallel, api_key=key,
                            max_queue=args.max_queue, special_in_content=args.special_in_content, sock=sock,
                            allowed_hosts=allowed_hosts, cors_origins=cors_origins, timeout=args.timeout,
                            max_connections=args.max_connections, prefill_chunk=args.prefill_chunk,
                            slot_save_path=args.slot_save_path)
        except NotEnoughMemory as exc:
            raise CLIError(f"{exc}; lower --parallel or -c") from None
        except OSError as exc:  # (the one folder Server makes)
            if args.slot_save_path is None:
                raise
            raise CLIError(f"--slot-save-path {args.slot_save_path}: cannot make this folder: "
                           f"{exc.strerror or exc}") from None
        except MemoryError:
            raise CLIError(f"not enough memory for {args.parallel} slots of {eng.n_ctx} tokens; lower --parallel "
                           "or -c") from None
        except CudaError as exc:
            raise CLIError(f"cannot make {args.parallel} slots of {eng.n_ctx} tokens on the GPU: {exc}; lower "
                           "--parallel or -c, or use --backend cpu") from None
        print(f"serving {server.app.config.model_id} ({eng.model.config.arch}, context {eng.n_ctx}, "
              f"{args.parallel} slot{'s' if args.parallel > 1 else ''}) at {server.url}/v1"
              f"{' (API key required)' if key else ''}; Ctrl-C stops", file=sys.stderr)
        _serve_until_stopped(server, args.host, open_to_all=not loopback and not key, what="the model")
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
            what = (f"reranker, rank pooling) at {server.url}/v1/rerank" if enc.pooling == "rank" else
                    f"embedding model, {enc.pooling} pooling, {enc.n_embd} dimensions) at {server.url}/v1/embeddings")
            print(f"serving {server.app.config.model_id} ({enc.config.arch} {what}"
                  f"{' (API key required)' if key else ''}; Ctrl-C stops", file=sys.stderr)
            _serve_until_stopped(server, args.host, open_to_all=not loopback and not key, what="the model")
            print("quantscope: server stopped", file=sys.stderr)
    finally:
        sock.close()
    return 0


def register(sub: Any) -> None:
    """Add ``serve`` to ``sub``."""
    s = sub.add_parser("serve", help="serve the model over a local OpenAI-compatible HTTP API")
    s.add_argument("file", metavar="MODEL", nargs="?", help="the model to serve (or --models for several)")
    m = s.add_argument_group("several models", "serve several models, each loaded when a request names it (the "
                             "'model' field: the name /v1/models lists, the file's name without .gguf)")
    m.add_argument("--models", nargs="+", action="extend", metavar="DIR|FILE",
                   help="the GGUF files to offer: files, and folders (their *.gguf files, subfolders included)")
    m.add_argument("--library", action="store_true",
                   help="also offer every model of the Library (the Hugging Face cache, LM Studio, Ollama, "
                   "llama.cpp's cache and the folders added in the Library view); Ollama's by name:tag")
    m.add_argument("--idle-unload", type=float_arg(0, 1e7), default=None, metavar="SECONDS",
                   help=f"unload a model unused this long (default {DEFAULT_IDLE:g}; 0: only when its room is needed)")
    m.add_argument("--max-loaded", type=int_arg(1, 1024), default=None, metavar="N",
                   help="models loaded at once; loading another unloads the least recently used idle one "
                   "(default: as many as --max-memory holds)")
    m.add_argument("--max-memory", type=_size_arg, default=None, metavar="SIZE",
                   help="memory the loaded models may take by their memory plans (weights and each slot's KV "
                   "cache), e.g. 12G; loading another unloads the least recently used idle ones first "
                   "(default: the memory available when the server starts)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int_arg(0, 65535), default=8080, help="port (default 8080; 0: any free port)")
    s.add_argument("-np", "--parallel", type=int_arg(1, 64), default=1,
                   help="requests served at once, each in its own slot with the full context (default 1)")
    s.add_argument("--max-queue", type=int_arg(0, 65536), default=64,
                   help="requests that may wait for a slot; beyond, 503 with Retry-After (default 64)")
    s.add_argument("-c", "--ctx", type=int_arg(16, MAX_CTX), default=4096, help="context size of each slot")
    s.add_argument("--prefill-chunk", type=int_arg(0, MAX_PREFILL_CHUNK), default=DEFAULT_PREFILL_CHUNK, metavar="N",
                   help="prompt tokens read per step while other slots generate, so a long prompt delays their "
                   f"next tokens by one chunk, not by the whole prompt (default {DEFAULT_PREFILL_CHUNK}; 0: each "
                   "prompt is read whole before the other slots go on)")
    s.add_argument("--slot-save-path", metavar="DIR", default=None,
                   help="let POST /slots/ID?action=save|restore|erase write and read slot cache files in DIR "
                   "(file names only; without this option the endpoint is refused)")
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
    add_cache_types(s)
    s.add_argument("--special-in-content", action="store_true",
                   help="read control tokens' texts (<|im_end|>) in chat messages and tool descriptions as control "
                   "tokens, as llama-server does (default: as text; only the chat template's markup is special)")
    s.add_argument("--no-repack", action="store_true",
                   help="keep the weights mapped from the file (zero-copy) instead of repacking them for the CPU")
    s.add_argument("--pooling", choices=("none", "mean", "cls", "last", "rank"), default=None,
                   help="embedding models: how a text's rows become its vector (default: the file's pooling_type); "
                   "rank: a reranker (BERT cross-encoder, Qwen3-Reranker) served on /v1/rerank")
    add_speculative(s)
    s.set_defaults(func=cmd_serve)
