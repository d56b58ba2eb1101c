"""Tiny random-weight decoder-body embedding models written with gguf-py: Qwen3-Embedding and EmbeddingGemma
fixtures of issue 51.

``qwen3-embed`` is a ``qwen3`` file with ``qwen3.pooling_type = 3`` (last token; causal attention) and
``tokenizer.ggml.add_eos_token`` set, as the published Qwen3-Embedding GGUFs; ``gemma-embed`` is a
``gemma-embedding`` file (EmbeddingGemma: Gemma 3's layers with bidirectional attention, 6 layers so that the 6th
attends to all while the others slide within a window of 6, i.e. 3 positions either side), mean pooling and the
dense head ``dense_2`` (64 -> 128) then ``dense_3`` (128 -> 64), with BOS and EOS added; ``qwen3-rank`` is a
Qwen3-Reranker as convert_hf_to_gguf.py writes one (``qwen3.pooling_type = 4``, a two-row ``cls.output.weight``,
labels ``["yes", "no"]``, the ``tokenizer.chat_template.rerank`` template, no BOS or EOS added); its head is drawn
at random (the tied LM head's own rows would saturate the softmax at 0 or 1 on random weights). Both take SmolLM2's
vocabulary cut to 1,024 tokens (tests/arch_fixtures.py), which llama.cpp tokenizes for any architecture. F32
weights drawn from a seeded generator; the bytes are a function of (variant, seed) and the gguf-py version
(pinned): ``tests/data/decoder_embed/meta.json`` records each fixture's SHA-256 beside llama-embedding's vectors
(``tests/record_decoder_embed_fixtures.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .arch_fixtures import HEAD_DIM, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_VOCAB, vocabulary

N_CTX_TRAIN = 256
#: the pooling_type values of llama.cpp (LLAMA_POOLING_TYPE_*)
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}


@dataclass(frozen=True)
class Variant:
    arch: str
    pooling: str
    n_layers: int
    gemma: bool  # Gemma 3's layers (post-norms, scaled embeddings, a sliding window) and the dense head
    add_bos: bool
    window: int = 0
    dense: int = 0  # dense_2's outputs (0: no head)
    add_eos: bool = True
    rank: bool = False  # Qwen3-Reranker's yes/no head, its labels and its rerank template


VARIANTS: dict[str, Variant] = {
    "qwen3-embed": Variant("qwen3", "last", 2, gemma=False, add_bos=False),
    "gemma-embed": Variant("gemma-embedding", "mean", 6, gemma=True, add_bos=True, window=6, dense=128),
}
#: the rerankers (rank pooling: scores of query/document pairs, not vectors), recorded into rank.json
RANKERS: dict[str, Variant] = {
    "qwen3-rank": Variant("qwen3", "rank", 2, gemma=False, add_bos=False, add_eos=False, rank=True),
}

#: the rerank template convert_hf_to_gguf.py writes into a Qwen3-Reranker (conversion/qwen.py, llama.cpp 0.3.36)
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")

#: the texts embedded (each one input of llama-embedding, one line each): short and long against the window
TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings turn text into vectors; similar meanings land close together in the space.",
    "hello",
    "Search engines rank documents by the cosine of their embeddings with the query's embedding.",
    "A short one.",
)


#: the query/document pairs scored (``query<TAB>document`` lines of llama-embedding)
PAIRS = (
    ("what is a panda?", "hi"),
    ("what is a panda?", "The giant panda is a bear species endemic to China."),
    ("what is a panda?", "Pandas eat bamboo; a red panda is not a bear."),
    ("how do embeddings rank documents", "Search engines rank documents by relevance to the query."),
    ("how do embeddings rank documents", "The quick brown fox jumps over the lazy dog."),
    ("how do embeddings rank documents", "Unaffable naive cafe owners, 42!"),
    ("hello", "hello"),
    ("A short one.", "Embeddings turn text into vectors; similar meanings land close together in the space."),
)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def write_fixture(name: str, path: str | Path, seed: int = 0, vocab: dict[str, object] | None = None,
                  omit: tuple[str, ...] = (), dense_in: int = N_EMBD,
                  labels: tuple[str, ...] = ("yes", "no"), extra: dict[str, np.ndarray] | None = None) -> Path:
    """Write fixture ``name`` (a key of :data:`VARIANTS` or :data:`RANKERS`) to ``path``; ``omit``: tensors left
    out, ``dense_in``: the ``dense_2_feat_in`` written, ``labels``: a reranker's output labels, ``extra``: tensors
    added (broken files for the refusal tests; the others keep their values)."""
    import gguf

    v = VARIANTS[name] if name in VARIANTS else RANKERS[name]
    voc = vocab or vocabulary()
    rng = np.random.default_rng([seed, sum(name.encode())])
    E, H, KV, hd, F = N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF
    w = gguf.GGUFWriter(str(path), v.arch)
    a = v.arch + "."
    w.add_uint32(a + "context_length", N_CTX_TRAIN)
    w.add_uint32(a + "embedding_length", E)
    w.add_uint32(a + "block_count", v.n_layers)
    w.add_uint32(a + "feed_forward_length", F)
    w.add_uint32(a + "attention.head_count", H)
    w.add_uint32(a + "attention.head_count_kv", KV)
    w.add_uint32(a + "attention.key_length", hd)
    w.add_uint32(a + "attention.value_length", hd)
    w.add_uint32(a + "rope.dimension_count", hd)
    w.add_float32(a + "rope.freq_base", 1000000.0 if v.gemma else 10000.0)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(a + "pooling_type", POOLING[v.pooling])
    if v.window:
        w.add_uint32(a + "attention.sliding_window", v.window)
    if v.dense:
        w.add_uint32(a + "dense_2_feat_in", dense_in)
        w.add_uint32(a + "dense_2_feat_out", v.dense)
        w.add_uint32(a + "dense_3_feat_in", v.dense)
        w.add_uint32(a + "dense_3_feat_out", E)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "smollm")
    w.add_array("tokenizer.ggml.tokens", voc["tokens"])  # type: ignore[arg-type]
    w.add_array("tokenizer.ggml.token_type", voc["types"])  # type: ignore[arg-type]
    w.add_array("tokenizer.ggml.merges", voc["merges"])  # type: ignore[arg-type]
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_bool("tokenizer.ggml.add_bos_token", v.add_bos)
    w.add_bool("tokenizer.ggml.add_eos_token", v.add_eos)
    if v.rank:
        w.add_array(a + "classifier.output_labels", list(labels))
        w.add_string("tokenizer.chat_template.rerank", RERANK_TEMPLATE)

    def matrix(tname: str, rows: int, cols: int, std: float) -> None:
        m = _normal(rng, (rows, cols), std)
        if tname not in omit:
            w.add_tensor(tname, m)

    def vector(tname: str, n: int, mean: float = 1.0, std: float = 0.1) -> None:
        w.add_tensor(tname, (mean + _normal(rng, (n,), std)).astype(np.float32))

    matrix("token_embd.weight", N_VOCAB, E, 0.5 if v.gemma else 1.0)
    if v.dense:
        matrix("dense_2.weight", v.dense, E, 1.0 / np.sqrt(E))
        matrix("dense_3.weight", E, v.dense, 1.0 / np.sqrt(v.dense))
    for i in range(v.n_layers):
        b = f"blk.{i}."
        vector(b + "attn_norm.weight", E)
        matrix(b + "attn_q.weight", H * hd, E, 0.3)
        matrix(b + "attn_k.weight", KV * hd, E, 0.3)
        matrix(b + "attn_v.weight", KV * hd, E, 0.3)
        vector(b + "attn_q_norm.weight", hd)
        vector(b + "attn_k_norm.weight", hd)
        matrix(b + "attn_output.weight", E, H * hd, 0.2)
        if v.gemma:
            vector(b + "post_attention_norm.weight", E)
        vector(b + "ffn_norm.weight", E)
        matrix(b + "ffn_gate.weight", F, E, 0.3)
        matrix(b + "ffn_up.weight", F, E, 0.3)
        matrix(b + "ffn_down.weight", E, F, 0.2)
        if v.gemma:
            vector(b + "post_ffw_norm.weight", E)
    vector("output_norm.weight", E)
    if v.rank:  # the two rows ("yes", "no"), small enough that P(yes) spreads over (0, 1)
        matrix("cls.output.weight", 2, E, 0.3)
    for tname, t in (extra or {}).items():
        w.add_tensor(tname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
