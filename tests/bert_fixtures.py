"""Tiny random-weight BERT-family embedding models written with gguf-py: the fidelity fixtures of issue 51.

Each has llama.cpp's tensor names and metadata for ``bert`` (position and token type embeddings, the embeddings'
LayerNorm, per layer q/k/v/output with biases, ``attn_output_norm``, GELU FFN with biases, ``layer_output_norm``),
``nomic-bert`` (no position embeddings: RoPE with ``rope.freq_base``; fused ``attn_qkv`` and the output without
biases; SwiGLU FFN of ffn_gate and ffn_up, no biases) or ``jina-bert-v2`` (no position embeddings: ALiBi; q/k/v
and output with biases; GEGLU FFN, the gate's rows then the up's in one ``ffn_up`` as llama.cpp's converter writes
it, or an older file's ``ffn_gate`` beside ``ffn_up`` with its bias; ``ffn_down`` with its bias),
F32 weights (or, with ``quant``, matrices quantized by gguf-py) and a real WordPiece vocabulary: bge's (llama.cpp's
``ggml-vocab-bert-bge.gguf`` from the catalogue's test data), so llama.cpp and Quantscope tokenize the same way.
``bert-rank`` is a BERT cross-encoder (a reranker): rank pooling and the ``cls.*`` classification head (a dense
layer with tanh, then one output row, both with biases), with the tokenizer flags convert_hf_to_gguf.py writes for
one (BOS and EOS added, EOS = [SEP], no extra SEP), so a query/document pair is ``[CLS] q [SEP] d [SEP]``.
The bytes are a function of (variant, seed) and the gguf-py version (pinned): ``tests/data/bert/meta.json``
records each fixture's SHA-256 beside llama-embedding's vectors (``tests/record_bert_fixtures.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

N_EMBD = 64
N_HEAD = 4
N_FF = 128
N_LAYERS = 2
N_CTX_TRAIN = 128
N_TYPES = 2
#: the pooling_type values of llama.cpp (LLAMA_POOLING_TYPE_*)
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}


@dataclass(frozen=True)
class Variant:
    """One fixture: the file's pooling type, the weights' type, whether the q/k/v projections are fused, the
    architecture, the width and heads, and (jina-bert-v2) whether the FFN's gate is its own tensor."""

    pooling: str = "mean"
    quant: str = "F32"
    fused_qkv: bool = False
    arch: str = "bert"
    n_embd: int = N_EMBD
    n_head: int = N_HEAD
    split_gate: bool = False
    #: a reranker's classification head (cls.weight/bias, cls.output.weight/bias) and a cross-encoder's flags
    rank_head: bool = False


VARIANTS: dict[str, Variant] = {
    "bert-mean": Variant("mean"),
    "bert-cls": Variant("cls"),
    "bert-mean-q8": Variant("mean", quant="Q8_0"),
    "bert-rank": Variant("rank", rank_head=True),
    # the same cross-encoder as convert_hf_to_gguf.py writes a BertForSequenceClassification without
    # sentence-transformers' pooling config: no pooling in the file (--pooling rank runs it); the same weights
    "bert-xenc": Variant("none", rank_head=True),
    "nomic-mean": Variant("mean", fused_qkv=True, arch="nomic-bert"),
    "nomic-cls-q8": Variant("cls", quant="Q8_0", fused_qkv=True, arch="nomic-bert"),
    "jina-mean": Variant("mean", arch="jina-bert-v2"),
    # six heads: ALiBi's slopes past the largest power of two (ggml's m1 branch); the older split-gate layout
    "jina-cls-split": Variant("cls", arch="jina-bert-v2", n_embd=96, n_head=6, split_gate=True),
}
#: nomic-embed-text v1.5's RoPE base
NOMIC_ROPE_BASE = 1000.0

#: the texts embedded (each one input of llama-embedding, one line each)
TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings turn text into vectors; similar meanings land close together.",
    "hello",
    "Unaffable naïve café owners re-tokenize WordPiece: ##ing, [MASK] 42!",
    "Search engines rank documents by the cosine of their embeddings with the query's.",
)


#: the query/document pairs a reranker fixture scores (llama-embedding's ``query<TAB>document`` lines)
PAIRS = (
    ("what is a panda?", "hi"),
    ("what is a panda?", "The giant panda is a bear species endemic to China."),
    ("what is a panda?", "Pandas eat bamboo; a red panda is not a bear."),
    ("how do embeddings rank documents", "Search engines rank documents by relevance to the query."),
    ("how do embeddings rank documents", "The quick brown fox jumps over the lazy dog."),
    ("how do embeddings rank documents", "Unaffable naïve café owners, 42!"),
)


def bge_vocab() -> Path:
    """llama.cpp's bge WordPiece vocabulary (the catalogue's llama.cpp test data)."""
    from quantscope.core import catalog

    path = catalog.data_dir() / "vocab" / "ggml-vocab-bert-bge.gguf"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `quantscope models fetch`")
    return path


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def write_fixture(name: str, path: str | Path, seed: int = 0, extra: dict[str, object] | None = None) -> Path:
    """Write fixture ``name`` (a key of :data:`VARIANTS`) to ``path``, with the metadata ``extra`` added (strings,
    arrays of strings, unsigned ints; the recorded fixtures have none)."""
    import gguf

    from quantscope.core.gguf import GGUFFile

    v = VARIANTS[name]
    with GGUFFile(bge_vocab()) as f:
        tokens = [str(t) for t in f.get("tokenizer.ggml.tokens")]
        types = [int(t) for t in f.get("tokenizer.ggml.token_type")]
    rng = np.random.default_rng(seed)
    E, H, F = v.n_embd, v.n_head, N_FF
    w = gguf.GGUFWriter(str(path), v.arch)
    a = v.arch + "."
    w.add_uint32(a + "context_length", N_CTX_TRAIN)
    w.add_uint32(a + "embedding_length", E)
    w.add_uint32(a + "block_count", N_LAYERS)
    w.add_uint32(a + "feed_forward_length", F)
    w.add_uint32(a + "attention.head_count", H)
    w.add_float32(a + "attention.layer_norm_epsilon", 1e-12)
    w.add_bool(a + "attention.causal", False)
    w.add_uint32(a + "pooling_type", POOLING[v.pooling])
    if v.arch == "nomic-bert":
        w.add_float32(a + "rope.freq_base", NOMIC_ROPE_BASE)
    w.add_uint32("tokenizer.ggml.token_type_count", N_TYPES)
    w.add_string("tokenizer.ggml.model", "bert")
    w.add_string("tokenizer.ggml.pre", "bert-bge")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 100)
    w.add_uint32("tokenizer.ggml.seperator_token_id", 102)
    w.add_uint32("tokenizer.ggml.padding_token_id", 0)
    w.add_uint32("tokenizer.ggml.cls_token_id", 101)
    w.add_uint32("tokenizer.ggml.mask_token_id", 103)
    for k, x in (extra or {}).items():
        if isinstance(x, str):
            w.add_string(k, x)
        elif isinstance(x, list):
            w.add_array(k, x)
        else:
            w.add_uint32(k, int(x))  # type: ignore[call-overload]
    if v.rank_head:  # as convert_hf_to_gguf.py's SpecialVocab writes a BERT cross-encoder's flags
        w.add_uint32("tokenizer.ggml.eos_token_id", 102)
        w.add_bool("tokenizer.ggml.add_bos_token", True)
        w.add_bool("tokenizer.ggml.add_eos_token", True)
        w.add_bool("tokenizer.ggml.add_sep_token", False)

    def matrix(tname: str, rows: int, cols: int, std: float) -> None:
        m = _normal(rng, (rows, cols), std)
        if v.quant == "F32":
            w.add_tensor(tname, m)
        else:
            qt = gguf.GGMLQuantizationType[v.quant]
            w.add_tensor(tname, gguf.quants.quantize(m, qt), raw_dtype=qt)

    def vector(tname: str, n: int, mean: float, std: float) -> None:
        w.add_tensor(tname, (mean + _normal(rng, (n,), std)).astype(np.float32))

    w.add_tensor("token_embd.weight", _normal(rng, (len(tokens), E), 1.0))  # F32: rows are gathered
    w.add_tensor("token_types.weight", _normal(rng, (N_TYPES, E), 0.5))
    if v.arch == "bert":
        w.add_tensor("position_embd.weight", _normal(rng, (N_CTX_TRAIN, E), 0.5))
    vector("token_embd_norm.weight", E, 1.0, 0.1)
    vector("token_embd_norm.bias", E, 0.0, 0.1)
    s = 1.0 / np.sqrt(E)
    biases = v.arch != "nomic-bert"  # nomic-embed-text has none
    for i in range(N_LAYERS):
        b = f"blk.{i}."
        if v.fused_qkv:
            matrix(b + "attn_qkv.weight", 3 * E, E, 2 * s)
            if biases:
                vector(b + "attn_qkv.bias", 3 * E, 0.0, 0.1)
        else:
            for p in ("q", "k", "v"):
                matrix(b + f"attn_{p}.weight", E, E, 2 * s)
                vector(b + f"attn_{p}.bias", E, 0.0, 0.1)
        matrix(b + "attn_output.weight", E, E, s)
        if biases:
            vector(b + "attn_output.bias", E, 0.0, 0.1)
        vector(b + "attn_output_norm.weight", E, 1.0, 0.1)
        vector(b + "attn_output_norm.bias", E, 0.0, 0.1)
        if v.arch == "bert":
            matrix(b + "ffn_up.weight", F, E, s)
            vector(b + "ffn_up.bias", F, 0.0, 0.1)
        elif v.arch == "nomic-bert" or v.split_gate:
            matrix(b + "ffn_gate.weight", F, E, s)
            matrix(b + "ffn_up.weight", F, E, s)
            if v.split_gate:
                vector(b + "ffn_up.bias", F, 0.0, 0.1)
        else:  # jina-bert-v2's GEGLU: the gate's rows, then the up's
            matrix(b + "ffn_up.weight", 2 * F, E, s)
        matrix(b + "ffn_down.weight", E, F, 1.0 / np.sqrt(F))
        if biases:
            vector(b + "ffn_down.bias", E, 0.0, 0.1)
        vector(b + "layer_output_norm.weight", E, 1.0, 0.1)
        vector(b + "layer_output_norm.bias", E, 0.0, 0.1)
    if v.rank_head:  # scores of order 1: the dense layer's tanh saturates little, the output row sums 64 terms
        matrix("cls.weight", E, E, s)
        vector("cls.bias", E, 0.0, 0.1)
        matrix("cls.output.weight", 1, E, 0.5)
        vector("cls.output.bias", 1, 0.0, 0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
