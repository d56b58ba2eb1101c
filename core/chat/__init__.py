"""Chat templates (rendered in a Jinja2 sandbox: GGUF templates are untrusted input) and the sampler."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..gguf import GGUFFile


class ChatTemplateError(ValueError):
    """The template failed to render (its own raise_exception included)."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """A GGUF ``tokenizer.chat_template`` compiled in an immutable sandbox with the helpers HF templates use."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        try:
            self.template = env.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from None
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any) -> str:
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except ChatTemplateError:
            raise
        except Exception as exc:  # the sandbox raises SecurityError and friends; all are template failures
            raise ChatTemplateError(f"chat template failed: {exc}") from None

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> ChatTemplate | None:
        """The file's template, or ``None`` when it has none (base models: plain completion)."""
        src = f.get("tokenizer.chat_template")
        if not isinstance(src, str) or not src.strip():
            return None
        toks = f.get("tokenizer.ggml.tokens")

        def tok(key: str) -> str:
            i = f.get(key)
            return toks[int(i)] if toks is not None and i is not None and 0 <= int(i) < len(toks) else ""

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
    seed: int | None = None
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)


class Sampler:
    """Pick the next token from logits: repetition penalty, then top-k, top-p, min-p, temperature; seeded."""

    def __init__(self, params: SamplerParams) -> None:
        self.p = params
        self.rng = np.random.default_rng(params.seed)

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        p = self.p
        x = np.asarray(logits, dtype=np.float64).copy()
        if p.repeat_penalty != 1.0 and history:
            recent = np.unique(np.asarray(history[-p.repeat_last_n:], dtype=np.int64))
            v = x[recent]
            x[recent] = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
        if p.temperature <= 0:
            return int(np.argmax(x))
        k = p.top_k if 0 < p.top_k < x.size else x.size
        idx = np.argpartition(-x, k - 1)[:k] if k < x.size else np.arange(x.size)
        idx = idx[np.argsort(-x[idx], kind="stable")]
        z = x[idx] / p.temperature
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        keep = probs.size
        if 0 < p.top_p < 1:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        if p.min_p > 0:
            keep = min(keep, int((probs >= p.min_p * probs[0]).sum()))
        keep = max(1, keep)
        probs = probs[:keep] / probs[:keep].sum()
        return int(idx[self.rng.choice(keep, p=probs)])
