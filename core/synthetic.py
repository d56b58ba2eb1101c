"""Random-weight llama GGUF files of the sizes people run, for reproducible speed comparisons.

A synthetic model has a real architecture and a real vocabulary but random weights: speed does not depend on
the values, only on the shapes and tensor types, so anyone can write the same file and measure the same work.

* Shapes (:data:`SHAPES`): ``1b`` (Llama-3.2-1B-like), ``3b`` (Llama-3.2-3B-like), ``8b`` (Llama-3.1-8B-like)
  and ``tiny`` (2 layers of 256, for tests); ``moe``, ``moe-k4`` and ``moe-k2``: Qwen3-30B-A3B's layer shape
  (``qwen3moe``, 128 experts of 768, q/k norms) in 4 layers, with 8, 4 and 2 experts per token (the same tensors:
  only ``expert_used_count`` differs), whose F32 routers hold random values so that tokens pick different experts;
  ``oss``: gpt-oss-20b's layer shape (32 experts of 2880, 4 per token, 64 query heads of 64, sinks, biases, window
  128 on the even layers, YaRN) in 4 layers, as llama-quantize's MXFP4_MOE mix (MXFP4 experts with random shared
  exponents 2^-8..2^-6, Q8_0 elsewhere; biases and sinks zero); ``q35``: a Qwen3.5-0.8B-like ``qwen35`` (24 layers
  of 1024, FFN 3584, every fourth layer attention with 8/2 heads of 256 rotating 64 values, the others gated
  delta-net layers of 16 heads of 128 with a conv of 4; ``ssm_a`` -1, conv taps 0.25, dt biases zero).
* Types, the Q4_K_M mix: Q4_K everywhere (``token_embd`` included), Q6_K for ``output.weight`` (untied) and for
  ``attn_v`` and ``ffn_down`` of the layers llama-quantize's Q4_K_M gives more bits (:func:`use_more_bits`: the
  first and last eighth of the layers and every third one in between, about half of them), F32 norms (ones).
* Vocabulary: every ``tokenizer.*`` metadata entry of SmolLM2-135M (49,152 tokens, gpt2 BPE, the ``smollm``
  pre-tokenizer, special ids, chat template), copied byte for byte; ``token_embd`` and ``output`` have that many
  rows.
* Blocks are valid: random code bytes with small positive finite fp16 super-block scales (Q4_K ``d``/``dmin``
  at bytes 0/2, Q6_K ``d`` at byte 208), so every engine stays finite.

The file is deterministic for a seed (one PCG64 stream per tensor), streamed a few MiB at a time (an 8B file
never needs its size in memory), and written through :class:`~.fsutil.OutputSet`: an unnamed temporary renamed
into place only when complete, so a cancel, an error or a kill leaves nothing. :func:`ensure_synthetic` keeps
the files in ``cache_dir()/synthetic`` and reuses a complete one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from .base.gguf_constants import DEFAULT_ALIGNMENT, FileType, ValueType
from .fsutil import OutputSet, open_input, pread
from .gguf import GGUFFile
from .gguf.writer import DataSection, GGUFHeader, encode_entry
from .quant import ggml_type

#: Bumped when the bytes a given shape and seed produce change; part of the marker key, so old files are remade.
FORMAT_VERSION = 2
MARKER_KEY = "quantscope.synthetic"
#: Super-block scales (fp16, normal numbers) are drawn uniformly from these ranges: weights with an RMS of about
#: 0.05 (Q4_K) and 0.12 (Q6_K, whose int8 sub-scales and signed codes are larger), every one below 1.
SCALE_RANGE = {"Q4_K": (1e-4, 2e-4), "Q6_K": (6.2e-5, 1.2e-4), "Q8_0": (3e-4, 6e-4)}
#: MXFP4 blocks (gpt-oss's experts): shared exponents 2^(e-127) for e in this range, values up to 6 x that
MXFP4_EXPONENTS = (119, 121)
CHUNK_BYTES = 4 << 20
VOCAB_MODEL = "smollm2"


@dataclass(frozen=True)
class Shape:
    """A llama model's dimensions."""

    name: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    like: str
    rope_base: float = 500000.0
    n_ctx: int = 8192
    arch: str = "llama"
    n_expert: int = 0  # qwen3moe: experts per layer, used per token, each expert's FFN width
    n_expert_used: int = 0
    expert_ff: int = 0
    rope_dim: int = 0  # rotated values per head (0: all)
    # qwen35: gated delta-net layers (all but every fourth): conv taps, state size, key heads, value heads
    ssm: tuple[int, int, int, int] = (0, 0, 0, 0)
    @property
    def delta_net(self) -> bool:
        """Are three of every four layers gated delta-net layers (qwen35's layout)?"""
        return any(self.ssm)

    @property
    def oss_layout(self) -> bool:
        """gpt-oss's layout (its description binds expert biases): MXFP4 experts with biases, biased attention with
        sinks, a sliding window and YaRN scaling."""
        from .model.arch import description

        return description(self.arch).expert_biases


def _gpt_oss_20b(name: str) -> Shape:
    return Shape(name, 4, 2880, 2880, 64, 8, 64, "gpt-oss-20b (4 of its 24 layers, 4 of 32 experts per token)",
                 rope_base=150000.0, arch="gpt-oss", n_expert=32, n_expert_used=4, expert_ff=2880)


def _qwen3_30b_a3b(name: str, used: int) -> Shape:
    return Shape(name, 4, 2048, 6144, 32, 4, 128, f"Qwen3-30B-A3B (4 of its 48 layers, {used} experts per token)",
                 rope_base=1e6, arch="qwen3moe", n_expert=128, n_expert_used=used, expert_ff=768)


def _qwen35_08b(name: str) -> Shape:
    return Shape(name, 24, 1024, 3584, 8, 2, 256, "Qwen3.5-0.8B-like (18 delta-net and 6 attention layers)",
                 rope_base=1e7, arch="qwen35", rope_dim=64, ssm=(4, 128, 16, 16))


SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("tiny", 2, 256, 512, 4, 2, 64, "a test-sized llama"),
    Shape("1b", 16, 2048, 8192, 32, 8, 64, "Llama-3.2-1B"),
    Shape("3b", 28, 3072, 8192, 24, 8, 128, "Llama-3.2-3B"),
    Shape("8b", 32, 4096, 14336, 32, 8, 128, "Llama-3.1-8B"),
    _qwen3_30b_a3b("moe", 8), _qwen3_30b_a3b("moe-k4", 4), _qwen3_30b_a3b("moe-k2", 2), _gpt_oss_20b("oss"),
    _qwen35_08b("q35"),
)}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]
    type_name: str

    @property
    def n_bytes(self) -> int:
        t = ggml_type(self.type_name)
        n = 1
        for d in self.ne:
            n *= d
        return n // t.block_elems * t.block_bytes


@dataclass(frozen=True)
class SyntheticProgress:
    done: int  # bytes of tensor data written
    total: int
    tensor: str


class Cancel(Protocol):
    @property
    def cancelled(self) -> bool: ...


class SyntheticCancelled(Exception):
    """Writing was cancelled; nothing was left at the target path."""


def get_shape(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown synthetic shape {name!r}; known: {', '.join(SHAPES)}") from None


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quantize's Q4_K_M rule for the layers whose attn_v and ffn_down get Q6_K: the first eighth, the
    last eighth, and every third layer in between (integer division, as in C)."""
    eighth = n_layers // 8
    return i_layer < eighth or i_layer >= 7 * n_layers // 8 or (i_layer - eighth) % 3 == 2


def tensor_plan(shape: Shape, n_vocab: int) -> list[TensorSpec]:
    """Every tensor of the model in file order, with its ``ne`` (row length first) and type."""
    e, f, q, kv = shape.n_embd, shape.n_ff, shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    if shape.oss_layout:
        return _gpt_oss_plan(shape, n_vocab)
    out = [TensorSpec("token_embd.weight", (e, n_vocab), "Q4_K")]
    for i in range(shape.n_layers):
        more = "Q6_K" if use_more_bits(i, shape.n_layers) else "Q4_K"
        p = f"blk.{i}."
        if shape.delta_net:
            out += _qwen35_layer(shape, i, more)
            continue
        if shape.n_expert:  # qwen3moe: q/k norms, an F32 router, the experts in three 3-D tensors
            ne, fe, hd = shape.n_expert, shape.expert_ff, shape.head_dim
            out += [TensorSpec(p + "attn_norm.weight", (e,), "F32"),
                    TensorSpec(p + "attn_q.weight", (e, q), "Q4_K"), TensorSpec(p + "attn_k.weight", (e, kv), "Q4_K"),
                    TensorSpec(p + "attn_v.weight", (e, kv), more), TensorSpec(p + "attn_q_norm.weight", (hd,), "F32"),
                    TensorSpec(p + "attn_k_norm.weight", (hd,), "F32"),
                    TensorSpec(p + "attn_output.weight", (q, e), "Q4_K"),
                    TensorSpec(p + "ffn_norm.weight", (e,), "F32"),
                    TensorSpec(p + "ffn_gate_inp.weight", (e, ne), "F32"),
                    TensorSpec(p + "ffn_gate_exps.weight", (e, fe, ne), "Q4_K"),
                    TensorSpec(p + "ffn_up_exps.weight", (e, fe, ne), "Q4_K"),
                    TensorSpec(p + "ffn_down_exps.weight", (fe, e, ne), more)]
            continue
        out += [TensorSpec(p + "attn_norm.weight", (e,), "F32"), TensorSpec(p + "attn_q.weight", (e, q), "Q4_K"),
                TensorSpec(p + "attn_k.weight", (e, kv), "Q4_K"), TensorSpec(p + "attn_v.weight", (e, kv), more),
                TensorSpec(p + "attn_output.weight", (q, e), "Q4_K"), TensorSpec(p + "ffn_norm.weight", (e,), "F32"),
                TensorSpec(p + "ffn_gate.weight", (e, f), "Q4_K"), TensorSpec(p + "ffn_up.weight", (e, f), "Q4_K"),
                TensorSpec(p + "ffn_down.weight", (f, e), more)]
    out += [TensorSpec("output_norm.weight", (e,), "F32"), TensorSpec("output.weight", (e, n_vocab), "Q6_K")]
    return out


def _qwen35_layer(shape: Shape, i: int, more: str) -> list[TensorSpec]:
    """A qwen35 layer in the Q4_K_M mix: a gated delta-net layer, or every fourth an attention layer whose attn_q
    also holds the output gates; F32 norms and delta-net vectors."""
    e, f, q, kv, hd = (shape.n_embd, shape.n_ff, shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim,
                       shape.head_dim)
    k, st, hk, hv = shape.ssm
    p = f"blk.{i}."
    out = [TensorSpec(p + "attn_norm.weight", (e,), "F32")]
    if (i + 1) % 4:
        c = (2 * hk + hv) * st
        out += [TensorSpec(p + "attn_qkv.weight", (e, c), "Q4_K"),
                TensorSpec(p + "attn_gate.weight", (e, hv * st), "Q4_K"),
                TensorSpec(p + "ssm_conv1d.weight", (k, c), "F32"), TensorSpec(p + "ssm_dt.bias", (hv,), "F32"),
                TensorSpec(p + "ssm_a", (hv,), "F32"), TensorSpec(p + "ssm_beta.weight", (e, hv), "Q4_K"),
                TensorSpec(p + "ssm_alpha.weight", (e, hv), "Q4_K"), TensorSpec(p + "ssm_norm.weight", (st,), "F32"),
                TensorSpec(p + "ssm_out.weight", (hv * st, e), "Q4_K")]
    else:
        out += [TensorSpec(p + "attn_q.weight", (e, 2 * q), "Q4_K"), TensorSpec(p + "attn_k.weight", (e, kv), "Q4_K"),
                TensorSpec(p + "attn_v.weight", (e, kv), more), TensorSpec(p + "attn_q_norm.weight", (hd,), "F32"),
                TensorSpec(p + "attn_k_norm.weight", (hd,), "F32"),
                TensorSpec(p + "attn_output.weight", (q, e), "Q4_K")]
    return [*out, TensorSpec(p + "post_attention_norm.weight", (e,), "F32"),
            TensorSpec(p + "ffn_gate.weight", (e, f), "Q4_K"), TensorSpec(p + "ffn_up.weight", (e, f), "Q4_K"),
            TensorSpec(p + "ffn_down.weight", (f, e), more)]


def _gpt_oss_plan(shape: Shape, n_vocab: int) -> list[TensorSpec]:
    """gpt-oss as llama-quantize's MXFP4_MOE mix writes it: MXFP4 experts, Q8_0 for the other matrices, F32 norms,
    biases, sinks and router."""
    e, q, kv, ne, fe = (shape.n_embd, shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim,
                        shape.n_expert, shape.expert_ff)
    out = [TensorSpec("token_embd.weight", (e, n_vocab), "Q8_0")]
    for i in range(shape.n_layers):
        p = f"blk.{i}."
        out += [TensorSpec(p + "attn_norm.weight", (e,), "F32"),
                TensorSpec(p + "attn_q.weight", (e, q), "Q8_0"), TensorSpec(p + "attn_q.bias", (q,), "F32"),
                TensorSpec(p + "attn_k.weight", (e, kv), "Q8_0"), TensorSpec(p + "attn_k.bias", (kv,), "F32"),
                TensorSpec(p + "attn_v.weight", (e, kv), "Q8_0"), TensorSpec(p + "attn_v.bias", (kv,), "F32"),
                TensorSpec(p + "attn_output.weight", (q, e), "Q8_0"), TensorSpec(p + "attn_output.bias", (e,), "F32"),
                TensorSpec(p + "attn_sinks.weight", (shape.n_head,), "F32"),
                TensorSpec(p + "post_attention_norm.weight", (e,), "F32"),
                TensorSpec(p + "ffn_gate_inp.weight", (e, ne), "F32"),
                TensorSpec(p + "ffn_gate_inp.bias", (ne,), "F32"),
                TensorSpec(p + "ffn_gate_exps.weight", (e, fe, ne), "MXFP4"),
                TensorSpec(p + "ffn_gate_exps.bias", (fe, ne), "F32"),
                TensorSpec(p + "ffn_up_exps.weight", (e, fe, ne), "MXFP4"),
                TensorSpec(p + "ffn_up_exps.bias", (fe, ne), "F32"),
                TensorSpec(p + "ffn_down_exps.weight", (fe, e, ne), "MXFP4"),
                TensorSpec(p + "ffn_down_exps.bias", (e, ne), "F32")]
    return [*out, TensorSpec("output_norm.weight", (e,), "F32"), TensorSpec("output.weight", (e, n_vocab), "Q8_0")]


def synthetic_path(shape: str, seed: int = 0) -> Path:
    """Where :func:`ensure_synthetic` keeps a shape (whether or not it is there yet); a seed other than 0 is
    part of the name."""
    from .catalog import cache_dir

    suffix = f"-seed{seed}" if seed else ""
    sh = get_shape(shape)
    mix = "mxfp4" if sh.oss_layout else "q4km"
    return cache_dir() / "synthetic" / f"{sh.arch}-{sh.name}-{mix}{suffix}.gguf"


def marker(shape: Shape, seed: int) -> str:
    return f"{shape.arch}-{shape.name} seed {seed} format {FORMAT_VERSION}"


# --- GGUF encoding -----------------------------------------------------------------------------------------------

def _kv(key: str, vtype: ValueType, value: object) -> bytes:
    return encode_entry(key, vtype, value)


def _align(n: int, a: int = DEFAULT_ALIGNMENT) -> int:
    return (n + a - 1) // a * a


def tokenizer_entries(vocab_source: str | os.PathLike[str]) -> tuple[list[bytes], int]:
    """The raw bytes of every ``tokenizer.*`` metadata entry of ``vocab_source`` and its vocabulary size."""
    with GGUFFile(vocab_source) as f:
        spans = [(kv.offset, kv.end) for key, kv in f.metadata.items() if key.startswith("tokenizer.")]
        tokens = f.metadata.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise ValueError(f"{vocab_source}: no tokenizer.ggml.tokens to copy")
        n_vocab = len(tokens.value)
    fd = open_input(vocab_source)
    try:
        return [pread(fd, end - start, start) for start, end in spans], n_vocab
    finally:
        os.close(fd)


def header_bytes(shape: Shape, seed: int, tok_entries: list[bytes], n_vocab: int) -> tuple[bytes, list[TensorSpec]]:
    """Header, metadata, tensor infos and padding up to the data section; and the tensors in data order."""
    a = shape.arch + "."
    experts = [_kv(a + "expert_count", ValueType.UINT32, shape.n_expert),
               _kv(a + "expert_used_count", ValueType.UINT32, shape.n_expert_used),
               _kv(a + "expert_feed_forward_length", ValueType.UINT32, shape.expert_ff)] if shape.n_expert else []
    if shape.oss_layout:  # the real models' window and YaRN scaling
        experts += [_kv(a + "attention.sliding_window", ValueType.UINT32, 128),
                    _kv(a + "rope.scaling.type", ValueType.STRING, "yarn"),
                    _kv(a + "rope.scaling.factor", ValueType.FLOAT32, 32.0),
                    _kv(a + "rope.scaling.original_context_length", ValueType.UINT32, 4096)]
    if shape.delta_net:  # the delta-net sizes; text RoPE sections (all of the rotated pairs)
        k, st, hk, hv = shape.ssm
        half = (shape.rope_dim or shape.head_dim) // 2
        sec = [(half + 2) // 3, (half + 1) // 3, half // 3, 0]  # (Qwen3.5's 11, 11, 10 for 32 pairs)
        experts += [_kv(a + "ssm.conv_kernel", ValueType.UINT32, k), _kv(a + "ssm.state_size", ValueType.UINT32, st),
                    _kv(a + "ssm.group_count", ValueType.UINT32, hk),
                    _kv(a + "ssm.time_step_rank", ValueType.UINT32, hv),
                    _kv(a + "ssm.inner_size", ValueType.UINT32, hv * st),
                    _kv(a + "full_attention_interval", ValueType.UINT32, 4),
                    encode_entry(a + "rope.dimension_sections", ValueType.ARRAY, sec, ValueType.INT32)]
    ftype = FileType.MOSTLY_MXFP4_MOE if shape.oss_layout else FileType.MOSTLY_Q4_K_M
    kvs = [
        _kv("general.architecture", ValueType.STRING, shape.arch),
        _kv("general.name", ValueType.STRING,
            f"synthetic {shape.arch} {shape.name} ({shape.like} shape, random weights)"),
        _kv("general.file_type", ValueType.UINT32, int(ftype)),
        _kv("general.quantization_version", ValueType.UINT32, 2),
        _kv(MARKER_KEY, ValueType.STRING, marker(shape, seed)),
        _kv(a + "block_count", ValueType.UINT32, shape.n_layers),
        _kv(a + "context_length", ValueType.UINT32, shape.n_ctx),
        _kv(a + "embedding_length", ValueType.UINT32, shape.n_embd),
        _kv(a + "feed_forward_length", ValueType.UINT32, shape.n_ff),
        _kv(a + "attention.head_count", ValueType.UINT32, shape.n_head),
        _kv(a + "attention.head_count_kv", ValueType.UINT32, shape.n_head_kv),
        _kv(a + "attention.key_length", ValueType.UINT32, shape.head_dim),
        _kv(a + "attention.value_length", ValueType.UINT32, shape.head_dim),
        _kv(a + "rope.dimension_count", ValueType.UINT32, shape.rope_dim or shape.head_dim),
        _kv(a + "rope.freq_base", ValueType.FLOAT32, shape.rope_base),
        _kv(a + "attention.layer_norm_rms_epsilon", ValueType.FLOAT32, 1e-5),
        _kv(a + "vocab_size", ValueType.UINT32, n_vocab),
        *experts,
        *tok_entries,
    ]
    plan = tensor_plan(shape, n_vocab)
    header = GGUFHeader(DEFAULT_ALIGNMENT)
    for kv in kvs:
        header.add_raw(kv)
    for t in plan:
        header.add_tensor(t.name, t.ne, ggml_type(t.type_name).id, t.n_bytes)
    return header.encode(), plan


def expected_size(head: bytes, plan: list[TensorSpec]) -> int:
    """The file's size: the header, then every tensor padded to the alignment (the last one too)."""
    return len(head) + sum(_align(t.n_bytes) for t in plan)


# --- tensor data -------------------------------------------------------------------------------------------------

def tensor_chunks(spec: TensorSpec, rng: np.random.Generator,
                  chunk_bytes: int = CHUNK_BYTES) -> Iterator[np.ndarray]:
    """The tensor's bytes in pieces of about ``chunk_bytes``: valid random blocks (F32: ones; an expert router:
    normal values of deviation 0.05, so that each token ranks the experts its own way)."""
    if spec.type_name == "F32":
        if spec.name.endswith("ffn_gate_inp.weight"):
            yield (rng.standard_normal(spec.n_bytes // 4) * 0.05).astype(np.float32).view(np.uint8)
        elif spec.name.endswith((".bias", "attn_sinks.weight")):  # gpt-oss's biases and sinks: none in effect
            yield np.zeros(spec.n_bytes // 4, np.float32).view(np.uint8)
        elif spec.name.endswith(".ssm_a"):  # -exp(A_log): a decaying delta-net state
            yield np.full(spec.n_bytes // 4, -1.0, np.float32).view(np.uint8)
        elif spec.name.endswith(".ssm_conv1d.weight"):
            yield np.full(spec.n_bytes // 4, 0.25, np.float32).view(np.uint8)
        else:
            yield np.ones(spec.n_bytes // 4, np.float32).view(np.uint8)
        return
    t = ggml_type(spec.type_name)
    if t.name == "MXFP4":  # random nibbles under a random shared exponent byte
        n_blocks = spec.n_bytes // t.block_bytes
        per = max(1, chunk_bytes // t.block_bytes)
        for start in range(0, n_blocks, per):
            n = min(per, n_blocks - start)
            raw = rng.bit_generator.random_raw((n * t.block_bytes + 7) // 8).view(np.uint8)[: n * t.block_bytes]
            raw.reshape(n, t.block_bytes)[:, 0] = rng.integers(*MXFP4_EXPONENTS, endpoint=True, size=n)
            yield raw
        return
    n_blocks = spec.n_bytes // t.block_bytes
    per = max(1, chunk_bytes // t.block_bytes)
    lo, hi = SCALE_RANGE[t.name]
    for start in range(0, n_blocks, per):
        n = min(per, n_blocks - start)
        raw = rng.bit_generator.random_raw((n * t.block_bytes + 7) // 8).view(np.uint8)[: n * t.block_bytes]
        blocks = raw.reshape(n, t.block_bytes)
        for off in t.fp16_scales:
            s = (lo + rng.random(n) * (hi - lo)).astype(np.float16)
            blocks[:, off : off + 2] = s.view(np.uint8).reshape(n, 2)
        yield raw


def write_synthetic(path: str | os.PathLike[str], shape: str | Shape, vocab_source: str | os.PathLike[str],
                    seed: int = 0, progress: Callable[[SyntheticProgress], None] | None = None,
                    cancel: Cancel | None = None, replace_stale: bool = False) -> Path:
    """Write the random-weight model ``shape`` to ``path`` atomically; returns the path written.

    Raises :class:`SyntheticCancelled` (leaving nothing) when ``cancel.cancelled`` becomes true."""
    sh = shape if isinstance(shape, Shape) else get_shape(shape)
    tok, n_vocab = tokenizer_entries(vocab_source)
    head, plan = header_bytes(sh, seed, tok, n_vocab)
    total = sum(t.n_bytes for t in plan)
    report = progress or (lambda _p: None)
    done = 0
    # replace_stale: the cache's own broken file, just read by is_complete, may be replaced (never the vocabulary)
    with OutputSet([("synthetic", path)], inputs=[vocab_source], replaces=[path] if replace_stale else []) as outs:
        outs.open("synthetic")
        outs.write_bytes("synthetic", head)
        data = DataSection(lambda b: outs.write_bytes("synthetic", b), DEFAULT_ALIGNMENT, (t.n_bytes for t in plan))
        for i, spec in enumerate(plan):
            rng = np.random.default_rng([seed, i])
            for piece in tensor_chunks(spec, rng):
                if cancel is not None and cancel.cancelled:
                    raise SyntheticCancelled("writing the synthetic model was cancelled")
                data.write(piece.data)
                done += piece.nbytes
                report(SyntheticProgress(done, total, spec.name))
            data.end_tensor()
        data.finish()
        outs.commit()
        return outs.target("synthetic")


def is_complete(path: str | os.PathLike[str], shape: str, seed: int = 0) -> bool:
    """Does ``path`` hold the finished synthetic model ``shape`` of ``seed`` (marker and full size)?"""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with GGUFFile(p) as f:
            if f.get(MARKER_KEY) != marker(get_shape(shape), seed) or not f.tensors:
                return False
            last = max(f.tensors, key=lambda t: t.data_offset)
            if last.n_bytes is None:
                return False
            return f.file_size == _align(last.data_offset + last.n_bytes, f.alignment)
    except (OSError, ValueError):
        return False


def ensure_synthetic(shape: str, seed: int = 0, progress: Callable[[SyntheticProgress], None] | None = None,
                     cancel: Cancel | None = None, say: Callable[[str], None] | None = None,
                     vocab_source: str | os.PathLike[str] | None = None) -> Path:
    """The cached synthetic model ``shape``: reused when complete, otherwise written with the vocabulary of
    ``vocab_source`` (default: the SmolLM2 catalogue model, fetched first if needed)."""
    from . import catalog

    target = synthetic_path(shape, seed)
    if is_complete(target, shape, seed):
        return target
    vocab = vocab_source if vocab_source is not None else catalog.fetch(VOCAB_MODEL, progress=say)
    target.parent.mkdir(parents=True, exist_ok=True)  # our cache folder (writers refuse a missing folder)
    return write_synthetic(target, shape, vocab, seed, progress, cancel, replace_stale=True)
