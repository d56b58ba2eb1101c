"""Fitting a conversation into the context window, and the exact prompt a conversation becomes.

:func:`fit_messages` drops the oldest turns (never a system message, never the turn being answered) until the
rendered prompt plus a reserve for the reply fits in ``n_ctx``; it is a pure function of the messages and a token
counter, so it is tested without a model. :func:`encode_prompt` / :func:`prompt_text` give the same text and ids
as :meth:`quantscope.core.engine.generate.Engine.prompt_ids` from a tokenizer and template alone (the template
preview and the tokenizer lab use them before any weights are loaded).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import ChatTemplate

Message = Mapping[str, Any]
PromptCounter = Callable[[list[Message]], int]


class Encoder(Protocol):
    """What :func:`encode_prompt` needs of a tokenizer."""

    def encode(self, text: str, add_special: bool | None = None, parse_special: bool = True) -> list[int]: ...


class HasPromptIds(Protocol):
    """An engine: anything with ``prompt_ids(messages) -> ids``."""

    def prompt_ids(self, messages: list[dict[str, Any]] | str) -> list[int]: ...


@dataclass(frozen=True)
class FitResult:
    """The messages to send and what was left out.

    ``dropped`` counts left-out messages (always a prefix of the non-system messages, so the first ``dropped``
    non-system messages of the conversation are the ones missing); ``turns_dropped`` counts whole turns;
    ``n_tokens`` is the prompt's length as kept; ``fits`` is false when even the last turn alone (with the system
    prompt) does not leave ``reserve`` tokens for the reply."""

    messages: list[Message]
    dropped: int
    turns_dropped: int
    n_tokens: int
    budget: int
    fits: bool


def prompt_text(template: ChatTemplate | None, messages: Sequence[Message]) -> str:
    """The text the engine tokenizes: the template's rendering (with the generation prompt), or for a model
    without a template the contents joined by newlines (as ``Engine.prompt_ids`` does)."""
    msgs = [dict(m) for m in messages]
    if template is None:
        return "\n".join(str(m["content"]) for m in msgs)
    return template.render(msgs, add_generation_prompt=True)


def encode_prompt(tokenizer: Encoder, template: ChatTemplate | None, messages: Sequence[Message]) -> list[int]:
    """Token ids of a conversation exactly as ``Engine.prompt_ids`` computes them (BOS added by the tokenizer
    unless the rendered text already starts with the template's BOS token)."""
    text = prompt_text(template, messages)
    if template is None:
        return tokenizer.encode(text)
    has_bos = bool(template.bos_token) and text.startswith(template.bos_token)
    return tokenizer.encode(text, add_special=not has_bos)


def token_counter(source: HasPromptIds | tuple[Encoder, ChatTemplate | None]) -> PromptCounter:
    """A :data:`PromptCounter` from an engine (``prompt_ids``) or a ``(tokenizer, template)`` pair."""
    if isinstance(source, tuple):
        tok, tpl = source
        return lambda msgs: len(encode_prompt(tok, tpl, msgs))
    engine = source
    return lambda msgs: len(engine.prompt_ids([dict(m) for m in msgs]))


def turn_groups(messages: Sequence[Message]) -> tuple[list[int], list[list[int]]]:
    """``(system indices, turns)``: a turn is a user message with the non-user messages after it (a leading
    assistant message before the first user message forms a turn of its own). Indices into ``messages``."""
    system: list[int] = []
    turns: list[list[int]] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "system":
            system.append(i)
        elif role == "user" or not turns:
            turns.append([i])
        else:
            turns[-1].append(i)
    return system, turns


def fit_messages(messages: Sequence[Message], count: PromptCounter | HasPromptIds, n_ctx: int,
                 reserve: int = 0) -> FitResult:
    """Drop the oldest non-system turns until ``count(kept) + reserve <= n_ctx``.

    ``count`` maps a message list to its prompt length in tokens (see :func:`token_counter`; an engine works
    directly). System messages and the last turn (the message being answered) are always kept; when they alone
    do not fit, the result has ``fits=False`` and keeps only them. ``reserve`` is clamped to ``0..n_ctx-1``.
    The number of turns to drop is found by bisection (a prompt gets no longer when a turn is removed), so a long
    conversation costs O(log turns) renderings."""
    if n_ctx <= 0:
        raise ValueError(f"n_ctx must be positive, got {n_ctx}")
    counter: PromptCounter = count if callable(count) else token_counter(count)
    reserve = max(0, min(int(reserve), n_ctx - 1))
    budget = n_ctx - reserve
    msgs = list(messages)
    _system, turns = turn_groups(msgs)

    def keep(k: int) -> list[Message]:
        """Messages with the first ``k`` turns removed (system messages stay where they were)."""
        gone = {i for t in turns[:k] for i in t}
        return [m for i, m in enumerate(msgs) if i not in gone]

    def n_tokens(k: int) -> int:
        if k not in cache:
            cache[k] = counter(keep(k))
        return cache[k]

    cache: dict[int, int] = {}
    if n_tokens(0) <= budget or not turns:
        return FitResult(msgs, 0, 0, n_tokens(0), budget, n_tokens(0) <= budget)
    last = len(turns) - 1  # the turn being answered is never dropped
    if n_tokens(last) > budget:
        kept = keep(last)
        return FitResult(kept, len(msgs) - len(kept), last, n_tokens(last), budget, False)
    lo, hi = 0, last  # n_tokens(lo) > budget, n_tokens(hi) <= budget
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if n_tokens(mid) <= budget:
            hi = mid
        else:
            lo = mid
    kept = keep(hi)
    return FitResult(kept, len(msgs) - len(kept), hi, n_tokens(hi), budget, True)


class ContextTooSmall(ValueError):
    """Even the last message (with the system prompt) leaves no room for the reply."""


@dataclass(frozen=True)
class PreparedPrompt:
    """What to hand to ``Engine.generate``: ``prompt`` (messages as kept, or the completion text), the number of
    messages ``dropped`` from the front, and ``n_tokens`` (-1 for a plain completion, which is not fitted)."""

    prompt: list[dict[str, Any]] | str
    dropped: int
    n_tokens: int


def prepare_prompt(prompt: Sequence[Message] | str, engine: HasPromptIds, n_ctx: int, reserve: int,
                   hint: str = "load the model with a larger context") -> PreparedPrompt:
    """The context policy the GUI and ``quantscope chat`` share: a conversation is fitted with
    :func:`fit_messages` (oldest turns left out); a plain completion text goes as it is (the engine refuses one
    longer than the context). :class:`ContextTooSmall` says how many tokens the last message needs; ``hint``
    ends the message with what the user can do."""
    if isinstance(prompt, str):
        return PreparedPrompt(prompt, 0, -1)
    fit = fit_messages(prompt, engine, n_ctx, reserve)
    if not fit.fits:
        raise ContextTooSmall(f"the last message alone needs {fit.n_tokens} tokens, but the context holds {n_ctx} "
                              f"and {n_ctx - fit.budget} are kept for the reply; shorten it or {hint}")
    return PreparedPrompt([dict(m) for m in fit.messages], fit.dropped, fit.n_tokens)


def reply_reserve(max_tokens: int, n_ctx: int) -> int:
    """Tokens to keep free for the reply: ``max_tokens``, but at most half the context (a long ``max_tokens``
    should not push the whole conversation out; generation stops at "context full" instead)."""
    return max(1, min(int(max_tokens), n_ctx // 2))
