"""The model in its own thread: load with progress and cancel, generate with streamed token deltas, stop within
one token, and shut down without blocking the event loop.

:class:`EngineHost` lives on the GUI thread. Each load starts a fresh :class:`QThread` with an
:class:`EngineWorker` moved into it; requests go in through queued signals, results come back through queued
signals (each tagged with its load or request id, so anything a retired worker still sends is ignored).
Cancellation uses :class:`threading.Event` objects set directly from the GUI thread: the engine checks them
between load stages and before every token. Unloading never waits: the old thread is told to stop and kept in
``retired`` until it has finished; :meth:`EngineHost.shutdown` (on close) is the only blocking wait.

Deltas are emitted per token and carry only the new text (never the whole reply); the view batches them with a
timer before touching any widget.
"""

from __future__ import annotations

import gc
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from quantscope.core.chat import ChatTemplateError, SamplerParams
from quantscope.core.chat.conversation import ContextTooSmall, prepare_prompt

from .guard import qt_guarded

BACKENDS = ("cpu", "cuda")

_gc_lock = threading.Lock()
_gc_pausers = 0


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a model loads, then its objects are frozen out of the collector.

    Loading builds hundreds of thousands of long-lived Python objects (the vocabulary, merges, their lookup
    tables). Each full collection walks every tracked object while holding the interpreter lock, which in the
    GUI's process stalls the event loop for 40+ ms; a collection triggered mid-load, or later by anyone, would do
    that. So collection is paused during the load and the survivors go to the permanent generation
    (``gc.freeze``): later collections skip them. Freeing by reference count is unaffected (unloading a model
    still returns its memory)."""
    global _gc_pausers
    with _gc_lock:
        _gc_pausers += 1
        if _gc_pausers == 1:
            gc.disable()
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0:
                gc.freeze()
                gc.enable()


def cuda_availability() -> tuple[bool | None, str]:
    """``(available, reason)`` from the CUDA backend; ``(None, "not built")`` when it cannot even be imported."""
    try:
        from quantscope.core.engine.cuda_library import cuda_status
    except Exception as exc:  # the module is optional and may be missing or half-written
        return None, f"not built ({type(exc).__name__})"
    try:
        ok, why = cuda_status()
    except Exception as exc:
        return False, f"CUDA check failed: {exc}"
    return bool(ok), str(why)


@dataclass(frozen=True)
class LoadRequest:
    path: Path
    n_ctx: int
    threads: int
    backend: str = "cpu"
    cache_types: tuple[str, str] = ("f16", "f16")  # the KV cache's K and V types (llama.cpp's -ctk / -ctv)


@dataclass(frozen=True)
class EngineInfo:
    """What the loaded engine is, for the model bar."""

    path: Path
    arch: str
    n_ctx: int
    n_ctx_train: int
    threads: int
    backend: str  # "CPU (avx512)" or "CUDA (device)"
    backend_note: str  # why CUDA was not used, when it was asked for
    has_template: bool
    n_vocab: int
    kv_bytes: int
    load_s: float
    tokenizer: Any = field(default=None, repr=False, compare=False)  # the engine's, shared with the preview/lab
    template: Any = field(default=None, repr=False, compare=False)
    engine_backend: str = "cpu"  # what the engine runs on: "cpu" or "cuda"
    cache_types: tuple[str, str] = ("f16", "f16")


@dataclass(frozen=True)
class GenStats:
    """Running numbers of one reply."""

    n_prompt: int = 0
    n_generated: int = 0
    ttft_s: float = 0.0
    prompt_tps: float = 0.0
    gen_tps: float = 0.0
    context_used: int = 0
    n_ctx: int = 0
    dropped: int = 0
    stop_reason: str = ""
    elapsed_s: float = 0.0
    n_prompt_new: int = -1  # prompt tokens evaluated (0: the whole prompt came from the cache)
    drafted: int = 0  # speculative decoding (prompt lookup): tokens proposed
    accepted: int = 0  # ... and accepted

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GenRequest:
    id: int
    prompt: list[dict[str, str]] | str  # messages (chat) or text (plain completion)
    params: SamplerParams
    threads: int
    reserve: int
    cancel: threading.Event = field(default_factory=threading.Event)
    forced: list[int] = field(default_factory=list)  # a branch: the reply's tokens up to the chosen one
    seed: list[Any] = field(default_factory=list)  # their TokenRecords (core.chat.tokens.branch_records)
    lookup: int = 0  # speculative decoding by prompt lookup: the longest n-gram (0: off)


@qt_guarded
class EngineWorker(QObject):
    """Owns the :class:`~quantscope.core.engine.generate.Engine`; every slot runs on the worker thread."""

    progress = Signal(int, str, float)  # load id, stage, fraction
    loaded = Signal(int, object)  # load id, EngineInfo
    loadFailed = Signal(int, str, str)  # load id, message, detail
    loadCancelled = Signal(int)
    trimmed = Signal(int, int, int)  # request id, messages left out, prompt tokens
    promptProgress = Signal(int, int, int)  # request id, new prompt tokens evaluated, of how many
    delta = Signal(int, str, object)  # request id, new text, GenStats
    thinking = Signal(int, str)  # request id, new text of the reply's thinking (harmony models)
    token = Signal(int, object)  # request id, the TokenRecord of a generated (or forced) token
    trace = Signal(int, object)  # request id, every TokenRecord of the reply (sent just before finished)
    finished = Signal(int, object)  # request id, final GenStats
    failed = Signal(int, str, str)  # request id, message, detail

    def __init__(self, load_id: int, cancel_load: threading.Event) -> None:
        super().__init__()
        self.load_id = load_id
        self.cancel_load = cancel_load
        self.engine: Any = None
        self.prompt_cache: Any = None  # the loaded model's PromptCache (core/chat/promptcache.py)

    @Slot(object)
    def load(self, req: LoadRequest) -> None:
        from quantscope.core.cpu import isa
        from quantscope.core.engine.generate import Engine, LoadCancelled, load_failure

        t0 = time.perf_counter()
        lid = self.load_id
        try:
            with gc_paused():
                # the user's choice goes to the engine: "cpu" never touches the GPU; "cuda" is the engine's
                # "auto" (the GPU when it starts, otherwise the CPU with the reason, shown in the pane)
                eng = Engine(req.path, n_ctx=req.n_ctx, threads=req.threads,
                             progress=lambda m, f: self.progress.emit(lid, m, float(f)), cancel=self.cancel_load,
                             backend="auto" if req.backend == "cuda" else "cpu", cache_types=req.cache_types)
            if self.cancel_load.is_set():
                eng.close()
                raise LoadCancelled("loading cancelled")
        except LoadCancelled:
            self.loadCancelled.emit(lid)
            return
        except Exception as exc:
            why = load_failure(exc)
            if why is None:
                self.loadFailed.emit(lid, f"Loading failed: {exc or type(exc).__name__}", traceback.format_exc())
            else:
                self.loadFailed.emit(lid, why.headline,
                                     why.detail + ("; try a smaller context" if isinstance(exc, MemoryError) else ""))
            return
        from quantscope.core.chat.promptcache import PromptCache

        self.engine = eng
        self.prompt_cache = PromptCache(req.path)
        if eng.backend == "cuda":
            backend, note = f"CUDA ({eng.backend_reason})", ""
        else:
            backend = f"CPU ({isa()})"
            note = eng.backend_reason if req.backend == "cuda" else ""
        cfg = eng.model.config
        info = EngineInfo(Path(req.path), cfg.arch, eng.n_ctx, cfg.n_ctx_train, eng.model.threads, backend, note,
                          eng.template is not None, eng.tokenizer.n_vocab, int(getattr(eng.session, "kv_bytes", 0)),
                          time.perf_counter() - t0, eng.tokenizer, eng.template, eng.backend,
                          eng.cache_types)
        self.loaded.emit(lid, info)

    @Slot(object)
    def generate(self, req: GenRequest) -> None:
        from quantscope.core.engine.session import ContextFull

        eng = self.engine
        if eng is None:
            self.failed.emit(req.id, "No model is loaded.", "")
            return
        t0 = time.perf_counter()
        try:
            if req.threads > 0:
                eng.model.threads = req.threads
            if (eng.speculator.lookup if eng.speculator is not None else 0) != req.lookup:
                eng.speculate(lookup=req.lookup)
            prep = prepare_prompt(req.prompt, eng, eng.n_ctx, req.reserve)
            self.trimmed.emit(req.id, prep.dropped, prep.n_tokens)
            last = GenStats(n_ctx=eng.n_ctx, dropped=prep.dropped)

            def on_prompt(done: int, total: int) -> None:
                self.promptProgress.emit(req.id, done, total)

            from quantscope.core.chat.tokens import ReplyTrace, piece_text

            tok = eng.tokenizer
            trace = ReplyTrace(lambda t: piece_text(tok.token_bytes(t, True)), req.seed)
            kw = {"forced": req.forced} if req.forced else {}
            if self.prompt_cache is not None:  # a conversation reopened: its cache from the file, not evaluated
                self.prompt_cache.restore(eng, eng.prompt_ids(prep.prompt) + list(req.forced))
            for d in eng.generate(prep.prompt, req.params, cancel=req.cancel, on_prompt=on_prompt, **kw):
                last = GenStats(d.n_prompt, d.n_generated, d.ttft_s, d.prompt_tps, d.gen_tps, d.context_used,
                                eng.n_ctx, prep.dropped, d.stop_reason, time.perf_counter() - t0, d.n_prompt_new,
                                d.drafted, d.accepted)
                rec = trace.add(d.token, d.text, d.channel, d.choice, d.forced)
                if rec is not None:
                    self.token.emit(req.id, rec)
                if d.text and d.channel:
                    self.thinking.emit(req.id, d.text)
                elif d.text:
                    self.delta.emit(req.id, d.text, last)
            self.trace.emit(req.id, trace.records)
            self.finished.emit(req.id, last)
            self._keep_cache()
        except (ContextFull, ContextTooSmall) as exc:
            self.failed.emit(req.id, "The conversation does not fit in the context.", str(exc))
        except ChatTemplateError as exc:
            self.failed.emit(req.id, "The model's chat template refused this conversation.", str(exc))
        except Exception as exc:
            self.failed.emit(req.id, f"Generation failed: {exc or type(exc).__name__}", traceback.format_exc())

    def _keep_cache(self) -> None:
        """Save the conversation's cache for the next time it is opened (after the reply is out); a cache that
        cannot be written (disk full, no permission) is only a lost shortcut."""
        from quantscope.core.engine.kvfile import KVFileError
        from quantscope.core.fsutil import PathRefused

        if self.prompt_cache is not None and self.engine is not None:
            try:
                self.prompt_cache.store(self.engine)
            except (OSError, PathRefused, KVFileError):
                pass

    def release(self) -> None:
        """Drop the engine (and with it the KV cache and the file mapping)."""
        eng, self.engine = self.engine, None
        if eng is not None:
            eng.close()


@qt_guarded
class EngineHost(QObject):
    """The GUI thread's handle on the model thread. ``state``: empty, loading, ready, generating."""

    stateChanged = Signal(str)
    loadProgress = Signal(str, float)
    loaded = Signal(object)  # EngineInfo
    loadFailed = Signal(str, str)
    loadCancelled = Signal()
    trimmed = Signal(int, int, int)
    promptProgress = Signal(int, int, int)
    delta = Signal(int, str, object)
    thinking = Signal(int, str)
    token = Signal(int, object)
    trace = Signal(int, object)
    finished = Signal(int, object)
    failed = Signal(int, str, str)

    _doLoad = Signal(object)
    _doGenerate = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.state = "empty"
        self.info: EngineInfo | None = None
        self._thread: QThread | None = None
        self._worker: EngineWorker | None = None
        self._load_id = 0
        self._req_id = 0
        self._cancel_load = threading.Event()
        self._request: GenRequest | None = None
        self.retired: list[tuple[QThread, EngineWorker]] = []
        self.closed = False
        #: called (on the GUI thread) with each new worker before its thread starts: tests connect to its signals
        #: with ``Qt.DirectConnection`` to act on the model thread at an exact point of a load or a reply
        self.on_worker: list[Callable[[EngineWorker], None]] = []
        self._reap_timer = QTimer(self)
        self._reap_timer.setSingleShot(True)
        self._reap_timer.setInterval(50)
        self._reap_timer.timeout.connect(self._reap)

    # ------------------------------------------------------------------ state
    def _set_state(self, s: str) -> None:
        if s != self.state:
            self.state = s
            self.stateChanged.emit(s)

    @property
    def busy(self) -> bool:
        return self.state in ("loading", "generating")

    def threads_alive(self) -> int:
        """Model threads still running (the current one and retired ones that have not finished yet)."""
        threads = [t for t, _ in self.retired] + ([self._thread] if self._thread is not None else [])
        return sum(1 for t in threads if t.isRunning())

    # ------------------------------------------------------------------ loading
    def load(self, path: str | Path, n_ctx: int, threads: int = 0, backend: str = "cpu",
             cache_types: tuple[str, str] = ("f16", "f16")) -> None:
        """Unload whatever is loaded, then load ``path`` on a fresh thread (progress, then loaded/failed), with
        the KV cache's ``cache_types`` (K, V)."""
        if self.closed:
            return
        self.unload()
        self._load_id += 1
        self._cancel_load = threading.Event()
        worker = EngineWorker(self._load_id, self._cancel_load)
        thread = QThread()
        thread.setObjectName(f"quantscope-model-{self._load_id}")
        worker.moveToThread(thread)
        worker.progress.connect(self._on_progress)
        worker.loaded.connect(self._on_loaded)
        worker.loadFailed.connect(self._on_load_failed)
        worker.loadCancelled.connect(self._on_load_cancelled)
        worker.trimmed.connect(self._on_trimmed)
        worker.promptProgress.connect(self._on_prompt_progress)
        worker.delta.connect(self._on_delta)
        worker.thinking.connect(self._on_thinking)
        worker.token.connect(self._on_token)
        worker.trace.connect(self._on_trace)
        worker.finished.connect(self._on_finished)
        worker.failed.connect(self._on_failed)
        self._doLoad.connect(worker.load)
        self._doGenerate.connect(worker.generate)
        self._thread, self._worker = thread, worker
        for hook in self.on_worker:
            hook(worker)
        thread.start()
        self._set_state("loading")
        self._doLoad.emit(LoadRequest(Path(path), int(n_ctx), int(threads), backend, tuple(cache_types)))

    def cancel_load(self) -> None:
        if self.state == "loading":
            self._cancel_load.set()
            self.unload()
            self.loadCancelled.emit()

    def _current(self, load_id: int) -> bool:
        return self._worker is not None and load_id == self._worker.load_id

    def _on_progress(self, load_id: int, stage: str, fraction: float) -> None:
        if self._current(load_id) and self.state == "loading":
            self.loadProgress.emit(stage, fraction)

    def _on_loaded(self, load_id: int, info: EngineInfo) -> None:
        if not self._current(load_id):
            return
        self.info = info
        self._set_state("ready")
        self.loaded.emit(info)

    def _on_load_failed(self, load_id: int, message: str, detail: str) -> None:
        if not self._current(load_id):
            return
        self.unload()
        self.loadFailed.emit(message, detail)

    def _on_load_cancelled(self, load_id: int) -> None:
        if self._current(load_id):
            self.unload()
            self.loadCancelled.emit()

    # ------------------------------------------------------------------ generation
    def generate(self, prompt: list[dict[str, str]] | str, params: SamplerParams, threads: int = 0,
                 reserve: int = 256, forced: list[int] | None = None, seed: list[Any] | None = None,
                 lookup: int = 0) -> int:
        """Start a reply (``forced``: a branch's first tokens, ``seed`` their records; ``lookup``: speculative
        decoding by prompt lookup, the longest n-gram, 0 off); returns its request id (0 when no model is
        ready)."""
        if self.state != "ready" or self._worker is None:
            return 0
        self._req_id += 1
        req = GenRequest(self._req_id, prompt, params, int(threads), int(reserve), forced=list(forced or []),
                         seed=list(seed or []), lookup=int(lookup))
        self._request = req
        self._set_state("generating")
        self._doGenerate.emit(req)
        return req.id

    def stop(self) -> None:
        """Ask the running reply to stop (the engine checks before every token)."""
        if self._request is not None:
            self._request.cancel.set()

    @property
    def request_id(self) -> int:
        return self._request.id if self._request is not None else 0

    def _live(self, req_id: int) -> bool:
        return self._request is not None and req_id == self._request.id

    def _on_trimmed(self, req_id: int, dropped: int, n_tokens: int) -> None:
        if self._live(req_id):
            self.trimmed.emit(req_id, dropped, n_tokens)

    def _on_prompt_progress(self, req_id: int, done: int, total: int) -> None:
        if self._live(req_id):
            self.promptProgress.emit(req_id, done, total)

    def _on_thinking(self, req_id: int, text: str) -> None:
        if self._live(req_id):
            self.thinking.emit(req_id, text)

    def _on_token(self, req_id: int, record: object) -> None:
        if self._live(req_id):
            self.token.emit(req_id, record)

    def _on_trace(self, req_id: int, records: object) -> None:
        if self._live(req_id):
            self.trace.emit(req_id, records)

    def _on_delta(self, req_id: int, text: str, stats: GenStats) -> None:
        if self._live(req_id):
            self.delta.emit(req_id, text, stats)

    def _on_finished(self, req_id: int, stats: GenStats) -> None:
        if self._live(req_id):
            self._request = None
            self._set_state("ready")
            self.finished.emit(req_id, stats)

    def _on_failed(self, req_id: int, message: str, detail: str) -> None:
        if self._live(req_id):
            self._request = None
            self._set_state("ready")
            self.failed.emit(req_id, message, detail)

    # ------------------------------------------------------------------ unloading
    def unload(self) -> None:
        """Stop generation and loading, and let the model thread end on its own (never waits)."""
        self.stop()
        self._cancel_load.set()
        thread, worker = self._thread, self._worker
        self._thread = self._worker = None
        self._request = None
        self.info = None
        if thread is not None and worker is not None:
            for sig in (self._doLoad, self._doGenerate):
                try:
                    sig.disconnect()
                except (RuntimeError, TypeError):
                    pass
            self.retired.append((thread, worker))
            thread.finished.connect(self._reap)
            thread.quit()  # the event loop ends once the running slot returns (within one token)
        self._set_state("empty")

    def _reap(self) -> None:
        """Release the engines of retired threads that have ended. ``finished`` is emitted just before the thread
        really ends, so a thread not quite done yet is looked at again shortly."""
        for pair in list(self.retired):
            t, w = pair
            if t.isFinished():
                w.release()
                self.retired.remove(pair)
        if self.retired and not self.closed and not self._reap_timer.isActive():
            self._reap_timer.start()

    def wait_retired(self, timeout_ms: int = 30000) -> bool:
        """Wait for the unloaded models' threads to end and release their engines (and file mappings)."""
        deadline = time.monotonic() + timeout_ms / 1000
        ok = True
        for t, _ in list(self.retired):
            ok = bool(t.wait(max(0, int((deadline - time.monotonic()) * 1000)))) and ok
        self._reap()
        return ok

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        """Stop everything and wait for every model thread to end (closing the window)."""
        self.closed = True
        self.unload()
        deadline = time.monotonic() + timeout_ms / 1000
        ok = True
        for t, _ in list(self.retired):
            left = max(0, int((deadline - time.monotonic()) * 1000))
            ok = bool(t.wait(left)) and ok
        self._reap()
        return ok
