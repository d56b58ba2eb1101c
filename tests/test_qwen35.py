"""Qwen3.5's gated delta-net layers in the engine beyond the fidelity test (tests/test_arch_fidelity.py): the native
block's own checks of the delta-net fields, the recurrent state in the session (reset, checkpoint, rewinding),
regenerating a reply, and the memory plan counting the state."""

from __future__ import annotations

import numpy as np
import pytest

from quantscope.core.chat import SamplerParams
from quantscope.core.engine import Model
from quantscope.core.engine.generate import Engine
from quantscope.core.gguf import GGUFFile
from quantscope.core.model.memory import memory_plan
from quantscope.core.native import ffi, lib

from .arch_fixtures import vocabulary, write_fixture


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_fixture("qwen35", tmp_path_factory.mktemp("q35") / "qwen35.gguf", vocab=vocabulary())


@pytest.fixture(scope="module")
def model(path):
    return Model(GGUFFile(path), threads=2)


def set_field(b, path: str, value) -> None:
    """Set a (dotted) field of a native ``qs_block``: ``attn.wq.bytes``, ``moe.n_expert`` ..."""
    *parents, name = path.split(".")
    for p in parents:
        b = getattr(b, p)
    setattr(b, name, value)


#: (field, value, error) of the fixture's first (delta-net) block: 4 value heads of 16 over 2 key heads, a conv of 4
#: taps over 128 channels
GDN_FIELDS = [("gdn.state", 0, "QS_ERR_HEADS"), ("gdn.state", 2000, "QS_ERR_HEADS"), ("gdn.v_heads", 3, "QS_ERR_HEADS"),
              ("gdn.conv", 65, "QS_ERR_HEADS"), ("gdn.conv_w.len", 127 * 4, "QS_ERR_VECTOR"),
              ("gdn.dt_bias.len", 3, "QS_ERR_VECTOR"), ("gdn.a.ptr", None, "QS_ERR_VECTOR"),
              ("gdn.norm.len", 15, "QS_ERR_VECTOR"), ("gdn.conv_state_len", 3 * 128 - 1, "QS_ERR_CACHE"),
              ("gdn.ssm_state_len", 4 * 16 * 16 + 1, "QS_ERR_CACHE"), ("gdn.ssm_state", None, "QS_ERR_CACHE"),
              ("gdn.z.bytes", 64 * 64 * 4 - 1, "QS_ERR_WEIGHT"), ("gdn.beta.bytes", 4 * 64 * 4 - 4, "QS_ERR_WEIGHT"),
              ("gdn.qkv.bytes", 128 * 64 * 4 - 1, "QS_ERR_WEIGHT"), ("gdn.out.bytes", 64 * 64 * 4 - 1, "QS_ERR_WEIGHT"),
              ("attn.q_gate", 1, "QS_ERR_SIZE"), ("attn.q_norm.ptr", "bq", "QS_ERR_VECTOR")]


@pytest.mark.parametrize(("field", "value", "code"), GDN_FIELDS, ids=[f"{f}={v}" for f, v, _ in GDN_FIELDS])
def test_the_native_block_checks_the_delta_net_fields(field, value, code, model):
    """qs_block_forward checks every delta-net size, vector and state buffer itself and writes nothing (not x, not
    the state) when one disagrees."""
    s = model.session(16)
    b = ffi.new("qs_block *", s._block_structs[0][0])
    assert (b.gdn.conv, b.gdn.state, b.gdn.k_heads, b.gdn.v_heads, b.gdn.ssm_state_len) == (4, 16, 2, 4, 1024)
    if value is None:
        set_field(b, field, ffi.NULL)
    elif value == "bq":
        set_field(b, field, b.gdn.norm.ptr)
        set_field(b, field.replace(".ptr", ".len"), 16)
    else:
        set_field(b, field, value)
    s.ssm_state[0][...] = 0.5
    x = np.ones((2, 64), np.float32)
    pos = np.array([0, 1], np.int32)
    rc = lib.qs_block_forward(b, ffi.cast("float *", ffi.from_buffer(x)), 2,
                              ffi.cast("int32_t *", ffi.from_buffer(pos)), 0, 1)
    assert rc == getattr(lib, code), (rc, code)
    assert (x == 1).all() and (s.ssm_state[0] == 0.5).all() and (s.conv_state[0] == 0).all()


def test_the_state_is_the_session_s_and_rewinds_to_its_checkpoint(model):
    """The delta-net state lives in the session: two sessions do not share it, reset clears it, and truncating
    returns to the checkpoint (a regenerated reply) or starts over; logits stay the same either way."""
    ids = [5, 17, 99, 4, 250, 31, 7, 600]
    s, other = model.session(64), model.session(64)
    full = s.forward(ids, all_logits=True)
    assert np.abs(s.ssm_state[0]).max() > 0 and not np.abs(other.ssm_state[0]).any()
    s.checkpoint()
    after = s.forward([12, 13])
    s.truncate(8)  # back to the checkpoint
    assert s.n_past == 8
    np.testing.assert_array_equal(s.forward([12, 13]), after)
    s.truncate(5)  # before the checkpoint: the recurrent state cannot be rewound there
    assert s.n_past == 0
    np.testing.assert_allclose(s.forward(ids, all_logits=True), full, rtol=0, atol=1e-5)
    s.reset()
    assert s.n_past == 0 and not np.abs(s.ssm_state[0]).any() and not np.abs(s.conv_state[0]).any()
    one = np.stack([s.forward([t]) for t in ids])  # decode token by token: the prefill's logits
    np.testing.assert_allclose(one, full, rtol=0, atol=1e-4)


def test_a_regenerated_reply_and_a_follow_up_turn(path):
    """The generator reuses the state after the prompt for a regenerated reply (the same seed gives the same
    text, from the checkpoint) and starts over where a new prompt leaves the checkpoint behind."""
    eng = Engine(path, n_ctx=128, threads=2, backend="cpu")
    params = SamplerParams(max_tokens=6, seed=3)

    def run(e: Engine, prompt: str) -> str:
        return "".join(d.text for d in e.generate(prompt, params))

    first = run(eng, "The cat sat")
    n_prompt = len(eng.prompt_ids("The cat sat"))
    assert eng.session.n_past > n_prompt
    assert run(eng, "The cat sat") == first
    other = run(eng, "A dog ran")
    assert run(Engine(path, n_ctx=128, threads=2, backend="cpu"), "A dog ran") == other


def test_the_memory_plan_counts_the_recurrent_state(path, model):
    plan = memory_plan(GGUFFile(path), 64)
    s = model.session(64)
    assert (plan.n_layers, plan.n_recurrent) == (2, 2)  # KV caches for the two attention layers only
    assert plan.state_bytes == 2 * 4 * (3 * 128 + 4 * 16 * 16)
    assert plan.kv_bytes + plan.state_bytes == s.kv_bytes
    assert plan.total_bytes == plan.weights_bytes + plan.kv_bytes + plan.state_bytes


def _gdn_step(st, k, q, v, decay, beta):
    o = np.zeros(st.shape[0], np.float32)
    p = {n: ffi.cast("float *", ffi.from_buffer(a)) for n, a in (("st", st), ("k", k), ("q", q), ("v", v), ("o", o))}
    assert lib.qs_gdn_step(st.shape[0], p["st"], p["k"], p["q"], p["v"], decay, beta, p["o"]) == lib.QS_OK
    return o


@pytest.mark.parametrize("S", [16, 128, 13])
def test_the_delta_rule_step_simd_equals_scalar_and_the_formula(S):
    """The delta-net head's step (csrc/qs_nn.c and its AVX2 twin): the same bits at every level, and the formula
    in float64 (st <- st * decay, d = beta (v - st^T k), st += k d^T, o = st^T q) to float rounding."""
    from quantscope.core.native import kernels as K

    rng = np.random.default_rng(S)
    st0 = rng.standard_normal((S, S)).astype(np.float32)
    k, q, v = ((rng.standard_normal(S) / np.sqrt(S)).astype(np.float32) for _ in range(3))
    got = {}
    for level in K.ISA_NAMES[: K.ISA_NAMES.index(K.isa_detected()) + 1]:
        st = st0.copy()
        with K.forced_isa(level):
            got[level] = (_gdn_step(st, k, q, v, 0.9, 0.6), st)
    ref_st = st0.astype(np.float64) * 0.9
    d = 0.6 * (v - ref_st.T @ k)
    ref_st += np.outer(k, d)
    ref_o = ref_st.T @ q
    for level, (o, st) in got.items():
        np.testing.assert_allclose(o, ref_o, rtol=1e-5, atol=1e-5, err_msg=level)
        np.testing.assert_allclose(st, ref_st, rtol=1e-5, atol=1e-5, err_msg=level)
        assert np.array_equal(o, got["scalar"][0]) and np.array_equal(st, got["scalar"][1]), level
    assert lib.qs_gdn_step(0, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 1.0, 1.0, ffi.NULL) == lib.QS_ERR_SIZE


#: (field, value, error) of the qwen35moe fixture's first block: a shared expert of 48 beside 8 experts of 32
SHEXP_FIELDS = [("moe.n_ff_shexp", -1, "QS_ERR_SIZE"), ("moe.sh_gate.bytes", 48 * 64 * 4 - 1, "QS_ERR_WEIGHT"),
                ("moe.sh_down.bytes", 64 * 48 * 4 - 4, "QS_ERR_WEIGHT"), ("moe.sh_up.ptr", None, "QS_ERR_WEIGHT"),
                ("moe.sh_gate_inp.len", 63, "QS_ERR_VECTOR"), ("moe.sh_gate_inp.ptr", None, "QS_ERR_VECTOR"),
                ("moe.n_expert", 0, "QS_ERR_SIZE")]


@pytest.mark.parametrize(("field", "value", "code"), SHEXP_FIELDS, ids=[f"{f}={v}" for f, v, _ in SHEXP_FIELDS])
def test_the_native_block_checks_the_shared_expert(field, value, code, tmp_path):
    """qwen35moe's shared expert: its matrices, gate vector and width are checked by qs_block_forward itself."""
    m = Model(GGUFFile(write_fixture("qwen35moe", tmp_path / "q35moe.gguf", vocab=vocabulary())), threads=2)
    s = m.session(16)
    b = ffi.new("qs_block *", s._block_structs[0][0])
    assert (b.moe.n_ff_shexp, b.moe.sh_gate_inp.len, b.moe.n_expert) == (48, 64, 8)
    set_field(b, field, ffi.NULL if value is None else value)
    x = np.ones((2, 64), np.float32)
    pos = np.array([0, 1], np.int32)
    rc = lib.qs_block_forward(b, ffi.cast("float *", ffi.from_buffer(x)), 2,
                              ffi.cast("int32_t *", ffi.from_buffer(pos)), 0, 1)
    assert rc == getattr(lib, code), (rc, code)
    assert (x == 1).all() and not s.ssm_state[0].any()
