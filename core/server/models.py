"""Several models behind one server, each loaded on first use (``quantscope serve --models DIR|FILE…``).

:func:`find_offers` turns files and folders (and the library's list, :func:`library_paths`) into the models the
server offers (:class:`Offer`: an API name, a file, its memory plan and its ``/api/tags`` row), read from their
headers only. :class:`ModelPool` loads an offer when a request names it (one load at a time; requests for a model
being loaded wait for it), counts the requests using each loaded model, unloads a model idle for ``idle_unload``
seconds, and makes room for another by unloading the least recently used idle ones when the loaded models would
exceed ``max_loaded`` or the memory ``budget`` (bytes, by :func:`~quantscope.core.model.memory.memory_plan`: the
weights and every slot's KV cache). A model in use is never unloaded: a load that needs its room waits for it.

:class:`PoolApp` is the ASGI application in front: it answers the listings (``/v1/models``, ``/api/tags``,
``/api/ps``, ``/health``, ``/metrics``) itself, and hands every other request, by the ``model`` its body names, to
that model's own :class:`~.app.ServerApp` (the same endpoints, checks and reply paths as a one-model server); the
key and the body's type, size and JSON are checked before any model loads. An unknown model is a 404 and a model
that fails to load a 500, each in the dialect of the request's path; the other models keep serving.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..gguf import GGUFError, GGUFFile
from ..model.memory import memory_plan
from .app import OPEN_PATHS, ServerApp, ServerConfig, StatusCounts, check_json_type, check_key, read_body
from .errors import ApiError, bad_request, dialect_of, error_body
from .ollama import OLLAMA_VERSION, model_entry
from .policy import Policy
from .protocol import parse_json
from .resources import size_text
from .scheduler import DEFAULT_PREFILL_CHUNK, Scheduler

#: the POST endpoints of a model's :class:`~.app.ServerApp` that a pool hands on by the body's ``model``
MODEL_PATHS = frozenset({
    "/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/v1/embeddings", "/embeddings",
    "/infill", "/tokenize", "/detokenize", "/api/show", "/api/chat", "/api/generate", "/api/embed", "/api/embeddings",
    "/v1/messages", "/v1/messages/count_tokens"})
_LATER_SHARD = re.compile(r"-(?!00001-)\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


def model_id_of(path: str | Path) -> str:
    """The model's name in the API: its file name without ``.gguf``."""
    name = Path(path).name
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


@dataclass(frozen=True)
class LoadOptions:
    """How every model of a pool is loaded and served: each slot's context, the slots, the queue, the engine's
    threads, backend, GPU layers, weight repacking and the prompt chunk (as ``quantscope serve`` takes them for one
    model)."""

    n_ctx: int = 4096
    parallel: int = 1
    max_queue: int = 64
    threads: int = 0
    backend: str = "auto"
    gpu_layers: int | None = None
    repack: bool = True
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK  # prompt tokens per step (core/server/scheduler.py)
    cache_types: tuple[str, str] = ("f16", "f16")  # the KV cache's K and V types (llama.cpp's -ctk / -ctv)


@dataclass(frozen=True)
class Offer:
    """A model the server can load: its API name, its file, the bytes it takes loaded (weights plus the slots' KV
    caches, by the memory plan), its context when loaded, its architecture and its ``/api/tags`` row."""

    id: str
    path: Path
    need: int
    n_ctx: int
    arch: str
    tag: dict[str, Any] = field(compare=False)


def _offer(model_id: str, path: Path, options: LoadOptions) -> Offer:
    """``path``'s offer, from its header (``GGUFError`` or ``OSError`` when it cannot be read)."""
    with GGUFFile(path) as f:
        trained = memory_plan(f).context
        n_ctx = min(options.n_ctx, trained) if trained else options.n_ctx
        plan = memory_plan(f, n_ctx, options.cache_types[0].upper(), options.cache_types[1].upper())
        need = plan.weights_bytes + options.parallel * (plan.kv_bytes + plan.state_bytes)
        return Offer(model_id, path, need, n_ctx, f.architecture or "unknown", model_entry(model_id, f))


def gguf_files(sources: Iterable[str | Path]) -> list[Path]:
    """The GGUF files of ``sources``: each file as given, each folder's ``*.gguf`` files (in its subfolders too,
    a split set by its first shard), in order; ``ValueError`` naming a source that is neither."""
    out: list[Path] = []
    for s in sources:
        p = Path(s)
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.suffix.lower() == ".gguf" and f.is_file()
                              and not _LATER_SHARD.search(f.name)))
        elif p.is_file():
            out.append(p)
        else:
            raise ValueError(f"{s}: no such file or folder")
    return out


def library_paths(places: Iterable[Any] | None = None, cache: Path | None = None) -> list[tuple[str, Path]]:
    """The library's models (:func:`quantscope.core.library.scan` of ``places``, default the Hugging Face cache,
    LM Studio, Ollama, … and the folders added in the Library view; ``cache``: its scan cache) as (name, file):
    Ollama's by their ``name:tag``, the others by their file's name; rows whose header could not be read are
    left out."""
    from ..library import scan

    return [(e.name if e.source == "ollama" else model_id_of(e.path), Path(e.path))
            for e in scan(places, cache=cache) if e.problem is None]


def find_offers(named: Iterable[tuple[str, Path]], options: LoadOptions,
                unique: bool = True) -> tuple[list[Offer], dict[str, str]]:
    """The offers of ``named`` (API name, file) with the reason for each file whose header cannot be read (by
    name). Two files with one name: ``ValueError`` when ``unique``, else the first one is kept."""
    offers: dict[str, Offer] = {}
    broken: dict[str, str] = {}
    where: dict[str, Path] = {}
    for name, path in named:
        if name in where:
            if unique and where[name].resolve() != path.resolve():
                raise ValueError(f"two models are named {name!r}: {where[name]} and {path}")
            continue
        where[name] = path
        try:
            offers[name] = _offer(name, path, options)
        except (GGUFError, OSError, ValueError, OverflowError) as exc:
            broken[name] = f"{path.name} is not a readable GGUF file: {str(exc).splitlines()[0] if str(exc) else exc!r}"
    return list(offers.values()), broken


_UNSET = object()
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(v: Any) -> float | object | None:
    """Ollama's ``keep_alive``: how long the model stays loaded unused after the request, in seconds (a number
    of seconds or a duration such as ``"5m"``, ``"1h30m"``, ``"0"``: unloaded at once); None for a negative one
    (for ever); ``_UNSET`` for anything else (the server's ``--idle-unload``)."""
    if isinstance(v, bool) or v is None:
        return _UNSET
    if isinstance(v, (int, float)):
        seconds = float(v)
    elif isinstance(v, str) and len(v) <= 32:
        text = v.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        text = text.lstrip("+-")
        try:
            seconds = sign * float(text)  # a bare number: seconds
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                return _UNSET
            seconds = sign * sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        return _UNSET
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return _UNSET
    return None if seconds < 0 else min(seconds, 1e9)


class Loaded:
    """A model in the pool: loading (``ready`` not done) or loaded (``app`` set); ``users`` counts the requests
    holding it (those waiting for its load too), ``last_used`` (monotonic seconds) orders the unloading."""

    def __init__(self, offer: Offer, ready: asyncio.Future[ServerApp]) -> None:
        self.offer = offer
        self.ready = ready
        self.app: ServerApp | None = None
        self.users = 0
        self.last_used = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None
        #: seconds to stay loaded unused, as the last request's Ollama ``keep_alive`` asked (None: for ever);
        #: unset: the pool's ``idle_unload``
        self.keep: float | object | None = _UNSET


class ModelPool:
    """The models ``offers`` loaded on demand (see the module's docstring). ``config``: each model's server
    configuration (its ``model_id`` replaced by the offer's); ``broken``: names of files that cannot be served,
    with the reason a request for them is told; ``idle_unload``: seconds a model stays loaded unused (None:
    until its room is needed); ``max_loaded``: models loaded at once (None: as many as the budget holds);
    ``budget``: bytes of memory the loaded models may take by their memory plans (None: no limit); ``say``:
    told a line for each load, unload and failed load (``quantscope serve`` prints them)."""

    def __init__(self, offers: Iterable[Offer], options: LoadOptions, config: ServerConfig, *,
                 broken: dict[str, str] | None = None, idle_unload: float | None = 300.0,
                 max_loaded: int | None = None, budget: int | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.say = say or (lambda _line: None)
        self.offers = {o.id: o for o in offers}
        self.options = options
        self.config = config
        self.broken = dict(broken or {})
        self.idle_unload = idle_unload
        self.max_loaded = max_loaded
        self.budget = budget
        #: the models loading or loaded, least recently used first
        self.loaded: dict[str, Loaded] = {}
        self.loads = 0
        self.unloads = 0
        self.load_failures = 0
        self.stopping = False
        #: the model whose load waits for a model in use to be released (its room is taken), else None
        self.waiting_for_room: str | None = None
        self._lock: asyncio.Lock | None = None
        self._freed: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ names
    def resolve(self, name: str, dialect: str) -> Offer:
        """The offer named ``name`` (Ollama's ``:latest`` tag optional), else a 404 that lists the names."""
        for n in (name, name.removesuffix(":latest"), name + ":latest"):
            if n in self.offers:
                return self.offers[n]
        if name in self.broken:
            raise ApiError(404, f"the model {name!r} cannot be served: {self.broken[name]}", param="model",
                           code="model_not_found")
        names = ", ".join(repr(n) for n in self.offers) or "none"
        raise ApiError(404, f"the model {name!r} does not exist: this server serves {names}", param="model",
                       code="model_not_found")

    # ------------------------------------------------------------------ loading and unloading
    async def acquire(self, offer: Offer) -> Loaded:
        """``offer`` loaded (its server in ``app``), loading it first when it is not loaded (waiting for a load
        under way, and for the room it needs); hold it until :meth:`release`. A failed load raises its
        :class:`ApiError`."""
        if self.stopping:
            raise ApiError(503, "the server is shutting down", code="server_shutting_down")
        e = self.loaded.get(offer.id)
        if e is None:
            e = Loaded(offer, asyncio.get_running_loop().create_future())
            e.ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # told to the waiters, not logged
            self.loaded[offer.id] = e
            self._spawn(self._load(e))
        e.users += 1
        if e.timer is not None:
            e.timer.cancel()
            e.timer = None
        try:
            await asyncio.shield(e.ready)
        except BaseException:
            self.release(e)
            raise
        self.loaded[offer.id] = self.loaded.pop(offer.id)  # the most recently used last
        return e

    def release(self, e: Loaded) -> None:
        """A request done with ``e``: idle now, it unloads after ``idle_unload`` seconds unless used again."""
        e.users -= 1
        e.last_used = time.monotonic()
        if not e.users and e.app is not None:
            self._idle(e)

    def _idle(self, e: Loaded) -> None:
        self._locks()[1].set()
        keep = self.idle_unload if e.keep is _UNSET else e.keep
        if isinstance(keep, (int, float)) and not self.stopping:
            e.timer = asyncio.get_running_loop().call_later(keep, lambda: self._spawn(self._expire(e)))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _locks(self) -> tuple[asyncio.Lock, asyncio.Event]:
        if self._lock is None or self._freed is None:  # made in the server's event loop, on first use
            self._lock, self._freed = asyncio.Lock(), asyncio.Event()
        return self._lock, self._freed

    def _resident(self, but: Loaded) -> list[Loaded]:
        return [x for x in self.loaded.values() if x is not but and x.app is not None]

    def _room_problem(self, e: Loaded) -> str | None:
        """Why ``e`` can never be loaded here (it alone exceeds the budget), else None."""
        if self.budget is not None and e.offer.need > self.budget:
            return (f"the model {e.offer.id!r} needs {size_text(e.offer.need)} ({self.options.parallel} slot(s) of "
                    f"{e.offer.n_ctx:,} tokens) but the memory budget is {size_text(self.budget)}")
        return None

    def _fits(self, e: Loaded) -> bool:
        resident = self._resident(e)
        if self.max_loaded is not None and len(resident) >= self.max_loaded:
            return False
        return self.budget is None or sum(x.offer.need for x in resident) + e.offer.need <= self.budget

    async def _load(self, e: Loaded) -> None:
        lock, freed = self._locks()
        try:
            async with lock:
                problem = self._room_problem(e)
                if problem is not None:
                    raise ApiError(503, problem, param="model", code="model_too_large")
                while not self._fits(e):
                    idle = [x for x in self._resident(e) if x.users == 0]
                    if idle:
                        await self._unload(idle[0], f"room for {e.offer.id}")
                        continue
                    freed.clear()  # every loaded model is in use: wait until one is released
                    self.waiting_for_room = e.offer.id
                    try:
                        await freed.wait()
                    finally:
                        self.waiting_for_room = None
                    if self.stopping:
                        raise ApiError(503, "the server is shutting down", code="server_shutting_down")
                t0 = time.monotonic()
                app = await asyncio.get_running_loop().run_in_executor(None, self._open, e.offer)
                if self.stopping:
                    await asyncio.get_running_loop().run_in_executor(None, _close, app)
                    raise ApiError(503, "the server is shutting down", code="server_shutting_down")
                e.app = app
                self.loads += 1
                self.say(f"loaded {e.offer.id} in {time.monotonic() - t0:.1f} s ({app.engine.backend}, context "
                         f"{app.engine.n_ctx}, {size_text(e.offer.need)} planned)")
                e.ready.set_result(app)
                if not e.users:  # its requests gave up waiting: idle from now
                    self._idle(e)
        except ApiError as exc:
            if exc.status == 500:
                self.load_failures += 1
            self.say(f"not loaded: {exc.message}")
            if self.loaded.get(e.offer.id) is e:
                del self.loaded[e.offer.id]
            e.ready.set_exception(exc)
        except BaseException as exc:
            if self.loaded.get(e.offer.id) is e:
                del self.loaded[e.offer.id]
            e.ready.set_exception(ApiError(500, f"cannot load {e.offer.id!r}: {exc}", code="model_load_failed"))
            if not isinstance(exc, Exception):
                raise

    def _open(self, offer: Offer) -> ServerApp:
        """``offer`` loaded, its scheduler started (on a worker thread); a failure is one line in an ApiError."""
        from ..engine.generate import Engine

        o = self.options
        eng = None
        try:
            eng = Engine(offer.path, n_ctx=o.n_ctx, threads=o.threads, backend=o.backend, repack=o.repack,
                         gpu_layers=o.gpu_layers, cache_types=o.cache_types)
            sched = Scheduler(eng, o.parallel, o.max_queue, prefill_chunk=o.prefill_chunk)
            app = ServerApp(eng, sched, replace(self.config, model_id=offer.id), slot_routes=False)
        except Exception as exc:  # a bad file, an unsupported model, no memory, the GPU: said, the rest serve on
            if eng is not None:
                eng.close()
            line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ApiError(500, f"cannot load {offer.id!r} ({offer.path.name}): {line}",
                           code="model_load_failed") from None
        sched.start()
        return app

    async def _unload(self, e: Loaded, why: str) -> None:
        """Unload ``e`` (idle; the load lock held) for the reason ``why``."""
        if self.loaded.get(e.offer.id) is e:
            del self.loaded[e.offer.id]
        if e.timer is not None:
            e.timer.cancel()
        app, e.app = e.app, None
        if app is not None:
            await asyncio.get_running_loop().run_in_executor(None, _close, app)
            self.unloads += 1
            self.say(f"unloaded {e.offer.id} ({why})")

    async def unload(self, offer: Offer) -> None:
        """Unload ``offer`` now if it is loaded and idle; in use (or loading), once its requests are done."""
        e = self.loaded.get(offer.id)
        if e is None:
            return
        e.keep = 0.0
        if e.app is not None and not e.users:
            async with self._locks()[0]:
                if e.users == 0 and e.app is not None and self.loaded.get(offer.id) is e:
                    await self._unload(e, "asked")

    async def _expire(self, e: Loaded) -> None:
        lock, _freed = self._locks()
        async with lock:
            if e.users == 0 and e.app is not None and self.loaded.get(e.offer.id) is e:
                await self._unload(e, "idle")

    # ------------------------------------------------------------------ stopping
    def stop(self) -> None:
        """Refuse new requests and end the running ones (streams with an error event, queued ones with a 503)."""
        self.stopping = True
        for e in list(self.loaded.values()):
            if e.app is not None:
                e.app.scheduler.stop(wait=False)
        if self._freed is not None:
            self._freed.set()

    def close(self) -> None:
        """Stop every model's scheduler and close its engine (after the server stopped)."""
        self.stopping = True
        for e in list(self.loaded.values()):
            if e.timer is not None:
                e.timer.cancel()
            if e.app is not None:
                _close(e.app)
                e.app = None
        self.loaded.clear()


def _close(app: ServerApp) -> None:
    app.scheduler.stop()
    app.engine.close()


class PoolApp(StatusCounts):
    """The ASGI application of a pool (see the module's docstring), behind the Host/Origin/CORS rules of
    ``pool.config``."""

    def __init__(self, pool: ModelPool) -> None:
        self.pool = pool
        self.config = pool.config
        self.created = int(time.time())
        self.http_requests: dict[int, int] = {}
        w = self._wrap
        routes = [
            Route("/v1/models", w(self.models), methods=["GET"]),
            Route("/models", w(self.models), methods=["GET"]),
            Route("/api/tags", w(self.tags), methods=["GET", "HEAD"]),
            Route("/api/ps", w(self.ps), methods=["GET"]),
            Route("/api/version", w(self.version), methods=["GET", "HEAD"]),
            Route("/", w(self.root), methods=["GET", "HEAD"]),
            Route("/health", w(self.health), methods=["GET"]),
            Route("/metrics", w(self.metrics), methods=["GET"]),
        ]

        async def http_error(request: Request, exc: Exception) -> Response:
            status = exc.status_code if isinstance(exc, HTTPException) else 500
            what = {404: f"no such endpoint: {request.url.path}",
                    405: f"{request.method} is not allowed on {request.url.path}"}.get(status, "request failed")
            return self._count(_error(ApiError(status, what), request.url.path))

        self.front = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
        self.front.router.redirect_slashes = False
        #: the ASGI application served
        self.asgi = Policy(self._route, self.config.host, self.config.allowed_hosts, self.config.cors_origins,
                           count=self._count_status)

    # ------------------------------------------------------------------ plumbing
    def _wrap(self, fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            try:
                if request.url.path not in OPEN_PATHS:
                    check_key(request, self.config.api_key)
                return self._count(await fn(request))
            except ApiError as exc:
                return self._count(_error(exc, request.url.path))

        return handler

    async def _route(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in MODEL_PATHS:
            await self._dispatch(scope, receive, send)
        else:
            await self.front(scope, receive, send)

    async def _dispatch(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        """A request for a model: the key checked, the body read, the model it names held (loaded first if
        need be) while its own server answers the request, the body replayed to it."""
        request = Request(scope, receive)
        path = scope["path"]
        try:
            check_key(request, self.config.api_key)
            check_json_type(request)
            body = await read_body(request, self.config.max_body)
            d = parse_json(body)
            offer, keep = self._offer_of(d, path)
            if keep == 0 and path in ("/api/generate", "/api/chat") and not d.get("prompt") and not d.get("messages"):
                await self.pool.unload(offer)  # Ollama's "unload the model" (`ollama stop`): nothing to load
                key = "message" if path == "/api/chat" else "response"
                await self._count(JSONResponse({
                    "model": offer.id, "created_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                    key: {"role": "assistant", "content": ""} if key == "message" else "", "done": True,
                    "done_reason": "unload"}))(scope, receive, send)
                return
            for field_ in ("model", "name"):  # named without its :latest or with one it lacks: the name it has
                if isinstance(d.get(field_), str) and d[field_] != offer.id:
                    d[field_] = offer.id
                    body = json.dumps(d, ensure_ascii=False).encode()
            held = await self.pool.acquire(offer)
        except ApiError as exc:
            await self._count(_error(exc, path))(scope, receive, send)
            return
        assert held.app is not None
        if keep is not _UNSET:
            held.keep = keep
        sent = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # the disconnect a reply watches for

        try:
            await held.app.app(scope, replay, send)
        finally:
            self.pool.release(held)

    def _offer_of(self, d: dict[str, Any], path: str) -> tuple[Offer, float | object | None]:
        """The offer the body ``d`` names in ``model`` (Ollama's old clients: ``name``; none named: the only
        one), and its Ollama ``keep_alive`` (:func:`keep_alive_seconds`)."""
        name = d.get("model")
        keep: float | object | None = _UNSET
        if dialect_of(path) == "ollama":
            name = d.get("name") if name is None else name
            keep = keep_alive_seconds(d.get("keep_alive"))
        if isinstance(name, str) and name:
            return self.pool.resolve(name, dialect_of(path)), keep
        if len(self.pool.offers) == 1:  # its own server says what else is wrong with the request
            return next(iter(self.pool.offers.values())), keep
        names = ", ".join(repr(n) for n in self.pool.offers)
        raise bad_request(f"name the model: this server serves {names}", "model", "model_required")

    # ------------------------------------------------------------------ endpoints
    async def models(self, request: Request) -> Response:
        data = []
        for o in self.pool.offers.values():
            e = self.pool.loaded.get(o.id)
            data.append({"id": o.id, "object": "model", "created": self.created, "owned_by": "quantscope",
                         "meta": {"arch": o.arch, "n_ctx": o.n_ctx, "size": o.tag["size"], "memory": o.need,
                                  "loaded": e is not None and e.app is not None}})
        return JSONResponse({"object": "list", "data": data})

    async def tags(self, request: Request) -> Response:
        return JSONResponse({"models": [o.tag for o in self.pool.offers.values()]})

    async def ps(self, request: Request) -> Response:
        out = []
        for e in self.pool.loaded.values():
            if e.app is None:
                continue
            eng = e.app.engine
            keep = self.pool.idle_unload if e.keep is _UNSET else e.keep
            left = e.last_used + keep - time.monotonic() if isinstance(keep, (int, float)) else None
            until = (datetime.fromtimestamp(time.time() + max(0.0, left), UTC) if left is not None and not e.users
                     else datetime(2318, 1, 1, tzinfo=UTC))
            out.append(e.offer.tag | {"size": e.offer.need, "size_vram": e.offer.need if eng.backend != "cpu" else 0,
                                      "context_length": eng.n_ctx,
                                      "expires_at": until.isoformat().replace("+00:00", "Z")})
        return JSONResponse({"models": out})

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION})

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def health(self, request: Request) -> Response:
        failed = [(e.offer.id, e.app.scheduler.failure) for e in self.pool.loaded.values()
                  if e.app is not None and e.app.scheduler.failure is not None]
        if failed:
            return JSONResponse({"status": "error", "error": f"{failed[0][0]}: {failed[0][1]}"}, status_code=500)
        return JSONResponse({"status": "ok", "models": len(self.pool.offers),
                             "loaded": [e.offer.id for e in self.pool.loaded.values() if e.app is not None],
                             "loading": {e.offer.id: e.users for e in self.pool.loaded.values() if e.app is None},
                             "waiting_for_room": self.pool.waiting_for_room})

    async def metrics(self, request: Request) -> Response:
        p = self.pool
        resident = [e for e in p.loaded.values() if e.app is not None]
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, values: list[tuple[str, float]]) -> None:
            lines.extend((f"# HELP quantscope_{name} {help_}", f"# TYPE quantscope_{name} {kind}"))
            lines.extend(f"quantscope_{name}{labels} {value:.15g}" for labels, value in values)

        metric("models", "gauge", "Models this server can load.", [("", len(p.offers))])
        metric("models_loaded", "gauge", "Models loaded now.", [("", len(resident))])
        metric("models_memory_bytes", "gauge", "Memory of the loaded models by their memory plans.",
               [("", sum(e.offer.need for e in resident))])
        metric("model_loads_total", "counter", "Models loaded.", [("", p.loads)])
        metric("model_unloads_total", "counter", "Models unloaded (idle, or to make room).", [("", p.unloads)])
        metric("model_load_failures_total", "counter", "Loads that failed.", [("", p.load_failures)])
        metric("requests_processing", "gauge", "Requests being answered, by model.",
               [(f'{{model="{_label(e.offer.id)}"}}', e.app.scheduler.busy_slots)  # type: ignore[union-attr]
                for e in resident] or [("", 0)])
        metric("http_responses_total", "counter", "HTTP responses of the listings and refusals, by status.",
               [(f'{{status="{k}"}}', v) for k, v in sorted(self.http_requests.items())] or [('{status="200"}', 0)])
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


def _label(v: str) -> str:
    """``v`` as a Prometheus label value."""
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _error(exc: ApiError, path: str) -> JSONResponse:
    return JSONResponse(error_body(exc, dialect_of(path)), status_code=exc.status, headers=exc.headers)

