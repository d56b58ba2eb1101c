"""Synthetic random-weight llama files (core/synthetic.py): the tiny shape end to end, the documented type
layout, determinism, cancel and reuse. The big shapes are only planned here (sizes), never written."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from quantscope.core import synthetic as S
from quantscope.core.chat import SamplerParams
from quantscope.core.gguf import GGUFFile
from quantscope.core.model import read_config
from quantscope.core.native import kernels as K

from .conftest import require_model


@pytest.fixture(scope="module")
def smol() -> Path:
    return require_model("smollm2")


@pytest.fixture(scope="module")
def tiny(smol, tmp_path_factory) -> Path:
    return S.write_synthetic(tmp_path_factory.mktemp("syn") / "tiny.gguf", "tiny", smol)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_tiny_opens_validates_and_generates(tiny, smol):
    from quantscope.core.engine.generate import Engine

    mine_bytes, src_bytes = tiny.read_bytes(), smol.read_bytes()
    with GGUFFile(tiny) as f, GGUFFile(smol) as src:
        cfg = read_config(f)
        assert (cfg.arch, cfg.n_layers, cfg.n_embd, cfg.n_ff, cfg.n_head, cfg.n_head_kv, cfg.head_dim) == (
            "llama", 2, 256, 512, 4, 2, 64)
        assert cfg.n_vocab == 49152 == len(f.get("tokenizer.ggml.tokens"))
        for key, kv in src.metadata.items():  # the whole tokenizer, byte for byte
            if key.startswith("tokenizer."):
                mine = f.metadata[key]
                assert mine_bytes[mine.offset : mine.end] == src_bytes[kv.offset : kv.end], key
        assert f.get("general.file_type") == 15 and f.get(S.MARKER_KEY) == S.marker(S.SHAPES["tiny"], 0)
    e = Engine(tiny, n_ctx=64, threads=1, backend="cpu")
    try:
        logits = e.model.session(16).forward(e.tokenizer.encode("Hello world"))
        assert np.isfinite(logits).all()
        deltas = list(e.generate("Hello", SamplerParams(temperature=0, max_tokens=3)))
        assert deltas[-1].finished and deltas[-1].n_generated == 3
    finally:
        e.close()


def test_layout_is_the_documented_q4_k_m_mix(tiny):
    assert [i for i in range(16) if S.use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert [i for i in range(32) if S.use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28,
                                                                  29, 30, 31]
    with GGUFFile(tiny) as f:
        types = {t.name: t.type_name for t in f.tensors}
        assert types.pop("token_embd.weight") == "Q4_K" and types.pop("output.weight") == "Q6_K"
        assert types.pop("output_norm.weight") == "F32"
        for name, ty in types.items():
            layer, kind = int(name.split(".")[1]), name.split(".")[2]
            if kind.endswith("norm"):
                assert ty == "F32", name
            elif kind in ("attn_v", "ffn_down"):
                assert ty == ("Q6_K" if S.use_more_bits(layer, 2) else "Q4_K"), name
            else:
                assert ty == "Q4_K", name
        for name in ("blk.1.ffn_down.weight", "output.weight", "blk.0.attn_q.weight"):
            w = K.dequantize(f.tensor_rows(name), f.tensor(name).type_name, threads=1)
            assert np.isfinite(w).all() and 0.02 < np.sqrt(np.mean(w * w)) < 0.2 and np.abs(w).max() < 1, name
        assert np.all(f.tensor_array("blk.0.attn_norm.weight") == 1)


def test_planned_sizes_match_the_issue(smol):
    tok, n_vocab = S.tokenizer_entries(smol)
    sizes = {}
    for name in ("1b", "3b", "8b"):
        head, plan = S.header_bytes(S.SHAPES[name], 0, tok, n_vocab)
        sizes[name] = S.expected_size(head, plan)
    assert round(sizes["1b"] / 1e6) == 725 and round(sizes["8b"] / 1e9, 2) == 4.47
    assert sizes["1b"] < sizes["3b"] < sizes["8b"]


def test_same_seed_same_bytes(tiny, smol, tmp_path):
    again = S.write_synthetic(tmp_path / "again.gguf", "tiny", smol)
    assert _sha(again) == _sha(tiny)
    other = S.write_synthetic(tmp_path / "other.gguf", "tiny", smol, seed=1)
    assert _sha(other) != _sha(tiny) and other.stat().st_size == tiny.stat().st_size


class _CancelAfter:
    def __init__(self, n: int) -> None:
        self.n = n

    @property
    def cancelled(self) -> bool:
        self.n -= 1
        return self.n < 0


def test_cancel_and_errors_leave_no_debris(smol, tmp_path):
    out = tmp_path / "out"
    out.mkdir()  # writers refuse a missing folder
    with pytest.raises(S.SyntheticCancelled):
        S.write_synthetic(out / "c.gguf", "tiny", smol, cancel=_CancelAfter(2))
    assert os.listdir(out) == []

    def boom(p: S.SyntheticProgress) -> None:
        if p.done > 1 << 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        S.write_synthetic(out / "k.gguf", "tiny", smol, progress=boom)
    assert os.listdir(out) == []


def test_ensure_reuses_a_complete_file_and_remakes_a_broken_one(smol, tmp_path, monkeypatch, capsys):
    from quantscope.cli.bench import SYNTHETIC_SHAPES
    from quantscope.cli.main import main

    assert tuple(S.SHAPES) == SYNTHETIC_SHAPES
    monkeypatch.setenv("QUANTSCOPE_MODELS", str(tmp_path / "cache"))
    assert main(["bench", "--synthetic", "tiny", "--path-only"]) == 0
    target = Path(capsys.readouterr().out.strip())
    assert target == S.synthetic_path("tiny") == tmp_path / "cache" / "synthetic" / "llama-tiny-q4km.gguf"
    assert not target.exists()
    seen = []
    p = S.ensure_synthetic("tiny", vocab_source=smol, progress=seen.append)
    assert p == target and seen[-1].done == seen[-1].total and S.is_complete(p, "tiny")
    p.unlink()
    (tmp_path / "cache" / smol.name).symlink_to(smol)  # the vocabulary's model "cached": nothing is downloaded
    assert main(["bench", "--synthetic=tiny"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(target) and "100%" in err and S.is_complete(p, "tiny")
    assert main(["bench", "--synthetic", "9b"]) == 2 and "invalid choice: '9b'" in capsys.readouterr().err
    ino = p.stat().st_ino
    assert S.ensure_synthetic("tiny", vocab_source=smol).stat().st_ino == ino  # reused, not rewritten
    assert not S.is_complete(p, "tiny", seed=3)
    with open(p, "r+b") as fh:
        fh.truncate(p.stat().st_size - 4096)
    assert not S.is_complete(p, "tiny")
    assert S.is_complete(S.ensure_synthetic("tiny", vocab_source=smol), "tiny")
    assert S.synthetic_path("tiny", seed=7).name == "llama-tiny-q4km-seed7.gguf"
    with pytest.raises(ValueError, match="unknown synthetic shape"):
        S.synthetic_path("9b")


def test_a_mixture_of_experts_shape_runs_and_routes(smol, tmp_path):
    """A qwen3moe shape (here 4 experts of 256, 2 per token, one layer) writes a file the engine loads and runs,
    prefill and decode agreeing; the routers are random (different tokens pick different experts) and the
    inspect summary counts the parameters a token reads."""
    from quantscope.core.engine import Model
    from quantscope.core.summary import experts_summary

    shape = S.Shape("moe-tiny", 1, 256, 512, 4, 2, 64, "a test-sized qwen3moe", arch="qwen3moe", n_expert=4,
                    n_expert_used=2, expert_ff=256)
    path = S.write_synthetic(tmp_path / "moe.gguf", shape, smol)
    with GGUFFile(path) as f:
        cfg = read_config(f)
        assert (cfg.arch, cfg.n_expert, cfg.n_expert_used, cfg.n_ff) == ("qwen3moe", 4, 2, 256)
        router = f.tensor_rows(f.tensor("blk.0.ffn_gate_inp.weight")).view(np.float32)
        assert router.std() > 0.01 and len(np.unique(router)) > 100
        ex = experts_summary(f)
        assert ex is not None and (ex["count"], ex["used"], ex["layers"]) == (4, 2, 1)
        assert ex["active_parameters"] == sum(t.n_elements for t in f.tensors) - ex["expert_parameters"] // 2
        m = Model(f, threads=2)
        ids = [5, 900, 77, 4000, 12]
        full = m.session(16).forward(ids, all_logits=True)
        s = m.session(16)
        steps = np.stack([s.forward([i]) for i in ids])
        assert np.isfinite(full).all()
        assert np.abs(steps - full).max() <= 1e-3 * np.abs(full).max()
    plan = {t.name: t for t in S.tensor_plan(S.SHAPES["moe"], 49152)}
    assert plan["blk.0.ffn_gate_exps.weight"].ne == (2048, 768, 128)  # Qwen3-30B-A3B's experts
    assert plan["blk.0.ffn_down_exps.weight"].ne == (768, 2048, 128)
    assert S.synthetic_path("moe-k2").name == "qwen3moe-moe-k2-q4km.gguf"


def test_a_gpt_oss_shape_runs(smol, tmp_path):
    """The gpt-oss shape (here 2 layers of 256, 4 experts, 2 per token) is llama-quantize's MXFP4_MOE mix: MXFP4
    experts with valid exponents, Q8_0 elsewhere, zero biases and sinks; the engine loads and runs it, prefill and
    decode agreeing."""
    from quantscope.core.engine import Model

    shape = S.Shape("oss-tiny", 2, 256, 256, 4, 2, 64, "a test-sized gpt-oss", rope_base=150000.0, arch="gpt-oss",
                    n_expert=4, n_expert_used=2, expert_ff=256)
    path = S.write_synthetic(tmp_path / "oss.gguf", shape, smol)
    with GGUFFile(path) as f:
        cfg = read_config(f)
        assert (cfg.arch, cfg.n_expert, cfg.sliding_window, cfg.rope_ext_factor) == ("gpt-oss", 4, 128, 1.0)
        assert f.tensor("blk.0.ffn_up_exps.weight").type_name == "MXFP4"
        assert f.tensor("blk.1.attn_q.weight").type_name == "Q8_0" and f.get("general.file_type") == 38
        exps = f.tensor_rows(f.tensor("blk.0.ffn_down_exps.weight")).reshape(-1, 17)[:, 0]
        assert exps.min() >= S.MXFP4_EXPONENTS[0] and exps.max() <= S.MXFP4_EXPONENTS[1]
        m = Model(f, threads=2)
        ids = [5, 900, 77, 4000, 12]
        full = m.session(16).forward(ids, all_logits=True)
        s = m.session(16)
        steps = np.stack([s.forward([i]) for i in ids])
        assert np.isfinite(full).all() and np.abs(full).max() > 0
        assert np.abs(steps - full).max() <= 1e-3 * np.abs(full).max()
    plan = {t.name: t for t in S.tensor_plan(S.SHAPES["oss"], 49152)}
    assert plan["blk.0.ffn_gate_exps.weight"].ne == (2880, 2880, 32)  # gpt-oss-20b's experts
    assert plan["blk.3.attn_sinks.weight"].ne == (64,)
    assert S.synthetic_path("oss").name == "gpt-oss-oss-mxfp4.gguf"
