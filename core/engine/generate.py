"""The generation API: load a model with progress/cancel, then stream token deltas with timings."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..chat import ChatTemplate, ChatTemplateError, Sampler, SamplerParams
from ..gguf import GGUFFile
from ..native.kernels import isa
from ..tokenizer import StreamDecoder, Tokenizer
from .session import ContextFull, Model, Session

BACKENDS = ("auto", "cpu", "cuda")


class LoadCancelled(Exception):
    """Loading was cancelled."""


class EmptyPrompt(ValueError):
    """The prompt has no tokens and the vocabulary has no BOS token to start from."""


@dataclass
class Delta:
    """One streamed piece of output with the running timings."""

    text: str
    token: int | None
    n_prompt: int
    n_generated: int
    ttft_s: float
    prompt_tps: float
    gen_tps: float
    context_used: int
    finished: bool = False
    stop_reason: str = ""


#: prompt tokens per forward call: bounds the block's scratch memory and lets a long prompt report progress and
#: be stopped; large enough that the prefill GEMM runs at full speed.
PREFILL_CHUNK = 512


class Engine:
    """A loaded model + tokenizer + template, with one chat session."""

    def __init__(self, path: str | Path, n_ctx: int = 4096, threads: int = 0,
                 progress: Callable[[str, float], None] | None = None,
                 cancel: threading.Event | None = None, backend: str = "auto") -> None:
        """``backend``: ``cpu``, ``cuda`` (fails with the reason when CUDA cannot be used) or ``auto`` (CUDA when
        it works, else the CPU with the reason in :attr:`backend_reason`)."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        say = progress or (lambda _m, _f: None)

        def check() -> None:
            if cancel is not None and cancel.is_set():
                raise LoadCancelled("loading cancelled")

        say("opening file", 0.0)
        self.file = GGUFFile(path)
        check()
        say("binding weights", 0.2)
        self.model = Model(self.file, threads)
        check()
        say("loading tokenizer", 0.6)
        self.tokenizer = Tokenizer(self.file)
        #: the template's compile error: plain prompts (``generate -p``) do not need it, chat messages raise it
        self.template_error: str | None = None
        try:
            self.template = ChatTemplate.from_gguf(self.file)
        except ChatTemplateError as exc:
            self.template, self.template_error = None, str(exc)
        check()
        n_ctx = min(n_ctx, self.model.config.n_ctx_train)
        say("allocating KV cache", 0.9)
        self.backend, self.backend_reason = "cpu", f"CPU kernels ({isa()}, {self.model.threads} threads)"
        self.session: Session | Any = None
        if backend != "cpu":
            from .cuda_backend import CudaError, CudaSession, CudaUnavailable, cuda_status

            ok, why = cuda_status()
            if not ok and backend == "cuda":
                raise CudaUnavailable(why)
            if ok:
                say("uploading weights to the GPU", 0.92)
                try:
                    self.session = CudaSession(self.model, n_ctx)
                    self.backend, self.backend_reason = "cuda", why
                except CudaError as exc:
                    if backend == "cuda":
                        raise
                    self.backend_reason = f"CUDA failed ({exc}); using the CPU ({isa()})"
            else:
                self.backend_reason = f"CUDA unavailable: {why}; using the CPU ({isa()})"
        if self.session is None:
            self.session = self.model.session(n_ctx)
        self.cached: list[int] = []  # token ids currently in the KV cache
        self._prompt_logits: tuple[tuple[int, ...], np.ndarray] | None = None  # last prompt and its logits
        say("ready", 1.0)

    def new_session(self, n_ctx: int) -> Session | Any:
        """A fresh session on this engine's backend (for perplexity and benchmarks)."""
        if self.backend == "cuda":
            from .cuda_backend import CudaSession

            return CudaSession(self.model, n_ctx)
        return self.model.session(n_ctx)

    def close(self) -> None:
        """Free the session (GPU memory for the CUDA backend)."""
        closer = getattr(self.session, "close", None)
        if closer is not None:
            closer()

    @property
    def n_ctx(self) -> int:
        return self.session.n_ctx

    def prompt_ids(self, messages: list[dict[str, Any]] | str) -> list[int]:
        """Token ids for a chat (rendered with the template) or a plain completion prompt."""
        if isinstance(messages, str):
            return self.tokenizer.encode(messages)
        if self.template_error is not None:
            raise ChatTemplateError(self.template_error)
        if self.template is None:  # base model: concatenate contents as plain text
            return self.tokenizer.encode("\n".join(str(m["content"]) for m in messages))
        text = self.template.render(messages, add_generation_prompt=True)
        has_bos = self.template.bos_token and text.startswith(self.template.bos_token)
        return self.tokenizer.encode(text, add_special=not has_bos)

    def generate(self, messages: list[dict[str, Any]] | str, params: SamplerParams | None = None,
                 cancel: threading.Event | None = None,
                 on_prompt: Callable[[int, int], None] | None = None) -> Iterator[Delta]:
        """Yield :class:`Delta` pieces until end-of-generation, a stop string, ``max_tokens`` or ``cancel``.

        Reuses the KV cache for the longest common prefix with the previous call (a follow-up turn only
        evaluates its new tokens). New prompt tokens are evaluated in chunks of ``PREFILL_CHUNK``:
        ``on_prompt(done, total)`` is called after each, and ``cancel`` is honoured between them."""
        p = params or SamplerParams()
        ids = self.prompt_ids(messages)
        if not ids:  # an empty prompt starts from BOS, as llama.cpp does
            bos = self.tokenizer.bos_id
            if bos is None:
                raise EmptyPrompt("the prompt is empty and the vocabulary has no BOS token to start from")
            ids = [bos]
        if len(ids) >= self.n_ctx:
            raise ContextFull(f"the prompt has {len(ids)} tokens but the context holds {self.n_ctx}; shorten the "
                              "conversation or raise the context size")
        common = 0
        for a, b in zip(self.cached, ids, strict=False):
            if a != b:
                break
            common += 1
        sampler = Sampler(p)
        t0 = time.perf_counter()
        memo = self._prompt_logits
        if common >= len(ids) and memo is not None and memo[0] == tuple(ids):
            # the same prompt again (regenerate, same seed): its logits as computed then, not re-derived by a
            # differently batched forward pass (which may round differently), so a seed reproduces its text
            self.session.truncate(len(ids))
            logits = memo[1].copy()
        else:
            common = min(common, len(ids) - 1)
            self.session.truncate(common)
            self.cached = self.cached[:common]
            new = ids[common:]
            for a in range(0, len(new), PREFILL_CHUNK):
                if a and cancel is not None and cancel.is_set():  # stop between chunks: keep what is evaluated
                    self.cached = list(ids[: common + a])
                    yield Delta("", None, len(ids), 0, 0.0, 0.0, 0.0, self.session.n_past, True, "cancelled")
                    return
                last = a + PREFILL_CHUNK >= len(new)
                logits = self.session.forward(new[a : a + PREFILL_CHUNK], logits=last)
                self.cached = list(ids[: common + min(len(new), a + PREFILL_CHUNK)])
                if on_prompt is not None:
                    on_prompt(min(len(new), a + PREFILL_CHUNK), len(new))
            self._prompt_logits = (tuple(ids), logits.copy())
        self.cached = list(ids)
        t1 = time.perf_counter()
        prompt_tps = (len(ids) - common) / (t1 - t0) if t1 > t0 else 0.0
        dec = StreamDecoder(self.tokenizer)
        text = ""
        history = list(ids)
        n = 0
        reason = ""
        while True:
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            tid = sampler.sample(logits, history)
            if self.tokenizer.is_eog(tid):
                reason = "end of generation"
                break
            n += 1
            history.append(tid)
            delta = dec.push(tid)
            text += delta
            hit = next((s for s in p.stop if s and s in text), None)
            now = time.perf_counter()
            gen_tps = n / (now - t1) if now > t1 else 0.0
            if hit:
                cut = text.index(hit)
                delta = delta[: max(0, len(delta) - (len(text) - cut))]
                yield Delta(delta, tid, len(ids), n, t1 - t0, prompt_tps, gen_tps, self.session.n_past)
                reason = f"stop string {hit!r}"
                break
            yield Delta(delta, tid, len(ids), n, t1 - t0, prompt_tps, gen_tps, self.session.n_past)
            if n >= p.max_tokens:
                reason = "max tokens"
                break
            if self.session.n_past >= self.n_ctx:
                reason = "context full"
                break
            logits = self.session.forward([tid])
            self.cached.append(tid)
        tail = dec.flush()
        now = time.perf_counter()
        yield Delta(tail, None, len(ids), n, t1 - t0, prompt_tps, n / (now - t1) if now > t1 and n else 0.0,
                    self.session.n_past, True, reason)
