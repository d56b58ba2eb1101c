"""Comparing two GGUFs of a model on a text (core/engine/compare.py, `quantscope compare`): the tiny llama fixture
(tests/arch_fixtures.py) in F32 as the base and in Q8_0 as the quant, against llama.cpp's perplexities for both
(tests/data/arch/meta.json: 4 chunks of 64 tokens of tests/data/english.txt) and its F32 log-probability file."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from quantscope.cli.main import main
from quantscope.core.engine import Model, kld
from quantscope.core.engine.compare import (
    CompareCancelled,
    CompareError,
    CompareResult,
    TokenScore,
    compare_models,
)
from quantscope.core.gguf import GGUFFile
from quantscope.core.tokenizer import Tokenizer

from .arch_fixtures import vocabulary, write_fixture

DATA = Path(__file__).parent / "data"
ARCH = DATA / "arch"
META = json.loads((ARCH / "meta.json").read_text(encoding="utf-8"))["fixtures"]
TEXT_PATH = DATA / "english.txt"
TEXT = TEXT_PATH.read_text(encoding="utf-8")
N_CTX, N_CHUNKS = 64, 4  # what meta.json's llama-perplexity runs used
SCORED = N_CHUNKS * (N_CTX - 1 - N_CTX // 2)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The llama fixture in F32 and Q8_0 (the files llama.cpp read), one with a token renamed, one with fewer
    tokens, and llama-perplexity's F32 log-probability file."""
    d = tmp_path_factory.mktemp("compare")
    v = vocabulary()
    out = {}
    for variant in ("F32", "Q8_0"):
        p = write_fixture("llama", d / f"llama-{variant}.gguf", variant, vocab=v)
        assert hashlib.sha256(p.read_bytes()).hexdigest() == META[f"llama-{variant}"]["sha256"]
        out[variant] = p
    renamed = dict(v, tokens=[*v["tokens"][:500], "zz-renamed", *v["tokens"][501:]])  # type: ignore[misc]
    out["renamed"] = write_fixture("llama", d / "renamed.gguf", vocab=renamed)
    short = dict(v, tokens=v["tokens"][:1000], types=v["types"][:1000])  # type: ignore[index]
    out["short"] = write_fixture("llama", d / "short.gguf", vocab=short)
    out["llama_base"] = d / "llama-F32.kld"
    out["llama_base"].write_bytes(gzip.decompress((ARCH / "llama-F32.kld.gz").read_bytes()))
    return out


def run(base: Path, quant: Path, text: str = TEXT, **kw: object) -> CompareResult:
    kw = {"n_ctx": N_CTX, "max_chunks": N_CHUNKS, "threads": 2} | kw
    return compare_models(base, quant, text, **kw)  # type: ignore[arg-type]


def ln_ratio(a: float, b: float) -> float:
    return abs(math.log(a / b))


def test_a_model_against_itself(files):
    calls: list[tuple[int, int, str]] = []
    r = run(files["F32"], files["F32"], progress=lambda d, t, m: calls.append((d, t, m)))
    assert (r.n_ctx, r.n_chunks, r.n_scored, len(r.tokens)) == (N_CTX, N_CHUNKS, SCORED, SCORED)
    assert r.kld_mean == r.kld_max == r.kld_median == r.kld_p99 == 0.0
    assert r.top1_agreement == 1.0 and r.ppl_base == r.ppl_quant
    assert all(t.base_logp == t.quant_logp and t.base_top1 == t.quant_top1 for t in r.tokens)
    # llama-perplexity's perplexity of the same file, chunks and positions
    assert ln_ratio(r.ppl_base, META["llama-F32"]["llama_ppl"]) < 0.01
    # the text: every position of every chunk, the scored ones indexed into it
    with GGUFFile(files["F32"]) as f:
        tok = Tokenizer(f)
        ids = tok.encode(TEXT)[: N_CHUNKS * N_CTX]
    assert [i for i, _ in r.context] == ids
    assert "".join(p for _, p in r.context) == tok.decode(ids) and TEXT.startswith(tok.decode(ids))
    assert [t.position for t in r.tokens] == [c * N_CTX + j for c in range(N_CHUNKS) for j in range(33, 64)]
    assert all(r.context[t.position] == (t.token_id, t.piece) for t in r.tokens)
    # progress: loading in thousandths, then one call per chunk, the last one complete
    chunks = [(d, t) for d, t, m in calls if m.startswith("chunk")]
    assert chunks == [(c, N_CHUNKS) for c in range(1, N_CHUNKS + 1)]
    assert any(m.startswith("loading the base") for _, _, m in calls)
    assert any(m.startswith("loading the quant") and d == t == 1000 for d, t, m in calls)


def test_q8_0_against_f32(files):
    r = run(files["F32"], files["Q8_0"])
    k = r.kld_values()
    assert k.size == SCORED and (k >= -1e-12).all()  # exact KL over the whole vocabulary
    assert 1e-3 < r.kld_mean < 0.2  # measured 0.037 (the fixture's logits are sharply peaked)
    assert r.kld_mean == pytest.approx(k.mean()) and r.kld_max == k.max()
    assert r.kld_median <= r.kld_p90 <= r.kld_p99 <= r.kld_max
    assert r.kld_median == pytest.approx(np.median(k)) and r.kld_p90 == pytest.approx(np.percentile(k, 90))
    assert 0.5 < r.top1_agreement < 1.0  # measured 0.847
    assert r.top1_agreement == pytest.approx(np.mean([t.base_top1 == t.quant_top1 for t in r.tokens]))
    # both perplexities are llama.cpp's for these files
    assert ln_ratio(r.ppl_base, META["llama-F32"]["llama_ppl"]) < 0.01
    assert ln_ratio(r.ppl_quant, META["llama-Q8_0"]["llama_ppl"]) < 0.01
    assert r.ppl_base == pytest.approx(math.exp(-np.mean([t.base_logp for t in r.tokens])))
    assert r.ppl_quant == pytest.approx(math.exp(-np.mean([t.quant_logp for t in r.tokens])))
    s = r.summary()
    json.dumps(s, allow_nan=False)
    assert s["ppl_ratio"] == pytest.approx(r.ppl_quant / r.ppl_base) and s["n_scored"] == SCORED
    assert {"kld_mean", "kld_median", "kld_p90", "kld_p99", "kld_max", "top1_agreement"} <= set(s)
    assert r.worst(3) == sorted(r.tokens, key=lambda t: -t.kld)[:3]
    assert all(t in r.token_text for t in (r.tokens[0].base_top1, r.tokens[0].quant_top1))
    # one position by hand: the two files' logits at a scored position of chunk 2
    t = r.tokens[2 * 31 + 5]
    chunk = [i for i, _ in r.context[2 * N_CTX : 3 * N_CTX]]
    logp = []
    for p in (files["F32"], files["Q8_0"]):
        m = Model(GGUFFile(p), threads=2)
        lg = m.session(N_CTX).forward(chunk, all_logits=True)[t.position - 1 - 2 * N_CTX].astype(np.float64)
        logp.append(lg - lg.max() - math.log(np.exp(lg - lg.max()).sum()))
    assert t.base_logp == pytest.approx(logp[0][t.token_id], abs=1e-3)
    assert t.quant_logp == pytest.approx(logp[1][t.token_id], abs=1e-3)
    assert t.kld == pytest.approx(float((np.exp(logp[0]) * (logp[0] - logp[1])).sum()), abs=1e-3)
    assert t.base_top1 == logp[0].argmax() and t.quant_top1 == logp[1].argmax()


def test_a_base_file_gives_the_figures_of_the_base_model(files, tmp_path):
    m = Model(GGUFFile(files["F32"]), threads=2)
    with GGUFFile(files["F32"]) as f:
        tok = Tokenizer(f)
    base = tmp_path / "f32.kld"
    assert kld.write_base(base, m, tok, TEXT, N_CTX, N_CHUNKS)[0] == N_CHUNKS
    direct = run(files["F32"], files["Q8_0"])
    r = run(base, files["Q8_0"], n_ctx=512, base_is_kld=True)  # the file's context wins
    assert (r.n_ctx, r.n_chunks, r.n_scored, r.base_is_kld) == (N_CTX, N_CHUNKS, SCORED, True)
    assert r.context == direct.context and [t.position for t in r.tokens] == [t.position for t in direct.tokens]
    assert r.ppl_quant == direct.ppl_quant  # the same quant, the same chunks
    assert r.kld_mean == pytest.approx(direct.kld_mean, abs=1e-4)
    assert np.abs(r.kld_values() - direct.kld_values()).max() < 1e-3
    assert r.kld_p99 == pytest.approx(direct.kld_p99, abs=1e-3) and r.kld_max == pytest.approx(direct.kld_max, abs=1e-3)
    assert abs(r.top1_agreement - direct.top1_agreement) <= 1 / SCORED
    # the stored log-probabilities: the model's to the quantization step, floored at 16 below the top
    for a, b in zip(r.tokens, direct.tokens, strict=True):
        assert a.base_logp >= b.base_logp - 1e-3
        if a.base_logp > -16:
            assert a.base_logp == pytest.approx(b.base_logp, abs=1e-3)
    # llama-perplexity's own figures for this base file and this model
    quant = Model(GGUFFile(files["Q8_0"]), threads=2)
    quant.repack()  # as compare_models runs it (the layouts' kernels round activations differently)
    with kld.KLDBase(base) as kb:
        ref = kld.kl_divergence(kb, quant, tok)
    assert r.kld_mean == pytest.approx(ref.mean_kld()[0], rel=1e-9)
    assert r.ppl_base == pytest.approx(ref.ppl_base()[0], rel=1e-9) and r.ppl_quant == pytest.approx(ref.ppl()[0])
    assert r.top1_agreement == ref.top1()
    # without the text: the file's tokens; fewer chunks on request
    assert run(base, files["Q8_0"], "", base_is_kld=True).tokens == r.tokens
    assert run(base, files["Q8_0"], base_is_kld=True, max_chunks=2).n_scored == SCORED // 2


def test_llama_perplexity_base_file(files):
    """The base file llama-perplexity wrote for the F32 fixture stands for it: the same KL divergence of the Q8_0
    file, to the two engines' differences."""
    direct = run(files["F32"], files["Q8_0"])
    r = run(files["llama_base"], files["Q8_0"], base_is_kld=True)
    assert r.context == direct.context
    assert r.kld_mean == pytest.approx(direct.kld_mean, abs=1e-4)
    assert ln_ratio(r.ppl_quant, META["llama-Q8_0"]["llama_ppl"]) < 0.01
    same = run(files["llama_base"], files["F32"], base_is_kld=True)
    assert abs(same.kld_mean) < 1e-4 and same.top1_agreement >= 0.99


def test_refusals(files, tmp_path):
    with pytest.raises(CompareError, match=r"do not share a vocabulary: token 500 is '.*' in the first and "
                                           r"'zz-renamed' in the second"):
        run(files["F32"], files["renamed"])
    with pytest.raises(CompareError, match="do not share a vocabulary: 1,024 tokens against 1,000"):
        run(files["F32"], files["short"])
    with pytest.raises(ValueError, match=r"the text has \d+ tokens; at least 64 are needed \(one chunk of 64\)"):
        run(files["F32"], files["Q8_0"], TEXT[:100])
    with pytest.raises(ValueError, match="context size 2 is outside"):
        run(files["F32"], files["Q8_0"], n_ctx=2)
    with pytest.raises(CompareError, match="does not tokenize to the file's tokens"):
        run(files["llama_base"], files["Q8_0"], TEXT[1:], base_is_kld=True)
    with pytest.raises(CompareError, match="not a llama-perplexity log-probability file"):
        run(files["F32"], files["Q8_0"], base_is_kld=True)
    bad = tmp_path / "v10.kld"
    rec = kld.record_len(10) * kld.scored_per_chunk(16)
    bad.write_bytes(kld.MAGIC + np.array([16, 10, 1], "<i4").tobytes() + np.zeros(16, "<i4").tobytes()
                    + np.zeros(rec, "<u2").tobytes())
    with pytest.raises(CompareError, match="written for a vocabulary of 10 entries"):
        run(bad, files["Q8_0"], "", base_is_kld=True)


def test_cancel(files):
    with pytest.raises(CompareCancelled):
        run(files["F32"], files["Q8_0"], cancel=lambda: True)
    seen: list[int] = []
    with pytest.raises(CompareCancelled):
        run(files["F32"], files["Q8_0"], progress=lambda d, t, m: seen.append(d) if m.startswith("chunk") else None,
            cancel=lambda: bool(seen))
    assert seen == [1]  # checked between chunks


def test_score_positions_blocks_and_definitions():
    """Exact KL over row blocks equals the whole-array formula; the records path is compare_records'."""
    rng = np.random.default_rng(5)
    T, V = kld.SCORE_ROWS * 2 + 7, 300
    a = (rng.standard_normal((T, V)) * 3).astype(np.float32)
    b = a + (rng.standard_normal((T, V)) * 0.3).astype(np.float32)
    tg = rng.integers(0, V, T)
    s = kld.score_positions(b, tg, base_logits=a)
    la, lb = (x.astype(np.float64) - np.log(np.exp(x.astype(np.float64)).sum(1, keepdims=True)) for x in (a, b))
    assert np.allclose(s.kld, (np.exp(la) * (la - lb)).sum(1), atol=1e-12)
    assert np.allclose(s.nll, -lb[np.arange(T), tg]) and np.allclose(s.nll_base, -la[np.arange(T), tg])
    assert (s.top == b.argmax(1)).all() and (s.top_base == a.argmax(1)).all()
    assert (kld.score_positions(a, tg, base_logits=a).kld == 0).all()
    rec = kld.quantize_log_probs(a)
    r = kld.score_positions(b, tg, records=rec, n_vocab=V)
    assert np.abs(r.kld - s.kld).max() < 1e-3
    assert all(np.array_equal(x, y) for x, y in zip(kld.compare_records(b, rec, tg, V), r[:5], strict=True))
    with pytest.raises(ValueError, match="exactly one"):
        kld.score_positions(b, tg)


def test_token_score_fields():
    """The fields the GUI's view reads."""
    t = TokenScore(1, 2, "x", 0.5, -1.0, -2.0, 3, 4)
    assert (t.position, t.token_id, t.piece, t.kld, t.base_logp, t.quant_logp, t.base_top1, t.quant_top1) == (
        1, 2, "x", 0.5, -1.0, -2.0, 3, 4)


# ------------------------------------------------------------------ the command line

def cli(capsys, *argv: object) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as ex:  # --help and the like
        rc = int(ex.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_summary_and_worst_positions(files, capsys):
    rc, out, err = cli(capsys, "compare", files["F32"], files["Q8_0"], "-f", TEXT_PATH, "-c", N_CTX, "--chunks",
                       N_CHUNKS, "-t", 2, "--worst", 5)
    assert rc == 0, err
    r = run(files["F32"], files["Q8_0"])
    assert "base   llama-F32.gguf" in out and "quant  llama-Q8_0.gguf" in out
    assert f"{N_CHUNKS} chunks of {N_CTX} tokens, {SCORED} positions" in out
    assert f"PPL    base {r.ppl_base:.4f}  quant {r.ppl_quant:.4f}  ratio {r.ppl_ratio:.6f}" in out
    assert f"KLD    mean {r.kld_mean:.6f}  median {r.kld_median:.6f}  p90 {r.kld_p90:.6f}  p99 {r.kld_p99:.6f}" in out
    assert f"top-1  {100 * r.top1_agreement:.2f} %" in out
    assert "\x1b[" not in out  # not a terminal: no colour, the worst positions instead
    assert "the 5 positions of largest KLD" in out
    worst = r.worst(5)[0]
    assert f"  {worst.kld:9.6f}  @{worst.position:<7}" in out
    assert f"[{N_CHUNKS}/{N_CHUNKS}] mean KLD" in err


def test_cli_colour(files, capsys):
    rc, out, _ = cli(capsys, "compare", files["F32"], files["Q8_0"], "-p", TEXT, "-c", N_CTX, "--chunks", 2,
                     "--color", "always")
    assert rc == 0
    assert "\x1b[48;5;" in out and "KLD (nats):" in out and "largest KLD" not in out
    body = out.split("\n\n", 1)[1].rsplit("\n\nKLD (nats):", 1)[0]
    plain = re.sub(r"\x1b\[[0-9;]*m", "", body)
    assert TEXT.startswith(plain) and len(plain) > 300  # the text itself, coloured
    rc, out, _ = cli(capsys, "compare", files["F32"], files["Q8_0"], "-p", TEXT, "-c", N_CTX, "--chunks", 2,
                     "--color", "never")
    assert rc == 0 and "\x1b[" not in out and "largest KLD" in out


def test_cli_json(files, capsys, tmp_path):
    rc, out, _ = cli(capsys, "compare", files["llama_base"], files["Q8_0"], "--base-kld", "--json", "-t", 2)
    assert rc == 0
    d = json.loads(out)
    r = run(files["llama_base"], files["Q8_0"], "", base_is_kld=True)
    assert d["summary"] == pytest.approx({**r.summary(), "seconds": d["summary"]["seconds"]})
    assert d["summary"]["n_scored"] == SCORED == len(d["tokens"]) and d["summary"]["base_is_kld"] is True
    assert d["tokens"][0] == {**d["tokens"][0], "position": 33, "token_id": r.tokens[0].token_id}
    assert set(d["tokens"][0]) == {"position", "token_id", "piece", "kld", "base_logp", "quant_logp", "base_top1",
                                   "quant_top1"}
    assert d["worst"] == [t.position for t in r.worst(10)]


def test_cli_errors_are_one_line(files, capsys, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("A few words.", encoding="utf-8")
    f32, q8 = str(files["F32"]), str(files["Q8_0"])
    cases = [
        ([f32, str(files["renamed"]), "-f", TEXT_PATH], "do not share a vocabulary"),
        ([f32, q8], "compare needs the text"),
        ([f32, q8, "-f", TEXT_PATH, "-p", "x"], "not allowed with argument"),
        ([f32, str(tmp_path / "none.gguf"), "-f", TEXT_PATH], "none.gguf"),
        ([f32, q8, "-f", short], "(one chunk of 512)"),
        ([f32, q8, "-f", tmp_path / "none.txt"], "none.txt"),
        ([f32, q8, "-f", TEXT_PATH, "--base-kld"], "not a llama-perplexity log-probability file"),
        ([str(files["llama_base"]), q8, "--base-kld", "-c", "128"], "written with a context of 64"),
        ([str(files["llama_base"]), q8, "--base-kld", "-p", "Other words entirely."], "does not tokenize"),
        ([f32, q8, "-p", TEXT, "-c", "2"], "out of range"),
        ([f32, q8, "-p", TEXT, "--color", "sometimes"], "invalid choice"),
    ]
    for argv, message in cases:
        rc, _out, err = cli(capsys, "compare", *argv)
        lines = err.strip().splitlines()
        assert rc == 2 and lines and lines[-1].startswith("quantscope: error: ") and message in lines[-1], (argv, err)
        assert len([x for x in lines if x.startswith("quantscope:")]) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.txt"]  # nothing written
