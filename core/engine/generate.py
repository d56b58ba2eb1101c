"""The generation API: load a model with progress/cancel, then stream token deltas with timings."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..chat import ChatTemplate, ChatTemplateError, Sampler, SamplerParams, TokenChoice
from ..chat.channels import HarmonySplitter, HarmonyTokens
from ..gguf import GGUFFile
from ..native.kernels import RepackCancelled, isa
from ..native.nn import kv_cache_type
from ..tokenizer import CONTROL, USER_DEFINED, StreamDecoder, Tokenizer
from .session import ContextFull, InferenceSession, Model
from .speculative import DRAFT_MAX, DRAFT_P_MIN, DraftModel, Speculator, VocabularyMismatch, vocabulary_difference

BACKENDS = ("auto", "cpu", "cuda")

#: Token texts that end generation when the vocabulary marks them control or user-defined (the names llama.cpp
#: recognises as end-of-generation besides the eos/eot/eom ids in the metadata).
EOG_PIECES = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
                        "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
                        "<｜end▁of▁sentence｜>"})
#: User-defined tokens that are markers, not text (gemma3's ``<start_of_image>``, ``<|...|>`` pieces): shown only
#: when control tokens are asked for. Other user-defined tokens (gemma's ``<table>``, runs of spaces) are text.
_MARKER = re.compile(r"<\|[^<>|]*\|>|<(?:start|end)_of_[a-z_]+>|\[multimodal\]")


def eog_ids(tok: Tokenizer, f: GGUFFile | None = None) -> frozenset[int]:
    """Every end-of-generation token: eos, eot and eom from the metadata, plus control or user-defined tokens
    named like an end marker (:data:`EOG_PIECES`)."""
    ids = {i for i in (tok.eos_id, tok.eot_id) if i is not None}
    # harmony (gpt-oss): <|end|> closes the thinking message and the answer follows, so it does not stop
    # generation when <|return|> and <|call|> exist (llama.cpp drops it from its end-of-generation set too)
    harmony = "<|return|>" in tok.vocab and "<|call|>" in tok.vocab
    end = tok.vocab.get("<|end|>") if harmony else None
    if f is not None:
        eom = f.get("tokenizer.ggml.eom_token_id")
        if isinstance(eom, (int, np.integer)) and not isinstance(eom, bool) and 0 <= int(eom) < tok.n_vocab:
            ids.add(int(eom))
    for piece in EOG_PIECES:
        i = tok.vocab.get(piece)
        if i is not None and tok.types[i] in (CONTROL, USER_DEFINED) and i != end:
            ids.add(i)
    ids.discard(end)  # type: ignore[arg-type]
    return frozenset(ids)


def marker_ids(tok: Tokenizer) -> frozenset[int]:
    """User-defined tokens that are markers rather than text (see :data:`_MARKER`); control tokens are hidden by
    the decoder itself."""
    return frozenset(i for i in tok.special_ids if tok.types[i] == USER_DEFINED and _MARKER.fullmatch(tok.pieces[i]))


class LoadCancelled(Exception):
    """Loading was cancelled."""


@dataclass(frozen=True)
class LoadFailure:
    """Why a model could not be loaded, in words: ``headline`` (a sentence) and ``detail``."""

    headline: str
    detail: str

    def line(self) -> str:
        """Headline and detail in one line."""
        return f"{self.headline.rstrip('.')}: {self.detail}" if self.detail else self.headline


def load_failure(exc: BaseException) -> LoadFailure | None:
    """What to tell the user when :class:`Engine` raised ``exc`` for a reason the file or the machine explains (an
    unsupported model or tokenizer, an unreadable GGUF, too little memory); ``None`` for anything else (a bug:
    show its traceback). The chat and the probe say the same."""
    from ..gguf import GGUFError
    from ..model import EmbeddingModel, UnsupportedModel
    from ..tokenizer import TokenizerError

    if isinstance(exc, EmbeddingModel):
        return LoadFailure("This is an embedding model: it does not chat or generate text.", str(exc))
    if isinstance(exc, UnsupportedModel):
        return LoadFailure("This model cannot run on Quantscope's engine.", str(exc))
    if isinstance(exc, TokenizerError):
        return LoadFailure("This model's tokenizer is not supported.", str(exc))
    if isinstance(exc, GGUFError):
        return LoadFailure("The file is not a readable GGUF model.", str(exc))
    if isinstance(exc, MemoryError):
        return LoadFailure("The model is too large for the memory available.",
                           "allocating the weights or the KV cache failed")
    return None


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
    n_prompt_new: int = -1  # prompt tokens evaluated for this reply (0: the whole prompt was cached)
    channel: str = ""  # "" for the answer; "analysis" (thinking) or "commentary" in a harmony (gpt-oss) reply
    choice: TokenChoice | None = None  # the token's probabilities and alternatives (SamplerParams.alternatives)
    forced: bool = False  # the token was given (``Engine.generate(forced=...)``), not sampled
    drafted: int = 0  # speculative decoding: tokens proposed so far in this reply
    accepted: int = 0  # ... and accepted by the model


#: prompt tokens per forward call: bounds the block's scratch memory and lets a long prompt report progress and
#: be stopped; large enough that the prefill GEMM runs at full speed.
PREFILL_CHUNK = 512


class Engine:
    """A loaded model + tokenizer + template, with one chat session."""

    def __init__(self, path: str | Path, n_ctx: int = 4096, threads: int = 0,
                 progress: Callable[[str, float], None] | None = None,
                 cancel: threading.Event | None = None, backend: str = "auto", repack: bool = True,
                 gpu_layers: int | None = None, cache_types: tuple[str, str] = ("f16", "f16")) -> None:
        """``backend``: ``cpu``, ``cuda`` (fails with the reason when CUDA cannot be used) or ``auto`` (CUDA when
        it works, else the CPU with the reason in :attr:`backend_reason`). ``repack``: on the CPU, copy the
        weights into the repacked layout of the SIMD kernels (faster; ``False`` keeps them mapped from the file,
        zero-copy, like llama.cpp's ``--no-repack``). ``gpu_layers``: how many leading layers run on the GPU
        (llama.cpp's ``-ngl``; more than the model has: all; the rest on the CPU, :class:`~.split.SplitSession`);
        ``None``: all with ``cuda``, and with ``auto`` all when they fit in the free GPU memory, else as many as
        fit (:func:`~.cuda_fit.choose_layers`). ``cache_types``: the KV cache's K and V types (llama.cpp's
        ``--cache-type-k/-v``: ``f16``, ``f32``, ``bf16``, ``q8_0``, ``q4_0``); the CUDA backend holds ``f16``
        only: ``auto`` runs another type on the CPU, ``cuda`` refuses it."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        if gpu_layers is not None and (isinstance(gpu_layers, bool) or not isinstance(gpu_layers, int)
                                       or gpu_layers < 0):
            raise ValueError(f"GPU layers must be a whole number of at least 0, not {gpu_layers!r}")
        if gpu_layers and backend == "cpu":
            raise ValueError("GPU layers need the cuda or auto backend")
        #: the KV cache's (K, V) types, names of :data:`~quantscope.core.native.nn.KV_CACHE_TYPES`
        self.cache_types = (kv_cache_type(cache_types[0]), kv_cache_type(cache_types[1]))
        gpu_cache = self.cache_types == ("f16", "f16")
        if not gpu_cache and (backend == "cuda" or gpu_layers):
            raise ValueError(f"the CUDA backend holds an F16 KV cache only, not {'/'.join(self.cache_types)}: "
                             "use --backend cpu for another cache type")
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
        self.session: InferenceSession | None = None
        L = self.model.config.n_layers
        #: layers on the GPU: all of them (``cuda``), some (a split session) or none (``cpu``)
        self.gpu_layers = 0
        if gpu_layers == 0 and backend != "cpu":
            backend, self.backend_reason = "cpu", f"no GPU layers asked for; CPU kernels ({isa()})"
        if not gpu_cache and backend != "cpu":
            backend = "cpu"
            self.backend_reason = f"KV cache {'/'.join(self.cache_types)} runs on the CPU; CPU kernels ({isa()})"
        if backend != "cpu":
            from .cuda_backend import CudaError, CudaSession, CudaUnavailable, cuda_status

            ok, why = cuda_status()
            if not ok and backend == "cuda":
                raise CudaUnavailable(why)
            fit = ""  # auto: the GPU only when weights + KV cache + scratch fit in its free memory (cuda_fit)
            n_gpu = L if gpu_layers is None else min(gpu_layers, L)
            if ok and backend == "auto" and gpu_layers is None:
                from .cuda_fit import gpu_layers_fit

                n_gpu, fit = gpu_layers_fit(self.model, n_ctx)
                ok = n_gpu > 0
            elif ok and n_gpu < L:  # (no GPU: the reason why, below)
                fit = f"{n_gpu} of {L} layers on the GPU (asked for), the rest on the CPU"
            if ok:
                say("uploading weights to the GPU", 0.92)
                try:
                    if n_gpu < L:
                        from .split import SplitSession

                        self.session = SplitSession(self.model, n_ctx, n_gpu)
                        why = f"{why}; {fit}"
                    else:
                        self.session = CudaSession(self.model, n_ctx)
                    self.backend, self.backend_reason, self.gpu_layers = "cuda", why, n_gpu
                except CudaError as exc:
                    if backend == "cuda":
                        raise
                    self.backend_reason = f"CUDA failed ({exc}); using the CPU ({isa()})"
                except Exception as exc:  # auto: any failure to start the GPU session falls back to the CPU
                    if backend == "cuda":
                        raise
                    self.backend_reason = f"CUDA failed ({exc or type(exc).__name__}); using the CPU ({isa()})"
            elif fit:
                self.backend_reason = f"CUDA not used: the model {fit}; using the CPU ({isa()})"
            else:
                self.backend_reason = f"CUDA unavailable: {why}; using the CPU ({isa()})"
        if self.session is None:
            if repack:
                say("repacking weights", 0.9)
                try:
                    self.model.repack(lambda f: say("repacking weights", 0.9 + 0.09 * f),
                                      cancel=(lambda: cancel.is_set()) if cancel is not None else None)
                except RepackCancelled:
                    raise LoadCancelled("loading cancelled") from None
                if self.model.repacked_bytes:
                    self.backend_reason += f", {self.model.repacked_bytes / 2**20:.0f} MiB repacked"
            self.session = self.model.session(n_ctx, self.cache_types[0], v_type=self.cache_types[1])
        #: token ids that end generation, and user-defined marker tokens hidden unless control tokens are shown
        self.eog = eog_ids(self.tokenizer, self.file)
        self.markers = marker_ids(self.tokenizer)
        #: the framing tokens when the chat template writes OpenAI's harmony format: replies are split into
        #: thinking and answer (:class:`~quantscope.core.chat.channels.HarmonySplitter`)
        src = self.template.source if self.template is not None else ""
        self.harmony = HarmonyTokens.find(self.tokenizer.vocab) if "<|channel|>" in src else None
        self.cached: list[int] = []  # token ids currently in the KV cache
        self._prompt_logits: tuple[tuple[int, ...], np.ndarray] | None = None  # last prompt and its logits
        #: speculative decoding (:meth:`speculate`): its proposers, and the draft model's engine
        self.speculator: Speculator | None = None
        self.draft: Engine | None = None
        self._threads = threads
        say("ready", 1.0)

    def speculate(self, draft: str | Path | None = None, lookup: int = 0, draft_max: int = DRAFT_MAX,
                  p_min: float = DRAFT_P_MIN, draft_backend: str = "cpu") -> None:
        """Decode speculatively from now on (docs/speculative.md): with a draft model (a GGUF with the same
        vocabulary, loaded here; :class:`VocabularyMismatch` when it differs), with prompt lookup (``lookup``: the
        longest n-gram matched in the context), or both; ``draft_max`` proposals per pass at most, a draft stops
        where its most likely token is below ``p_min``. Nothing asked for (no draft, lookup 0): off again."""
        if isinstance(p_min, bool) or not isinstance(p_min, int | float) or not 0.0 <= p_min <= 1.0:
            raise ValueError(f"the draft's minimum probability must be 0..1, not {p_min!r}")
        if draft is None and not lookup:
            self._drop_draft()
            self.speculator = None
            return
        eng = None
        if draft is not None:
            eng = Engine(draft, n_ctx=self.n_ctx, threads=self._threads, backend=draft_backend)
            why = vocabulary_difference(self.tokenizer, eng.tokenizer, self.model.config.n_vocab,
                                        eng.model.config.n_vocab)
            if why:
                eng.close()
                raise VocabularyMismatch(f"the draft model's vocabulary differs from the model's: {why}")
        try:
            spec = Speculator(DraftModel(eng.session, float(p_min)) if eng is not None else None, lookup, draft_max)
        except ValueError:
            if eng is not None:
                eng.close()
            raise
        self._drop_draft()
        self.draft, self.speculator = eng, spec

    def _drop_draft(self) -> None:
        if self.draft is not None:
            self.draft.close()
            self.draft = None

    def new_session(self, n_ctx: int) -> InferenceSession:
        """A fresh session on this engine's backend (for perplexity and benchmarks)."""
        if self.backend == "cuda" and self.gpu_layers < self.model.config.n_layers:
            from .split import SplitSession

            return SplitSession(self.model, n_ctx, self.gpu_layers)
        if self.backend == "cuda":
            from .cuda_backend import CudaSession

            return CudaSession(self.model, n_ctx)
        return self.model.session(n_ctx, self.cache_types[0], v_type=self.cache_types[1])

    def set_cached(self, tokens: list[int]) -> None:
        """The session's cache now holds ``tokens`` (put there from elsewhere: a prompt cache's file); the next
        :meth:`generate` reuses what its prompt shares with them."""
        self.cached = list(tokens)
        self._prompt_logits = None

    def close(self) -> None:
        """Free the session (GPU memory for the CUDA backend) and unmap the file (numpy views still held keep the
        mapping until they are dropped). Safe to call more than once."""
        try:
            self._drop_draft()
            if self.session is not None:
                self.session.close()
        finally:
            self.file.close()

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
                 on_prompt: Callable[[int, int], None] | None = None,
                 forced: Sequence[int] = ()) -> Iterator[Delta]:
        """Yield :class:`Delta` pieces until end-of-generation, a stop string, ``max_tokens`` or ``cancel``.

        ``forced``: the reply starts with these tokens instead of sampled ones (branching a reply: its tokens
        before the branch point, then the token picked there). They are evaluated with the prompt (the cache
        keeps what it shares with the last call, so a branch of the last reply evaluates only what differs) and
        streamed first as deltas marked ``forced`` (without a ``choice``); ``max_tokens`` counts the tokens
        generated after them. A forced end-of-generation token ends the reply after its (empty) delta.

        Reuses the KV cache for the longest common prefix with the previous call (a follow-up turn only
        evaluates its new tokens). New prompt tokens are evaluated in chunks of ``PREFILL_CHUNK``:
        ``on_prompt(done, total)`` is called after each, and ``cancel`` is honoured between them. Every token of
        :attr:`eog` stops; control and marker tokens are left out of the text unless ``params.special``."""
        p = params or SamplerParams()
        ids = self.prompt_ids(messages)
        if not ids:  # an empty prompt starts from BOS, as llama.cpp does
            bos = self.tokenizer.bos_id
            if bos is None:
                raise EmptyPrompt("the prompt is empty and the vocabulary has no BOS token to start from")
            ids = [bos]
        forced = [int(t) for t in forced]
        bad = next((t for t in forced if not 0 <= t < self.tokenizer.n_vocab), None)
        if bad is not None:
            raise ValueError(f"forced token {bad} is not in the vocabulary (0..{self.tokenizer.n_vocab - 1})")
        n_prompt = len(ids)
        ids = ids + forced
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
        same = common >= len(ids) and memo is not None and memo[0] == tuple(ids)
        if same:
            self.session.truncate(len(ids))
        if same and self.session.n_past == len(ids):
            # the same prompt again (regenerate, same seed): its logits as computed then, not re-derived by a
            # differently batched forward pass (which may round differently), so a seed reproduces its text
            assert memo is not None
            logits = memo[1].copy()
            n_new = 0
        else:
            common = min(common, len(ids) - 1)
            self.session.truncate(common)
            # a model with recurrent layers rewinds only to its checkpoint, or starts over
            common = min(common, self.session.n_past)
            self.cached = self.cached[:common]
            new = ids[common:]
            for a in range(0, len(new), PREFILL_CHUNK):
                if a and cancel is not None and cancel.is_set():  # stop between chunks: keep what is evaluated
                    self.cached = list(ids[: common + a])
                    yield Delta("", None, n_prompt, 0, 0.0, 0.0, 0.0, self.session.n_past, True, "cancelled")
                    return
                last = a + PREFILL_CHUNK >= len(new)
                logits = self.session.forward(new[a : a + PREFILL_CHUNK], logits=last)
                self.cached = list(ids[: common + min(len(new), a + PREFILL_CHUNK)])
                if on_prompt is not None:
                    on_prompt(min(len(new), a + PREFILL_CHUNK), len(new))
            self._prompt_logits = (tuple(ids), logits.copy())
            # the recurrent state after the prompt: a regenerated reply starts there
            self.session.checkpoint()
            n_new = len(ids) - common
        self.cached = list(ids)
        t1 = time.perf_counter()
        prompt_tps = (len(ids) - common) / (t1 - t0) if t1 > t0 else 0.0
        dec = StreamDecoder(self.tokenizer, special=p.special)
        hide = frozenset() if p.special else self.markers
        split = HarmonySplitter(self.harmony) if self.harmony is not None and not isinstance(messages, str) else None
        channel = ""
        text = ""
        history = list(ids)
        n = 0
        reason = ""
        for tid in forced:  # the given start of the reply: text and channel as if it had been sampled
            n += 1
            if tid in self.eog:
                yield Delta("", tid, n_prompt, n, t1 - t0, prompt_tps, 0.0, self.session.n_past,
                            n_prompt_new=n_new, channel=channel, forced=True)
                reason = "end of generation"
                break
            delta = "" if tid in hide else dec.push(tid)
            if split is not None:
                part = split.push(tid, delta)
                delta, channel = ("", channel) if part is None else (part[1], part[0])
            text += delta
            hit = next((s for s in p.stop if s and s in text), None)
            if hit:
                delta = delta[: max(0, len(delta) - (len(text) - text.index(hit)))]
                reason = f"stop string {hit!r}"
            yield Delta(delta, tid, n_prompt, n, t1 - t0, prompt_tps, 0.0, self.session.n_past,
                        n_prompt_new=n_new, channel=channel, forced=True)
            if hit:
                break
        n_forced = n
        spec = self.speculator
        if spec is not None:
            spec.begin(p)
        queue: list[tuple[int, TokenChoice | None]] = []  # speculation: tokens picked, not yet streamed
        choice: TokenChoice | None = None
        while not reason:
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            if queue:
                tid, choice = queue.pop(0)
            else:
                tid = sampler.sample(logits, history)
                choice = getattr(sampler, "last", None)
            if tid in self.eog:
                reason = "end of generation"
                break
            n += 1
            history.append(tid)
            delta = "" if tid in hide else dec.push(tid)
            if split is not None:  # the framing tokens and headers are not text; the rest is thinking or answer
                part = split.push(tid, delta)
                delta, channel = ("", channel) if part is None else (part[1], part[0])
            text += delta
            hit = next((s for s in p.stop if s and s in text), None)
            now = time.perf_counter()
            gen_tps = (n - n_forced) / (now - t1) if now > t1 else 0.0
            drafted, accepted = (spec.stats.drafted, spec.stats.accepted) if spec is not None else (0, 0)
            if hit:
                cut = text.index(hit)
                delta = delta[: max(0, len(delta) - (len(text) - cut))]
                yield Delta(delta, tid, n_prompt, n, t1 - t0, prompt_tps, gen_tps, self.session.n_past,
                            n_prompt_new=n_new, channel=channel, choice=choice, drafted=drafted, accepted=accepted)
                reason = f"stop string {hit!r}"
                break
            yield Delta(delta, tid, n_prompt, n, t1 - t0, prompt_tps, gen_tps, self.session.n_past,
                        n_prompt_new=n_new, channel=channel, choice=choice, drafted=drafted, accepted=accepted)
            if n - n_forced >= p.max_tokens:
                reason = "max tokens"
                break
            if queue:  # (a speculated token: already in the cache)
                continue
            if self.session.n_past >= self.n_ctx:
                reason = "context full"
                break
            if spec is not None:
                queue = spec.step(self.session, sampler, history, p.max_tokens - (n - n_forced), self.eog)
                self.cached += [tid] + [t for t, _c in queue[:-1]]
                continue
            logits = self.session.forward([tid])
            self.cached.append(tid)
        tail = dec.flush()
        now = time.perf_counter()
        made = n - n_forced
        drafted, accepted = (spec.stats.drafted, spec.stats.accepted) if spec is not None else (0, 0)
        yield Delta(tail, None, n_prompt, n, t1 - t0, prompt_tps, made / (now - t1) if now > t1 and made else 0.0,
                    self.session.n_past, True, reason, n_new, channel, drafted=drafted, accepted=accepted)
