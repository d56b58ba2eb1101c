"""Token probabilities and alternatives (issue 20, "In the chat", core and CLI): the sampler's view of each picked
token (after the repetition penalty; raw and temperature-scaled probabilities over the whole vocabulary, entropy,
the top alternatives) against a float64 numpy computation, never changing what is sampled; the engine's deltas carry
them; `quantscope generate --alternatives N` prints them."""

from __future__ import annotations

import numpy as np
import pytest

from quantscope.cli.main import main as cli_main
from quantscope.core.chat import Sampler, SamplerParams, token_choice
from quantscope.core.engine.generate import Engine


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 1.6])
def test_token_choice_is_the_softmax(temperature: float) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(5000) * 4
    c = token_choice(x, 17, temperature, 10)
    p = _softmax(x)
    s = _softmax(x / temperature) if temperature > 0 else p
    assert c.token == 17 and c.prob == pytest.approx(p[17], rel=1e-12)
    assert c.scaled_prob == pytest.approx(s[17], rel=1e-12)
    assert c.entropy == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-10)
    order = np.argsort(-x, kind="stable")[:10]
    assert [a[0] for a in c.alternatives] == order.tolist()
    assert [a[1] for a in c.alternatives] == pytest.approx(p[order].tolist(), rel=1e-12)
    assert [a[2] for a in c.alternatives] == pytest.approx(s[order].tolist(), rel=1e-12)
    assert len(token_choice(x[:4], 0, temperature, 10).alternatives) == 4  # fewer tokens than asked
    assert token_choice(x, 0, temperature, 0).alternatives == ()


def test_the_sampler_reports_after_the_penalty_and_samples_the_same() -> None:
    rng = np.random.default_rng(5)
    logits = rng.standard_normal(300).astype(np.float32) * 3
    top = int(np.argmax(logits))
    history = [top, 4, 9]
    params = dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.3, seed=11)
    on = Sampler(SamplerParams(**params, alternatives=5))
    off = Sampler(SamplerParams(**params))
    picks_on = [on.sample(logits, history) for _ in range(50)]
    picks_off = [off.sample(logits, history) for _ in range(50)]
    assert picks_on == picks_off and off.last is None  # reporting never touches the random stream
    x = logits.astype(np.float64)
    for t in set(history):  # in float32, as llama.cpp's penalties sampler computes it
        v = logits[t]
        x[t] = v / np.float32(1.3) if v > 0 else v * np.float32(1.3)
    c = on.last
    assert c is not None and c.token == picks_on[-1]
    assert c.prob == pytest.approx(_softmax(x)[c.token], rel=1e-12)
    assert c.scaled_prob == pytest.approx(_softmax(x / 0.9)[c.token], rel=1e-12)
    assert [a[0] for a in c.alternatives] == np.argsort(-x, kind="stable")[:5].tolist()


def test_engine_deltas_carry_the_choice(model_path) -> None:
    eng = Engine(model_path("smollm2"), n_ctx=256, threads=2)
    try:
        prompt = "The capital of France is"
        deltas = list(eng.generate(prompt, SamplerParams(temperature=0, max_tokens=6, alternatives=5)))
        made = [d for d in deltas if d.token is not None]
        assert made and all(d.choice is not None and d.choice.token == d.token for d in made)
        assert all(d.choice.alternatives[0][0] == d.token for d in made)  # greedy: the most likely one
        # the first token's figures are those of the prompt's logits, from a fresh session
        s = eng.new_session(256)
        logits = np.asarray(s.forward(eng.prompt_ids(prompt), logits=True), dtype=np.float64)
        want = token_choice(logits, made[0].token, 0.0, 5)
        got = made[0].choice
        assert got.prob == pytest.approx(want.prob, rel=1e-5, abs=1e-7)
        assert got.entropy == pytest.approx(want.entropy, rel=1e-5)
        assert [a[0] for a in got.alternatives] == [a[0] for a in want.alternatives]
        # off by default: nothing computed
        eng.session.reset()
        eng.cached = []
        assert all(d.choice is None for d in eng.generate(prompt, SamplerParams(temperature=0, max_tokens=3)))
    finally:
        eng.close()


def test_cli_prints_a_line_per_token(model_path, capsys) -> None:
    rc = cli_main(["generate", str(model_path("smollm2")), "-p", "The capital of France is", "-n", "3", "--temp",
                   "0", "--alternatives", "3"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.strip()  # the text still goes to stdout, the figures to stderr
    assert "[p " not in out
    lines = [ln for ln in err.splitlines() if ln.startswith("[p ")]
    assert len(lines) == 3
    assert all(ln.count("' ") >= 3 and " | " in ln for ln in lines)
    assert cli_main(["generate", str(model_path("smollm2")), "-p", "x", "--alternatives", "101"]) == 2


def test_alternatives_are_exact_under_ties_and_float32_rounding():
    """The top-N comes from a float32 partition widened by its rounding: logits that differ only below float32's
    precision, and exact ties (kept in index order), still give numpy's exact top-N."""
    from quantscope.core.chat import ChoiceScratch, token_choice

    rng = np.random.default_rng(3)
    x = rng.standard_normal(50_000)
    x[100:130] = 7.0 - (30 - np.arange(30)) * 1e-12  # 30 values float32 rounds up to one
    x[[5, 9, 2000]] = 7.5  # an exact tie above them
    sc = ChoiceScratch()
    c = token_choice(x, 9, 1.0, 10, sc)
    want = [5, 9, 2000, *range(129, 122, -1)]
    assert [a[0] for a in c.alternatives] == want
    e = np.exp(x - x.max())
    assert c.prob == pytest.approx(e[9] / e.sum(), rel=1e-12)
    again = token_choice(x[:1000], 5, 0.5, 3, sc)  # the scratch follows a new vocabulary size
    assert [a[0] for a in again.alternatives] == [5, 9, 129]
