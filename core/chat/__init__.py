"""Chat templates (rendered in a Jinja2 sandbox with a budget: GGUF templates are untrusted input) and the
sampler."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

import numpy as np
from jinja2 import TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from ..gguf import GGUFFile


class ChatTemplateError(ValueError):
    """The template does not compile or failed to render (its own raise_exception included)."""


class ChatTemplateBudgetError(ChatTemplateError):
    """The template exceeded its rendering budget (steps, time or output size)."""


@dataclass(frozen=True)
class RenderBudget:
    """Limits on one rendering: ``steps`` counts loop iterations, calls, filters and output pieces."""

    steps: int = 1_000_000
    seconds: float = 5.0
    chars: int = 16 * 2**20


DEFAULT_BUDGET = RenderBudget()


class _Meter:
    """The running count of one rendering against its :class:`RenderBudget`."""

    __slots__ = ("budget", "deadline", "steps")

    def __init__(self, budget: RenderBudget) -> None:
        self.budget = budget
        self.steps = 0
        self.deadline = time.monotonic() + budget.seconds

    def tick(self) -> None:
        self.steps += 1
        if self.steps > self.budget.steps:
            raise ChatTemplateBudgetError(f"template exceeded its budget: more than {self.budget.steps:,} steps")
        if not self.steps & 255 and time.monotonic() > self.deadline:
            raise ChatTemplateBudgetError(f"template exceeded its budget: more than {self.budget.seconds:g} s")

    def size(self, n: int, what: str = "a string") -> None:
        if n > self.budget.chars:
            raise ChatTemplateBudgetError(f"template exceeded its budget: {what} of {n:,} characters "
                                          f"(at most {self.budget.chars:,})")


_METER: ContextVar[_Meter | None] = ContextVar("quantscope_template_meter", default=None)


def _guard_iter(value: Any) -> Any:
    """Filter wrapped around every ``for`` loop's iterable: one step per iteration."""
    meter = _METER.get()
    if meter is None:
        return value

    def walk(it: Iterable[Any]) -> Iterator[Any]:
        for x in it:
            meter.tick()
            yield x

    try:
        return walk(iter(value))
    except TypeError:
        return value  # not iterable: let the loop raise its own error


def _guard_str(value: Any) -> Any:
    """Filter wrapped around every output expression and ``~`` concatenation: bounds string sizes."""
    meter = _METER.get()
    if meter is not None:
        meter.tick()
        if isinstance(value, str):
            meter.size(len(value))
    return value


class _Instrument(NodeTransformer):
    """Rewrite a parsed template so loops, concatenations and output expressions pass through the guards."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, "_qs_iter", [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Filter(node, "_qs_str", [], [], None, None, lineno=node.lineno)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [n if isinstance(n, nodes.TemplateData)
                      else nodes.Filter(n, "_qs_str", [], [], None, None, lineno=n.lineno) for n in node.nodes]
        return node


_PAD_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs"})
_PCT_WIDTH = re.compile(r"%[-#0 +]*(\d+)?(?:\.(\d+))?")


class _GuardedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, plus a step/time/size budget on calls, loops, filters and the size-making
    operators (``*``, ``**``, ``%``)."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        return _Instrument().visit(tree)  # type: ignore[no-any-return]

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        meter = _METER.get()
        if meter is not None:
            meter.tick()
            if isinstance(getattr(__obj, "__self__", None), str) and getattr(__obj, "__name__", "") in _PAD_METHODS:
                for a in args:
                    if isinstance(a, int):
                        meter.size(a, f"{__obj.__name__}() width")
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        meter = _METER.get()
        if meter is not None:
            meter.tick()
            if operator == "*":
                for seq, k in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(k, int) and not isinstance(k, bool):
                        meter.size(len(seq) * max(k, 0), "a repetition")
            elif operator == "**" and isinstance(left, int) and isinstance(right, int):
                bits = abs(right) * math.log2(abs(left)) if abs(left) > 1 else 0
                if bits > 65536:
                    raise ChatTemplateBudgetError(f"template exceeded its budget: {left} ** {right} is too large")
            elif operator == "%" and isinstance(left, str):
                for m in _PCT_WIDTH.finditer(left):
                    for g in m.groups():
                        if g:
                            meter.size(int(g), "a % format width")
        return super().call_binop(context, operator, left, right)


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Generation(Extension):
    """``{% generation %}…{% endgeneration %}``: Hugging Face marks the assistant's tokens with it (for training
    masks); rendering keeps the body as it is."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _make_env() -> _GuardedEnvironment:
    env = _GuardedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _Generation])
    env.filters["tojson"] = _tojson
    env.filters["_qs_iter"] = _guard_iter
    env.filters["_qs_str"] = _guard_str
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A GGUF ``tokenizer.chat_template`` compiled in an immutable sandbox with the helpers HF templates use.

    Every rendering runs under a :class:`RenderBudget` (the GUI and the CLI share this guard): a template that
    loops too long, runs too long or makes too much text raises :class:`ChatTemplateBudgetError`; one that does
    not compile or fails to render raises :class:`ChatTemplateError`."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "",
                 budget: RenderBudget = DEFAULT_BUDGET) -> None:
        env = _make_env()
        try:
            self.template = env.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from None
        except RecursionError:
            raise ChatTemplateError("chat template does not compile: nested too deeply") from None
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.budget = budget

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt for ``messages``; ``extra`` goes to the template (``tools``, ``documents``, …). As Hugging
        Face's renderer does, ``tools`` and ``documents`` are passed as None when not given."""
        extra = {"tools": None, "documents": None} | extra
        meter = _Meter(self.budget)
        token = _METER.set(meter)
        try:
            out: list[str] = []
            n = 0
            for piece in self.template.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                bos_token=self.bos_token, eos_token=self.eos_token, **extra):
                n += len(piece)
                meter.size(n, "the output")
                meter.tick()
                out.append(piece)
            return "".join(out)
        except ChatTemplateError:
            raise
        except RecursionError:
            raise ChatTemplateBudgetError("template exceeded its budget: recursion too deep") from None
        except MemoryError:
            raise ChatTemplateBudgetError("template exceeded its budget: out of memory") from None
        except Exception as exc:  # the sandbox raises SecurityError and friends; all are template failures
            raise ChatTemplateError(f"chat template failed: {exc or type(exc).__name__}") from None
        finally:
            _METER.reset(token)

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> ChatTemplate | None:
        """The file's template, or ``None`` when it has none (base models: plain completion)."""
        src = f.get("tokenizer.chat_template")
        if not isinstance(src, str) or not src.strip():
            return None
        toks = f.get("tokenizer.ggml.tokens")

        def tok(key: str) -> str:
            i = f.get(key)
            if toks is None or isinstance(i, (bool, str, bytes)) or not isinstance(i, (int, np.integer)):
                return ""
            i = int(i)
            if not 0 <= i < len(toks):
                return ""
            s = toks[i]
            return s if isinstance(s, str) else ""

        return cls(src, tok("tokenizer.ggml.bos_token_id"), tok("tokenizer.ggml.eos_token_id"))


@dataclass
class SamplerParams:
    """Sampling settings (llama.cpp's meanings). ``temperature <= 0`` is greedy."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from each token the reply has used (window below)
    frequency_penalty: float = 0.0  # OpenAI's: subtracted per use of each token in the reply
    seed: int | None = None
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    special: bool = False  # print control tokens (``<|im_end|>``, ``<start_of_image>``) instead of leaving them out
    alternatives: int = 0  # keep the picked token's probabilities and this many top alternatives (0: off)


@dataclass(frozen=True)
class TokenChoice:
    """How the sampler saw a picked token, from the logits after the repetition penalty: its probability over the
    whole vocabulary (``prob``: temperature 1; ``scaled_prob``: at the sampling temperature, before top-k/top-p/
    min-p), the distribution's entropy (nats) and the most likely tokens as ``(token, prob, scaled_prob)``."""

    token: int
    prob: float
    scaled_prob: float
    entropy: float
    alternatives: tuple[tuple[int, float, float], ...]


class ChoiceScratch:
    """Work arrays reused by :func:`token_choice` from token to token (fresh vocabulary-sized arrays each time
    would cost more in page faults than the arithmetic)."""

    def __init__(self) -> None:
        self.n = -1
        self.z = self.e = self.t = np.empty(0)
        self.z32 = np.empty(0, np.float32)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if n != self.n:
            self.n, self.z, self.e, self.t = n, np.empty(n), np.empty(n), np.empty(n)
            self.z32 = np.empty(n, np.float32)
        return self.z, self.e, self.t, self.z32


def token_choice(penalized: np.ndarray, token: int, temperature: float, n: int = 10,
                 scratch: ChoiceScratch | None = None) -> TokenChoice:
    """:class:`TokenChoice` of ``token`` under ``penalized`` logits (float64 softmax; a greedy temperature <= 0
    scales nothing; tied alternatives in index order). About 0.3 ms for a 150k vocabulary with a ``scratch``."""
    x = np.asarray(penalized, dtype=np.float64).reshape(-1)
    z, e, t, z32 = (scratch or ChoiceScratch()).get(x.size)
    np.subtract(x, x.max(), out=z)
    np.exp(z, out=e)
    total = float(e.sum())
    # (not e @ z: a BLAS dot wakes OpenBLAS's threads, whose spinning then slows the engine's next forward pass)
    np.maximum(z, -1.0e300, out=t)  # a -inf logit (a bias, a JSON mask) adds 0, not 0 * -inf = NaN
    entropy = math.log(total) - float(np.multiply(e, t, out=t).sum()) / total
    k = max(0, min(int(n), x.size))
    if 0 < k < x.size:  # candidates from a float32 partition (cheap), widened by its rounding, then sorted exactly
        np.maximum(z, -3.0e38, out=t)  # float32's range: a penalty of 1e-45 pushes logits to -1e46 (no overflow)
        z32[...] = t
        z32.partition(x.size - k)
        cut = float(z32[x.size - k])
        cand = np.flatnonzero(z >= cut - abs(cut) * 2.4e-7 - 1e-37)
        top = cand[np.argsort(-z[cand], kind="stable")][:k]
    else:
        top = np.argsort(-z, kind="stable")[:k]
    idx = np.append(top, int(token))
    prob = e[idx] / total
    if temperature > 0 and temperature != 1.0:
        with np.errstate(over="ignore"):  # (a tiny temperature: -inf, as it should be)
            sel = z[idx] / temperature
            np.divide(z, temperature, out=e)  # (not z * (1 / temperature): 0 * inf is NaN for a tiny temperature)
        np.exp(e, out=e)
        scaled = np.exp(sel) / float(e.sum())
    else:
        scaled = prob
    return TokenChoice(int(token), float(prob[-1]), float(scaled[-1]), entropy,
                       tuple((int(i), float(p), float(q)) for i, p, q in zip(top, prob[:-1], scaled[:-1],
                                                                            strict=True)))


def apply_penalties(x: np.ndarray, history: list[int], prompt_len: int, p: SamplerParams) -> None:
    """llama.cpp's ``llama_sampler_penalties`` on ``x`` (in place), in float32 as it computes: each token among
    the last ``repeat_last_n`` of ``history`` has its logit divided by ``repeat_penalty`` (multiplied when <= 0),
    then ``count * frequency_penalty + (count > 0) * presence_penalty`` subtracted, ``count`` being its uses
    among those tokens that the reply generated (``history[prompt_len:]``: OpenAI's meaning, the prompt's own
    tokens are not penalised for presence or frequency). ``repeat_last_n`` 0 turns them all off."""
    n = p.repeat_last_n
    if n <= 0 or not history:
        return
    window = np.asarray(history[-n:], dtype=np.int64)
    recent, inverse = np.unique(window, return_inverse=True)
    gen = max(0, len(history) - max(prompt_len, 0))
    counts = np.bincount(inverse[max(0, window.size - gen):], minlength=recent.size).astype(np.float32)
    v = x[recent].astype(np.float32)
    rp = np.float32(p.repeat_penalty)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        v = np.where(v <= 0, v * rp, v / rp).astype(np.float32)
        v -= counts * np.float32(p.frequency_penalty) + (counts > 0).astype(np.float32) * np.float32(p.presence_penalty)
    # a penalty near 0 overflows float32 (llama.cpp's logits become inf there, its probabilities NaN): held to the
    # largest finite value instead, so the pick stays defined
    big = np.finfo(np.float32).max
    x[recent] = np.nan_to_num(v, nan=-big, posinf=big, neginf=-big)


class Sampler:
    """Pick the next token from logits: repetition, presence and frequency penalties, then top-k, top-p, min-p,
    temperature; seeded. ``prompt_len``: how many tokens at the start of a history are the prompt's."""

    def __init__(self, params: SamplerParams, prompt_len: int = 0) -> None:
        self.p = params
        self.prompt_len = prompt_len
        self.rng = np.random.default_rng(params.seed)
        #: the last pick seen as :class:`TokenChoice` (only with ``params.alternatives``)
        self.last: TokenChoice | None = None
        self._scratch = ChoiceScratch()

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        x = self.penalized(logits, history)
        tid = self._pick(x)
        self.note(x, tid)
        return tid

    def penalized(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        """``logits`` as float64 with the repetition, presence and frequency penalties of ``history`` applied (a
        copy): what the pick and :meth:`distribution` read."""
        p = self.p
        x = np.asarray(logits, dtype=np.float64).copy()
        if (p.repeat_penalty != 1.0 or p.presence_penalty or p.frequency_penalty) and history:
            apply_penalties(x, history, self.prompt_len, p)
        return x

    def note(self, x: np.ndarray, tid: int) -> None:
        """Record ``tid``, picked from the penalized logits ``x``, as :attr:`last` (with ``params.alternatives``)."""
        if self.p.alternatives > 0:
            self.last = token_choice(x, tid, self.p.temperature, self.p.alternatives, self._scratch)

    def distribution(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The distribution a pick from the penalized logits ``x`` draws from: token ids and their probabilities
        (after temperature, top-k, top-p and min-p; greedy: the argmax with probability 1)."""
        p = self.p
        if p.temperature <= 0:
            return np.array([int(np.argmax(x))]), np.ones(1)
        k = p.top_k if 0 < p.top_k < x.size else x.size
        idx = np.argpartition(-x, k - 1)[:k] if k < x.size else np.arange(x.size)
        idx = idx[np.argsort(-x[idx], kind="stable")]
        xs = x[idx]
        # the largest logit taken away first: a tiny temperature (5e-324) then gives -inf and 0, never inf - inf
        with np.errstate(over="ignore"):
            probs = np.exp((xs - xs[0]) / p.temperature)
        probs /= probs.sum()
        keep = probs.size
        if 0 < p.top_p < 1:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        if p.min_p > 0:
            keep = min(keep, int((probs >= p.min_p * probs[0]).sum()))
        keep = max(1, keep)
        return idx[:keep], probs[:keep] / probs[:keep].sum()

    def _pick(self, x: np.ndarray) -> int:
        if self.p.temperature <= 0:
            return int(np.argmax(x))
        idx, probs = self.distribution(x)
        return int(idx[self.rng.choice(idx.size, p=probs)])
