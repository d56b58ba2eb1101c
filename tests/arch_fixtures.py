"""Tiny random-weight GGUFs, one per architecture, written with gguf-py: the fidelity fixtures of issue 15.

Each fixture has llama.cpp's tensor names and metadata for its architecture, F32 weights (or, with ``quant``,
matrices quantized by gguf-py) and a real vocabulary: SmolLM2's first :data:`N_VOCAB` tokens with the merges
that stay inside them (byte-level BPE, pre-tokenizer ``smollm``), so llama.cpp and Quantscope tokenize text the
same way. Weights are drawn from a seeded generator and scaled so that the logits are peaked (a near-uniform
distribution would hide differences). The bytes are a function of (architecture, variant, seed) and the gguf-py
version (pinned): ``tests/data/arch/meta.json`` records each fixture's SHA-256 next to llama.cpp's numbers
(``tests/record_arch_fixtures.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

N_VOCAB = 1024
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 16
N_FF = 128
N_LAYERS = 2
N_CTX_TRAIN = 256


@dataclass(frozen=True)
class Spec:
    """What one architecture's fixture holds beyond the llama layout."""

    arch: str
    biases: bool = False  # attn_q/k/v.bias
    qk_norm: str = ""  # "head": attn_q/k_norm of head_dim; "full": of the whole projection
    post_norms: bool = False  # post_attention_norm, post_ffw_norm
    pre_norms: bool = True  # attn_norm, ffn_norm
    fused_qkv: bool = False  # attn_qkv
    fused_gate_up: bool = False  # ffn_up holds gate then up
    tied: bool = False  # no output.weight
    extra_kv: dict[str, object] = field(default_factory=dict)
    extra_tensors: Callable[[np.random.Generator], dict[str, np.ndarray]] | None = None
    n_layers: int = N_LAYERS  # enough to reach every kind of layer (gemma3's global 6th, smollm3's NoPE 4th)
    embd_std: float = 1.0  # token_embd; a tied output gets its logits from it too
    rope_dim: int = HEAD_DIM  # rotated values per head (Phi-4-mini rotates 3/4 of them)
    pre: str = "smollm"  # tokenizer.ggml.pre
    experts: tuple[int, int] = (0, 0)  # (expert_count, expert_used_count): ffn_gate_inp + ffn_*_exps
    expert_ff: int = 0  # qwen3moe: expert_feed_forward_length (0: the experts are feed_forward_length wide)
    ffn_norm: str = "ffn_norm.weight"  # the pre-FFN norm's name (seed_oss: post_attention_norm.weight)
    oai: bool = False  # gpt-oss: attn_output.bias, attn_sinks, post_attention_norm as the FFN norm, router and
    # expert biases


def _llama3_rope_freqs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Llama 3.1's frequency factors for a head of 16: 1 for the fast pairs, up to 8 for the slow ones."""
    return {"rope_freqs.weight": np.array([1.0, 1.0, 1.0, 1.5, 2.5, 4.0, 8.0, 8.0], dtype=np.float32)}


def _longrope(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Phi-3.5-style factors for 6 rotated pairs: the long ones stretch the slow pairs much further."""
    return {"rope_factors_long.weight": np.array([1.0, 1.2, 2.0, 4.0, 9.0, 16.0], dtype=np.float32),
            "rope_factors_short.weight": np.array([1.0, 1.0, 1.1, 1.3, 1.6, 2.0], dtype=np.float32)}


SPECS: dict[str, Spec] = {
    "llama": Spec("llama"),
    "llama3": Spec("llama", extra_tensors=_llama3_rope_freqs),
    "qwen2": Spec("qwen2", biases=True),
    "qwen3": Spec("qwen3", qk_norm="head"),
    "gemma3": Spec("gemma3", qk_norm="head", post_norms=True, tied=True, n_layers=6, embd_std=0.5,
                   extra_kv={"attention.sliding_window": 16}),
    "phi3": Spec("phi3", fused_qkv=True, fused_gate_up=True),
    "smollm3": Spec("smollm3", n_layers=4),
    # YaRN with pairs on both sides of the correction range (2..6 of 8 at base 10000, original context 4096)
    "llama-yarn": Spec("llama", extra_kv={"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                          "rope.scaling.original_context_length": 4096}),
    # Gemma 3 4B and up: linear scaling of the global layers only
    "gemma3-linear": Spec("gemma3", qk_norm="head", post_norms=True, tied=True, n_layers=6, embd_std=0.5,
                          extra_kv={"attention.sliding_window": 16, "rope.scaling.type": "linear",
                                    "rope.scaling.factor": 8.0}),
    # Ministral 3: YaRN with a log multiplier, and query temperature from position 16 on
    "mistral3": Spec("mistral3", extra_kv={"rope.scaling.type": "yarn", "rope.scaling.factor": 16.0,
                                           "rope.scaling.original_context_length": 16,
                                           "rope.scaling.yarn_log_multiplier": 1.0,
                                           "rope.scaling.yarn_beta_fast": 4.0, "rope.scaling.yarn_beta_slow": 0.5,
                                           "attention.temperature_scale": 0.4}),
    # Phi-3.5/4 LongRoPE with 3/4 of each head rotated: llama-perplexity's 64-token context is beyond the 32 of
    # "original_context_length" (long factors), and within 4096 (short factors)
    "phi3-long": Spec("phi3", fused_qkv=True, fused_gate_up=True, rope_dim=12, extra_tensors=_longrope,
                      extra_kv={"rope.scaling.attn_factor": 1.19, "rope.scaling.original_context_length": 32}),
    "phi3-short": Spec("phi3", fused_qkv=True, fused_gate_up=True, rope_dim=12, extra_tensors=_longrope,
                       extra_kv={"rope.scaling.attn_factor": 1.19, "rope.scaling.original_context_length": 4096}),
    "granite": Spec("granite", extra_kv={"embedding_scale": 6.0, "attention.scale": 0.1, "residual_scale": 0.4,
                                         "logit_scale": 0.5}),
    # small caps, so that the soft-capping changes these random logits and scores
    "gemma2": Spec("gemma2", post_norms=True, tied=True, embd_std=0.5,
                   extra_kv={"attention.sliding_window": 16, "attn_logit_softcapping": 1.5,
                             "final_logit_softcapping": 6.0}),
    # Seed-OSS: qwen2's layout (q/k/v biases) with the pre-FFN norm named post_attention_norm
    "seed_oss": Spec("seed_oss", biases=True, ffn_norm="post_attention_norm.weight"),
    "olmo2": Spec("olmo2", qk_norm="full", post_norms=True, pre_norms=False),
    # written by _gemma4_layers: 6 layers alternating sliding/global with their own head sizes, KV heads, FFN
    # widths and rotated sizes, V = K's projection in layer 1, the last 2 layers reading layers 2 and 3's caches,
    # per-layer embeddings of 8, output scales and a small final cap
    "gemma4": Spec("gemma4", tied=True, n_layers=6, embd_std=0.5),
    # mixtures of experts: Mixtral-style llama (8 experts of feed_forward_length, 2 per token) and qwen3moe (16 of
    # their own width, 4 per token)
    "mixtral": Spec("llama", experts=(8, 2)),
    "qwen3moe": Spec("qwen3moe", qk_norm="head", experts=(16, 4), expert_ff=48),
    # gpt-oss: 2 layers (sliding, full) with a window of 16 inside the 64-token chunks, YaRN as the
    # real models have it (factor 32 from 4096 positions, base 150000), 8 biased experts of 64 with 2 per token,
    # sinks, and o200k's pre-tokenizer; its quantized variant is llama-quantize's MXFP4_MOE mix (MXFP4 experts,
    # Q8_0 for the other matrices)
    "gpt-oss": Spec("gpt-oss", biases=True, experts=(8, 2), expert_ff=64, oai=True, pre="gpt-4o",
                    extra_kv={"attention.sliding_window": 16, "rope.scaling.type": "yarn", "rope.scaling.factor": 32.0,
                              "rope.scaling.original_context_length": 4096}),
    # Qwen3.5: gated delta-net (linear attention) layers with full-attention ones every second layer (real files:
    # every fourth), 4 value heads of 16 over 2 key heads, a conv kernel of 4; the attention layers' queries carry a
    # per-head output gate, q/k norms, and interleaved multi-section RoPE over half of each head
    "qwen35": Spec("qwen35", qk_norm="head", n_layers=4, rope_dim=8,
                   extra_kv={"full_attention_interval": 2, "rope.dimension_sections": [2, 1, 1, 0],
                             "ssm.conv_kernel": 4, "ssm.inner_size": 64, "ssm.state_size": 16,
                             "ssm.time_step_rank": 4, "ssm.group_count": 2}),
    # qwen35moe: the same layers with 8 experts of 32 (2 per token) and a shared expert of 48 behind a sigmoid gate
    "qwen35moe": Spec("qwen35moe", qk_norm="head", n_layers=4, rope_dim=8, experts=(8, 2), expert_ff=32,
                      extra_kv={"full_attention_interval": 2, "rope.dimension_sections": [2, 1, 1, 0],
                                "ssm.conv_kernel": 4, "ssm.inner_size": 64, "ssm.state_size": 16,
                                "ssm.time_step_rank": 4, "ssm.group_count": 2,
                                "expert_shared_feed_forward_length": 48}),
}

#: qwen35 fixture: (d_conv, d_state, key heads, value heads)
Q35_SSM = (4, 16, 2, 4)

#: gemma4 fixture: sliding layers, (head size, KV heads, FFN width) of sliding and global layers, shared layers
G4_SWA = [True, False, True, False, True, False]
G4_SHAPES = {True: (16, 2, 128), False: (32, 1, 128)}
G4_SHARED = 2
G4_PLE = 8


def _gemma4_tensors(w, rng: np.random.Generator, matrix: Callable[..., None], vector: Callable[..., None],
                    n_layers: int, ff: list[int]) -> None:
    """Gemma 4's tensors (llama.cpp's names): proportional RoPE factors, per-layer embeddings, and per layer the
    q/k norms, post norms, per-layer-embedding gate/projection/norm and output scale; the shared layers have no
    k/v, layer 1 no attn_v."""
    E, H, P = N_EMBD, N_HEAD, G4_PLE
    hd_full = G4_SHAPES[False][0]
    # the global layers rotate a quarter of each head: the other pairs get a factor that stops them
    w.add_tensor("rope_freqs.weight", np.array([1.0] * (hd_full // 8) + [1e30] * (hd_full // 2 - hd_full // 8),
                                               dtype=np.float32))
    matrix("per_layer_token_embd.weight", N_VOCAB, n_layers * P, 0.5)
    matrix("per_layer_model_proj.weight", n_layers * P, E, 0.2)
    vector("per_layer_proj_norm.weight", P)
    for i in range(n_layers):
        b = f"blk.{i}."
        hd, kv, _ = G4_SHAPES[G4_SWA[i]]
        shared = i >= n_layers - G4_SHARED
        vector(b + "attn_norm.weight", E)
        matrix(b + "attn_q.weight", H * hd, E, 0.3)
        if not shared:
            matrix(b + "attn_k.weight", kv * hd, E, 0.3)
            if i != 1:
                matrix(b + "attn_v.weight", kv * hd, E, 0.3)
        vector(b + "attn_q_norm.weight", hd)
        if not shared:
            vector(b + "attn_k_norm.weight", hd)
        matrix(b + "attn_output.weight", E, H * hd, 0.2)
        vector(b + "post_attention_norm.weight", E)
        vector(b + "ffn_norm.weight", E)
        matrix(b + "ffn_gate.weight", ff[i], E, 0.3)
        matrix(b + "ffn_up.weight", ff[i], E, 0.3)
        matrix(b + "ffn_down.weight", E, ff[i], 0.2)
        vector(b + "post_ffw_norm.weight", E)
        matrix(b + "inp_gate.weight", P, E, 0.3)
        matrix(b + "proj.weight", E, P, 0.3)
        vector(b + "post_norm.weight", E)
        vector(b + "layer_output_scale.weight", 1, 0.8, 0.2)


def vocabulary(source: str | Path | None = None) -> dict[str, object]:
    """SmolLM2's tokenizer cut to its first N_VOCAB tokens (and the merges whose parts and result stay inside), read
    from ``source`` (a GGUF with SmolLM2's vocabulary) or the catalogue's SmolLM2."""
    from quantscope.core import catalog
    from quantscope.core.gguf import GGUFFile

    with GGUFFile(source or catalog.fetch("smollm2")) as f:
        tokens = list(f.get("tokenizer.ggml.tokens"))[:N_VOCAB]
        types = [int(t) for t in list(f.get("tokenizer.ggml.token_type"))[:N_VOCAB]]
        keep = set(tokens)
        merges = [m for m in f.get("tokenizer.ggml.merges")
                  if (p := m.split(" ", 1)) and len(p) == 2 and p[0] in keep and p[1] in keep
                  and p[0] + p[1] in keep]
    return {"tokens": tokens, "types": types, "merges": merges}


def _qwen35_recurrent(b: str, rng: np.random.Generator, matrix: Callable[..., None], vector: Callable[..., None],
                      w) -> None:
    """The gated delta-net mixer of a qwen35 fixture layer (llama.cpp's tensor names and shapes); the FFN is
    written as for the other layers."""
    E = N_EMBD
    K, S, HK, HV = Q35_SSM
    conv = 2 * HK * S + HV * S
    vector(b + "attn_norm.weight", E)
    matrix(b + "attn_qkv.weight", conv, E, 0.3)
    matrix(b + "attn_gate.weight", HV * S, E, 0.3)
    w.add_tensor(b + "ssm_conv1d.weight", _normal(rng, (conv, K), 0.5))
    vector(b + "ssm_dt.bias", HV, 0.0, 0.5)
    # -exp(A_log), in float64 and then rounded: numpy's float32 exp differs by an ulp between CPU families (its
    # SIMD paths), and the file must be the one llama.cpp read on every platform
    w.add_tensor(b + "ssm_a", (-np.exp(_normal(rng, (HV,), 0.5).astype(np.float64))).astype(np.float32))
    matrix(b + "ssm_beta.weight", HV, E, 0.3)
    matrix(b + "ssm_alpha.weight", HV, E, 0.3)
    vector(b + "ssm_norm.weight", S)
    matrix(b + "ssm_out.weight", E, HV * S, 0.2)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def write_fixture(name: str, path: str | Path, quant: str = "F32", seed: int = 0,
                  vocab: dict[str, object] | None = None, chat_template: str = "") -> Path:
    """Write fixture ``name`` (a key of :data:`SPECS`) to ``path``; ``quant``: F32, F16 or a gguf-py quantizable
    type for the 2-D matrices (norms and biases stay F32); MXFP4 means the experts in MXFP4 and the other matrices
    in Q8_0 (the MXFP4_MOE mix of gpt-oss files)."""
    import gguf

    s = SPECS[name]
    v = vocab or vocabulary()
    rng = np.random.default_rng([seed, sum(name.encode())])
    E, H, KV, hd, F = N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF
    w = gguf.GGUFWriter(str(path), s.arch)
    a = s.arch + "."
    w.add_uint32(a + "context_length", N_CTX_TRAIN)
    w.add_uint32(a + "embedding_length", E)
    w.add_uint32(a + "block_count", s.n_layers)
    if s.arch == "gemma4":
        def put(add: Callable[[str, object], None], key: str, val: object) -> None:
            if key not in s.extra_kv:  # a test's extra_kv replaces the fixture's value
                add(a + key, val)

        put(w.add_uint32, "attention.head_count", H)
        g4_ff = [G4_SHAPES[x][2] * (2 if i >= s.n_layers - G4_SHARED else 1) for i, x in enumerate(G4_SWA)]
        put(w.add_array, "feed_forward_length", g4_ff)
        put(w.add_array, "attention.head_count_kv", [G4_SHAPES[x][1] for x in G4_SWA])
        put(w.add_array, "attention.sliding_window_pattern", G4_SWA)
        put(w.add_uint32, "attention.key_length", G4_SHAPES[False][0])
        put(w.add_uint32, "attention.value_length", G4_SHAPES[False][0])
        put(w.add_uint32, "attention.key_length_swa", G4_SHAPES[True][0])
        put(w.add_uint32, "attention.value_length_swa", G4_SHAPES[True][0])
        put(w.add_uint32, "rope.dimension_count", G4_SHAPES[False][0])
        put(w.add_uint32, "rope.dimension_count_swa", G4_SHAPES[True][0])
        put(w.add_float32, "rope.freq_base", 1e6)
        put(w.add_float32, "rope.freq_base_swa", 10000.0)
        put(w.add_uint32, "attention.sliding_window", 16)
        put(w.add_uint32, "attention.shared_kv_layers", G4_SHARED)
        put(w.add_uint32, "embedding_length_per_layer_input", G4_PLE)
        put(w.add_float32, "final_logit_softcapping", 6.0)
    else:
        w.add_uint32(a + "feed_forward_length", F)
        w.add_uint32(a + "attention.head_count", H)
        w.add_uint32(a + "attention.head_count_kv", KV)
        w.add_uint32(a + "attention.key_length", hd)
        w.add_uint32(a + "attention.value_length", hd)
        w.add_uint32(a + "rope.dimension_count", s.rope_dim)
        w.add_float32(a + "rope.freq_base", 150000.0 if s.oai else 10000.0)
        if s.experts[0]:
            w.add_uint32(a + "expert_count", s.experts[0])
            w.add_uint32(a + "expert_used_count", s.experts[1])
        if s.expert_ff:
            w.add_uint32(a + "expert_feed_forward_length", s.expert_ff)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    for key, val in s.extra_kv.items():
        if isinstance(val, list):
            w.add_array(a + key, val)
        elif isinstance(val, str):
            w.add_string(a + key, val)
        elif isinstance(val, float):
            w.add_float32(a + key, val)
        else:
            w.add_uint32(a + key, int(val))  # type: ignore[call-overload]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", s.pre)
    w.add_array("tokenizer.ggml.tokens", v["tokens"])  # type: ignore[arg-type]
    w.add_array("tokenizer.ggml.token_type", v["types"])  # type: ignore[arg-type]
    w.add_array("tokenizer.ggml.merges", v["merges"])  # type: ignore[arg-type]
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    if "eos" not in v:
        w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    if chat_template:  # (none in the recorded fixtures)
        w.add_string("tokenizer.chat_template", chat_template)
    if "eos" in v:
        w.add_uint32("tokenizer.ggml.eos_token_id", int(v["eos"]))  # type: ignore[call-overload]

    def store(tname: str, m: np.ndarray) -> None:
        """A 2-D matrix, or a 3-D stack of them (experts: ggml shape [cols, rows, n]), in the fixture's type."""
        if quant == "F32":
            w.add_tensor(tname, m)
        elif quant == "F16":
            w.add_tensor(tname, m.astype(np.float16))
        else:
            qt = gguf.GGMLQuantizationType["Q8_0" if quant == "MXFP4" and m.ndim == 2 else quant]
            q = gguf.quants.quantize(m.reshape(-1, m.shape[-1]), qt)
            w.add_tensor(tname, q.reshape(*m.shape[:-1], -1), raw_dtype=qt)

    def matrix(tname: str, rows: int, cols: int, std: float) -> None:
        store(tname, _normal(rng, (rows, cols), std))

    def experts(tname: str, n: int, rows: int, cols: int, std: float) -> None:
        store(tname, _normal(rng, (n, rows, cols), std))

    def vector(tname: str, n: int, mean: float = 1.0, std: float = 0.1) -> None:
        w.add_tensor(tname, (mean + _normal(rng, (n,), std)).astype(np.float32))

    matrix("token_embd.weight", N_VOCAB, E, s.embd_std)
    if s.extra_tensors:
        for tname, arr in s.extra_tensors(rng).items():
            w.add_tensor(tname, arr)
    if s.arch == "gemma4":
        _gemma4_tensors(w, rng, matrix, vector, s.n_layers, g4_ff)
    for i in range(s.n_layers if s.arch != "gemma4" else 0):
        b = f"blk.{i}."
        q35 = s.arch in ("qwen35", "qwen35moe")
        recurrent = q35 and (i + 1) % int(s.extra_kv.get("full_attention_interval", 4))  # type: ignore[call-overload]
        if recurrent:
            _qwen35_recurrent(b, rng, matrix, vector, w)
        if s.pre_norms and not recurrent:
            vector(b + "attn_norm.weight", E)
        if recurrent:
            pass
        elif s.fused_qkv:
            matrix(b + "attn_qkv.weight", (H + 2 * KV) * hd, E, 0.3)
        else:
            matrix(b + "attn_q.weight", H * hd * (2 if q35 else 1), E, 0.3)  # qwen35: + the gate
            matrix(b + "attn_k.weight", KV * hd, E, 0.3)
            matrix(b + "attn_v.weight", KV * hd, E, 0.3)
        if s.biases and not recurrent:
            vector(b + "attn_q.bias", H * hd, 0.0, 0.2)
            vector(b + "attn_k.bias", KV * hd, 0.0, 0.2)
            vector(b + "attn_v.bias", KV * hd, 0.0, 0.2)
        if s.qk_norm and not recurrent:
            vector(b + "attn_q_norm.weight", hd if s.qk_norm == "head" else H * hd)
            vector(b + "attn_k_norm.weight", hd if s.qk_norm == "head" else KV * hd)
        if not recurrent:
            matrix(b + "attn_output.weight", E, H * hd, 0.2)
        if s.oai:
            vector(b + "attn_output.bias", E, 0.0, 0.2)
            vector(b + "attn_sinks.weight", H, 0.0, 1.0)
        if s.post_norms:
            vector(b + "post_attention_norm.weight", E)
        if s.pre_norms:
            vector(b + ("post_attention_norm.weight" if s.oai or q35 else s.ffn_norm), E)
        if s.experts[0]:
            ne, fe = s.experts[0], s.expert_ff or F
            matrix(b + "ffn_gate_inp.weight", ne, E, 0.5)
            experts(b + "ffn_gate_exps.weight", ne, fe, E, 0.3)
            experts(b + "ffn_up_exps.weight", ne, fe, E, 0.3)
            experts(b + "ffn_down_exps.weight", ne, E, fe, 0.2)
            if "expert_shared_feed_forward_length" in s.extra_kv:  # qwen35moe's shared expert and its gate
                fs = int(s.extra_kv["expert_shared_feed_forward_length"])  # type: ignore[call-overload]
                vector(b + "ffn_gate_inp_shexp.weight", E, 0.0, 0.5)
                matrix(b + "ffn_gate_shexp.weight", fs, E, 0.3)
                matrix(b + "ffn_up_shexp.weight", fs, E, 0.3)
                matrix(b + "ffn_down_shexp.weight", E, fs, 0.2)
            if s.oai:
                vector(b + "ffn_gate_inp.bias", ne, 0.0, 0.5)
                w.add_tensor(b + "ffn_gate_exps.bias", _normal(rng, (ne, fe), 0.5))
                w.add_tensor(b + "ffn_up_exps.bias", _normal(rng, (ne, fe), 0.5))
                w.add_tensor(b + "ffn_down_exps.bias", _normal(rng, (ne, E), 0.2))
        elif s.fused_gate_up:
            matrix(b + "ffn_up.weight", 2 * F, E, 0.3)
        else:
            matrix(b + "ffn_gate.weight", F, E, 0.3)
            matrix(b + "ffn_up.weight", F, E, 0.3)
        if not s.experts[0]:
            matrix(b + "ffn_down.weight", E, F, 0.2)
        if s.post_norms:
            vector(b + "post_ffw_norm.weight", E)
    vector("output_norm.weight", E)
    if not s.tied:
        matrix("output.weight", N_VOCAB, E, 0.6)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
