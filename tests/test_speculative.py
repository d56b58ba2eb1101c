"""Speculative decoding (core/engine/speculative.py): greedy output token for token the same as without it on every
architecture fixture and on the catalogue models, the sampled distribution unchanged (the acceptance rule, checked
against the exact distribution with a chi-square bound, fixed seeds), prompt lookup, and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantscope.core.chat import Sampler, SamplerParams
from quantscope.core.engine.generate import Engine
from quantscope.core.engine.speculative import NGramLookup, Speculator, VocabularyMismatch

from .arch_fixtures import SPECS, vocabulary, write_fixture
from .conftest import MODEL_NAMES

PROMPT = "the cat sat on the mat and the cat sat on the mat while the dog"


@pytest.fixture(scope="module")
def vocab() -> dict[str, object]:
    return vocabulary()


def _tokens(eng: Engine, prompt, params: SamplerParams) -> tuple[list[int], int, int]:
    eng.session.reset()
    eng.cached, eng._prompt_logits = [], None
    out = list(eng.generate(prompt, params))
    return [d.token for d in out if d.token is not None], out[-1].drafted, out[-1].accepted


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_greedy_speculation_is_token_for_token_the_plain_output(arch, tmp_path, vocab) -> None:
    """Prompt lookup and a draft model (the same architecture, other weights) on each fixture: the greedy reply is
    the plain one, token for token (the gemma fixtures repeat one token, which their drafts propose too: accepted
throughout; the others reject proposals along the way)."""
    path = write_fixture(arch, tmp_path / f"{arch}.gguf", vocab=vocab)
    draft = write_fixture(arch, tmp_path / f"{arch}-draft.gguf", seed=1, vocab=vocab)
    eng = Engine(path, n_ctx=256, threads=2, backend="cpu")
    try:
        greedy = SamplerParams(temperature=0, max_tokens=40)
        plain, _, _ = _tokens(eng, PROMPT, greedy)
        assert len(plain) >= 8
        eng.speculate(lookup=3, draft_max=6)
        looked, drafted, _ = _tokens(eng, PROMPT, greedy)
        assert looked == plain and drafted > 0
        eng.speculate(draft=draft, draft_max=4, p_min=0.0)
        with_draft, drafted, accepted = _tokens(eng, PROMPT, greedy)
        assert with_draft == plain and drafted > 0
        eng.speculate(draft=path, draft_max=5, p_min=0.0)  # the model as its own draft: every proposal is kept
        own, drafted, accepted = _tokens(eng, PROMPT, greedy)
        assert own == plain and drafted == accepted > 0
    finally:
        eng.close()


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_greedy_lookup_on_the_catalogue_models(name, model_path) -> None:
    """The real models (repacked weights): a rewrite prompt whose reply repeats its text, speculated by prompt
    lookup, is the plain greedy reply."""
    eng = Engine(model_path(name), n_ctx=512, threads=2)
    try:
        code = "def area(width, height):\n    result = width * height\n    return result\n"
        msgs = [{"role": "user", "content": f"Rename `result` to `size` in this code and print it:\n\n{code}"}]
        greedy = SamplerParams(temperature=0, max_tokens=48)
        plain, _, _ = _tokens(eng, msgs, greedy)
        eng.speculate(lookup=4)
        spec, drafted, accepted = _tokens(eng, msgs, greedy)
        assert spec == plain and drafted > 0 and accepted > 0
    finally:
        eng.close()


def _chi_square_z(counts: dict[int, int], probs: dict[int, float], n: int) -> float:
    """Pearson's chi-square of ``counts`` against ``probs`` as a standard normal deviate (Wilson-Hilferty), the
    categories with an expected count under 5 pooled."""
    cells, small_obs, small_exp = [], 0, 0.0
    for t, p in probs.items():
        e = p * n
        if e < 5:
            small_obs, small_exp = small_obs + counts.get(t, 0), small_exp + e
        else:
            cells.append((counts.get(t, 0), e))
    extra = n - sum(counts.get(t, 0) for t in probs)
    assert extra == 0, "a token outside the target's distribution was sampled"
    if small_exp > 0:
        cells.append((small_obs, small_exp))
    chi2 = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    return ((chi2 / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))


@pytest.mark.parametrize("mode", ["draft", "lookup"])
def test_sampled_speculation_keeps_the_distribution(mode, tmp_path, vocab) -> None:
    """The first two sampled tokens of replies of three (the second one verified against a proposal) over many
    seeds follow the model's exact distribution (each first token's probability times the second token's after
    it). The draft model proposes from its own distribution (accepted with min(1, p/q), else resampled from the
    residual); prompt lookup proposes a point mass."""
    # (gemma3's fixture repeats its tokens: lookup's proposals are sometimes accepted)
    path = write_fixture("llama" if mode == "draft" else "gemma3", tmp_path / "t.gguf", vocab=vocab)
    eng = Engine(path, n_ctx=128, threads=1, backend="cpu")
    try:
        params = SamplerParams(temperature=1.5, top_k=6, top_p=1.0, min_p=0.0, max_tokens=3)
        s = Sampler(params)
        prompt = PROMPT
        if mode == "lookup":  # the prompt, then the model's greedy continuation: lookup proposes from it
            ids = eng.prompt_ids(prompt)
            for _ in range(12):
                ids.append(int(np.argmax(eng.model.session(128).forward(ids))))
        else:
            ids = eng.prompt_ids(prompt)
        # the exact distribution of the first token, then of the second after each first one
        first = eng.model.session(128).forward(ids)
        i1, p1 = s.distribution(s.penalized(first, ids))
        joint: dict[tuple[int, int], float] = {}
        for a, pa in zip(i1.tolist(), p1.tolist(), strict=True):
            row = eng.model.session(128).forward([*ids, a])
            i2, p2 = s.distribution(s.penalized(row, [*ids, a]))
            for b, pb in zip(i2.tolist(), p2.tolist(), strict=True):
                joint[(a, b)] = pa * pb
        if mode == "draft":  # (lookup: below)
            # the model quantized: a draft close to it (its proposals mostly, not always, accepted)
            eng.speculate(draft=write_fixture("llama", tmp_path / "d.gguf", "Q4_0", vocab=vocab), draft_max=1,
                          p_min=0.0)
        n = 3000
        counts: dict[int, int] = {}
        drafted = accepted = 0
        keys = {k: i for i, k in enumerate(joint)}
        spec = Speculator(lookup=1, draft_max=1)
        for seed in range(n):
            seeded = SamplerParams(**{**params.__dict__, "seed": seed})
            if mode == "draft":
                toks, d, acc = _tokens(eng, prompt, seeded)
                assert len(toks) == 3  # (the third: room for one proposal after the first token)
            else:  # (the prompt's tokens as made above: the speculator itself, as generate calls it)
                eng.session.reset()
                sampler = Sampler(seeded)
                toks = [sampler.sample(eng.session.forward(ids), ids)]
                spec.begin(seeded)
                toks += [t for t, _c in spec.step(eng.session, sampler, [*ids, *toks], 2)]
                d, acc = spec.stats.drafted, spec.stats.accepted
            key = keys.get((toks[0], toks[1]), -1)
            counts[key] = counts.get(key, 0) + 1
            drafted, accepted = drafted + d, accepted + acc
        # (a draft proposes for every second token; lookup where the first token occurs in the prompt)
        assert (drafted == n if mode == "draft" else drafted > n // 4) and 0 < accepted < drafted
        z = _chi_square_z(counts, {keys[k]: p for k, p in joint.items()}, n)
        assert z < 4.0, z
    finally:
        eng.close()


def test_prompt_lookup_proposes_the_latest_continuation() -> None:
    look = NGramLookup(3)
    h = [1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]
    assert look.propose(h, 2) == [7, 5]  # the latest earlier "1 2 3" was followed by 7 5
    assert look.propose([*h, 4], 4) == []  # "3 4", "4" never seen before
    assert look.propose([*h, 4, 3], 3) == [4, 3]  # "4 3" unseen; the latest "3" with a successor: the tail's
    assert look.propose([1, 2, 3, 9, 1, 2], 3) == [3, 9, 1]  # a history that is not an extension: indexed anew
    assert look.propose([5, 6, 5], 8) == [6, 5]  # the continuation may run into the tail


def test_refusals(tmp_path, vocab) -> None:
    path = write_fixture("llama", tmp_path / "t.gguf", vocab=vocab)
    other = dict(vocab, tokens=list(vocab["tokens"]))  # type: ignore[call-overload]
    other["tokens"][500] = "zzzz"  # type: ignore[index]
    bad = write_fixture("llama", tmp_path / "bad.gguf", seed=1, vocab=other)
    eng = Engine(path, n_ctx=64, threads=1, backend="cpu")
    try:
        with pytest.raises(VocabularyMismatch, match="token 500 is 'zzzz'") as exc:
            eng.speculate(draft=bad)
        assert "\n" not in str(exc.value)
        assert eng.speculator is None and eng.draft is None
        for kw, msg in (({"lookup": 17}, "n-gram size"), ({"lookup": 2, "draft_max": 0}, "drafted at once"),
                        ({"lookup": 2, "p_min": 1.5}, "minimum probability")):
            with pytest.raises(ValueError, match=msg):
                eng.speculate(**kw)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="draft model or a lookup"):
            Speculator()
        eng.speculate(lookup=2)
        eng.speculate()  # nothing asked: off again
        assert eng.speculator is None
    finally:
        eng.close()


def test_context_and_max_tokens_bound_the_proposals(tmp_path, vocab) -> None:
    """A reply near the end of the context or of max_tokens ends where the plain one ends."""
    path = write_fixture("qwen2", tmp_path / "t.gguf", vocab=vocab)
    eng = Engine(path, n_ctx=48, threads=1, backend="cpu")
    try:
        for params in (SamplerParams(temperature=0, max_tokens=200), SamplerParams(temperature=0, max_tokens=7)):
            eng.speculate()
            plain, _, _ = _tokens(eng, PROMPT, params)
            eng.speculate(lookup=2, draft_max=16)
            spec, _, _ = _tokens(eng, PROMPT, params)
            assert spec == plain
    finally:
        eng.close()


def test_cli_generate_with_lookup_and_draft(tmp_path, vocab, capsys) -> None:
    from quantscope.cli.main import main

    path = str(write_fixture("qwen3", tmp_path / "t.gguf", vocab=vocab))
    args = ["generate", path, "-p", PROMPT, "-n", "24", "--temp", "0", "-t", "1", "--backend", "cpu", "-c", "128"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main([*args, "--lookup", "3", "--draft-max", "4"]) == 0
    out = capsys.readouterr()
    assert out.out == plain and "drafted tokens accepted" in out.err
    assert main([*args, "--draft", path, "--draft-p-min", "0"]) == 0
    out = capsys.readouterr()
    assert out.out == plain and "(100%)" in out.err
    other = dict(vocab, tokens=list(vocab["tokens"]))  # type: ignore[call-overload]
    other["tokens"][7] = "zzzz"  # type: ignore[index]
    bad = str(write_fixture("qwen3", tmp_path / "bad.gguf", vocab=other))
    assert main([*args, "--draft", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("quantscope: error: --draft ") and "vocabulary differs" in err[-1]
    assert main([*args, "--draft", str(tmp_path / "none.gguf")]) == 2
    assert "--draft: " in capsys.readouterr().err


def test_server_speculates_for_a_single_generating_slot(tmp_path, vocab) -> None:
    """The server with prompt lookup and with a draft: greedy completions (one at a time, then two at once in
    two slots, batched while both generate) are the plain server's, and its metrics count the proposals."""
    import concurrent.futures

    import openai

    from quantscope.core.server import Server, model_id_of

    path = write_fixture("llama", tmp_path / "t.gguf", vocab=vocab)
    eng = Engine(path, n_ctx=256, threads=1, backend="cpu")
    srv = Server(eng, model_id_of(path), port=0, parallel=2)
    srv.start()
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        prompts = [PROMPT, "the dog ran after the ball and the dog ran"]

        def complete(prompt: str) -> str:
            r = client.completions.create(model=model_id_of(path), prompt=prompt, max_tokens=30, temperature=0)
            return r.choices[0].text

        plain = [complete(p) for p in prompts]
        # (the model as its own draft: its proposals are accepted)
        for kw in ({"lookup": 2, "draft_max": 5}, {"draft": path, "p_min": 0.0}):
            eng.speculate(**kw)  # (between requests: the scheduler reads it at each step)
            before = srv.scheduler.metrics.drafted_tokens
            assert [complete(p) for p in prompts] == plain
            assert srv.scheduler.metrics.drafted_tokens > before
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                assert list(pool.map(complete, prompts)) == plain
        m = srv.scheduler.metrics
        assert 0 < m.accepted_tokens <= m.drafted_tokens
    finally:
        srv.stop()
        eng.close()


def test_speculation_uses_only_the_session_protocol(tmp_path, vocab) -> None:
    """The model's and the draft's sessions wrapped to the protocol's members alone (what the CUDA and split
    sessions also have): the same greedy tokens as on the CPU sessions themselves."""
    from .test_session_protocol import ProtocolOnly

    path = write_fixture("llama", tmp_path / "t.gguf", vocab=vocab)
    runs = []
    for wrap in (False, True):
        eng = Engine(path, n_ctx=128, threads=1, backend="cpu")
        try:
            eng.speculate(draft=path, lookup=2, draft_max=4, p_min=0.0)
            assert eng.speculator is not None and eng.speculator.draft is not None
            if wrap:
                eng.session = ProtocolOnly(eng.session)  # type: ignore[assignment]
                eng.speculator.draft.session = ProtocolOnly(eng.speculator.draft.session)  # type: ignore[assignment]
            runs.append(_tokens(eng, PROMPT, SamplerParams(temperature=0, max_tokens=20)))
            if wrap:
                assert {"forward", "truncate", "checkpoint"} <= eng.session.used  # type: ignore[union-attr]
        finally:
            eng.close()
    assert runs[0] == runs[1] and runs[0][1] > 0


def test_serve_refuses_speculation_with_several_models(tmp_path, vocab, capsys) -> None:
    from quantscope.cli.main import main

    path = str(write_fixture("llama", tmp_path / "t.gguf", vocab=vocab))
    assert main(["serve", "--models", path, "--lookup", "2", "--port", "0"]) == 2
    assert "--draft and --lookup are for serving one model" in capsys.readouterr().err
