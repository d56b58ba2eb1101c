"""A reply's tokens as the sampler saw them, and branching a reply at one of them.

Each generated token becomes a :class:`TokenRecord`: its id, the text it added to the reply (which may be empty,
for a control token or the first bytes of a character split over tokens, or longer than its own piece, for the
token that completes such a character), its own piece, its probability (raw and at the sampling temperature), the
distribution's entropy and the top alternatives with their pieces. :class:`ReplyTrace` builds them from the
engine's deltas. :func:`dumps` / :func:`loads` store them compactly (JSON lists, probabilities to 5 significant
digits); :func:`loads` validates everything (a database is input like any other).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from . import TokenChoice

#: alternatives the chat keeps per token
N_ALTERNATIVES = 10
#: at most this many records per reply are stored (a reply never has more tokens than the context)
MAX_RECORDS = 1 << 20


@dataclass(frozen=True)
class Alternative:
    """A token the sampler could have picked: its probability raw (``prob``) and at the temperature."""

    token: int
    piece: str
    prob: float
    scaled_prob: float


@dataclass(frozen=True)
class TokenRecord:
    """One token of a reply (see the module's docstring). ``chosen``: put there by the user (a branch), not
    sampled; ``channel``: "" for the answer, "analysis"/"commentary" for a harmony model's thinking."""

    token: int
    text: str
    piece: str
    prob: float
    scaled_prob: float
    entropy: float
    alternatives: tuple[Alternative, ...] = ()
    channel: str = ""
    chosen: bool = False

    @property
    def known(self) -> bool:
        """Whether the probabilities were recorded (a token of a reply made without alternatives has none)."""
        return not math.isnan(self.prob)


def piece_text(raw: bytes) -> str:
    """A token's own text for display: its UTF-8 text, or its bytes in hex when it is part of a character."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(f"<0x{b:02X}>" for b in raw)


def record_of(token: int, text: str, choice: TokenChoice | None, piece: Callable[[int], str],
              channel: str = "", chosen: bool = False) -> TokenRecord:
    """The record of ``token`` (``piece(id)`` gives a token's own text); without a ``choice`` the numbers are NaN."""
    if choice is None:
        nan = float("nan")
        return TokenRecord(token, text, piece(token), nan, nan, nan, (), channel, chosen)
    alts = tuple(Alternative(t, piece(t), p, s) for t, p, s in choice.alternatives)
    return TokenRecord(token, text, piece(token), choice.prob, choice.scaled_prob, choice.entropy, alts, channel,
                       chosen)


class ReplyTrace:
    """Collects a reply's :class:`TokenRecord` from the engine's deltas (``add`` for each delta).

    ``seed``: the records of a branch's forced tokens (:func:`branch_records`); a forced delta takes its
    figures from the seed record at its place and only its text and channel from the delta."""

    def __init__(self, piece: Callable[[int], str], seed: Sequence[TokenRecord] = ()) -> None:
        self.piece = piece
        self.seed = list(seed)
        self.records: list[TokenRecord] = []

    def add(self, token: int | None, text: str, channel: str = "", choice: TokenChoice | None = None,
            forced: bool = False) -> TokenRecord | None:
        """A delta: a token makes a record (returned); the closing text without a token (bytes held back at
        the end) joins the last record of its channel."""
        if token is not None:
            k = len(self.records)
            if forced and k < len(self.seed) and self.seed[k].token == token:
                rec = replace(self.seed[k], text=text, channel=channel)
            else:
                rec = record_of(token, text, choice, self.piece, channel, forced)
            self.records.append(rec)
            return rec
        if text:
            for i in range(len(self.records) - 1, -1, -1):
                if self.records[i].channel == channel:
                    self.records[i] = replace(self.records[i], text=self.records[i].text + text)
                    return None
            self.records.append(TokenRecord(-1, text, "", *(float("nan"),) * 3, (), channel))
        return None


def answer_text(records: Sequence[TokenRecord]) -> str:
    """The answer the records make (the thinking channels left out)."""
    return "".join(r.text for r in records if not r.channel)


def answer_spans(records: Sequence[TokenRecord]) -> list[tuple[int, int, int]]:
    """``(start, end, record index)`` of each answer token with text, as offsets into :func:`answer_text`."""
    out = []
    pos = 0
    for i, r in enumerate(records):
        if r.channel or not r.text:
            continue
        out.append((pos, pos + len(r.text), i))
        pos += len(r.text)
    return out


def replay_tokens(records: Sequence[TokenRecord], index: int, token: int) -> list[int]:
    """The reply's tokens to force when branching at record ``index`` with ``token``: the ones before it, then
    ``token``. ``ValueError`` when the index is out of range or a record before it has no token id."""
    if not 0 <= index < len(records):
        raise ValueError(f"token index {index} is out of range (the reply has {len(records)} tokens)")
    ids = [r.token for r in records[:index]]
    if any(t < 0 for t in ids):
        raise ValueError("the reply's tokens before this one are not all known")
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise ValueError(f"not a token id: {token!r}")
    return [*ids, token]


def branch_records(records: Sequence[TokenRecord], index: int, token: int) -> list[TokenRecord]:
    """The records a branch at ``index`` with ``token`` starts from: the ones before it, then the chosen token's
    (its figures are the alternative's at that position, its entropy the position's; ``chosen`` is set)."""
    replay_tokens(records, index, token)
    at = records[index]
    alt = next((a for a in at.alternatives if a.token == token), None)
    if alt is not None:
        rec = TokenRecord(token, "", alt.piece, alt.prob, alt.scaled_prob, at.entropy, at.alternatives, at.channel,
                          True)
    elif token == at.token:
        rec = replace(at, text="", chosen=True)
    else:
        nan = float("nan")
        rec = TokenRecord(token, "", "", nan, nan, at.entropy, at.alternatives, at.channel, True)
    return [*records[:index], rec]


# ---------------------------------------------------------------------------------------------------- storage
def _num(x: float) -> float | None:
    return None if math.isnan(x) else float(f"{x:.5g}")


def to_lists(records: Sequence[TokenRecord]) -> list[list[Any]]:
    """The compact form: one list per token ``[id, text, piece, prob, scaled, entropy, [[id, piece, prob,
    scaled], ...], channel, chosen]`` (NaN as null)."""
    return [[r.token, r.text, r.piece, _num(r.prob), _num(r.scaled_prob), _num(r.entropy),
             [[a.token, a.piece, _num(a.prob), _num(a.scaled_prob)] for a in r.alternatives], r.channel,
             1 if r.chosen else 0] for r in records]


def to_dicts(records: Sequence[TokenRecord]) -> list[dict[str, Any]]:
    """The readable form for the JSON export (one object per token)."""
    out = []
    for r in records:
        d: dict[str, Any] = {"token": r.token, "text": r.text, "piece": r.piece, "prob": _num(r.prob),
                             "scaled_prob": _num(r.scaled_prob), "entropy": _num(r.entropy)}
        if r.alternatives:
            d["alternatives"] = [{"token": a.token, "piece": a.piece, "prob": _num(a.prob),
                                  "scaled_prob": _num(a.scaled_prob)} for a in r.alternatives]
        if r.channel:
            d["channel"] = r.channel
        if r.chosen:
            d["chosen"] = True
        out.append(d)
    return out


def dumps(records: Sequence[TokenRecord]) -> str:
    """``records`` as compact JSON ("" for none)."""
    if not records:
        return ""
    return json.dumps(to_lists(records), ensure_ascii=False, separators=(",", ":"))


def _float(v: Any, hi: float = 1.0 + 1e-6) -> float:
    if v is None:
        return float("nan")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isnan(v) or 0.0 <= v <= hi):
        raise ValueError(f"not a probability or entropy: {v!r}")
    return float(v)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not -1 <= v < 2**31:
        raise ValueError(f"not a token id: {v!r}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"not a string: {v!r}")
    return v


def from_lists(data: Any) -> list[TokenRecord]:
    """Records from :func:`to_lists`'s form; ``ValueError`` on anything else."""
    if not isinstance(data, list) or len(data) > MAX_RECORDS:
        raise ValueError("token records must be a list")
    out = []
    for row in data:
        if not isinstance(row, list) or len(row) != 9 or not isinstance(row[6], list) or len(row[6]) > 1000:
            raise ValueError("a token record must be a list of 9 fields")
        alts = []
        for a in row[6]:
            if not isinstance(a, list) or len(a) != 4:
                raise ValueError("an alternative must be a list of 4 fields")
            alts.append(Alternative(_int(a[0]), _str(a[1]), _float(a[2]), _float(a[3])))
        if row[8] not in (0, 1) or isinstance(row[8], bool):
            raise ValueError("chosen must be 0 or 1")
        out.append(TokenRecord(_int(row[0]), _str(row[1]), _str(row[2]), _float(row[3]), _float(row[4]),
                               _float(row[5], 1e6), tuple(alts), _str(row[7]), bool(row[8])))
    return out


def loads(text: str) -> list[TokenRecord]:
    """Records from :func:`dumps` ("" is none); ``ValueError`` when the text is not such records."""
    if not text:
        return []
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"token records are not JSON: {exc}") from None
    return from_lists(data)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens ``a`` and ``b`` share from their start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
