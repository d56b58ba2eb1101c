"""Embedding models: a BERT-style encoder run over whole sequences, its rows pooled into one vector per input and
normalised as llama.cpp's ``llama-embedding`` does.

llama.cpp's ``bert`` graph: token + token type 0 + absolute position embeddings, LayerNorm (with bias), then per
layer q/k/v with biases, attention of every token to every token of its own input, output projection, residual,
LayerNorm; GELU FFN (ggml's CPU GELU, a table over F16 inputs) with biases, residual, LayerNorm. nomic-bert rotates
q and k (RoPE) instead of adding position embeddings and has a SwiGLU FFN; jina-bert-v2 biases the scores by ALiBi
and has a GEGLU FFN (``ModelConfig.encoder_positions`` / ``encoder_ffn``). K and V are rounded to F16, as
llama-embedding's flash attention casts them. The layers run on the native block
(:meth:`Encoder.forward_native`: each layer's plan with BERT's switches, docs/embeddings.md); the same graph in
float32 numpy over the dequantized weights is the float reference (:meth:`Encoder.forward_numpy`) and runs a
file whose weight type has no native kernel. Pooling (``{arch}.pooling_type`` unless overridden): ``mean`` of the
rows, ``cls`` the first row, ``last`` the last, ``none`` every row. Normalisation as ``common_embd_normalize``: 2
(Euclidean, the default), -1 none, 0 max-abs scaled to 32760, p a p-norm. ``rank`` pooling (a BERT cross-encoder)
puts the classification head on the pooled row and gives relevance scores, not vectors (:meth:`Encoder.rerank`).

Qwen3-Embedding (``qwen3`` with a pooling) and EmbeddingGemma (``gemma-embedding``) are decoder bodies (their
description's ``decoder_embedding``): they run on the text generation engine's own model and session (the same
native layers; EmbeddingGemma's without the causal mask), each input's rows after the final norm pooled, then
EmbeddingGemma's dense head (``dense_2``, ``dense_3``) before the normalisation. A ``qwen3`` with rank pooling is
Qwen3-Reranker: its two-row ``cls.output.weight`` ("yes", "no") on the last token's row, then a softmax (P(yes)).

Every input is checked before any arithmetic (token ids in range, length within the position table), so a bad
input is one line of :class:`EmbedError`. An encoder is used by one thread at a time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..gguf import GGUFFile
from ..model import ModelConfig, ModelError, UnsupportedModel, bind_weights, read_config
from ..model.arch import description
from ..model.arch.bert import POOLING_TYPES
from ..native import ffi, lib
from ..native.kernels import copy_mapped, default_threads, native_error
from ..quant import dequantize
from ..tokenizer import Tokenizer
from .reference import _rope
from .session import MAX_SESSION_CTX, Model, Session

#: poolings that give one vector per input (``none`` gives one per token)
POOLINGS = tuple(p for p in POOLING_TYPES if p != "rank")
#: the pooling of a reranker: the classification head (``cls.*``) on the pooled row gives scores (llama.cpp's
#: LLAMA_POOLING_TYPE_RANK)
RANK = "rank"
#: how many tokens one forward evaluates at most, all inputs together: bounds the float32 activations (the FFN's
#: are MAX_BATCH_TOKENS x n_ff: 128 MiB for bge-large's 4096)
MAX_BATCH_TOKENS = 8192


class EmbedError(ValueError):
    """An input the encoder refuses (empty, too long, a token id out of range, an unknown pooling)."""


@dataclass
class RankHead:
    """A reranker's classification head as llama.cpp's ``build_pooling`` applies it: the row picked by ``pool``
    (``cls``: the first; ``mean``: the mean, ``{arch}.classifier.pooling_type``; ``last``: the last, for a causal
    model such as Qwen3-Reranker), then ``tanh(cls.weight @ x + cls.bias)`` where the file has ``cls.weight``, then
    ``cls.output.weight @ x + cls.output.bias`` where it has that, then a softmax over the head's values where
    ``softmax`` (llama.cpp's qwen3: the yes/no head gives P(yes), P(no)); the first ``n_out`` values are the
    scores, otherwise raw (no sigmoid: llama-server answers them as they are)."""

    pool: str
    dense: np.ndarray | None
    dense_b: np.ndarray | None
    out: np.ndarray | None
    out_b: np.ndarray | None
    #: the labels of the scores (``{arch}.classifier.output_labels``; empty: one unnamed score)
    labels: tuple[str, ...]
    #: a softmax over the head's values (llama.cpp applies it for qwen3)
    softmax: bool = False

    @property
    def n_out(self) -> int:
        return max(1, len(self.labels))

    def scores(self, rows: np.ndarray) -> np.ndarray:
        """The head's ``n_out`` scores of one input's last-layer rows ([tokens, n_embd])."""
        if self.pool == "mean":
            x = rows.mean(axis=0, dtype=np.float64).astype(np.float32)
        else:
            x = rows[-1] if self.pool == "last" else rows[0]
        if self.dense is not None:
            x = self.dense @ x
            if self.dense_b is not None:
                x = x + self.dense_b
            x = np.tanh(x)
        if self.out is not None:
            x = self.out @ x
            if self.out_b is not None:
                x = x + self.out_b
        if self.softmax:
            e = np.exp(x.astype(np.float64) - float(np.max(x)))
            x = e / e.sum()
        return np.asarray(x[:self.n_out], dtype=np.float32)


class _Dense:
    """A matrix of the file as float32 for the numpy forward, dequantized on first use (the native layers read
    the file's own bytes, so a model run natively never holds a float32 copy of its matrices)."""

    def __init__(self, read: Callable[[], np.ndarray], shape: tuple[int, int], name: str = "", row0: int = 0) -> None:
        self._read, self.shape = read, shape
        #: the file's tensor and the first of its rows this matrix is (the native layers read them there)
        self.name, self.row0 = name, row0
        self._value: np.ndarray | None = None

    def value(self) -> np.ndarray:
        if self._value is None:
            self._value = self._read()
        return self._value

    @property
    def T(self) -> np.ndarray:
        return self.value().T

    def rows(self, r0: int, r1: int) -> _Dense:
        """Rows r0..r1 (a fused q/k/v matrix's parts), sharing this matrix's one copy."""
        return _Dense(lambda: self.value()[r0:r1], (r1 - r0, self.shape[1]), self.name, self.row0 + r0)


@dataclass
class _Layer:
    wq: _Dense
    wk: _Dense
    wv: _Dense
    bq: np.ndarray | None
    bk: np.ndarray | None
    bv: np.ndarray | None
    wo: _Dense
    bo: np.ndarray | None
    attn_norm: tuple[np.ndarray, np.ndarray]
    up: _Dense
    b_up: np.ndarray | None
    down: _Dense
    b_down: np.ndarray | None
    out_norm: tuple[np.ndarray, np.ndarray]
    gate: _Dense | None = None  # a gated FFN's gate (nomic-bert's SwiGLU, jina-bert-v2's GEGLU); None: plain
    b_gate: np.ndarray | None = None  # jina-bert-v2's fused gate/up bias, its gate part (numpy forward only)


class _DecoderBody:
    """An embedding model on the decoder layers (Qwen3-Embedding, EmbeddingGemma): the text generation engine's
    :class:`~.session.Model` and :class:`~.session.Session`, so the same native blocks run, causal or not as the
    config says (``causal``); :meth:`rows` gives each input's rows after the final norm. The session's cache holds
    the longest input seen, rounded up to a power of two within ``n_ctx`` (float16 for a causal model, as
    llama.cpp's KV cache; float32 otherwise, as its cache-less encoder graph)."""

    def __init__(self, f: GGUFFile, cfg: ModelConfig, head: frozenset[str], threads: int, n_ctx: int) -> None:
        self.model = Model(f, threads, weights=bind_weights(f, cfg, pooled=head))
        self._kv = np.float16 if cfg.causal else np.float32
        self._n_ctx = n_ctx
        self._session: Session | None = None

    def rows(self, seq: list[int]) -> np.ndarray:
        if self._session is None or self._session.n_ctx < len(seq):
            n = min(self._n_ctx, 1 << max(0, len(seq) - 1).bit_length())
            self._session = self.model.session(n_ctx=max(n, len(seq)), kv_dtype=self._kv)
        self._session.reset()
        return self._session.final_rows(seq)


def is_embedding_file(f: GGUFFile) -> bool:
    """Is ``f`` an embedding model the encoder runs (its architecture's description sets a pooling)?"""
    try:
        return read_config(f).is_embedding
    except (UnsupportedModel, ValueError):
        return False


def normalize(v: np.ndarray, mode: int = 2) -> np.ndarray:
    """``common_embd_normalize`` of llama.cpp over the last axis: -1 none, 0 max-abs (scaled to 32760), 2
    Euclidean, any other p > 0 the p-norm. A zero vector stays zero."""
    v = np.asarray(v, dtype=np.float32)
    if mode == -1:
        return v.copy()
    a = np.abs(v.astype(np.float64))
    if mode == 0:
        s = a.max(axis=-1, keepdims=True) / 32760.0
    elif mode == 2:
        s = np.sqrt((a * a).sum(axis=-1, keepdims=True))
    elif mode > 0:
        s = (a ** mode).sum(axis=-1, keepdims=True) ** (1.0 / mode)
    else:
        raise EmbedError(f"normalisation must be -1, 0 or a positive p-norm, not {mode}")
    with np.errstate(divide="ignore"):
        inv = np.where(s > 0, 1.0 / np.where(s > 0, s, 1.0), 0.0)
    return (v * inv).astype(np.float32)


def gelu_f16(x: np.ndarray) -> np.ndarray:
    """GELU as ggml's CPU computes it (qs_gelu_f16's twin): a table over F16 inputs, fp16(gelu(fp16(x))) in the
    tanh form of ggml_gelu_f32, 0 at or below -10, x at or above 10."""
    h = x.astype(np.float16).astype(np.float32)
    c, a = np.float32(math.sqrt(2.0 / math.pi)), np.float32(0.044715)
    y = (np.float32(0.5) * h * (np.float32(1.0) + np.tanh(c * h * (np.float32(1.0) + a * h * h))))
    return np.where(x <= -10.0, np.float32(0.0), np.where(x >= 10.0, x, y.astype(np.float16).astype(np.float32)))


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """Each head's ALiBi slope as ggml_soft_max_ext computes it (qs_alibi_slope's twin): n2 the largest power of
    two <= n_head, m0 = 2^(-max_bias / n2), m1 = 2^(-max_bias / 2 / n2); head h < n2: m0^(h + 1), else
    m1^(2 (h - n2) + 1)."""
    n2 = 1 << (n_head.bit_length() - 1)
    m0 = np.float32(2.0) ** np.float32(-max_bias / n2)
    m1 = np.float32(2.0) ** np.float32(-(max_bias / 2.0) / n2)
    h = np.arange(n_head)
    return np.where(h < n2, m0 ** (h + 1).astype(np.float32),
                    m1 ** (2 * (h - n2) + 1).astype(np.float32)).astype(np.float32)


def _layer_norm(x: np.ndarray, wb: tuple[np.ndarray, np.ndarray], eps: float) -> np.ndarray:
    """LayerNorm over rows (statistics in float64, as ggml_norm sums), then weight and bias."""
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    d = x64 - mean
    var = (d * d).mean(axis=-1, keepdims=True)
    y = (d / np.sqrt(var + eps)).astype(np.float32)
    return y * wb[0] + wb[1]


class Encoder:
    """An embedding model opened from a GGUF file: :meth:`embed` gives the pooled, normalised vectors of texts or
    token lists. ``pooling`` overrides the file's ``{arch}.pooling_type``."""

    def __init__(self, path: str | Path, pooling: str | None = None, threads: int = 0) -> None:
        self.file = GGUFFile(path)
        #: CPU threads of the native layers (0: one per core)
        self.threads = threads or default_threads()
        try:
            self._load(pooling)
        except BaseException:
            self.file.close()
            raise

    def _load(self, pooling: str | None) -> None:
        f = self.file
        cfg: ModelConfig = read_config(f)
        if not cfg.is_embedding:
            raise UnsupportedModel(f"{cfg.arch} is a text generation model, not an embedding model: it has no "
                                   "pooling (embeddings need a model such as BERT, bge or all-MiniLM)")
        self.config = cfg
        if pooling is None:
            pooling = cfg.pooling
        if pooling not in (*POOLINGS, RANK):
            raise EmbedError(f"pooling must be one of {', '.join((*POOLINGS, RANK))}, not {pooling!r}")
        self.pooling: str = pooling
        self.tokenizer = Tokenizer(f)
        E = cfg.n_embd
        self._used: set[str] = set()
        #: the dense head after pooling (EmbeddingGemma's dense_2 then dense_3), float32 matrices; empty: none
        self.head: list[np.ndarray] = []
        #: the decoder layers of a Qwen3-Embedding or EmbeddingGemma file (None: BERT's encoder layers below)
        self.decoder: _DecoderBody | None = None
        if description(cfg.arch).decoder_embedding:
            self._load_decoder()
            return
        self.tok_embd = self._matrix("token_embd.weight", cfg.n_vocab, E).value()
        #: the absolute position embeddings (BERT); None where positions are rotary (nomic-bert) or ALiBi (jina)
        self.pos_embd = (self._matrix("position_embd.weight", None, E).value()
                         if cfg.encoder_positions == "absolute" else None)
        #: how many positions (tokens per input) the model has
        self.n_ctx = int(self.pos_embd.shape[0]) if self.pos_embd is not None else cfg.n_ctx_train
        types = self._matrix("token_types.weight", None, E, optional=True)
        self.type0 = types.value()[0] if types is not None and types.shape[0] else None
        self.embd_norm = (self._vec("token_embd_norm.weight", E), self._vec("token_embd_norm.bias", E))
        QD, KD = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
        self.layers: list[_Layer] = []
        for i in range(cfg.n_layers):
            b = f"blk.{i}."
            F = cfg.n_ff_at(i)
            if f.has_tensor(b + "attn_qkv.weight"):
                qkv = self._matrix(b + "attn_qkv.weight", QD + 2 * KD, E)
                wq, wk, wv = qkv.rows(0, QD), qkv.rows(QD, QD + KD), qkv.rows(QD + KD, QD + 2 * KD)
                bqkv = self._vec(b + "attn_qkv.bias", QD + 2 * KD, optional=True)
                if bqkv is None:  # llama.cpp reads separate biases beside a fused matrix without its own
                    bq, bk, bv = (self._vec(b + "attn_q.bias", QD, True), self._vec(b + "attn_k.bias", KD, True),
                                  self._vec(b + "attn_v.bias", KD, True))
                else:
                    bq, bk, bv = bqkv[:QD], bqkv[QD:QD + KD], bqkv[QD + KD:]
            else:
                wq, wk, wv = (self._matrix(b + "attn_q.weight", QD, E), self._matrix(b + "attn_k.weight", KD, E),
                              self._matrix(b + "attn_v.weight", KD, E))
                bq, bk, bv = (self._vec(b + "attn_q.bias", QD, True), self._vec(b + "attn_k.bias", KD, True),
                              self._vec(b + "attn_v.bias", KD, True))
            self.layers.append(_Layer(
                wq=wq, wk=wk, wv=wv, bq=bq, bk=bk, bv=bv,
                wo=self._matrix(b + "attn_output.weight", E, QD), bo=self._vec(b + "attn_output.bias", E, True),
                attn_norm=(self._vec(b + "attn_output_norm.weight", E), self._vec(b + "attn_output_norm.bias", E)),
                down=self._matrix(b + "ffn_down.weight", E, F),
                out_norm=(self._vec(b + "layer_output_norm.weight", E),
                          self._vec(b + "layer_output_norm.bias", E)), **self._ffn(b, F)))
        #: the layers' descriptions for the native block (qs_block_forward), None where a weight type has no kernel
        self.blocks: list[Any] | None = self._describe()
        if self.blocks is None:  # the numpy forward runs: read every matrix now (an unreadable one fails here)
            for L in self.layers:
                for m in (L.wq, L.wk, L.wv, L.wo, L.up, L.down):
                    m.value()
        #: the classification head of rank pooling (None with any other pooling: llama.cpp ignores it then)
        self.rank_head: RankHead | None = self._rank_head() if pooling == RANK else None
        # the head's tensors llama.cpp's bert loads (and leaves unused unless rank pooling)
        self._used.update(n for n in ("cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias")
                          if f.has_tensor(n))
        left = [t.name for t in f.tensors if t.name not in self._used]
        if left:
            raise UnsupportedModel(f"tensor {left[0]} is not used by the {cfg.arch} encoder (running without it "
                                   "would give wrong results)")

    # ------------------------------------------------------------------ loading
    def _labels(self) -> tuple[str, ...]:
        """``{arch}.classifier.output_labels`` (absent: none, one unnamed score)."""
        key = f"{self.config.arch}.classifier.output_labels"
        labels = self.file.get(key)
        if labels is None:
            return ()
        if isinstance(labels, str) or not isinstance(labels, Sequence) or not all(isinstance(x, str) for x in labels):
            raise ModelError(f"{key} is not an array of strings")
        return tuple(labels)

    def _rank_head(self, decoder: bool = False) -> RankHead:
        """The ``cls.*`` head as llama.cpp's bert reads it (``cls.weight`` [n_embd, n_embd] and ``cls.output.weight``
        [n_embd, n_out], each with an optional bias), or with ``decoder`` as its qwen3 reads it (``cls.output.weight``
        alone, on the last token's row, then a softmax); a file with neither is refused (it has no head to rank
        with)."""
        f, c = self.file, self.config
        E = c.n_embd
        labels = self._labels()
        n_out = max(1, len(labels))
        if decoder and not description(c.arch).decoder_rank_head:
            raise UnsupportedModel(f"rank pooling needs a classification head, which {c.arch} does not have (of "
                                   "the decoder bodies, llama.cpp loads one for qwen3 only): it is not a reranker")
        heads = ("cls.output.weight",) if decoder else ("cls.weight", "cls.output.weight")
        if not any(f.has_tensor(n) for n in heads):
            raise UnsupportedModel(f"rank pooling needs a classification head ({' or '.join(heads)}), which this "
                                   "file does not have: it is not a reranker")
        dense = None if decoder else self._matrix("cls.weight", E, E, optional=True)
        out = self._matrix("cls.output.weight", n_out, E, optional=True)
        if out is None and n_out > E:
            raise ModelError(f"{c.arch}.classifier.output_labels names {n_out} scores but the head gives {E}")
        pool = "cls"
        key = f"{c.arch}.classifier.pooling_type"
        if key in f.metadata:
            v = f.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < len(POOLING_TYPES):
                raise ModelError(f"{key} is not a pooling type (0..{len(POOLING_TYPES) - 1}): {v!r}")
            pool = "mean" if POOLING_TYPES[v] == "mean" else "cls"
        if decoder and pool == "cls" and c.causal:  # llama.cpp's rank row of a causal model: the last position
            pool = "last"
        return RankHead(pool=pool, dense=None if dense is None else dense.value(),
                        dense_b=None if decoder else self._vec("cls.bias", E, optional=True),
                        out=None if out is None else out.value(),
                        out_b=None if decoder else self._vec("cls.output.bias", n_out, optional=True),
                        labels=labels, softmax=description(c.arch).decoder_rank_head)

    def _load_decoder(self) -> None:
        """A decoder-body embedding model: its layers bound by the text generation engine's binding, its head
        read here (``dense_2`` of [n, n_embd] and then ``dense_3`` of [n_embd, n], as llama.cpp's
        build_dense_out applies them after pooling; the head must end at n_embd values, as llama.cpp asserts)."""
        f, cfg, E = self.file, self.config, self.config.n_embd
        d2 = self._matrix("dense_2.weight", None, E, optional=True)
        d3 = self._matrix("dense_3.weight", E, d2.shape[0] if d2 is not None else E, optional=True)
        if d2 is not None and d3 is None and d2.shape[0] != E:
            raise ModelError(f"dense_2.weight: {d2.shape[0]} outputs without a dense_3.weight back to "
                             f"{cfg.arch}.embedding_length = {E}")
        self.head = [m.value() for m in (d2, d3) if m is not None]
        self.n_ctx = min(cfg.n_ctx_train, MAX_SESSION_CTX)
        self.blocks = None
        self.rank_head = self._rank_head(decoder=True) if self.pooling == RANK else None
        if self.rank_head is None and description(cfg.arch).decoder_rank_head:  # loaded, unused (llama.cpp)
            self._matrix("cls.output.weight", max(1, len(self._labels())), E, optional=True)
        self.decoder = _DecoderBody(f, cfg, frozenset(self._used), self.threads, self.n_ctx)

    def _ffn(self, b: str, F: int) -> dict[str, Any]:
        """Layer ``b``'s FFN matrices and biases as ``config.encoder_ffn`` says: plain (up, GELU), gated (gate and up,
        no biases: llama.cpp's nomic-bert graph passes none), or either (jina-bert-v2: ``ffn_gate``, or the gate's
        rows then the up's in one ``ffn_up``, else plain; with the biases of up and down)."""
        c, f, E = self.config, self.file, self.config.n_embd
        kind = c.encoder_ffn
        if kind not in ("plain", "gated", "any"):
            raise UnsupportedModel(f"an encoder FFN of kind {kind!r} is not supported")
        has_gate = f.has_tensor(b + "ffn_gate.weight")
        up_rows = f.tensor(b + "ffn_up.weight").n_rows if f.has_tensor(b + "ffn_up.weight") else F
        if kind == "gated" or (kind == "any" and has_gate):
            out = {"gate": self._matrix(b + "ffn_gate.weight", F, E), "up": self._matrix(b + "ffn_up.weight", F, E)}
        elif kind == "any" and up_rows == 2 * F:  # GEGLU: gelu(first half) * second half
            fused = self._matrix(b + "ffn_up.weight", 2 * F, E)
            out = {"gate": fused.rows(0, F), "up": fused.rows(F, 2 * F)}
        else:
            out = {"up": self._matrix(b + "ffn_up.weight", F, E)}
        out["b_up"] = out["b_down"] = None
        if kind != "gated":
            n_up = 2 * F if "gate" in out and not has_gate else F
            bias = self._vec(b + "ffn_up.bias", n_up, True)
            if bias is not None and n_up == 2 * F:
                out["b_gate"], bias = bias[:F], bias[F:]
            out["b_up"], out["b_down"] = bias, self._vec(b + "ffn_down.bias", E, True)
        return out

    def _describe(self) -> list[Any] | None:
        """Each layer as a ``qs_block`` (csrc/qs_api_nn.h): the matrices zero-copy from the mapped file, the vectors
        (float32 copies) kept by ``_keep``, BERT's switches set (post-LayerNorm residuals, plain or gated FFN with
        biases, non-causal attention with RoPE, ALiBi or neither); the KV cache is set per call. None when a
        matrix's type has no native kernel or a gate has a bias (the numpy forward then runs)."""
        c, f = self.config, self.file
        self._keep: list[Any] = []

        def weight(d: Any, name: str, row0: int = 0, rows: int | None = None) -> bool:
            t = f.tensor(name)
            assert t.type is not None
            if not lib.qs_can_dequantize(t.type.id):
                return False
            rb = t.type.row_bytes(t.row_len)
            n = t.n_rows - row0 if rows is None else rows
            data = f.tensor_bytes(t)[row0 * rb:(row0 + n) * rb]
            buf = ffi.from_buffer(data)
            self._keep.append(buf)
            d.ptr, d.type, d.bytes, d.rows, d.k = ffi.cast("uint8_t *", buf), t.type.id, int(data.size), n, t.row_len
            return True

        def vec(d: Any, v: np.ndarray | None) -> None:
            if v is not None:
                a = np.ascontiguousarray(v, dtype=np.float32)
                buf = ffi.from_buffer(a, require_writable=False)
                self._keep += [a, buf]
                d.ptr, d.len = ffi.cast("float *", buf), int(a.size)

        QD, KD = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        if any(L.b_gate is not None for L in self.layers):  # a bias on a gate: the block has none
            return None
        blocks = []
        for i, L in enumerate(self.layers):
            pre = f"blk.{i}."
            b = ffi.new("qs_block *")
            b.n_embd, b.eps, b.post_ln = c.n_embd, c.rms_eps, 1
            a = b.attn
            a.n_head, a.n_head_kv, a.head_dim = c.n_head, c.n_head_kv, c.head_dim
            a.scale, a.non_causal = 1.0 / math.sqrt(c.head_dim), 1
            a.k_type = a.v_type = lib.QS_KV_F16  # K and V in F16: see forward_numpy
            a.alibi_max_bias = c.alibi_max_bias if c.encoder_positions == "alibi" else 0.0
            r = b.rope
            r.skip, r.dim, r.base = 1, c.head_dim - c.head_dim % 2, 10000.0
            if c.encoder_positions == "rope":
                r.skip, r.dim, r.neox, r.base = 0, c.rope_dim, int(c.rope_neox), c.rope_base
                r.freq_scale, r.ext_factor, r.mscale = c.rope_freq_scale, c.rope_ext_factor, c.rope_mscale
                r.corr0, r.corr1 = c.yarn_corr_dims(i)
            if f.has_tensor(pre + "attn_qkv.weight"):
                ok = all(weight(d, pre + "attn_qkv.weight", r0, n) for d, r0, n in
                         ((a.wq, 0, QD), (a.wk, QD, KD), (a.wv, QD + KD, KD)))
            else:
                ok = all(weight(d, pre + f"attn_{p}.weight") for d, p in ((a.wq, "q"), (a.wk, "k"), (a.wv, "v")))
            ok = ok and weight(a.wo, pre + "attn_output.weight")
            ok = ok and weight(b.ffn.up, L.up.name, L.up.row0, L.up.shape[0])
            ok = ok and weight(b.ffn.down, pre + "ffn_down.weight")
            if L.gate is not None:
                ok = ok and weight(b.ffn.gate, L.gate.name, L.gate.row0, L.gate.shape[0])
            if not ok:
                self._keep = []
                return None
            for d, v in ((a.bq, L.bq), (a.bk, L.bk), (a.bv, L.bv), (a.bo, L.bo), (b.post_attn_norm, L.attn_norm[0]),
                         (b.post_attn_norm_b, L.attn_norm[1]), (b.post_ffn_norm, L.out_norm[0]),
                         (b.post_ffn_norm_b, L.out_norm[1]), (b.ffn.b_up, L.b_up), (b.ffn.b_down, L.b_down)):
                vec(d, v)
            b.ffn.n_ff, b.ffn.gelu, b.ffn.plain = int(L.up.shape[0]), int(c.gelu), int(L.gate is None)
            b.ffn.gelu_f16 = int(c.gelu)  # ggml's CPU GELU: its table over F16 inputs
            blocks.append(b)
        return blocks

    def _read(self, name: str) -> tuple[np.ndarray, tuple[int, ...]]:
        if not self.file.has_tensor(name):
            raise UnsupportedModel(f"missing tensor {name}")
        t = self.file.tensor(name)
        if t.type is None:
            raise UnsupportedModel(f"tensor {name} has {t.type_name}")
        self._used.add(name)
        try:
            raw = copy_mapped(self.file.tensor_bytes(t), name)
            v = dequantize(raw.reshape(max(1, t.n_elements // t.row_len), -1), t.type).reshape(-1)
        except (ValueError, NotImplementedError, KeyError) as exc:
            raise ModelError(f"{name}: a {t.type_name} tensor the encoder cannot read ({exc})") from None
        return np.ascontiguousarray(v, dtype=np.float32), tuple(t.ne)

    def _matrix(self, name: str, rows: int | None, k: int, optional: bool = False) -> _Dense:
        """Matrix ``name`` of ``rows`` x ``k`` (rows None: any), its shape and type checked now, its values read
        when first used."""
        if optional and not self.file.has_tensor(name):
            return None  # type: ignore[return-value]
        if not self.file.has_tensor(name):
            raise UnsupportedModel(f"missing tensor {name}")
        t = self.file.tensor(name)
        ne = tuple(t.ne)
        if t.type is None:
            raise UnsupportedModel(f"tensor {name} has {t.type_name}")
        if len(ne) != 2 or ne[0] != k or (rows is not None and ne[1] != rows):
            want = f"[{k}, {rows if rows is not None else 'n'}]"
            raise ModelError(f"{name}: expected shape {want}, found {list(ne)}")
        self._used.add(name)
        return _Dense(lambda: self._read(name)[0].reshape(ne[1], ne[0]), (int(ne[1]), int(ne[0])), name)

    def _vec(self, name: str, n: int, optional: bool = False) -> np.ndarray:
        if optional and not self.file.has_tensor(name):
            return None  # type: ignore[return-value]
        v, ne = self._read(name)
        if v.size != n:
            raise ModelError(f"{name}: expected {n} values, found shape {list(ne)}")
        return v

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> Encoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ running
    @property
    def n_embd(self) -> int:
        return self.config.n_embd

    def tokenize(self, text: str) -> list[int]:
        """``text``'s ids as llama-embedding tokenizes an input: with the vocabulary's special tokens (CLS/SEP)."""
        return self.tokenizer.encode(text, add_special=True, parse_special=True)

    def check_ids(self, ids: Sequence[int], what: str = "input") -> list[int]:
        """``ids`` as ints, refused when empty, longer than the positions or holding an id out of range."""
        n = self.config.n_vocab
        if not len(ids):
            raise EmbedError(f"{what} is empty: nothing to embed")
        if len(ids) > self.n_ctx:
            raise EmbedError(f"{what} has {len(ids)} tokens but the model's positions hold {self.n_ctx}")
        out = []
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int | np.integer) or not 0 <= int(t) < n:
                raise EmbedError(f"{what}: token id {t!r} is not in 0..{n - 1}")
            out.append(int(t))
        return out

    def embed(self, inputs: Sequence[str | Sequence[int]], pooling: str | None = None,
              normalize_mode: int = 2) -> list[np.ndarray]:
        """One vector per input (``none`` pooling: one [tokens, n_embd] array per input), normalised. Texts are
        tokenized with the special tokens; token lists are taken as they are."""
        pooling = self.pooling if pooling is None else pooling
        if pooling == RANK:
            raise EmbedError("rank pooling gives relevance scores of query/document pairs, not vectors: rerank them "
                             "(quantscope embed --rerank QUERY, POST /v1/rerank)")
        if pooling not in POOLINGS:
            raise EmbedError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
        seqs = [self.check_ids(self.tokenize(x) if isinstance(x, str) else x, f"input {i}")
                for i, x in enumerate(inputs)]
        return self.embed_ids(seqs, pooling, normalize_mode)

    def embed_ids(self, seqs: Sequence[list[int]], pooling: str, normalize_mode: int = 2,
                  batch_tokens: int = MAX_BATCH_TOKENS) -> list[np.ndarray]:
        """:meth:`embed` of checked token lists, evaluated in batches of at most ``batch_tokens`` tokens (an input
        longer than that alone)."""
        out: list[np.ndarray] = []
        for r in self._batched_rows(seqs, batch_tokens):
            v = r if pooling == "none" else {"mean": lambda a: a.mean(axis=0, dtype=np.float64),
                                             "cls": lambda a: a[0], "last": lambda a: a[-1]}[pooling](r)
            v = np.asarray(v, dtype=np.float32)
            for m in self.head:  # (rows too with none pooling, as llama.cpp's build_dense_out)
                v = v @ m.T
            out.append(normalize(v, normalize_mode))
        return out

    def _batched_rows(self, seqs: Sequence[list[int]], batch_tokens: int) -> Iterator[np.ndarray]:
        """Each sequence's last-layer rows (:meth:`forward`), the sequences evaluated in batches of at most
        ``batch_tokens`` tokens (a longer sequence alone)."""
        i = 0
        while i < len(seqs):
            j, n = i, 0
            while j < len(seqs) and (j == i or n + len(seqs[j]) <= batch_tokens):
                n += len(seqs[j])
                j += 1
            yield from self.forward(seqs[i:j])
            i = j

    # ------------------------------------------------------------------ reranking
    def rerank_tokens(self, query: str, document: str) -> list[int]:
        """The ids of one query/document pair as llama-server's ``format_prompt_rerank`` builds them: the file's
        ``tokenizer.chat_template.rerank`` with ``{query}`` and ``{document}`` filled in (special tokens parsed, none
        added) where it has one; otherwise BOS (when the vocabulary adds it), the query, EOS (SEP when there is
        no EOS) when it adds EOS, SEP when it adds SEP, the document, EOS when it adds EOS; the texts' own
        special-token spellings are text. For a converted BERT cross-encoder: ``[CLS] q [SEP] d [SEP]``."""
        tok = self.tokenizer
        template = self.file.get("tokenizer.chat_template.rerank")
        if isinstance(template, str):
            prompt = template.replace("{query}", query).replace("{document}", document)
            return tok.encode(prompt, add_special=False, parse_special=True)
        q = tok.encode(query, add_special=False, parse_special=False)
        d = tok.encode(document, add_special=False, parse_special=False)
        eos = tok.eos_id if tok.eos_id is not None else tok.sep_id
        ids: list[int] = []
        if tok.add_bos and tok.bos_id is not None:
            ids.append(tok.bos_id)
        ids += q
        if tok.add_eos and eos is not None:
            ids.append(eos)
        if tok.add_sep and tok.sep_id is not None:
            ids.append(tok.sep_id)
        ids += d
        if tok.add_eos and eos is not None:
            ids.append(eos)
        return ids

    def rank_ids(self, seqs: Sequence[list[int]], batch_tokens: int = MAX_BATCH_TOKENS) -> list[np.ndarray]:
        """The head's scores ([n_out] float32, raw) of each checked token list, batched as :meth:`embed_ids`."""
        if self.rank_head is None:
            raise EmbedError(f"this encoder pools by {self.pooling}: reranking needs rank pooling (a reranker "
                             "with a classification head)")
        head = self.rank_head
        return [head.scores(r) for r in self._batched_rows(seqs, batch_tokens)]

    def rerank(self, query: str, documents: Sequence[str]) -> list[float]:
        """The relevance score of each document for ``query`` (the head's first score, as llama-server's
        ``/v1/rerank`` answers it), in the documents' order; a pair longer than the positions is one line of
        :class:`EmbedError`."""
        seqs = [self.check_ids(self.rerank_tokens(query, d), f"document {i}") for i, d in enumerate(documents)]
        return [float(s[0]) for s in self.rank_ids(seqs)]

    def forward(self, seqs: Sequence[list[int]]) -> list[np.ndarray]:
        """The last layer's rows of each sequence ([tokens, n_embd] float32): by the native block, all sequences in
        one call (:meth:`forward_native`), or where a weight type has no native kernel by the numpy forward
        (:meth:`forward_numpy`); a decoder-body model's rows after the final norm, one sequence per call. No
        sequences: no rows."""
        if not seqs:
            return []
        if self.decoder is not None:
            return [self.decoder.rows(s) for s in seqs]
        if self.blocks is None:
            return self.forward_numpy(seqs)
        return self.forward_native(seqs)

    def _embeddings(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        x = self.tok_embd[ids]
        if self.type0 is not None:
            x = x + self.type0
        if self.pos_embd is not None:
            x = self.pos_embd[pos] + x
        return np.ascontiguousarray(x, dtype=np.float32)

    def forward_native(self, seqs: Sequence[list[int]]) -> list[np.ndarray]:
        """The sequences through the native layers in one call per layer (csrc/qs_block.c walking each layer's
        plan: post-LayerNorm residuals, plain or gated FFN, non-causal attention over an F16 cache): their rows back
        to back, the positions restarting at each sequence, and the layer's ``attn.seg_len`` keeping each
        sequence's attention to its own keys (a cache of the call's rows). Not thread-safe: the layers'
        descriptions hold the call's cache and segments."""
        assert self.blocks is not None
        c = self.config
        lens = np.asarray([len(s) for s in seqs], dtype=np.int32)
        T = int(lens.sum())
        pos = np.concatenate([np.arange(n, dtype=np.int32) for n in lens])
        x = self._embeddings(np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs]), pos)
        xp = ffi.cast("float *", ffi.from_buffer(x))
        w, b0 = (ffi.cast("float *", ffi.from_buffer(v, require_writable=False)) for v in self.embd_norm)
        lib.qs_layernorm(xp, w, b0, xp, T, c.n_embd, c.rms_eps)
        kv = T * c.n_head_kv * c.head_dim
        k_cache, v_cache = np.zeros(kv, np.float16), np.zeros(kv, np.float16)  # every layer's, in turn
        kb, vb = ffi.from_buffer(k_cache), ffi.from_buffer(v_cache)
        pp = ffi.cast("int32_t *", ffi.from_buffer(pos))
        sp = ffi.cast("int32_t *", ffi.from_buffer(lens))
        try:
            for b in self.blocks:
                a = b.attn
                a.n_ctx, a.k_cache, a.v_cache, a.k_cache_bytes, a.v_cache_bytes = T, kb, vb, 2 * kv, 2 * kv
                a.seg_len, a.n_seg = (sp, len(lens)) if len(lens) > 1 else (ffi.NULL, 0)
                rc = lib.qs_block_forward(b, xp, T, pp, 0, self.threads)
                if rc:
                    raise native_error("encoder layer", rc)
        finally:
            for b in self.blocks:
                b.attn.k_cache = b.attn.v_cache = b.attn.seg_len = ffi.NULL
                b.attn.n_seg = 0
        bounds = np.cumsum(np.concatenate([[0], lens]))
        return [x[s0:s1] for s0, s1 in itertools.pairwise(bounds)]

    def forward_numpy(self, seqs: Sequence[list[int]]) -> list[np.ndarray]:
        """The numpy forward (the float reference): the sequences evaluated together (products over all rows at
        once, attention within each sequence). BERT's layers only: a decoder-body model runs natively."""
        if self.decoder is not None:
            raise UnsupportedModel(f"{self.config.arch}: the numpy forward runs BERT's layers only")
        c = self.config
        ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])
        pos = np.concatenate([np.arange(len(s)) for s in seqs])
        x = self._embeddings(ids, pos)
        x = _layer_norm(x, self.embd_norm, c.rms_eps)
        bounds = np.cumsum([0] + [len(s) for s in seqs])
        H, Hk, D = c.n_head, c.n_head_kv, c.head_dim
        scale = np.float32(1.0 / math.sqrt(D))
        slopes = alibi_slopes(H, c.alibi_max_bias)[:, None, None] if c.encoder_positions == "alibi" else None
        for li, L in enumerate(self.layers):
            q, k, v = x @ L.wq.T, x @ L.wk.T, x @ L.wv.T
            if L.bq is not None:
                q = q + L.bq
            if L.bk is not None:
                k = k + L.bk
            if L.bv is not None:
                v = v + L.bv
            if c.encoder_positions == "rope":  # as the decoders' reference rotates (ggml_rope_ext)
                rope = (c.rope_base, c.rope_dim, c.rope_neox, None, c.rope_freq_scale, c.rope_ext_factor,
                        c.yarn_corr_dims(li), c.rope_mscale)
                q = _rope(q.reshape(-1, H, D), pos, *rope).reshape(q.shape).astype(np.float32)
                k = _rope(k.reshape(-1, Hk, D), pos, *rope).reshape(k.shape).astype(np.float32)
            # llama-embedding's attention is ggml's flash attention (on by default on the CPU), which casts K and V
            # to F16: rounding them here (and F16 caches natively) is what makes a Q8_0 file's per-token rows
            # match its to float precision (they differ by ~4e-4 in cosine otherwise)
            k, v = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
            att = np.empty_like(q)
            for s0, s1 in itertools.pairwise(bounds):
                T = s1 - s0
                qh = q[s0:s1].reshape(T, H, D).transpose(1, 0, 2)
                kh = np.repeat(k[s0:s1].reshape(T, Hk, D).transpose(1, 0, 2), H // Hk, axis=0)
                vh = np.repeat(v[s0:s1].reshape(T, Hk, D).transpose(1, 0, 2), H // Hk, axis=0)
                sc = (qh @ kh.transpose(0, 2, 1)) * scale
                if slopes is not None:  # ALiBi: -slope * |i - j| (ggml_soft_max_ext's max_bias over the mask)
                    p = np.arange(T, dtype=np.float32)
                    sc = sc - slopes * np.abs(p[:, None] - p[None, :])
                sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
                sc /= sc.sum(axis=-1, keepdims=True)
                att[s0:s1] = (sc @ vh).transpose(1, 0, 2).reshape(T, H * D)
            o = att @ L.wo.T
            if L.bo is not None:
                o = o + L.bo
            x = _layer_norm(o + x, L.attn_norm, c.rms_eps)
            h = x @ L.up.T
            if L.b_up is not None:
                h = h + L.b_up
            if L.gate is None:
                a = gelu_f16(h)
            else:  # ggml's split GLU: act(gate) * up (GEGLU with ``gelu``, else SwiGLU)
                g = x @ L.gate.T
                if L.b_gate is not None:
                    g = g + L.b_gate
                a = (gelu_f16(g) if c.gelu else g / (np.float32(1.0) + np.exp(-g))) * h
            o = a @ L.down.T
            if L.b_down is not None:
                o = o + L.b_down
            x = _layer_norm(o + x, L.out_norm, c.rms_eps)
        return [x[s0:s1] for s0, s1 in itertools.pairwise(bounds)]
