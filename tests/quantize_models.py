"""Tiny random-weight models for the llama-quantize byte-identity tests (tests/test_quantize_file.py).

Rows are 256 values or a multiple (every K-quant and i-quant block fits), except where a model exists to reach
llama-quantize's fallbacks. Written with gguf-py (pinned) from seeded generators, so the bytes depend only on the
model name; tests/data/quantize/files.json records each model's SHA-256 next to the SHA-256 of llama-quantize's
output for each preset (tests/record_quantize_fixtures.py).

* ``llama``: 4 layers of 256, 8 query heads sharing 2 key/value heads (GQA 4), FFN 512, an untied output, F32.
* ``qwen2``: 4 layers of 256, 4 heads of 64 without sharing, q/k/v biases, tied embeddings (no output.weight),
  FFN 544 (ffn_down's rows of 544 are not whole 256-blocks: the K-types fall back), F16 matrices.
* ``qwen3moe``: 2 layers of 256, 8 experts of 256 (2 per token) as 3-D tensors, q/k norms, F32 (the 8-expert
  rules give attn_v and attn_k Q8_0, attn_output Q5_K).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .arch_fixtures import vocabulary

MODELS = ("llama", "qwen2", "qwen3moe")
N_VOCAB = 1024


def write_model(name: str, path: str | Path) -> Path:
    import gguf

    if name not in MODELS:
        raise KeyError(name)
    rng = np.random.default_rng([1818, sum(name.encode())])
    arch = name
    E = 256
    H, KV, hd, F, L = {"llama": (8, 2, 32, 512, 4), "qwen2": (4, 4, 64, 544, 4), "qwen3moe": (4, 2, 64, 256, 2)}[name]
    n_exp = 8 if name == "qwen3moe" else 0
    w = gguf.GGUFWriter(str(path), arch)
    a = arch + "."
    w.add_string("general.name", f"quantscope-{name}-tiny")
    w.add_uint32(a + "context_length", 256)
    w.add_uint32(a + "embedding_length", E)
    w.add_uint32(a + "block_count", L)
    w.add_uint32(a + "feed_forward_length", F)
    w.add_uint32(a + "attention.head_count", H)
    w.add_uint32(a + "attention.head_count_kv", KV)
    w.add_uint32(a + "attention.key_length", hd)
    w.add_uint32(a + "attention.value_length", hd)
    w.add_uint32(a + "rope.dimension_count", hd)
    w.add_float32(a + "rope.freq_base", 10000.0)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32("general.file_type", 0 if name != "qwen2" else 1)
    if n_exp:
        w.add_uint32(a + "expert_count", n_exp)
        w.add_uint32(a + "expert_used_count", 2)
        w.add_uint32(a + "expert_feed_forward_length", F)
    v = vocabulary()
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "smollm")
    w.add_array("tokenizer.ggml.tokens", v["tokens"])  # type: ignore[arg-type]
    w.add_array("tokenizer.ggml.token_type", v["types"])  # type: ignore[arg-type]
    w.add_array("tokenizer.ggml.merges", v["merges"])  # type: ignore[arg-type]
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    f16 = name == "qwen2"

    def matrix(tname: str, *shape: int, std: float = 0.05) -> None:
        m = rng.normal(0.0, std, shape).astype(np.float32)
        # a few large columns, as trained weights have, so importance weights and scale searches matter
        m[..., rng.integers(0, shape[-1], 4)] *= 8.0
        w.add_tensor(tname, m.astype(np.float16) if f16 else m)

    def vector(tname: str, n: int) -> None:
        w.add_tensor(tname, (1.0 + rng.normal(0.0, 0.1, n)).astype(np.float32))

    matrix("token_embd.weight", N_VOCAB, E, std=0.5)
    vector("output_norm.weight", E)
    if name != "qwen2":
        matrix("output.weight", N_VOCAB, E)
    for i in range(L):
        b = f"blk.{i}."
        vector(b + "attn_norm.weight", E)
        matrix(b + "attn_q.weight", H * hd, E)
        matrix(b + "attn_k.weight", KV * hd, E)
        matrix(b + "attn_v.weight", KV * hd, E)
        matrix(b + "attn_output.weight", E, H * hd)
        if name == "qwen2":
            for p, n in (("q", H * hd), ("k", KV * hd), ("v", KV * hd)):
                w.add_tensor(b + f"attn_{p}.bias", rng.normal(0.0, 0.02, n).astype(np.float32))
        if name == "qwen3moe":
            vector(b + "attn_q_norm.weight", hd)
            vector(b + "attn_k_norm.weight", hd)
        vector(b + "ffn_norm.weight", E)
        if n_exp:
            w.add_tensor(b + "ffn_gate_inp.weight", rng.normal(0.0, 0.5, (n_exp, E)).astype(np.float32))
            matrix(b + "ffn_gate_exps.weight", n_exp, F, E)
            matrix(b + "ffn_up_exps.weight", n_exp, F, E)
            matrix(b + "ffn_down_exps.weight", n_exp, E, F)
        else:
            matrix(b + "ffn_gate.weight", F, E)
            matrix(b + "ffn_up.weight", F, E)
            matrix(b + "ffn_down.weight", E, F)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
