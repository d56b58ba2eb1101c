"""Embedding models: a BERT-style encoder run over whole sequences, its rows pooled into one vector per input and
normalised as llama.cpp's ``llama-embedding`` does.

The forward pass is llama.cpp's ``bert`` graph in float32 numpy over the dequantized weights: token + token type 0
+ absolute position embeddings, LayerNorm (with bias), then per layer q/k/v with biases, attention of every token
to every token of its own input (no causal mask, no KV cache), output projection, residual, LayerNorm; GELU FFN
(tanh form, as ggml_gelu) with biases, residual, LayerNorm. Pooling (``{arch}.pooling_type`` unless overridden):
``mean`` of the rows, ``cls`` the first row, ``last`` the last, ``none`` every row. Normalisation as
``common_embd_normalize``: 2 (Euclidean, the default), -1 none, 0 max-abs scaled to 32760, p a p-norm. Rerank
(``rank`` pooling and its classification head) is refused.

Every input is checked before any arithmetic (token ids in range, length within the position table), so a bad
input is one line of :class:`EmbedError`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..gguf import GGUFFile
from ..model import ModelConfig, ModelError, UnsupportedModel, read_config
from ..model.arch.bert import POOLING_TYPES
from ..native.kernels import copy_mapped
from ..quant import dequantize
from ..tokenizer import Tokenizer

#: poolings that give one vector per input (``none`` gives one per token)
POOLINGS = tuple(p for p in POOLING_TYPES if p != "rank")
#: how many tokens one forward evaluates at most, all inputs together: bounds the float32 activations (the FFN's
#: are MAX_BATCH_TOKENS x n_ff: 128 MiB for bge-large's 4096)
MAX_BATCH_TOKENS = 8192


class EmbedError(ValueError):
    """An input the encoder refuses (empty, too long, a token id out of range, an unknown pooling)."""


@dataclass
class _Layer:
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    bq: np.ndarray | None
    bk: np.ndarray | None
    bv: np.ndarray | None
    wo: np.ndarray
    bo: np.ndarray | None
    attn_norm: tuple[np.ndarray, np.ndarray]
    up: np.ndarray
    b_up: np.ndarray | None
    down: np.ndarray
    b_down: np.ndarray | None
    out_norm: tuple[np.ndarray, np.ndarray]


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


def _gelu(x: np.ndarray) -> np.ndarray:
    """GELU in its tanh form (ggml_gelu)."""
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


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

    def __init__(self, path: str | Path, pooling: str | None = None) -> None:
        self.file = GGUFFile(path)
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
        if pooling == "rank":
            raise UnsupportedModel("rank pooling (a reranker's classification head) is not supported yet")
        if pooling not in POOLINGS:
            raise EmbedError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
        self.pooling: str = pooling
        self.tokenizer = Tokenizer(f)
        E = cfg.n_embd
        self._used: set[str] = set()
        self.tok_embd = self._matrix("token_embd.weight", cfg.n_vocab, E)
        self.pos_embd = self._matrix("position_embd.weight", None, E)
        #: how many positions (tokens per input) the model has
        self.n_ctx = int(self.pos_embd.shape[0])
        types = self._matrix("token_types.weight", None, E, optional=True)
        self.type0 = types[0] if types is not None and len(types) else None
        self.embd_norm = (self._vec("token_embd_norm.weight", E), self._vec("token_embd_norm.bias", E))
        QD, KD = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
        self.layers: list[_Layer] = []
        for i in range(cfg.n_layers):
            b = f"blk.{i}."
            F = cfg.n_ff_at(i)
            if f.has_tensor(b + "attn_qkv.weight"):
                qkv = self._matrix(b + "attn_qkv.weight", QD + 2 * KD, E)
                wq, wk, wv = qkv[:QD], qkv[QD:QD + KD], qkv[QD + KD:]
                bqkv = self._vec(b + "attn_qkv.bias", QD + 2 * KD, optional=True)
                bq, bk, bv = (None, None, None) if bqkv is None else (bqkv[:QD], bqkv[QD:QD + KD], bqkv[QD + KD:])
            else:
                wq, wk, wv = (self._matrix(b + "attn_q.weight", QD, E), self._matrix(b + "attn_k.weight", KD, E),
                              self._matrix(b + "attn_v.weight", KD, E))
                bq, bk, bv = (self._vec(b + "attn_q.bias", QD, True), self._vec(b + "attn_k.bias", KD, True),
                              self._vec(b + "attn_v.bias", KD, True))
            self.layers.append(_Layer(
                wq=wq, wk=wk, wv=wv, bq=bq, bk=bk, bv=bv,
                wo=self._matrix(b + "attn_output.weight", E, QD), bo=self._vec(b + "attn_output.bias", E, True),
                attn_norm=(self._vec(b + "attn_output_norm.weight", E), self._vec(b + "attn_output_norm.bias", E)),
                up=self._matrix(b + "ffn_up.weight", F, E), b_up=self._vec(b + "ffn_up.bias", F, True),
                down=self._matrix(b + "ffn_down.weight", E, F), b_down=self._vec(b + "ffn_down.bias", E, True),
                out_norm=(self._vec(b + "layer_output_norm.weight", E),
                          self._vec(b + "layer_output_norm.bias", E))))
        head = [t.name for t in f.tensors if t.name.startswith("cls")]
        self._used.update(head)  # the rerank head: read by rank pooling only (llama.cpp ignores it otherwise)
        left = [t.name for t in f.tensors if t.name not in self._used]
        if left:
            raise UnsupportedModel(f"tensor {left[0]} is not used by the {cfg.arch} encoder (running without it "
                                   "would give wrong results)")

    # ------------------------------------------------------------------ loading
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

    def _matrix(self, name: str, rows: int | None, k: int, optional: bool = False) -> np.ndarray:
        if optional and not self.file.has_tensor(name):
            return None  # type: ignore[return-value]
        v, ne = self._read(name)
        if len(ne) != 2 or ne[0] != k or (rows is not None and ne[1] != rows):
            want = f"[{k}, {rows if rows is not None else 'n'}]"
            raise ModelError(f"{name}: expected shape {want}, found {list(ne)}")
        return v.reshape(ne[1], ne[0])

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
        i = 0
        while i < len(seqs):
            j, n = i, 0
            while j < len(seqs) and (j == i or n + len(seqs[j]) <= batch_tokens):
                n += len(seqs[j])
                j += 1
            rows = self.forward(seqs[i:j])
            for r in rows:
                v = r if pooling == "none" else {"mean": lambda a: a.mean(axis=0, dtype=np.float64),
                                                 "cls": lambda a: a[0], "last": lambda a: a[-1]}[pooling](r)
                out.append(normalize(np.asarray(v, dtype=np.float32), normalize_mode))
            i = j
        return out

    def forward(self, seqs: Sequence[list[int]]) -> list[np.ndarray]:
        """The last layer's rows of each sequence ([tokens, n_embd] float32), the sequences evaluated together
        (products over all rows at once, attention within each sequence)."""
        c = self.config
        ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])
        pos = np.concatenate([np.arange(len(s)) for s in seqs])
        x = self.tok_embd[ids]
        if self.type0 is not None:
            x = x + self.type0
        x = self.pos_embd[pos] + x
        x = _layer_norm(x, self.embd_norm, c.rms_eps)
        bounds = np.cumsum([0] + [len(s) for s in seqs])
        H, Hk, D = c.n_head, c.n_head_kv, c.head_dim
        scale = np.float32(1.0 / math.sqrt(D))
        for L in self.layers:
            q, k, v = x @ L.wq.T, x @ L.wk.T, x @ L.wv.T
            if L.bq is not None:
                q = q + L.bq
            if L.bk is not None:
                k = k + L.bk
            if L.bv is not None:
                v = v + L.bv
            att = np.empty_like(q)
            for s0, s1 in itertools.pairwise(bounds):
                T = s1 - s0
                qh = q[s0:s1].reshape(T, H, D).transpose(1, 0, 2)
                kh = np.repeat(k[s0:s1].reshape(T, Hk, D).transpose(1, 0, 2), H // Hk, axis=0)
                vh = np.repeat(v[s0:s1].reshape(T, Hk, D).transpose(1, 0, 2), H // Hk, axis=0)
                sc = (qh @ kh.transpose(0, 2, 1)) * scale
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
            o = _gelu(h) @ L.down.T
            if L.b_down is not None:
                o = o + L.b_down
            x = _layer_norm(o + x, L.out_norm, c.rms_eps)
        return [x[s0:s1] for s0, s1 in itertools.pairwise(bounds)]
