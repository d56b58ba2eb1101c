"""The layer as a plan (csrc/qs_plan.h, docs/engine.md "The layer as a plan"): the steps qs_block_plan builds from
each architecture fixture's descriptions, the policy it resolves, and that every backend walks every step kind."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from quantscope.core.engine.session import Model
from quantscope.core.native import ffi, lib, nn

from .arch_fixtures import vocabulary, write_fixture

ROOT = Path(__file__).resolve().parents[1]

ATTENTION = ["norm attn_norm: x -> h", "tap attn_in: h", "proj h -> q:wq k:wk v:wv", "qk_post", "tap q: q",
             "attend: q -> att", "tap wo_in: att", "proj att -> o:wo"]
DENSE_FFN = ["norm ffn_norm: x -> h", "tap ffn_in: h", "proj h -> g:gate u:up", "glu silu: g * u -> a",
             "tap down_in: a", "proj a -> o:down"]


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    """name -> the CPU session's layer descriptions (qs_block) of that fixture."""
    vocab = vocabulary()
    root = tmp_path_factory.mktemp("plan")
    cache: dict[str, list] = {}

    def get(name: str) -> list:
        if name not in cache:
            model = Model.load(str(write_fixture(name, root / f"{name}.gguf", vocab=vocab)), threads=1)
            cache[name] = [model, model.session(32)]
        return cache[name][1]._block_structs

    return get


def test_a_dense_layer(blocks):
    assert nn.block_plan(blocks("llama")[0]) == [*ATTENTION, "residual none: x += o", *DENSE_FFN,
                                                 "residual none: x += o"]


def test_biases_post_norms_and_no_pre_norms(blocks):
    qwen2 = nn.block_plan(blocks("qwen2")[0])
    assert qwen2[2] == "proj h -> q:wq+bq k:wk+bk v:wv+bv"
    olmo2 = nn.block_plan(blocks("olmo2")[1])
    assert olmo2[0] == "norm copy: x -> h" and "norm copy: x -> h" in olmo2[9]
    assert "residual post_attn_norm: x += o" in olmo2 and olmo2[-1] == "residual post_ffn_norm: x += o"


def test_residual_scale_is_resolved_in_the_plan(blocks):
    granite = nn.block_plan(blocks("granite")[0])
    assert granite.count("residual none x0.4: x += o") == 2
    b = ffi.new("qs_block *", blocks("llama")[0][0])  # a copy
    plain = nn.block_plan(b)
    for value in (0.0, 1.0):  # 0 (unset) and 1 mean the same: no scaling, no step
        b.residual_scale = b.out_scale = value
        assert nn.block_plan(b) == plain
    b.out_scale = 0.5
    assert nn.block_plan(b) == [*plain, "scale x0.5: x"]


def test_delta_net_and_gated_attention_layers(blocks):
    qwen35 = blocks("qwen35")
    recurrent = nn.block_plan(qwen35[0])
    assert recurrent[:4] == ["norm attn_norm: x -> h", "tap attn_in: h", "gdn: h -> o", "residual none: x += o"]
    gated = nn.block_plan(qwen35[3])
    assert gated[2:5] == ["proj h -> qg:wq k:wk v:wv", "qgate_split qg -> q gate", "qk_post"]
    assert gated[gated.index("attend: q -> att") + 1] == "qgate: gate -> att"


def test_experts_and_the_output_bias(blocks):
    plan = nn.block_plan(blocks("gpt-oss")[0])
    assert "proj att -> o:wo+bo" in plan and "moe: h -> o" in plan
    assert not any(line.startswith("glu") for line in plan)


def test_per_layer_embedding_shared_cache_and_output_scale(blocks):
    layers = blocks("gemma4")
    plan = nn.block_plan(layers[-1])
    assert layers[-1].attn.kv_reuse == 1 and "proj h -> q:wq" in plan  # its queries alone
    assert plan[-6:-1] == ["norm copy: x -> h", "proj h -> pg:ple_gate", "glu gelu: pg * ple_in -> pa",
                           "proj pa -> o:ple_proj", "residual ple_post_norm: x += o"]
    assert re.fullmatch(r"scale x0\.\d+: x", plan[-1])


def test_the_plan_refuses_a_short_list(blocks):
    steps = ffi.new("qs_step[]", 4)
    assert lib.qs_block_plan(blocks("llama")[0], steps, 4) == lib.QS_ERR_SIZE
    assert lib.qs_block_plan(ffi.NULL, steps, 4) == lib.QS_ERR_SIZE
    full = ffi.new("qs_step[]", int(lib.QS_PLAN_MAX))
    assert lib.qs_block_plan(blocks("gemma4")[0], full, int(lib.QS_PLAN_MAX)) == 22


def test_every_backend_walks_every_step_kind():
    """Each QS_STEP_* kind has its CPU step function (qs_block.c's CPU_STEPS) and its case in the CUDA backend's
    run_step (kernels and host twins through one launch table): a new kind without one of them fails here."""
    header = (ROOT / "csrc" / "qs_api_nn.h").read_text(encoding="utf-8")
    enum = header[header.index("QS_STEP_NORM = 1"):header.index("QS_STEP_KINDS")]
    kinds = re.findall(r"(QS_STEP_[A-Z_]+)", enum)
    assert len(kinds) == len(nn.plan_names()["kinds"]) == 12
    cpu = (ROOT / "csrc" / "qs_block.c").read_text(encoding="utf-8")
    table = cpu[cpu.index("CPU_STEPS[QS_STEP_KINDS] = {"):]
    table = table[:table.index("};")]
    cuda = (ROOT / "csrc" / "cuda" / "qsc_device.cu").read_text(encoding="utf-8")
    walk = cuda[cuda.index("static int run_step("):]
    walk = walk[:walk.index("\n}\n")]
    for kind in kinds:
        assert f"[{kind}] = cpu_" in table, kind
        assert f"case {kind}:" in walk, kind
    assert "m->host" not in walk  # the launch table, chosen when the model is made, decides


BERT = ["norm copy: x -> h", "tap attn_in: h", "proj h -> q:wq+bq k:wk+bk v:wv+bv", "qk_post", "tap q: q",
        "attend: q -> att", "tap wo_in: att", "proj att -> o:wo+bo",
        "residual ln post_attn_norm+post_attn_norm_b: x = ln(x + o)", "norm copy: x -> h", "tap ffn_in: h",
        "proj h -> u:up+bup", "glu gelu_plain: u * u -> a", "tap down_in: a", "proj a -> o:down+bdown",
        "residual ln post_ffn_norm+post_ffn_norm_b: x = ln(x + o)"]


def test_bert_post_layernorm_ungated_gelu_and_full_attention(tmp_path):
    """BERT's layer (core/engine/encoder.py's descriptions): no pre-norms, x = LayerNorm(x + o) after attention and
    after the FFN, an ungated GELU FFN with biases; its switches only with their vectors, as the block checks."""
    from quantscope.core.engine.encoder import Encoder

    from .bert_fixtures import write_fixture as write_bert

    with Encoder(write_bert("bert-mean", tmp_path / "bert.gguf"), threads=1) as enc:
        assert enc.blocks is not None
        assert nn.block_plan(enc.blocks[0]) == BERT
        b = enc.blocks[0]
        assert b.attn.non_causal == 1 and b.post_ln == 1 and b.ffn.plain == 1
        x = np.zeros((3, 64), np.float32)
        pos = np.arange(3, dtype=np.int32)
        kv, kv2 = np.zeros(3 * 64, np.float32), np.zeros(3 * 64, np.float32)  # (kept alive: the calls' caches)

        def forward(block) -> int:
            a = block.attn
            a.n_ctx, a.k_cache, a.v_cache = 3, ffi.from_buffer(kv), ffi.from_buffer(kv2)
            a.k_cache_bytes = a.v_cache_bytes = kv.nbytes
            return lib.qs_block_forward(block, ffi.cast("float *", ffi.from_buffer(x)), 3,
                                        ffi.cast("int32_t *", ffi.from_buffer(pos)), 0, 1)

        assert forward(ffi.new("qs_block *", b[0])) == lib.QS_OK
        for change, code in ((lambda c: setattr(c.ffn, "plain", 0), lib.QS_ERR_WEIGHT),  # gated: no gate
                             (lambda c: setattr(c, "post_ln", 0), lib.QS_ERR_VECTOR),
                             (lambda c: setattr(c.post_ffn_norm_b, "ptr", ffi.NULL) or setattr(
                                 c.post_ffn_norm_b, "len", 0), lib.QS_ERR_VECTOR),
                             (lambda c: setattr(c.attn, "window", -1), lib.QS_ERR_SIZE),
                             (lambda c: setattr(c.attn, "non_causal", 2), lib.QS_ERR_SIZE)):
            c = ffi.new("qs_block *", b[0])
            change(c)
            assert forward(c) == code
