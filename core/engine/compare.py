"""Compare two GGUFs of the same model on a text: perplexity of each, KL divergence and top-1 agreement per token.

The text is cut into chunks and scored as llama-perplexity does (:mod:`.kld`): each chunk evaluated from an empty
cache, its first token replaced by BOS when the model adds BOS, the second half scored. Chunk by chunk, the base's
logits and then the quant's are reduced to per-position figures, so memory stays at one chunk's logits whatever the
length of the text. The base may also be a llama-perplexity KL-divergence base file (``--kl-divergence-base``): its
stored log-probabilities stand for the base model, and KL divergence is then summed as llama-perplexity sums it
(over the base entries above log-probability -16); between two models it is exact, over the whole vocabulary.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..gguf import GGUFError, GGUFFile
from ..gguf.strings import StringArray
from ..model import UnsupportedModel
from ..tokenizer import StreamDecoder, Tokenizer, TokenizerError
from . import kld
from .generate import Engine, LoadCancelled

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class TokenScore:
    """One scored position: the token it predicts and how the two models saw it."""

    position: int  # index into the whole tokenized text (and into CompareResult.context)
    token_id: int  # the actual next token (the one being predicted)
    piece: str  # its text (detokenized; "" when it only begins a multi-byte character the next token ends)
    kld: float  # KL(base || quant) at this position, nats
    base_logp: float  # log-probability of the actual token under the base
    quant_logp: float  # ... under the quant
    base_top1: int
    quant_top1: int


@dataclass
class CompareResult:
    """The figures of one comparison, and every scored position for rendering the text.

    From a base file, the base's figures are llama-perplexity's: its log-probabilities are stored to 16 below the
    top, so a token the base puts further down (common in random-weight models, rare in trained ones) counts at that
    floor and ``ppl_base`` reads lower than the model's own perplexity."""

    base_name: str
    quant_name: str
    n_ctx: int
    n_chunks: int
    n_scored: int
    ppl_base: float  # each model's perplexity over the scored positions (llama-perplexity's procedure)
    ppl_quant: float
    kld_mean: float
    kld_median: float
    kld_p90: float
    kld_p99: float
    kld_max: float
    top1_agreement: float  # fraction of scored positions where both argmaxes agree
    tokens: list[TokenScore]  # every scored position in order
    context: list[tuple[int, str]]  # (token_id, piece) for every position of every chunk, in order
    base_is_kld: bool = False  # the base was a llama-perplexity log-probability file
    seconds: float = 0.0  # scoring time (models loaded)
    backends: tuple[str, str] = ("", "")  # the base's and the quant's ("" for a base file)
    #: text of every top-1 token named in ``tokens`` (bytes that are not UTF-8 on their own written as ``\\xNN``)
    token_text: dict[int, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ppl_ratio(self) -> float:
        """PPL(quant) / PPL(base)."""
        return self.ppl_quant / self.ppl_base

    def kld_values(self) -> np.ndarray:
        """KL divergence of every scored position, in order."""
        return np.fromiter((t.kld for t in self.tokens), np.float64, len(self.tokens))

    def kld_histogram(self, bins: int = 40, floor: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
        """(edges, counts) of the positions' KL divergence in ``bins`` bins evenly spaced in log10 (edges in nats,
        ``bins + 1`` of them) from the smallest value to the largest; values below ``floor`` (the two models agree
        to rounding there, or exactly) are counted in the first bin."""
        k = np.maximum(self.kld_values(), floor)
        lo, hi = (math.log10(float(k.min())), math.log10(float(k.max()))) if k.size else (0.0, 0.0)
        if hi - lo < 1e-9:
            lo, hi = lo - 0.5, hi + 0.5
        edges = np.logspace(lo, hi, max(int(bins), 1) + 1)
        if k.size:  # the outer edges hold the extremes exactly (10 ** log10(x) may round below x)
            edges[0], edges[-1] = min(edges[0], float(k.min())), max(edges[-1], float(k.max()))
        counts, _ = np.histogram(k, edges)
        return edges, counts

    def worst(self, n: int) -> list[TokenScore]:
        """The ``n`` positions of largest KL divergence, largest first."""
        return sorted(self.tokens, key=lambda t: -t.kld)[: max(n, 0)]

    def summary(self) -> dict[str, object]:
        """The figures as JSON-ready values."""
        return {
            "base": self.base_name, "quant": self.quant_name, "base_is_kld": self.base_is_kld,
            "n_ctx": self.n_ctx, "n_chunks": self.n_chunks, "n_scored": self.n_scored,
            "ppl_base": self.ppl_base, "ppl_quant": self.ppl_quant, "ppl_ratio": self.ppl_ratio,
            "ln_ppl_ratio": math.log(self.ppl_ratio),
            "kld_mean": self.kld_mean, "kld_median": self.kld_median, "kld_p90": self.kld_p90,
            "kld_p99": self.kld_p99, "kld_max": self.kld_max, "top1_agreement": self.top1_agreement,
            "seconds": self.seconds,
        }

    def token_rows(self) -> list[dict[str, object]]:
        """Every scored position as a JSON-ready dict."""
        return [asdict(t) for t in self.tokens]


class CompareCancelled(Exception):
    """The comparison was cancelled."""


class CompareError(ValueError):
    """A comparison refused before or while scoring (the message names the file and what is wrong)."""


class _Poll(threading.Event):
    """An event that reads a cancel callback, for :class:`Engine`'s loading."""

    def __init__(self, fn: Callable[[], bool]) -> None:
        super().__init__()
        self._fn = fn

    def is_set(self) -> bool:
        return bool(self._fn())


def _vocab_tokens(path: str) -> tuple[int, bytes]:
    """Count and raw bytes of ``tokenizer.ggml.tokens``."""
    try:
        with GGUFFile(path) as f:
            toks = f.get("tokenizer.ggml.tokens")
            if not isinstance(toks, StringArray):
                raise CompareError(f"{path}: the file has no tokenizer.ggml.tokens array")
            return len(toks), toks.copy()
    except GGUFError as exc:
        raise CompareError(f"{path}: not a readable GGUF file: {exc}") from None


def check_same_vocab(base: str | Path, quant: str | Path) -> None:
    """Refuse two files whose ``tokenizer.ggml.tokens`` differ (the message says where)."""
    (nb, rb), (nq, rq) = _vocab_tokens(str(base)), _vocab_tokens(str(quant))
    if nb != nq:
        raise CompareError(f"{base} and {quant} do not share a vocabulary: {nb:,} tokens against {nq:,}")
    if rb != rq:
        with GGUFFile(str(base)) as fb, GGUFFile(str(quant)) as fq:
            tb, tq = fb.get("tokenizer.ggml.tokens"), fq.get("tokenizer.ggml.tokens")
            i = next(k for k in range(nb) if tb.raw(k) != tq.raw(k))
            raise CompareError(f"{base} and {quant} do not share a vocabulary: token {i} is {tb[i]!r} in the first "
                               f"and {tq[i]!r} in the second")


def _load(path: str, what: str, n_ctx: int, threads: int, backend: str, repack: bool, say: Progress,
          cancel: Callable[[], bool] | None) -> Engine:
    def tell(message: str, fraction: float) -> None:
        say(int(1000 * fraction), 1000, f"loading the {what}: {message}")

    try:
        return Engine(path, n_ctx=n_ctx, threads=threads, progress=tell, backend=backend, repack=repack,
                      cancel=_Poll(cancel) if cancel is not None else None)
    except LoadCancelled:
        raise CompareCancelled("comparison cancelled") from None
    except GGUFError as exc:
        raise CompareError(f"{path}: not a readable GGUF file: {exc}") from None
    except (UnsupportedModel, TokenizerError) as exc:
        raise CompareError(f"{path}: {exc}") from None


def _session(eng: Engine, n_ctx: int, made: list[Any]) -> Any:
    """The engine's own session when it holds ``n_ctx`` tokens (its context is capped at the trained one), else a
    new one (kept in ``made`` to be closed)."""
    s = eng.session
    if s is not None and s.n_ctx >= n_ctx:
        return s
    made.append(eng.new_session(n_ctx))
    return made[-1]


def _pieces(tok: Tokenizer, ids: np.ndarray) -> list[tuple[int, str]]:
    """(id, text) for each token, a multi-byte character split over tokens going to the token that ends it."""
    dec = StreamDecoder(tok, special=True)
    out = [(int(t), dec.push(int(t))) for t in ids]
    tail = dec.flush()
    if tail and out:
        out[-1] = (out[-1][0], out[-1][1] + tail)
    return out


def compare_models(base: str | Path, quant: str | Path, text: str, *, n_ctx: int = 512, max_chunks: int = 0,
                   threads: int = 0, base_is_kld: bool = False, progress: Progress | None = None,
                   cancel: Callable[[], bool] | None = None, backend: str = "auto",
                   repack: bool = True) -> CompareResult:
    """Score ``text`` with both models chunk by chunk and compare them position by position.

    ``base`` is a GGUF (sharing the quant's ``tokenizer.ggml.tokens``) or, with ``base_is_kld``, a llama-perplexity
    KL-divergence base file: its context size replaces ``n_ctx``, its chunks are used, and the text must tokenize
    to its tokens (an empty text takes them as they are). ``progress(done, total, message)``: each model's loading
    in thousandths, then the chunks done of all; ``cancel()`` is polled while loading and between chunks
    (:class:`CompareCancelled`). Refusals raise :class:`CompareError` (a ``ValueError``)."""
    say: Progress = progress or (lambda _d, _t, _m: None)

    def check() -> None:
        if cancel is not None and cancel():
            raise CompareCancelled("comparison cancelled")

    base, quant = str(base), str(quant)
    kbase: kld.KLDBase | None = None
    beng: Engine | None = None
    qeng: Engine | None = None
    made: list[Any] = []
    try:
        if base_is_kld:
            kbase = kld.KLDBase(base)
            n_ctx = kbase.n_ctx
        else:
            if not 4 <= n_ctx <= kld.MAX_CTX:
                raise CompareError(f"context size {n_ctx} is outside 4..{kld.MAX_CTX}")
            check_same_vocab(base, quant)
        check()
        if kbase is None:
            beng = _load(base, "base", n_ctx, threads, backend, repack, say, cancel)
            check()
        qeng = _load(quant, "quant", n_ctx, threads, backend, repack, say, cancel)
        check()
        tok = qeng.tokenizer
        V = qeng.model.config.n_vocab
        if beng is not None and beng.model.config.n_vocab != V:
            raise CompareError(f"{base} and {quant} do not share a vocabulary: the output layers have "
                               f"{beng.model.config.n_vocab:,} and {V:,} rows")
        if kbase is not None:
            if kbase.n_vocab != V:
                raise CompareError(f"{base}: written for a vocabulary of {kbase.n_vocab:,} entries; {quant} has "
                                   f"{V:,}")
            n = min(kbase.n_chunk, max_chunks) if max_chunks else kbase.n_chunk
            chunks = kbase.tokens[:n]
            if text:
                ids = tok.encode(text)
                want = chunks.reshape(-1)
                if len(ids) < want.size or not np.array_equal(np.asarray(ids[: want.size]), want):
                    raise CompareError(f"{base}: the text does not tokenize to the file's tokens ({n} chunks of "
                                       f"{n_ctx}; the text has {len(ids):,} tokens{_first_diff(ids, want)})")
        else:
            try:
                chunks = kld.chunk_ids(tok.encode(text), n_ctx, max_chunks, min_chunks=1)
            except ValueError as exc:
                raise CompareError(str(exc)) from None
        n_chunks = int(chunks.shape[0])
        first = n_ctx // 2
        qs = _session(qeng, n_ctx, made)
        bs = _session(beng, n_ctx, made) if beng is not None else None
        btok = beng.tokenizer if beng is not None else tok
        parts: list[tuple[np.ndarray, ...]] = []
        kl_sum, kl_count = 0.0, 0
        t0 = time.perf_counter()
        say(0, n_chunks, f"{n_chunks} chunks of {n_ctx} tokens")
        for c in range(n_chunks):
            check()
            chunk = chunks[c]
            targets = chunk[first + 1 :]
            if kbase is not None:
                s = kld.score_positions(kld._chunk_logits(qs, tok, chunk), targets, records=kbase.records(c),
                                        n_vocab=V)
            else:
                blog = kld._chunk_logits(bs, btok, chunk)
                s = kld.score_positions(kld._chunk_logits(qs, tok, chunk), targets, base_logits=blog)
                del blog
            parts.append((s.nll, s.nll_base, s.kld, s.top, s.top_base))
            kl_sum += float(s.kld.sum())
            kl_count += int(s.kld.size)
            say(c + 1, n_chunks, f"chunk {c + 1}/{n_chunks}: mean KLD {kl_sum / kl_count:.6f}")
        seconds = time.perf_counter() - t0
    except (kld.KLDFileError, TokenizerError) as exc:
        raise CompareError(str(exc)) from None
    finally:
        if kbase is not None:
            kbase.close()
        for e in (*made, beng, qeng):
            closer = getattr(e, "close", None)
            if closer is not None:
                closer()
    nll, nll_base, kl, top, top_base = (np.concatenate([p[i] for p in parts]) for i in range(5))
    context = _pieces(tok, chunks.reshape(-1))
    positions = (np.arange(n_chunks)[:, None] * n_ctx + np.arange(first + 1, n_ctx)[None, :]).reshape(-1)
    tokens = [TokenScore(int(p), context[p][0], context[p][1], float(k), float(-b), float(-q), int(tb), int(tq))
              for p, k, b, q, tb, tq in zip(positions, kl, nll_base, nll, top_base, top, strict=True)]
    return CompareResult(
        base_name=Path(base).name, quant_name=Path(quant).name, n_ctx=n_ctx, n_chunks=n_chunks, n_scored=len(tokens),
        ppl_base=math.exp(float(nll_base.mean())), ppl_quant=math.exp(float(nll.mean())),
        kld_mean=float(kl.mean()), kld_median=float(np.median(kl)), kld_p90=float(np.percentile(kl, 90)),
        kld_p99=float(np.percentile(kl, 99)), kld_max=float(kl.max()), top1_agreement=float((top == top_base).mean()),
        tokens=tokens, context=context, base_is_kld=base_is_kld, seconds=seconds,
        backends=("" if beng is None else beng.backend, qeng.backend),
        token_text={int(t): tok.token_bytes(int(t)).decode("utf-8", errors="backslashreplace")
                    for t in np.unique(np.concatenate([top, top_base]))})


def _first_diff(ids: list[int], want: np.ndarray) -> str:
    n = min(len(ids), want.size)
    diff = np.flatnonzero(np.asarray(ids[:n]) != want[:n])
    return f"; they differ first at token {int(diff[0])}" if diff.size else ""
