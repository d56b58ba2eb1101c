"""Speculative decoding: tokens proposed cheaply, then checked by the model in one batched forward pass.

Two proposers: a *draft model* with the same vocabulary (a small model run token by token on its own session), and
*prompt lookup* (no model: the last n tokens of the context are looked up earlier in it, and what followed that
earlier occurrence is proposed, as llama.cpp's lookup/ngram). The target model evaluates the last sampled token
and the proposals in one forward pass with every position's logits (:meth:`Speculator.step`), keeps the proposals
it agrees with and rolls its cache back over the rest (``truncate``; a model with recurrent layers returns to a
checkpoint taken before the pass and re-reads the kept tokens).

Exactness: with greedy sampling each position's token is the target's argmax, as without speculation (on the CPU
a batched forward of a few tokens gives the same bits as one token at a time: the repacked kernels compute every
column alike; the tiled prefill GEMM of unrepacked weights is switched off for the verification pass). With
sampling the standard acceptance rule keeps the target's distribution: a proposal ``d`` drawn from the draft's
distribution ``q`` is accepted with probability ``min(1, p(d)/q(d))``, else the token is drawn from
``norm(max(0, p - q))``; a prompt-lookup proposal is a point mass (``q = 1`` at ``d``), for which the rule is the
same as sampling from ``p`` and accepting when the sample equals ``d`` (what llama.cpp does for both).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..chat import Sampler, SamplerParams, TokenChoice
from ..native import lib
from ..tokenizer import Tokenizer
from .session import InferenceSession

#: llama.cpp's defaults for a draft model (``--draft-max 16``, ``--draft-p-min 0.75`` in its server until the
#: speculative parameters were reorganized)
DRAFT_MAX = 16
DRAFT_P_MIN = 0.75
#: the longest n-gram prompt lookup accepts (``--lookup N``)
LOOKUP_MAX = 16
#: prompt tokens per forward call when the draft model reads the context
_DRAFT_CHUNK = 512


class VocabularyMismatch(ValueError):
    """The draft model's vocabulary differs from the target's."""


def vocabulary_difference(target: Tokenizer, draft: Tokenizer, n_target: int, n_draft: int) -> str:
    """Why a draft model cannot propose tokens for the target (its vocabulary or output size differs), in words;
    ``""`` when it can. ``n_target``/``n_draft``: the models' output sizes (logits per position)."""
    if n_target != n_draft or target.n_vocab != draft.n_vocab:
        return (f"the draft model has {draft.n_vocab} tokens ({n_draft} logits), the model {target.n_vocab} "
                f"({n_target})")
    i = next((i for i, (a, b) in enumerate(zip(target.pieces, draft.pieces, strict=True)) if a != b), None)
    if i is not None:
        return f"token {i} is {draft.pieces[i]!r} in the draft model and {target.pieces[i]!r} in the model"
    if (target.bos_id, target.eos_id) != (draft.bos_id, draft.eos_id):
        return "the draft model's BOS/EOS tokens differ from the model's"
    return ""


class NGramLookup:
    """Prompt lookup: the continuation of the latest earlier occurrence of the context's last ``n`` tokens (the
    longest ``n`` up to ``n_max`` that occurs), as the proposal. The index grows with the context."""

    def __init__(self, n_max: int) -> None:
        if isinstance(n_max, bool) or not isinstance(n_max, int) or not 1 <= n_max <= LOOKUP_MAX:
            raise ValueError(f"the lookup n-gram size must be 1..{LOOKUP_MAX}, not {n_max!r}")
        self.n_max = n_max
        self._seen: list[int] = []
        #: per size n: n-gram -> the position after its latest occurrence that has a following token
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_max + 1)]

    def _extend(self, history: Sequence[int]) -> None:
        if self._seen != list(history[: len(self._seen)]):
            self._seen, self._index = [], [{} for _ in range(self.n_max + 1)]
        start = len(self._seen)
        self._seen.extend(int(t) for t in history[start:])
        h = self._seen
        # an n-gram ending at i-1 is indexed once token i exists (its continuation)
        for i in range(max(1, start), len(h)):
            for n in range(1, min(self.n_max, i) + 1):
                self._index[n][tuple(h[i - n : i])] = i

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of ``history``'s last n-gram."""
        self._extend(history)
        h = self._seen
        for n in range(min(self.n_max, len(h) - 1), 0, -1):
            at = self._index[n].get(tuple(h[len(h) - n :]))
            if at is not None:
                return h[at : at + k]
        return []


class DraftModel:
    """A draft model's session kept in step with the context: it reads what it has not seen (the prompt, the
    accepted tokens) and then proposes tokens one forward pass each, stopping early where its most likely token
    has a probability below ``p_min`` (llama.cpp's ``--draft-p-min``, at temperature 1)."""

    def __init__(self, session: InferenceSession, p_min: float = DRAFT_P_MIN) -> None:
        self.session = session
        self.p_min = p_min
        self.cached: list[int] = []
        self.sampler: Sampler | None = None

    def begin(self, params: SamplerParams) -> None:
        """A new reply: sample proposals with ``params`` (greedy: the argmax), from a generator of their own."""
        seed = None if params.seed is None else params.seed + 1
        self.sampler = Sampler(dataclasses.replace(params, seed=seed, alternatives=0))

    def _sync(self, history: Sequence[int]) -> np.ndarray:
        s = self.session
        common = 0
        for a, b in zip(self.cached, history, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(history) - 1)
        s.truncate(common)
        common = min(common, s.n_past)  # recurrent layers: back to the checkpoint, or to the start
        new = list(history[common:])
        row = np.empty(0, np.float32)
        for a in range(0, len(new), _DRAFT_CHUNK):
            row = s.forward(new[a : a + _DRAFT_CHUNK], logits=a + _DRAFT_CHUNK >= len(new))
        self.cached = list(history)
        s.checkpoint()  # (recurrent layers: the next call rewinds here)
        return row

    def propose(self, history: Sequence[int], k: int, stop: frozenset[int] = frozenset()
                ) -> tuple[list[int], list[tuple[np.ndarray, np.ndarray]]]:
        """Up to ``k`` proposed tokens after ``history`` and the distribution each was drawn from."""
        assert self.sampler is not None, "begin() first"
        k = min(k, self.session.n_ctx - len(history))
        if k <= 0:
            return [], []
        row = self._sync(history)
        toks: list[int] = []
        dists: list[tuple[np.ndarray, np.ndarray]] = []
        for i in range(k):
            r = np.asarray(row, dtype=np.float64)
            if self.p_min > 0 and 1.0 / float(np.exp(r - r.max()).sum()) < self.p_min:
                break
            x = self.sampler.penalized(row, [*history, *toks])
            idx, p = self.sampler.distribution(x)
            t = int(idx[0]) if idx.size == 1 else int(idx[self.sampler.rng.choice(idx.size, p=p)])
            toks.append(t)
            dists.append((idx, p))
            if i + 1 == k or t in stop:
                break
            row = self.session.forward([t])
            self.cached.append(t)
        return toks, dists


@dataclass
class SpeculationStats:
    """Proposals made and accepted (running totals)."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # verification passes

    @property
    def rate(self) -> float:
        """Accepted proposals per proposal (0 when none was made)."""
        return self.accepted / self.drafted if self.drafted else 0.0


_gemm_lock = threading.Lock()
_gemm_users = 0
_gemm_prev = 1


@contextmanager
def _row_kernels() -> Iterator[None]:
    """The tiled prefill GEMM off while any verification pass runs (a process-wide switch: counted, so that
    passes in several threads restore it once, when the last ends)."""
    global _gemm_users, _gemm_prev
    with _gemm_lock:
        if _gemm_users == 0:
            _gemm_prev = int(lib.qs_gemm_set(0))
        _gemm_users += 1
    try:
        yield
    finally:
        with _gemm_lock:
            _gemm_users -= 1
            if _gemm_users == 0:
                lib.qs_gemm_set(_gemm_prev)


def _verify(sampler: Sampler, row: np.ndarray, history: list[int], d: int,
            q: tuple[np.ndarray, np.ndarray] | None) -> tuple[int, bool]:
    """The token at a position whose proposal is ``d``, and whether it is ``d``. ``q``: the distribution ``d`` was
    drawn from (None: a point mass at ``d``, or a greedy proposal)."""
    if q is None or sampler.p.temperature <= 0:
        t = sampler.sample(row, history)
        return t, t == d
    x = sampler.penalized(row, history)
    idx, p = sampler.distribution(x)
    pf = np.zeros(x.size)
    pf[idx] = p
    qf = np.zeros(x.size)
    qf[q[0]] = q[1]
    if sampler.rng.random() * qf[d] < pf[d]:  # accept with probability min(1, p/q)
        t, ok = d, True
    else:
        r = np.maximum(pf - qf, 0.0)
        if r.sum() <= 0:  # (p == q: a rejection cannot happen; rounding only)
            r = pf
        nz = np.flatnonzero(r)
        t, ok = int(nz[sampler.rng.choice(nz.size, p=r[nz] / r[nz].sum())]), False
    sampler.note(x, t)
    return t, ok


class Speculator:
    """Speculative decoding for one engine: prompt lookup (``lookup`` > 0: the longest n-gram), a draft model's
    session (``draft``), or both (lookup first, the draft where lookup finds nothing); at most ``draft_max``
    proposals per verification pass."""

    def __init__(self, draft: DraftModel | None = None, lookup: int = 0, draft_max: int = DRAFT_MAX) -> None:
        if isinstance(draft_max, bool) or not isinstance(draft_max, int) or not 1 <= draft_max <= 256:
            raise ValueError(f"the most tokens drafted at once must be 1..256, not {draft_max!r}")
        if isinstance(lookup, bool) or not isinstance(lookup, int) or not 0 <= lookup <= LOOKUP_MAX:
            raise ValueError(f"the lookup n-gram size must be 0..{LOOKUP_MAX}, not {lookup!r}")
        if draft is None and not lookup:
            raise ValueError("speculative decoding needs a draft model or a lookup n-gram size")
        self.draft = draft
        self.lookup = lookup
        self.draft_max = draft_max
        self._ngrams: NGramLookup | None = None
        self.stats = SpeculationStats()

    def begin(self, params: SamplerParams) -> None:
        """A new reply (fresh counts and lookup index)."""
        self.stats = SpeculationStats()
        self._ngrams = NGramLookup(self.lookup) if self.lookup else None
        if self.draft is not None:
            self.draft.begin(params)

    def step(self, session: InferenceSession, sampler: Sampler, history: list[int], room: int,
             stop: frozenset[int] = frozenset()) -> list[tuple[int, TokenChoice | None]]:
        """Evaluate ``history[-1]`` (sampled, not yet in ``session``'s cache) and up to ``room - 1`` proposals after
        it in one forward pass; the tokens picked after it, each with its choice (``params.alternatives``): the
        accepted proposals, then the target's own token at the first rejection (or after the last proposal). The
        cache then holds ``history[-1]`` and the accepted proposals; the last token returned is not in it."""
        last = history[-1]
        k = max(0, min(self.draft_max, room - 1, session.n_ctx - session.n_past - 1))
        drafts: list[int] = []
        dists: list[tuple[np.ndarray, np.ndarray]] | None = None
        if k and self._ngrams is not None:
            drafts = self._ngrams.propose(history, k)
        if k and not drafts and self.draft is not None:
            drafts, dists = self.draft.propose(history, k, stop)
            if sampler.p.temperature <= 0:
                dists = None
        n0 = session.n_past
        if not drafts:
            row = session.forward([last])
            t = sampler.sample(row, history)
            return [(t, sampler.last)]
        session.checkpoint()  # (recurrent layers: where a rejection rolls back to)
        with _row_kernels():
            rows = session.forward([last, *drafts], all_logits=True)
        out: list[tuple[int, TokenChoice | None]] = []
        seen = list(history)
        for i, d in enumerate(drafts):
            t, ok = _verify(sampler, rows[i], seen, d, dists[i] if dists is not None else None)
            out.append((t, sampler.last))
            seen.append(t)
            if not ok:
                break
        else:
            t = sampler.sample(rows[len(drafts)], seen)
            out.append((t, sampler.last))
        kept = len(out) - 1
        self.stats.drafted += len(drafts)
        self.stats.accepted += kept
        self.stats.steps += 1
        session.truncate(n0 + 1 + kept)
        if session.n_past < n0 + 1 + kept:  # recurrent layers: back at the checkpoint; read the kept tokens again
            if session.n_past < n0:
                raise RuntimeError("the session lost its checkpoint during a verification pass")
            redo = [last, *drafts[:kept]][session.n_past - n0 :]
            with _row_kernels():
                session.forward(redo, logits=False)
        return out
