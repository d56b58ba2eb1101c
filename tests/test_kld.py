"""llama-perplexity's KL-divergence file format (core/engine/kld.py), both ways, against files llama.cpp wrote and
read (tests/data/kld/, recorded by tests/make_kld_fixtures.py), and hostile files."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

from quantscope.cli.main import main
from quantscope.core.engine import Model, kld
from quantscope.core.gguf import GGUFFile
from quantscope.core.tokenizer import Tokenizer

DATA = Path(__file__).parent / "data" / "kld"
META = json.loads((DATA / "meta.json").read_text(encoding="utf-8"))
TEXT = (Path(__file__).parent / "data" / "english.txt").read_text(encoding="utf-8")[:3000]


def unpack(name: str, tmp_path: Path) -> Path:
    out = tmp_path / name.removesuffix(".gz")
    out.write_bytes(gzip.decompress((DATA / name).read_bytes()))
    return out


@pytest.fixture(scope="module")
def smollm2(model_path) -> tuple[Model, Tokenizer]:
    """Repacked, as the CLI that wrote tests/data/kld/smollm2-c16-ours.kld runs it (the file layout's kernels
    give logits up to ~0.9 apart on this model: activation quantization, docs/engine.md)."""
    f = GGUFFile(model_path("smollm2"))
    m = Model(f, threads=2)
    m.repack()
    return m, Tokenizer(f)


def test_reads_the_file_llama_perplexity_wrote(tmp_path, smollm2):
    model, tok = smollm2
    base = kld.KLDBase(unpack("smollm2-c16-llama.kld.gz", tmp_path))
    assert (base.n_ctx, base.n_vocab, base.n_chunk) == (16, model.config.n_vocab, 1)
    assert base.tokens[0].tolist() == tok.encode(TEXT)[:16]  # llama.cpp's tokens are ours
    r = kld.kl_divergence(base, model, tok)
    assert r.count == 16 - 1 - 8
    # the base's own log-probabilities reproduce the perplexity llama-perplexity printed for its run
    assert r.ppl_base()[0] == pytest.approx(META["llama_ppl"], rel=2e-4)
    assert r.mean_kld()[0] < 0.02  # measured 0.0059: the two engines on the same Q4_1 weights
    assert r.top1() == 1.0
    assert abs(np.log(r.ppl()[0] / r.ppl_base()[0])) < 0.1


def test_llama_perplexity_read_the_file_we_write(tmp_path, smollm2, model_path):
    """What we write today has the layout of the file llama-perplexity read (tests/data/kld/meta.json), and
    llama-perplexity found it close to its own model."""
    model, tok = smollm2
    ours = tmp_path / "now.kld"
    n, ppl = kld.write_base(ours, model, tok, TEXT, 16, max_chunks=1)
    assert n == 1 and ppl > 1
    then = unpack("smollm2-c16-ours.kld.gz", tmp_path).read_bytes()
    now = ours.read_bytes()
    head = kld.HEADER_BYTES + 4 * 16
    assert len(now) == len(then) and now[:head] == then[:head]
    V = model.config.n_vocab
    a = kld.log_probs_of(np.frombuffer(now[head:], "<u2").reshape(-1, kld.record_len(V)), V)
    b = kld.log_probs_of(np.frombuffer(then[head:], "<u2").reshape(-1, kld.record_len(V)), V)
    live = b > -10
    assert np.abs(a - b)[live].max() < 0.1  # the same engine, maybe another ISA's rounding
    (row,) = META["llama_reading_ours_rows"]
    cols = [float(x) for x in re.findall(r"-?\d+\.\d+", row)]
    ppl_q, kld_mean, same_top = cols[0], cols[4], cols[8]
    assert ppl_q == pytest.approx(META["llama_ppl"], rel=1e-3)  # it evaluated the tokens we stored
    assert kld_mean < 0.02 and same_top == 100.0
    # and we read what we wrote: our engine against itself
    r = kld.kl_divergence(kld.KLDBase(ours), model, tok)
    assert r.mean_kld()[0] < 1e-4 and r.top1() == 1.0


def test_quantized_log_probs_round_trip():
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((5, 1001)) * 4).astype(np.float32)
    logits[2] = 7.0  # a flat row: scale 0, every code 0
    rec = kld.quantize_log_probs(logits)
    assert rec.shape == (5, 2 * 501 + 4) and rec.dtype == np.uint16
    got = kld.log_probs_of(rec, 1001).astype(np.float64)
    lg = logits.astype(np.float64)
    ref = lg - (lg.max(1, keepdims=True) + np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1, keepdims=True)))
    for t in (0, 1, 3, 4):
        scale = float(rec[t, :4].copy().view(np.float32)[0])
        near = logits[t] > logits[t].max() - 16
        assert np.abs(got[t] - ref[t])[near].max() <= scale / 2 + 1e-5
        assert rec[t, 4 + np.flatnonzero(~near)].max(initial=0) == 0
        assert rec[t, 4 + int(logits[t].argmax())] == 65535
    assert not rec[2, 4:].any() and np.allclose(got[2], ref[2], atol=1e-6)
    assert not rec[:, 4 + 1001 :].any()  # the padding entry


def _write(path: Path, n_ctx: int, n_vocab: int, n_chunk: int, tokens: np.ndarray | None = None,
           extra: int = 0, magic: bytes = kld.MAGIC) -> Path:
    toks = tokens if tokens is not None else np.zeros(n_ctx * n_chunk, "<i4")
    n = n_chunk * kld.scored_per_chunk(n_ctx) * kld.record_len(n_vocab)
    body = np.zeros(n if 0 < n < 1 << 24 else 0, "<u2").tobytes()  # absurd counts: the header alone
    path.write_bytes(magic + np.array([n_ctx, n_vocab, n_chunk], "<i4").tobytes() + toks.astype("<i4").tobytes()
                     + body + b"\0" * extra)
    return path


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(magic=b"_LOGITS_"), "not a llama-perplexity"),
    (dict(n_ctx=2), "context size 2"),
    (dict(n_vocab=0), "vocabulary size 0"),
    (dict(n_vocab=(1 << 24) + 1), "vocabulary size 16777217"),
    (dict(n_chunk=0), "0 chunks"),
    (dict(extra=1), "expected"),
    (dict(tokens=np.full(16, 99)), "token ids must lie in 0..9"),
])
def test_hostile_files_are_refused(tmp_path, kwargs, message):
    args = dict(n_ctx=16, n_vocab=10, n_chunk=1) | kwargs
    p = _write(tmp_path / "bad.kld", **args)  # type: ignore[arg-type]
    with pytest.raises(kld.KLDFileError, match=re.escape(message)):
        kld.KLDBase(p)


def test_hostile_counts_and_truncation(tmp_path):
    p = _write(tmp_path / "ok.kld", 16, 10, 2)
    assert kld.KLDBase(p).n_chunk == 2
    data = p.read_bytes()
    for cut in (0, 7, kld.HEADER_BYTES - 1, kld.HEADER_BYTES + 5, len(data) - 1):
        (tmp_path / "cut.kld").write_bytes(data[:cut])
        with pytest.raises(kld.KLDFileError):
            kld.KLDBase(tmp_path / "cut.kld")
    huge = bytearray(data)
    huge[16:20] = np.array([2**31 - 1], "<i4").tobytes()  # n_chunk far beyond the file
    (tmp_path / "huge.kld").write_bytes(bytes(huge))
    with pytest.raises(kld.KLDFileError, match="the file has"):
        kld.KLDBase(tmp_path / "huge.kld")


def test_cli_errors_are_one_line(tmp_path, capsys, model_path):
    m = str(model_path("smollm2"))
    bad = _write(tmp_path / "bad.kld", 16, 10, 1)  # a vocabulary of 10: not SmolLM2's
    cases = [
        (["perplexity", m, "--kl-divergence"], "needs --kl-divergence-base"),
        (["perplexity", m, "--kl-divergence-base", str(tmp_path / "none.kld"), "--kl-divergence"], "none.kld"),
        (["perplexity", m, "--kl-divergence-base", str(bad), "--kl-divergence"], "vocabulary of 10"),
        (["perplexity", m], "needs the text"),
        (["perplexity", m, "-f", str(Path(__file__).parent / "data" / "english.txt"), "-c", "16", "--chunks", "1",
          "--kl-divergence-base", m], "is the input file"),
    ]
    for argv, message in cases:
        try:
            rc = main(argv)
        except SystemExit as ex:
            rc = ex.code
        err = capsys.readouterr().err.strip().splitlines()
        assert rc != 0 and err[-1].startswith("quantscope: error: ") and message in err[-1], err
        assert "Traceback" not in "\n".join(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.kld"]  # nothing left behind


def test_cli_writes_and_reads_a_base(tmp_path, capsys, model_path):
    m = str(model_path("smollm2"))
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "base.kld"
    assert main(["perplexity", m, "-f", str(text), "-c", "16", "--chunks", "2", "-t", "2",
                 "--kl-divergence-base", str(out)]) == 0
    assert "perplexity" in capsys.readouterr().out
    assert kld.KLDBase(out).n_chunk == 2
    assert main(["perplexity", m, "-t", "2", "--kl-divergence-base", str(out), "--kl-divergence"]) == 0
    report = capsys.readouterr().out
    assert "14 positions" in report and "Mean    KLD:" in report and "Same top p: 100.000" in report


def test_records_are_read_per_chunk_and_truncation_in_use_is_an_error(tmp_path):
    p = _write(tmp_path / "ok.kld", 16, 10, 3)
    with kld.KLDBase(p) as base:
        assert base.records(2).shape == (7, kld.record_len(10))
        with open(p, "r+b") as fh:  # cut the last chunk after opening
            fh.truncate(p.stat().st_size - 5)
        assert base.records(1).shape == (7, kld.record_len(10))
        with pytest.raises(kld.KLDFileError, match="cut short"):
            base.records(2)
        with pytest.raises(IndexError):
            base.records(3)
    with pytest.raises(ValueError, match="closed"):
        base.records(0)
