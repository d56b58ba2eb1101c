"""Every architecture against llama.cpp's own numbers: tiny random-weight fixtures (tests/arch_fixtures.py) and the
log-probabilities llama-perplexity computed for them (tests/data/arch, recorded by tests/record_arch_fixtures.py).

For each fixture: the file gguf-py writes today must be the one llama.cpp read (SHA-256), and our logits at every
scored position of 4 chunks of 64 tokens must match: mean KL divergence below 1e-4 with F32 weights (below 2e-3
with Q8_0 matrices, where the two engines quantize activations differently) and the same top token at 99 % of the
positions, for the chunk evaluated at once (prefill) and token by token (decode).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from quantscope.cli.main import main
from quantscope.core.engine import Model, kld
from quantscope.core.gguf import GGUFFile
from quantscope.core.model import UnsupportedModel
from quantscope.core.native import kernels as K
from quantscope.core.tokenizer import Tokenizer

from . import arch_fixtures
from .arch_fixtures import Spec, vocabulary, write_fixture

DATA = Path(__file__).parent / "data" / "arch"
META = json.loads((DATA / "meta.json").read_text(encoding="utf-8"))
LIMITS = {"F32": 1e-4, "Q8_0": 2e-3, "MXFP4": 2e-3}


@pytest.fixture(scope="module")
def vocab() -> dict[str, object]:
    return vocabulary()


def load(key: str, tmp_path: Path, vocab: dict[str, object]) -> tuple[Model, Tokenizer, kld.KLDBase]:
    m = META["fixtures"][key]
    path = write_fixture(m["arch"], tmp_path / f"{key}.gguf", m["variant"], vocab=vocab)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == m["sha256"], (f"{key}: tests/arch_fixtures.py now writes another file than the one llama.cpp "
                                   "read; re-record with tests/record_arch_fixtures.py")
    base = tmp_path / f"{key}.kld"
    base.write_bytes(gzip.decompress((DATA / f"{key}.kld.gz").read_bytes()))
    f = GGUFFile(path)
    return Model(f, threads=2), Tokenizer(f), kld.KLDBase(base)


@pytest.mark.parametrize("repack", [False, True], ids=["file-layout", "repacked"])
@pytest.mark.parametrize("key", sorted(META["fixtures"]))
def test_logits_match_llama_cpp(key, repack, tmp_path, vocab):
    model, tok, base = load(key, tmp_path, vocab)
    if repack:  # the repacked layouts (float ones for the F32 fixtures) against the same oracle
        if K.isa() == "scalar":
            pytest.skip("the engine repacks only for SIMD kernels")
        assert model.repack() > 0
    text = (Path(__file__).parent / "data" / "english.txt").read_text(encoding="utf-8")
    assert base.tokens.reshape(-1).tolist() == tok.encode(text)[: base.tokens.size]  # same tokenizer
    r = kld.kl_divergence(base, model, tok)
    limit = LIMITS[META["fixtures"][key]["variant"]]
    assert r.count == 4 * (64 - 1 - 32)
    assert r.mean_kld()[0] < limit, r.report()
    assert r.top1() >= 0.99, r.report()
    if META["fixtures"][key]["llama_ppl"]:
        assert np.log(r.ppl()[0] / META["fixtures"][key]["llama_ppl"]) == pytest.approx(0, abs=0.01)
    # token by token through the KV cache: the same numbers
    s = model.session(base.n_ctx)
    chunk = base.tokens[1]
    steps = np.stack([s.forward([int(t)]) for t in chunk[: base.n_ctx - 1]])[base.n_ctx // 2 :]
    _, _, kl, _, same = kld.compare_records(steps, base.records(1), chunk[base.n_ctx // 2 + 1 :], base.n_vocab)
    assert kl.mean() < limit and same.mean() >= 0.96


@pytest.mark.parametrize(("key", "change"), [
    ("llama3-F32", dict(rope_freqs=None)),  # as the engine ran Llama 3 files before it read the tensor
    ("gemma2-F32", dict(attn_softcap=0.0)),
    ("gemma2-F32", dict(final_softcap=0.0)),
    ("smollm3-F32", dict(no_rope_step=0)),
    ("granite-F32", dict(residual_scale=1.0)),
    ("phi3-long-F32", dict(rope_mscale=1.0)),
    ("phi3-long-F32", dict(rope_orig_ctx=4096)),  # the short factors where llama.cpp takes the long ones
    ("phi3-short-F32", dict(rope_orig_ctx=32)),
    ("llama-yarn-F32", dict(rope_ext_factor=0.0)),  # linear interpolation only
    ("gemma3-linear-F32", dict(rope_freq_scale=1.0)),
    ("mistral3-F32", dict(attn_temp_scale=0.0)),
    ("granite-F32", dict(logit_scale=1.0)),
    ("gemma4-F32", dict(v_norm=False)),
    ("gemma4-F32", dict(attn_scale=0.0)),  # 1/sqrt(head size), as every other architecture
    ("gemma4-F32", dict(rope_base_swa=1e6)),
    ("gemma4-F32", dict(final_softcap=0.0)),
    ("gemma4-F32", dict(rope_freqs=None)),  # every pair of the global layers rotated
    ("gemma4-F32", dict(layer_out_scale=None)),
    ("gemma4-F32", dict(layer_ple_post_norm=0.0)),  # the per-layer embeddings add nothing
    ("mixtral-F32", dict(n_expert_used=1)),  # routing: how many experts each token takes
    ("qwen3moe-F32", dict(n_expert_used=3)),
    ("qwen3moe-F32", dict(expert_weights_scale=2.0)),  # the picked experts' weights sum to 1
    ("gpt-oss-F32", dict(swiglu_oai=False)),  # the plain SwiGLU
    ("gpt-oss-F32", dict(rope_scale_swa=False)),  # the sliding layers rotated without YaRN
    ("gpt-oss-F32", dict(sliding_window=0)),
    ("gpt-oss-F32", dict(layer_sinks=None)),
    ("gpt-oss-F32", dict(layer_bo=None)),
    ("gpt-oss-F32", dict(layer_b_router=None)),
    ("gpt-oss-F32", dict(layer_b_down=None)),
    ("qwen35-F32", dict(rope_dim=16)),  # every value of the heads rotated, not the first rope.dimension_count
    ("qwen35-F32", dict(gdn_dt_bias=0.0)),  # the delta-net's decay without its bias
    ("qwen35-F32", dict(gdn_conv="last tap")),  # no conv across positions (so no conv state either)
    ("qwen35moe-F32", dict(layer_shared=None)),  # the routed experts alone
    ("qwen35moe-F32", dict(n_expert_used=1)),
    ("seed_oss-F32", dict(rope_neox=False)),  # adjacent pairs where its description says NeoX halves
])
def test_the_oracle_catches_a_missing_feature(key, change, tmp_path, vocab):
    """Each feature the fixtures exercise matters: without it the fidelity test above would fail (gemma3's linear
    scaling, on its one global layer in six, moves the mean KLD to 5e-4; the others to 0.05 and far beyond)."""
    model, tok, base = load(key, tmp_path, vocab)
    weights = model.weights
    if "rope_freqs" in change:
        weights = dataclasses.replace(weights, rope_freqs=None)
    elif "layer_out_scale" in change:
        weights = dataclasses.replace(weights, layers=[dataclasses.replace(lw, out_scale=None)
                                                       for lw in weights.layers])
    elif any(k in change for k in ("layer_sinks", "layer_bo", "layer_b_router", "layer_b_down")):
        field = next(iter(change))[len("layer_"):]  # a gpt-oss vector left out
        cfg = dataclasses.replace(model.config, attn_sinks=field != "sinks")
        weights = dataclasses.replace(weights, config=cfg, layers=[dataclasses.replace(lw, **{field: None})
                                                                   for lw in weights.layers])
    elif "layer_shared" in change:
        weights = dataclasses.replace(weights, config=dataclasses.replace(model.config, n_ff_shexp=0), layers=[
            dataclasses.replace(lw, sh_gate=None, sh_up=None, sh_down=None, sh_gate_inp=None) for lw in weights.layers])
    elif "gdn_dt_bias" in change or "gdn_conv" in change:
        def gdn(g):
            if "gdn_dt_bias" in change:
                return dataclasses.replace(g, dt_bias=g.dt_bias * 0)
            conv = g.conv.reshape(-1, model.config.ssm_conv).copy()
            conv[:, :-1] = 0.0
            return dataclasses.replace(g, conv=conv.reshape(-1))
        weights = dataclasses.replace(weights, layers=[
            lw if lw.gdn is None else dataclasses.replace(lw, gdn=gdn(lw.gdn)) for lw in weights.layers])
    elif "layer_ple_post_norm" in change:
        weights = dataclasses.replace(weights, layers=[dataclasses.replace(lw, ple_post_norm=lw.ple_post_norm * 0)
                                                       for lw in weights.layers])
    else:
        weights = dataclasses.replace(weights, config=dataclasses.replace(model.config, **change))
    r = kld.kl_divergence(base, Model(None, threads=2, weights=weights), tok)
    assert r.mean_kld()[0] > 3 * LIMITS["F32"], r.report()


def _extra(names: dict[str, int]):
    return lambda rng: {n: np.ones(k, np.float32) for n, k in names.items()}


def G4(**kw: object) -> Spec:  # the gemma4 fixture with changes
    return dataclasses.replace(arch_fixtures.SPECS["gemma4"], **kw)


def Q35(**kv: object) -> Spec:  # the qwen35 fixture with metadata changed (the tensors stay as they are)
    base = arch_fixtures.SPECS["qwen35"]
    return dataclasses.replace(base, extra_kv={**base.extra_kv, **kv})


@pytest.mark.parametrize(("spec", "message"), [
    (Spec("llama", extra_tensors=_extra({"blk.0.attn_sinks.weight": 4})), "blk.0.attn_sinks.weight"),
    (Spec("llama", extra_kv={"rope.scaling.type": "dynamic-ntk"}), "llama.rope.scaling.type = 'dynamic-ntk'"),
    (Spec("phi3", fused_qkv=True, fused_gate_up=True, extra_tensors=_extra({"rope_factors_long.weight": 8})),
     "rope_factors_long/rope_factors_short.weight: expected both or neither"),
    (Spec("olmo2", qk_norm="full", post_norms=True, pre_norms=False, extra_kv={"attention.sliding_window": 8}),
     "sliding-window"),
    (Spec("mistral4"), "architecture 'mistral4' is not supported"),
    (Spec("llama", extra_kv={"rope.scaling.type": "yarn", "rope.scaling.yarn_ext_factor": 0.5}),
     "llama.rope.scaling.yarn_ext_factor: not supported"),
    (Spec("granite"), "granite.logit_scale: expected a value, found none"),
    (G4(extra_tensors=lambda rng: {"blk.0.ffn_gate_inp.weight": np.ones((4, 64), np.float32)}),
     "the mixture-of-experts variant (ffn_gate_inp) is not supported"),
    (G4(extra_kv={"attention.shared_kv_layers": 6}), "gemma4.attention.shared_kv_layers: expected fewer than"),
    (G4(extra_kv={"attention.shared_kv_layers": 5}), "own KV cache to number 2..6, found 1"),
    (G4(extra_kv={"attention.shared_kv_layers": 3}), "layer 3 would read layer 2's KV cache"),
    (G4(extra_kv={"attention.sliding_window_pattern": [True, False]}),
     "gemma4.attention.sliding_window_pattern: expected an array of 6 booleans"),
    (G4(extra_kv={"rope.dimension_count_swa": 20}), "at most the head dimension 16 for layer 0, found 20"),
    (G4(extra_kv={"attention.head_count_kv": [2, 1, 2, 3, 2, 1]}), "for layer 3, found 3"),
    (G4(extra_kv={"feed_forward_length": [128] * 6}), "blk.4.ffn_gate.weight to be 128 x 64"),
    (dataclasses.replace(arch_fixtures.SPECS["qwen3moe"], extra_kv={"expert_shared_count": 1}),
     "qwen3moe.expert_shared_count: shared experts are not supported"),
    (dataclasses.replace(arch_fixtures.SPECS["qwen3moe"], extra_kv={"expert_gating_func": 2}),
     "only softmax gating (1) is supported, found 2"),
    (dataclasses.replace(arch_fixtures.SPECS["qwen3moe"], extra_kv={"expert_used_count": 17}),
     "qwen3moe.expert_used_count: expected an integer in 1..16"),
    (dataclasses.replace(arch_fixtures.SPECS["qwen3moe"], expert_ff=32, extra_kv={"expert_feed_forward_length": 48}),
     "blk.0.ffn_gate_exps.weight: expected shape [64, 48, 16]"),
    (Spec("llama", extra_tensors=lambda rng: {"blk.0.ffn_gate_inp.weight": np.ones((4, 64), np.float32)}),
     "llama.expert_count: expected the number of experts (the file has blk.0.ffn_gate_inp.weight)"),
    (dataclasses.replace(arch_fixtures.SPECS["gpt-oss"], extra_kv={}),
     "gpt-oss.attention.sliding_window: expected a value, found none"),
    (dataclasses.replace(arch_fixtures.SPECS["gpt-oss"], extra_tensors=_extra({"blk.0.attn_q_norm.weight": 16})),
     "gpt-oss: the engine does not use the tensor(s) blk.0.attn_q_norm.weight"),
    (dataclasses.replace(arch_fixtures.SPECS["gpt-oss"], extra_kv={"attention.sliding_window": 16,
                                                                    "expert_used_count": 9}),
     "gpt-oss.expert_used_count: expected an integer in 1..8"),
    (Q35(**{"ssm.inner_size": 60}),
     "qwen35.ssm.inner_size: expected qwen35.ssm.time_step_rank x qwen35.ssm.state_size = 64, found 60"),
    (Q35(**{"ssm.group_count": 3}), "qwen35.ssm.group_count: expected a divisor of qwen35.ssm.time_step_rank = 4"),
    (Q35(**{"rope.dimension_sections": [1, 1, 1, 1]}), "leave rotated pairs to the fourth (vision) section"),
    (Q35(**{"ssm.conv_kernel": 5}), "expected blk.0.ssm_conv1d.weight of shape [5, 128], found [4, 128]"),
    (Q35(**{"ssm.state_size": 8, "ssm.inner_size": 32}), "expected blk.0.ssm_conv1d.weight of shape [4, 64]"),
    (Q35(nextn_predict_layers=1), "multi-token-prediction layers are not supported"),
    (dataclasses.replace(arch_fixtures.SPECS["qwen35moe"], extra_kv={**arch_fixtures.SPECS["qwen35moe"].extra_kv,
                                                                      "expert_shared_count": 2}),
     "qwen35moe.expert_shared_count: only one shared expert is supported"),
    (dataclasses.replace(arch_fixtures.SPECS["qwen35moe"], extra_kv={
        k: v for k, v in arch_fixtures.SPECS["qwen35moe"].extra_kv.items()
        if k != "expert_shared_feed_forward_length"}),
     "missing tensor blk.0.ffn_gate_shexp.weight"),  # the file has no shared expert: llama.cpp requires one
])
def test_what_the_engine_would_ignore_is_refused(spec, message, tmp_path, vocab, monkeypatch, capsys):
    monkeypatch.setitem(arch_fixtures.SPECS, "case", spec)
    path = write_fixture("case", tmp_path / "case.gguf", vocab=vocab)
    with pytest.raises(UnsupportedModel, match=re.escape(message)):
        Model(GGUFFile(path))
    assert main(["generate", str(path), "-p", "hi", "-n", "1"]) != 0  # the CLI: one line, no traceback
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("quantscope: error: ") and message in err[-1] and "Traceback" not in "\n".join(err)


@pytest.mark.parametrize("base", [1.0, 1e-30, 1e30])
def test_odd_rope_bases_give_finite_yarn_ranges(base, tmp_path, vocab):
    """A RoPE base of 1 (log 0) or an extreme one must not crash the session set-up: the YaRN correction range is
    clamped to finite numbers, and the forward pass runs."""
    model, _, _ = load("llama-yarn-F32", tmp_path, vocab)
    cfg = dataclasses.replace(model.config, rope_base=base)
    c0, c1 = cfg.yarn_corr_dims(0)
    assert np.isfinite([c0, c1]).all() and 0 <= c0 and c1 <= cfg.rope_dim - 1
    odd = Model(None, threads=2, weights=dataclasses.replace(model.weights, config=cfg))
    assert np.isfinite(odd.session(16).forward([5, 6, 7])).all()


def test_a_yarn_factor_that_zeroes_the_magnitude_is_refused(tmp_path, vocab, monkeypatch):
    monkeypatch.setitem(arch_fixtures.SPECS, "case", Spec("llama", extra_kv={"rope.scaling.type": "yarn",
                                                                             "rope.scaling.factor": 4.5e-5}))
    path = write_fixture("case", tmp_path / "case.gguf", vocab=vocab)
    with pytest.raises(UnsupportedModel, match=re.escape("rope.scaling.factor: expected a YaRN factor")):
        Model(GGUFFile(path))


def test_experts_run_from_the_cli_and_have_a_gpu_path(tmp_path, vocab, capsys):
    """A qwen3moe file generates from the CLI; the CUDA backend names nothing missing in a llama file's experts
    (csrc/cuda/qsc_moe.cuh) and takes its shapes; qwen3moe's experts of width 48 are what it refuses."""
    from quantscope.core.engine import cuda_description

    model, _, _ = load("qwen3moe-F32", tmp_path, vocab)
    assert (model.config.n_expert, model.config.n_expert_used, model.config.n_ff) == (16, 4, 48)
    mixtral, _, _ = load("mixtral-F32", tmp_path, vocab)  # an architecture the GPU runs, with experts
    cuda_description.check_config(mixtral.config)
    with pytest.raises(UnsupportedModel, match="n_ff 48 must be a positive multiple of 32"):
        cuda_description.check_config(model.config)
    assert main(["generate", str(tmp_path / "qwen3moe-F32.gguf"), "-p", "The cat", "-n", "8", "--temp", "0"]) == 0
    assert capsys.readouterr().out.strip()


def test_gemma4_runs_from_the_cli_and_has_a_gpu_path(tmp_path, vocab, capsys):
    """The CLI generates with a gemma4 file; the CUDA backend finds nothing missing in it (per-layer shapes and
    embeddings, shared KV caches: tests/test_cuda.py runs it), nor in a llama whose layers differ in FFN width."""
    from quantscope.core.engine import cuda_description

    model, _, _ = load("gemma4-F32", tmp_path, vocab)
    cuda_description.check_config(model.config)
    llama, _, _ = load("llama-F32", tmp_path, vocab)
    cuda_description.check_config(dataclasses.replace(llama.config, layer_n_ff=(128, 64)))
    assert main(["generate", str(tmp_path / "gemma4-F32.gguf"), "-p", "The cat", "-n", "8", "--temp", "0"]) == 0
    assert capsys.readouterr().out.strip()  # the continuation (the prompt is not echoed)
    s = model.session(32)
    assert s.kv_bytes == 2 * 32 * (2 * 2 * 16 + 2 * 1 * 32) * 2  # 4 caches of their own (f16), 2 shared
    assert s.k_cache[4] is s.k_cache[2] and s.v_cache[5] is s.v_cache[3]


def set_field(b, path: str, value) -> None:
    """Set a (dotted) field of a native ``qs_block``: ``attn.wq.bytes``, ``moe.n_expert`` ..."""
    *parents, name = path.split(".")
    for p in parents:
        b = getattr(b, p)
    setattr(b, name, value)


MOE_FIELDS = [("moe.n_expert", -1, "QS_ERR_SIZE"), ("moe.n_expert", 5000, "QS_ERR_SIZE"),
              ("moe.n_used", 0, "QS_ERR_SIZE"), ("moe.n_used", 9, "QS_ERR_SIZE"), ("moe.n_expert", 16, "QS_ERR_WEIGHT"),
              ("moe.router.ptr", None, "QS_ERR_WEIGHT"), ("moe.router.bytes", 100, "QS_ERR_WEIGHT"),
              ("moe.router.type", 999, "QS_ERR_TYPE"), ("moe.scale", float("nan"), "QS_ERR_SIZE"),
              ("moe.scale", -1.0, "QS_ERR_SIZE"), ("ffn.gate.bytes", 7 * 128 * 64 * 4, "QS_ERR_WEIGHT"),
              ("ffn.down.bytes", 8 * 64 * 128 * 4 - 1, "QS_ERR_WEIGHT"), ("ffn.n_ff", 256, "QS_ERR_WEIGHT")]


def assert_refused(s, b, code: str) -> None:
    """qs_block_forward on 2 tokens with block ``b`` of session ``s`` returns ``code`` and writes nothing."""
    from quantscope.core.native import ffi, lib

    x = np.ones((2, 64), np.float32)
    pos = np.array([0, 1], np.int32)
    cache = s.k_cache[0].copy()
    rc = lib.qs_block_forward(b, ffi.cast("float *", ffi.from_buffer(x)), 2,
                              ffi.cast("int32_t *", ffi.from_buffer(pos)), 0, 1)
    assert rc == getattr(lib, code), (rc, code)
    assert (x == 1).all() and np.array_equal(s.k_cache[0], cache)


#: (field, value, error) of the gpt-oss fixture's blocks (4 heads, 8 experts of 64 x 64)
OAI_FIELDS = [("attn.bo.len", 63, "QS_ERR_VECTOR"), ("attn.sinks.len", 3, "QS_ERR_VECTOR"),
              ("moe.b_router.len", 9, "QS_ERR_VECTOR"), ("moe.b_gate.len", 8 * 64 - 1, "QS_ERR_VECTOR"),
              ("moe.b_up.len", 0, "QS_ERR_VECTOR"), ("moe.b_down.len", 64, "QS_ERR_VECTOR"),
              ("ffn.swiglu_oai", -1, "QS_ERR_SIZE"), ("sink0", float("nan"), "QS_ERR_SIZE"),
              ("sink0", float("inf"), "QS_ERR_SIZE")]


@pytest.mark.parametrize(("field", "value", "code"), OAI_FIELDS, ids=[f"{f}={v}" for f, v, _ in OAI_FIELDS])
def test_the_native_block_checks_gpt_oss_vectors(field, value, code, tmp_path, vocab):
    """The biases, sinks and mode switches of gpt-oss's blocks are checked by qs_block_forward itself before anything
    is written."""
    from quantscope.core.native import ffi

    model, _, _ = load("gpt-oss-F32", tmp_path, vocab)
    s = model.session(16)
    b = ffi.new("qs_block *", s._block_structs[0][0])
    assert (b.attn.bo.len, b.attn.sinks.len, b.moe.b_router.len, b.moe.b_gate.len, b.moe.b_down.len,
            b.ffn.swiglu_oai) == (64, 4, 8, 8 * 64, 8 * 64, 1)
    if field == "sink0":
        sinks = np.array([value, 0.0, 0.0, 0.0], np.float32)
        b.attn.sinks.ptr = ffi.cast("float *", ffi.from_buffer(sinks))
    else:
        set_field(b, field, value)
    assert_refused(s, b, code)


@pytest.mark.parametrize(("field", "value", "code"), MOE_FIELDS, ids=[f"{f}={v}" for f, v, _ in MOE_FIELDS])
def test_the_native_block_checks_the_expert_sizes(field, value, code, tmp_path, vocab):
    """qs_block_forward checks the router and the expert matrices against n_expert, n_expert_used and n_ff itself
    (8 experts of 128 x 64 in F32 here) and writes nothing when one disagrees."""
    from quantscope.core.native import ffi

    model, _, _ = load("mixtral-F32", tmp_path, vocab)
    s = model.session(16)
    b = ffi.new("qs_block *", s._block_structs[0][0])
    assert (b.moe.n_expert, b.moe.n_used, b.moe.router.bytes) == (8, 2, 8 * 64 * 4)
    set_field(b, field, ffi.NULL if value is None else value)
    assert_refused(s, b, code)
