"""The chat's prompt cache (core/chat/promptcache.py): a conversation's cache saved after a reply is restored when
the conversation comes back, so only its new turn is evaluated, with the same greedy reply as evaluating it all;
earlier turns' files are superseded, the folder stays under its bound, damaged files are dropped, and another
model file's caches are never used. SmolLM2 on the CPU engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantscope.core.chat import SamplerParams
from quantscope.core.chat.promptcache import MIN_GAIN, PromptCache
from quantscope.core.engine.generate import Engine

GREEDY = SamplerParams(temperature=0.0, max_tokens=8)
CONV = [{"role": "system", "content": "You are a helpful assistant who answers in full sentences."},
        {"role": "user", "content": "Name three colours of the rainbow and say which one you like best."}]
OTHER = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def engine(model_path: Any) -> Iterator[Engine]:
    eng = Engine(model_path("smollm2"), n_ctx=512, threads=1, backend="cpu")
    yield eng
    eng.close()


def reply(eng: Engine, messages: list[dict[str, str]]) -> tuple[str, int]:
    """The greedy reply's text and how many prompt tokens were evaluated for it."""
    text, new = "", -1
    for d in eng.generate(messages, GREEDY):
        text += d.text
        new = d.n_prompt_new
    return text, new


def test_a_reopened_conversation_evaluates_only_its_new_turn(engine: Engine, model_path: Any, tmp_path: Path) -> None:
    cache = PromptCache(model_path("smollm2"), tmp_path / "pc")
    first, _ = reply(engine, CONV)
    saved = cache.store(engine)
    assert saved is not None and saved.exists()
    n_first = len(engine.cached)
    reply(engine, OTHER)  # another conversation: the engine's cache no longer holds the first
    cache.store(engine)
    more = [*CONV, {"role": "assistant", "content": first}, {"role": "user", "content": "Why that one?"}]
    ids = engine.prompt_ids(more)
    got = cache.restore(engine, ids)
    assert got is not None and got.file == saved.name
    assert got.tokens >= n_first - 2 and engine.cached == ids[: got.tokens] and engine.session.n_past == got.tokens
    with_cache, evaluated = reply(engine, more)
    assert evaluated == len(ids) - got.tokens
    cache.store(engine)
    assert not saved.exists()  # superseded by the longer conversation's file
    assert len(list((tmp_path / "pc").iterdir())) == 2  # that one and the other conversation's
    engine.session.reset()
    engine.set_cached([])
    whole, evaluated = reply(engine, more)
    assert evaluated == len(ids) and whole == with_cache  # the same reply as evaluating everything


def test_nothing_to_gain_other_models_damaged_files_and_the_bound(engine: Engine, model_path: Any,
                                                                  tmp_path: Path) -> None:
    folder = tmp_path / "pc"
    cache = PromptCache(model_path("smollm2"), folder)
    reply(engine, CONV)
    path = cache.store(engine)
    assert path is not None
    ids = [*engine.cached, 42]
    assert cache.restore(engine, ids) is None  # the engine's own cache holds it already
    engine.session.reset()
    engine.set_cached([])
    assert cache.restore(engine, ids[:MIN_GAIN - 1]) is None  # too little to gain
    other = PromptCache(model_path("gemma3"), folder)  # another model file: its key finds none of these
    assert other.restore(engine, ids) is None and path.exists()
    got = cache.restore(engine, ids)
    assert got is not None and got.tokens == len(ids) - 1
    engine.session.reset()
    engine.set_cached([])
    path.write_bytes(path.read_bytes()[:100])  # damaged: dropped, the prompt evaluated as usual
    assert cache.restore(engine, ids) is None and not path.exists()
    reply(engine, CONV)
    size = cache.store(engine).stat().st_size  # type: ignore[union-attr]
    small = PromptCache(model_path("smollm2"), folder, max_bytes=size + 10)
    reply(engine, OTHER)
    newest = small.store(engine)
    assert [p.name for p in folder.iterdir()] == [newest.name]  # type: ignore[union-attr]


def test_a_recurrent_models_cache_is_restored_only_where_it_was_saved(tmp_path: Path) -> None:
    """qwen35's delta-net state cannot be rewound: a file is used when the prompt continues all of it, and is not
    when the prompt leaves it earlier (the prompt is then evaluated as usual, with the same reply)."""
    from .arch_fixtures import vocabulary, write_fixture

    path = write_fixture("qwen35", tmp_path / "qwen35.gguf", vocab=vocabulary())
    eng = Engine(path, n_ctx=256, threads=1, backend="cpu")
    try:
        cache = PromptCache(path, tmp_path / "pc")
        prompt = "the cat sat on the mat while the dog slept by the door and the bird sang in the tree"
        greedy = SamplerParams(temperature=0.0, max_tokens=4)
        list(eng.generate(prompt, greedy))
        held = list(eng.cached)
        assert cache.store(eng) is not None and len(held) > MIN_GAIN + 4
        eng.session.reset()
        eng.set_cached([])
        diverging = [*held[: len(held) - 2], (held[-2] + 1) % eng.tokenizer.n_vocab, *held[-1:], 7]
        assert cache.restore(eng, diverging) is None and eng.session.n_past == 0
        extending = [*held, 11, 12]
        got = cache.restore(eng, extending)
        assert got is not None and got.tokens == len(held) == eng.session.n_past and eng.cached == held
        fresh = eng.new_session(256)
        want = fresh.forward(extending)
        np.testing.assert_allclose(eng.session.forward([11, 12]), want, rtol=1e-4, atol=1e-4 * float(abs(want).max()))
    finally:
        eng.close()
