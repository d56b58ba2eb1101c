"""KL divergence against a base model, in llama-perplexity's own log-probability file format.

``llama-perplexity --kl-divergence-base FILE`` writes, and ``--kl-divergence-base FILE --kl-divergence`` reads, a
file laid out as (all little-endian; docs/engine.md, "KL divergence files"):

* the 8 bytes ``_logits_``, then int32 ``n_ctx``, int32 ``n_vocab``, int32 ``n_chunk``;
* ``n_chunk * n_ctx`` int32 tokens: the tokenized text, chunk after chunk, as tokenized (the BOS that replaces a
  chunk's first token while it is evaluated is not written);
* per chunk, one record for each of the ``n_ctx - 1 - n_ctx // 2`` scored positions (``n_ctx // 2`` up to
  ``n_ctx - 2``, each predicting the next token): ``2 * ((n_vocab + 1) // 2) + 4`` uint16, i.e. two float32
  (``scale``, ``min_log_prob``) and then one uint16 per vocabulary entry, padded to an even count. Entry ``q``
  stands for the log-probability ``scale * q + min_log_prob``; logits more than 16 below the maximum are stored
  as 0.

:func:`quantize_log_probs` reproduces the writer's float32 arithmetic, so a file written here is read by
llama-perplexity and the other way round (``tests/test_kld.py`` checks both against files it wrote).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .. import sysinfo
from ..fsutil import OutputSet, open_input, pread
from ..tokenizer import Tokenizer
from .session import Model

MAGIC = b"_logits_"
HEADER_BYTES = 8 + 3 * 4
MAX_VOCAB = 1 << 24
MAX_CTX = 1 << 20


class KLDFileError(ValueError):
    """A file that is not a well-formed llama-perplexity log-probability file (the message says what is wrong)."""


#: the largest scale a writer can store: the log-probabilities kept span at most 16 nats over 65535 steps
MAX_SCALE = float(np.float32(16.0) / np.float32(65535.0)) * 1.001


def memory_bytes() -> int:
    """This machine's physical memory (0 when unknown)."""
    return sysinfo.memory_total() or 0


def check_context(c: Any, n_ctx: int, what: str = "a context") -> None:
    """Refuse a context the model (its :class:`~quantscope.core.model.ModelConfig` ``c``) was not trained for, or
    whose KV cache and logits would not fit in half of this machine's memory (a KLD base file may ask for any
    context up to 2**20)."""
    if n_ctx > c.n_ctx_train:
        raise ValueError(f"{what} of {n_ctx:,} tokens is longer than the model's trained context of "
                         f"{c.n_ctx_train:,}")
    need = 8 * c.n_layers * n_ctx * c.n_head_kv * c.head_dim + 4 * n_ctx * c.n_vocab
    mem = memory_bytes()
    if mem and need > mem // 2:
        raise ValueError(f"{what} of {n_ctx:,} tokens needs about {need / 2**30:.1f} GiB for its KV cache and "
                         f"logits; this machine has {mem / 2**30:.1f} GiB")


def record_len(n_vocab: int) -> int:
    """uint16 values per scored position."""
    return 2 * ((n_vocab + 1) // 2) + 4


def scored_per_chunk(n_ctx: int) -> int:
    return n_ctx - 1 - n_ctx // 2


def quantize_log_probs(logits: np.ndarray) -> np.ndarray:
    """(T, V) float32 logits -> (T, record_len(V)) uint16 records, as llama-perplexity's writer computes them
    (float32 arithmetic, the sum of exponentials in float64, round half to even)."""
    lg = np.ascontiguousarray(logits, dtype=np.float32)
    T, V = lg.shape
    out = np.zeros((T, record_len(V)), dtype=np.uint16)
    for t in range(T):
        row = lg[t]
        mx = row.max()
        mn = max(row.min(), np.float32(mx - np.float32(16)))
        sum_exp = float(np.exp(row - mx, dtype=np.float32).astype(np.float64).sum())
        log_sum_exp = np.float32(math.log(sum_exp))
        min_log_prob = np.float32(np.float32(mn - mx) - log_sum_exp)
        scale = np.float32(np.float32(mx - mn) / np.float32(65535.0))
        head = np.array([scale, min_log_prob], dtype=np.float32).view(np.uint16)
        out[t, :4] = head
        if scale:
            inv = np.float32(np.float32(1.0) / scale)
            q = np.rint(inv * (row - mn)).astype(np.int64)
            out[t, 4 : 4 + V] = np.where(row > mn, np.clip(q, 0, 65535), 0).astype(np.uint16)
    return out


def log_probs_of(records: np.ndarray, n_vocab: int) -> np.ndarray:
    """(T, record_len) uint16 records -> (T, n_vocab) float32 log-probabilities ``scale * q + min_log_prob``."""
    head = np.ascontiguousarray(records[:, :4]).view(np.float32)
    scale, lo = head[:, 0:1], head[:, 1:2]
    return (scale * records[:, 4 : 4 + n_vocab].astype(np.float32) + lo).astype(np.float32)


class KLDBase:
    """A log-probability file opened for reading; every count and the file size are checked when opened. The
    tokens are read at once; each chunk's records only when asked for (a base over a long text and a large
    vocabulary runs to gigabytes)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = None
        fd = open_input(self.path)
        try:
            with os.fdopen(os.dup(fd), "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                head = fh.read(HEADER_BYTES)
                if len(head) < HEADER_BYTES or head[:8] != MAGIC:
                    raise KLDFileError(f"{self.path}: not a llama-perplexity log-probability file (it does not start "
                                       f"with {MAGIC.decode()!r} and three counts)")
                n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(head, "<i4", 3, 8))
                if not 4 <= n_ctx <= MAX_CTX:
                    raise KLDFileError(f"{self.path}: context size {n_ctx} is outside 4..{MAX_CTX}")
                if not 1 <= n_vocab <= MAX_VOCAB:
                    raise KLDFileError(f"{self.path}: vocabulary size {n_vocab} is outside 1..{MAX_VOCAB}")
                per_chunk = 4 * n_ctx + 2 * scored_per_chunk(n_ctx) * record_len(n_vocab)
                if not 1 <= n_chunk <= (size - HEADER_BYTES) // per_chunk:
                    raise KLDFileError(f"{self.path}: {n_chunk} chunks of {n_ctx} tokens over {n_vocab} entries need "
                                       f"{HEADER_BYTES + max(n_chunk, 1) * per_chunk} bytes; the file has {size}")
                expect = HEADER_BYTES + n_chunk * per_chunk
                if size != expect:
                    raise KLDFileError(f"{self.path}: expected {expect} bytes for {n_chunk} chunks of {n_ctx} tokens "
                                       f"over {n_vocab} entries, found {size}")
                self.n_ctx, self.n_vocab, self.n_chunk = n_ctx, n_vocab, n_chunk
                self.tokens = np.frombuffer(fh.read(4 * n_ctx * n_chunk), "<i4").astype(np.int64).reshape(n_chunk,
                                                                                                             n_ctx)
        except BaseException:
            os.close(fd)
            raise
        if self.tokens.min() < 0 or self.tokens.max() >= n_vocab:
            os.close(fd)
            raise KLDFileError(f"{self.path}: token ids must lie in 0..{n_vocab - 1}, found "
                               f"{int(self.tokens.min())}..{int(self.tokens.max())}")
        self._fd = fd
        self._chunk_bytes = 2 * scored_per_chunk(n_ctx) * record_len(n_vocab)
        self._records_at = HEADER_BYTES + 4 * n_ctx * n_chunk

    def records(self, chunk: int) -> np.ndarray:
        """(scored positions, record_len) uint16 records of one chunk, read from the file now; a file cut short
        since it was opened raises :class:`KLDFileError`."""
        if not 0 <= chunk < self.n_chunk:
            raise IndexError(f"chunk {chunk} outside 0..{self.n_chunk - 1}")
        if self._fd is None:
            raise ValueError(f"{self.path}: closed")
        data = pread(self._fd, self._chunk_bytes, self._records_at + chunk * self._chunk_bytes)
        if len(data) != self._chunk_bytes:
            raise KLDFileError(f"{self.path}: chunk {chunk} is cut short ({len(data)} of {self._chunk_bytes} bytes): "
                               "the file changed while in use")
        rec = np.frombuffer(data, "<u2").reshape(-1, record_len(self.n_vocab))
        head = np.ascontiguousarray(rec[:, :4]).view(np.float32)
        scale, lo = head[:, 0], head[:, 1]
        floor = -(16.0 + math.log(self.n_vocab) + 1.0)
        with np.errstate(invalid="ignore"):
            bad = ~(np.isfinite(scale) & np.isfinite(lo) & (scale >= 0) & (scale <= MAX_SCALE) & (lo <= 0)
                    & (lo >= floor))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise KLDFileError(f"{self.path}: chunk {chunk}, position {i}: scale {float(scale[i]):g} and minimum "
                               f"log-probability {float(lo[i]):g} are out of range (a writer stores a scale in "
                               f"0..{MAX_SCALE:.3g} and a minimum in {floor:.3g}..0)")
        return rec

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> KLDBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _exp(x: float) -> float:
    """``exp(x)``, infinity instead of an OverflowError."""
    return math.exp(x) if x < 709.0 else math.inf


@dataclass
class KLDResult:
    """What llama-perplexity's KL-divergence run reports, from per-position values."""

    n_ctx: int
    n_chunks: int
    nll: np.ndarray  # ours, per scored position
    nll_base: np.ndarray
    kld: np.ndarray
    p_diff: np.ndarray  # p(token) ours - base
    same_top: np.ndarray  # bool
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return int(self.kld.size)

    @staticmethod
    def _mean_unc(x: np.ndarray) -> tuple[float, float]:
        n = x.size
        f = float(x.mean())
        var = float((x * x).mean()) - f * f
        return f, (math.sqrt(var / (n - 1)) if var > 0 and n > 10 else 0.0)

    def ppl(self) -> tuple[float, float]:
        m, u = self._mean_unc(self.nll)
        return _exp(m), _exp(m) * u

    def ppl_base(self) -> tuple[float, float]:
        m, u = self._mean_unc(self.nll_base)
        return _exp(m), _exp(m) * u

    def mean_kld(self) -> tuple[float, float]:
        return self._mean_unc(self.kld)

    def top1(self) -> float:
        return float(self.same_top.mean())

    def report(self) -> str:
        """The statistics block, in llama-perplexity's wording."""
        def pct(x: np.ndarray, f: float) -> float:
            s = np.sort(x)
            p = f * (s.size - 1)
            i = int(p)
            return float((1 - (p - i)) * s[i] + (p - i) * s[min(i + 1, s.size - 1)])

        q, qu = self.ppl()
        b, bu = self.ppl_base()
        n = self.count
        m1, m2 = self.nll.mean(), self.nll_base.mean()
        cov = float((self.nll * self.nll_base).mean() - m1 * m2) / (n - 1) if n >= 10 else 0.0
        s1, s2 = self._mean_unc(self.nll)[1], self._mean_unc(self.nll_base)[1]
        ratio_unc = math.sqrt(max(s1 * s1 + s2 * s2 - 2 * cov, 0.0))
        k, ku = self.mean_kld()
        rms = math.sqrt(float((self.p_diff ** 2).mean()))
        top = self.top1()
        lines = [
            "====== Perplexity statistics ======",
            f"Mean PPL(Q)                   : {q:10.6f} ± {qu:10.6f}",
            f"Mean PPL(base)                : {b:10.6f} ± {bu:10.6f}",
            f"Mean ln(PPL(Q)/PPL(base))     : {m1 - m2:10.6f} ± {ratio_unc:10.6f}",
            f"Mean PPL(Q)/PPL(base)         : {q / b if b else math.inf:10.6f}",
            f"Mean PPL(Q)-PPL(base)         : {q - b:10.6f}",
            "",
            "====== KL divergence statistics ======",
            f"Mean    KLD: {k:10.6f} ± {ku:10.6f}",
            f"Maximum KLD: {float(self.kld.max()):10.6f}",
            f"99.0%   KLD: {pct(self.kld, 0.99):10.6f}",
            f"Median  KLD: {float(np.median(self.kld)):10.6f}",
            f"Minimum KLD: {float(self.kld.min()):10.6f}",
            "",
            "====== Token probability statistics ======",
            f"Mean    Δp: {100 * float(self.p_diff.mean()):6.3f} %",
            f"RMS Δp    : {100 * rms:6.3f} %",
            f"Same top p: {100 * top:6.3f} ± {100 * math.sqrt(top * (1 - top) / max(n - 1, 1)):5.3f} %",
        ]
        return "\n".join(lines)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    lg = logits.astype(np.float64)
    mx = lg.max(axis=1, keepdims=True)
    return lg - (mx + np.log(np.exp(lg - mx).sum(axis=1, keepdims=True)))


#: scored positions handled at once by :func:`score_positions` (bounds its float64 temporaries to a few rows of the
#: vocabulary)
SCORE_ROWS = 32


class PositionScores(NamedTuple):
    """Per scored position: our nll, the base's nll, KL(base || ours), p(target) ours - base, whether the top tokens
    agree, and the two top tokens."""

    nll: np.ndarray
    nll_base: np.ndarray
    kld: np.ndarray
    p_diff: np.ndarray
    same: np.ndarray
    top: np.ndarray
    top_base: np.ndarray


def score_positions(logits: np.ndarray, targets: np.ndarray, *, base_logits: np.ndarray | None = None,
                    records: np.ndarray | None = None, n_vocab: int = 0) -> PositionScores:
    """Compare our (T, V) logits with a base given either as its logits (KL over the whole vocabulary, exactly 0
    for the same logits) or as llama-perplexity's records (KL over the base entries above log-probability -16, as
    llama-perplexity sums it); in blocks of :data:`SCORE_ROWS` rows."""
    if (base_logits is None) == (records is None):
        raise ValueError("give exactly one of base_logits and records")
    T = int(targets.size)
    cols: list[list[np.ndarray]] = [[] for _ in range(7)]
    for a in range(0, T, SCORE_ROWS):
        b = min(a + SCORE_ROWS, T)
        ours = _log_softmax(logits[a:b])
        tg = targets[a:b]
        idx = np.arange(b - a)
        if base_logits is not None:
            base = _log_softmax(base_logits[a:b])
            pb = np.exp(base)
            kld = np.where(pb > 0, pb * (base - ours), 0.0).sum(axis=1)
            top_base = base_logits[a:b].argmax(axis=1)
        else:
            assert records is not None
            base = log_probs_of(records[a:b], n_vocab).astype(np.float64)
            keep = base > -16.0
            pb = np.where(keep, np.exp(np.where(keep, base, 0.0)), 0.0)
            kld = (pb * np.where(keep, base - ours, 0.0)).sum(axis=1)
            top_base = base.argmax(axis=1)
        nll = -ours[idx, tg]
        nll_base = -base[idx, tg]
        top = logits[a:b].argmax(axis=1)
        for col, x in zip(cols, (nll, nll_base, kld, np.exp(-nll) - np.exp(-nll_base), top == top_base, top,
                                 top_base), strict=True):
            col.append(x)
    empty = (np.zeros(0),) * 4 + (np.zeros(0, bool),) + (np.zeros(0, np.int64),) * 2
    return PositionScores(*(np.concatenate(c) if c else e for c, e in zip(cols, empty, strict=True)))


def compare_records(logits: np.ndarray, records: np.ndarray, targets: np.ndarray,
                    n_vocab: int) -> tuple[np.ndarray, ...]:
    """Per position: our nll, the base's nll, KL(base || ours) over the entries above log-probability -16 (as
    llama-perplexity sums it), p(target) ours - base, and whether the top tokens agree."""
    return score_positions(logits, targets, records=records, n_vocab=n_vocab)[:5]


def chunk_ids(ids: list[int] | np.ndarray, n_ctx: int, max_chunks: int = 0, min_chunks: int = 2) -> np.ndarray:
    """Token ids cut into (n_chunks, n_ctx) non-overlapping chunks (at most ``max_chunks``, 0 = all); the text must
    have ``min_chunks * n_ctx`` tokens (llama-perplexity asks for two chunks' worth)."""
    n_chunks = len(ids) // n_ctx
    if max_chunks:
        n_chunks = min(n_chunks, max_chunks)
    if len(ids) < min_chunks * n_ctx or n_chunks == 0:
        if min_chunks >= 2:
            raise ValueError(f"the text has {len(ids)} tokens; llama-perplexity's procedure needs at least "
                             f"{min_chunks * n_ctx} ({'two' if min_chunks == 2 else min_chunks} chunks of {n_ctx})")
        raise ValueError(f"the text has {len(ids)} tokens; at least {n_ctx} are needed (one chunk of {n_ctx})")
    return np.asarray(ids[: n_chunks * n_ctx], dtype=np.int64).reshape(n_chunks, n_ctx)


def _chunks(tok: Tokenizer, text: str, n_ctx: int, max_chunks: int) -> np.ndarray:
    return chunk_ids(tok.encode(text), n_ctx, max_chunks)


def _chunk_logits(session: Any, tok: Tokenizer, chunk: np.ndarray) -> np.ndarray:
    """Logits of the scored positions of one chunk, its first token replaced by BOS when the model adds BOS."""
    n_ctx = chunk.size
    ids = [int(t) for t in chunk]
    if tok.add_bos and tok.bos_id is not None:
        ids[0] = tok.bos_id
    session.reset()
    logits = session.forward(ids, all_logits=True)
    return np.asarray(logits[n_ctx // 2 : n_ctx - 1], dtype=np.float32)


def write_base(path: str | os.PathLike[str], model: Model, tok: Tokenizer, text: str, n_ctx: int,
               max_chunks: int = 0, make_session: Callable[[int], Any] | None = None,
               progress: Callable[[int, int], None] | None = None,
               inputs: tuple[str, ...] = ()) -> tuple[int, float]:
    """Evaluate ``text`` as llama-perplexity does and write the log-probability file to ``path`` (through a
    temporary and a rename, refusing a path that is one of ``inputs``); returns the number of chunks and the
    perplexity of the scored positions."""
    if not 4 <= n_ctx <= MAX_CTX:
        raise ValueError(f"context size {n_ctx} is outside 4..{MAX_CTX}")
    check_context(model.config, n_ctx)
    chunks = _chunks(tok, text, n_ctx, max_chunks)
    V = model.config.n_vocab
    session = make_session(n_ctx) if make_session else model.session(n_ctx)
    with OutputSet([("--kl-divergence-base", path)], inputs=inputs) as outs:
        outs.open("--kl-divergence-base")
        outs.write_bytes("--kl-divergence-base",
                         MAGIC + np.array([n_ctx, V, chunks.shape[0]], "<i4").tobytes()
                         + chunks.astype("<i4").tobytes())
        nll_sum, count = 0.0, 0
        for c, chunk in enumerate(chunks):
            logits = _chunk_logits(session, tok, chunk)
            targets = chunk[n_ctx // 2 + 1 :]
            nll_sum -= float(_log_softmax(logits)[np.arange(targets.size), targets].sum())
            count += int(targets.size)
            outs.write_bytes("--kl-divergence-base", quantize_log_probs(logits).astype("<u2").tobytes())
            if progress:
                progress(c + 1, chunks.shape[0])
        outs.commit()
    return int(chunks.shape[0]), math.exp(nll_sum / count)


def kl_divergence(base: KLDBase, model: Model, tok: Tokenizer, make_session: Callable[[int], Any] | None = None,
                  progress: Callable[[int, int, KLDResult], None] | None = None) -> KLDResult:
    """Evaluate the base file's token chunks on ``model`` and compare with its log-probabilities."""
    if base.n_vocab != model.config.n_vocab:
        raise ValueError(f"{base.path}: written for a vocabulary of {base.n_vocab} entries; this model has "
                         f"{model.config.n_vocab}")
    check_context(model.config, base.n_ctx, f"{base.path}: its context")
    session = make_session(base.n_ctx) if make_session else model.session(base.n_ctx)
    parts: list[tuple[np.ndarray, ...]] = []
    first = base.n_ctx // 2
    result = KLDResult(base.n_ctx, 0, *(np.zeros(0) for _ in range(4)), np.zeros(0, bool))
    for c in range(base.n_chunk):
        chunk = base.tokens[c]
        logits = _chunk_logits(session, tok, chunk)
        parts.append(compare_records(logits, base.records(c), chunk[first + 1 :], base.n_vocab))
        cols = [np.concatenate([p[i] for p in parts]) for i in range(5)]
        result = KLDResult(base.n_ctx, c + 1, *cols)
        if progress:
            progress(c + 1, base.n_chunk, result)
    return result
