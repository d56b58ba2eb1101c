"""Which ggml type each tensor of a file gets under a llama-quantize preset (docs/quantize.md#presets).

A preset (``Q4_K_M``, ``IQ4_XS``, ...) names a *file type*: a default tensor type plus a mixture of rules that give
some tensors more (or fewer) bits by their role, their layer and the model's shape. The rules here reproduce
llama-quantize's choices for the llama.cpp version Quantscope is tested against, so that the same input, preset and
options give the same type for every tensor (and, with ggml-identical quantizers, the same file).

The steps for one tensor, in order:

1. Is it quantized at all? Only tensors of two or more dimensions whose name ends in ``weight``, excluding norms,
   routers, positional and type embeddings, small conv/recurrence weights and a few multimodal ones
   (:func:`allows_quantization`). The others are copied unchanged.
2. ``--token-embedding-type`` and ``--output-tensor-type`` win for those two tensors.
3. For a quantized default type: the first ``--tensor-type`` pattern that matches (a regular expression searched in
   the name) wins; otherwise, unless ``--pure``, the preset's rules (:func:`_mixture_type`).
4. A type whose block does not divide the row length falls back to one that does (:func:`fallback_type`).

The rules need a running count of value/FFN tensors seen so far (llama-quantize's counters), so the tensors are
visited in llama-quantize's order: :func:`tensor_order`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from ..base.ggml_types import ggml_type
from ..base.gguf_constants import FileType
from ..userregex import UserPattern


@dataclass(frozen=True)
class Preset:
    """One llama-quantize target: its name, the ``general.file_type`` it writes and its default tensor type."""

    name: str
    ftype: FileType
    default: str
    description: str


def _p(name: str, ftype: str, default: str, desc: str) -> Preset:
    return Preset(name, FileType[f"MOSTLY_{ftype}" if ftype not in ("ALL_F32",) else ftype], default, desc)


#: llama-quantize's presets, in its order (the aliases Q3_K, Q4_K and Q5_K name the _M mixtures).
PRESETS: dict[str, Preset] = {p.name: p for p in (
    _p("Q4_0", "Q4_0", "Q4_0", "4.34G, +0.4685 ppl @ Llama-3-8B"),
    _p("Q4_1", "Q4_1", "Q4_1", "4.78G, +0.4511 ppl @ Llama-3-8B"),
    _p("MXFP4_MOE", "MXFP4_MOE", "MXFP4", "MXFP4 experts, Q8_0 elsewhere"),
    _p("Q5_0", "Q5_0", "Q5_0", "5.21G, +0.1316 ppl @ Llama-3-8B"),
    _p("Q5_1", "Q5_1", "Q5_1", "5.65G, +0.1062 ppl @ Llama-3-8B"),
    _p("IQ2_XXS", "IQ2_XXS", "IQ2_XXS", "2.06 bpw"),
    _p("IQ2_XS", "IQ2_XS", "IQ2_XS", "2.31 bpw"),
    _p("IQ2_S", "IQ2_S", "IQ2_XS", "2.5 bpw"),
    _p("IQ2_M", "IQ2_M", "IQ2_S", "2.7 bpw"),
    _p("IQ1_S", "IQ1_S", "IQ1_S", "1.56 bpw"),
    _p("IQ1_M", "IQ1_M", "IQ1_M", "1.75 bpw"),
    _p("TQ1_0", "TQ1_0", "TQ1_0", "1.69 bpw ternary"),
    _p("TQ2_0", "TQ2_0", "TQ2_0", "2.06 bpw ternary"),
    _p("Q2_K", "Q2_K", "Q2_K", "2.96G, +3.5199 ppl @ Llama-3-8B"),
    _p("Q2_K_S", "Q2_K_S", "Q2_K", "2.96G, +3.1836 ppl @ Llama-3-8B"),
    _p("IQ3_XXS", "IQ3_XXS", "IQ3_XXS", "3.06 bpw"),
    _p("IQ3_S", "IQ3_S", "IQ3_S", "3.44 bpw"),
    _p("IQ3_M", "IQ3_M", "IQ3_S", "3.66 bpw mix"),
    _p("Q3_K", "Q3_K_M", "Q3_K", "alias for Q3_K_M"),
    _p("IQ3_XS", "IQ3_XS", "IQ3_S", "3.3 bpw"),
    _p("Q3_K_S", "Q3_K_S", "Q3_K", "3.41G, +1.6321 ppl @ Llama-3-8B"),
    _p("Q3_K_M", "Q3_K_M", "Q3_K", "3.74G, +0.6569 ppl @ Llama-3-8B"),
    _p("Q3_K_L", "Q3_K_L", "Q3_K", "4.03G, +0.5562 ppl @ Llama-3-8B"),
    _p("IQ4_NL", "IQ4_NL", "IQ4_NL", "4.50 bpw non-linear"),
    _p("IQ4_XS", "IQ4_XS", "IQ4_XS", "4.25 bpw non-linear"),
    _p("Q4_K", "Q4_K_M", "Q4_K", "alias for Q4_K_M"),
    _p("Q4_K_S", "Q4_K_S", "Q4_K", "4.37G, +0.2689 ppl @ Llama-3-8B"),
    _p("Q4_K_M", "Q4_K_M", "Q4_K", "4.58G, +0.1754 ppl @ Llama-3-8B"),
    _p("Q5_K", "Q5_K_M", "Q5_K", "alias for Q5_K_M"),
    _p("Q5_K_S", "Q5_K_S", "Q5_K", "5.21G, +0.1049 ppl @ Llama-3-8B"),
    _p("Q5_K_M", "Q5_K_M", "Q5_K", "5.33G, +0.0569 ppl @ Llama-3-8B"),
    _p("Q6_K", "Q6_K", "Q6_K", "6.14G, +0.0217 ppl @ Llama-3-8B"),
    _p("Q8_0", "Q8_0", "Q8_0", "7.96G, +0.0026 ppl @ Llama-3-8B"),
    _p("F16", "F16", "F16", "14.00G, +0.0020 ppl @ Mistral-7B"),
    _p("BF16", "BF16", "BF16", "14.00G, -0.0050 ppl @ Mistral-7B"),
    _p("F32", "ALL_F32", "F32", "26.00G @ 7B"),
)}


def get_preset(name: str) -> Preset:
    """A preset by name (case-insensitive); the error lists the known ones."""
    p = PRESETS.get(name.upper())
    if p is None:
        raise ValueError(f"unknown quantization type {name!r}; known: {', '.join(PRESETS)}")
    return p


class Category(Enum):
    """A tensor's role as the mixture rules see it (from its name alone)."""

    OUTPUT = "output"
    TOKEN_EMBD = "token_embd"
    ATTN_QKV = "attn_qkv"
    ATTN_KV_B = "attn_kv_b"
    ATTN_V = "attn_v"
    ATTN_K = "attn_k"
    ATTN_Q = "attn_q"
    ATTN_OUTPUT = "attn_output"
    FFN_UP = "ffn_up"
    FFN_GATE = "ffn_gate"
    FFN_DOWN = "ffn_down"
    OTHER = "other"


def category(name: str) -> Category:
    """The role of a tensor by name: the first matching test wins (``ffn_up`` before ``ffn_gate``)."""
    if name == "output.weight":
        return Category.OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return Category.TOKEN_EMBD
    for needle, cat in (("attn_qkv.weight", Category.ATTN_QKV), ("attn_kv_b.weight", Category.ATTN_KV_B),
                        ("attn_v.weight", Category.ATTN_V), ("attn_k.weight", Category.ATTN_K),
                        ("attn_q.weight", Category.ATTN_Q), ("attn_output.weight", Category.ATTN_OUTPUT),
                        ("ffn_up", Category.FFN_UP), ("ffn_gate", Category.FFN_GATE),
                        ("ffn_down", Category.FFN_DOWN)):
        if needle in name:
            return cat
    return Category.OTHER


_VALUE_LIKE = (Category.ATTN_V, Category.ATTN_QKV, Category.ATTN_KV_B)

#: name pieces of tensors that stay in their type (tiny, or precision-critical)
_NEVER = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
          "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
          "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
          "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
          "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
          "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
          ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger",
          "a.rvq.codebook", "mm.a.code_embd")
_NEVER_GLM5_NEXT = ("hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
                    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight",
                    "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight")


def n_dims(ne: Sequence[int]) -> int:
    """ggml's dimension count: trailing dimensions of 1 do not count (at least 1)."""
    n = len(ne)
    while n > 1 and ne[n - 1] == 1:
        n -= 1
    return max(n, 1)


def allows_quantization(name: str, ne: Sequence[int], arch: str, *, quantize_output: bool = True) -> bool:
    """True when llama-quantize would requantize this tensor (otherwise it is copied as it is)."""
    if n_dims(ne) < 2 or not name.endswith("weight"):
        return False
    if not quantize_output and name == "output.weight":
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    if any(s in name for s in _NEVER):
        return False
    return not (arch == "glm5-next" and any(s in name for s in _NEVER_GLM5_NEXT))


def layer_of(name: str) -> int:
    """The block number of a ``blk.N.`` tensor, -1 for the others (as ``sscanf("blk.%d.")`` reads it)."""
    m = re.match(r"blk\.\s*([+-]?\d+)\.", name)
    if m is None:
        return -1
    v = int(m.group(1))
    return v if -(2**31) <= v < 2**31 else -1


def tensor_order(names: Sequence[str]) -> list[str]:
    """llama-quantize's tensor order: by block number (the non-block tensors first), then by name (bytewise)."""
    return sorted(names, key=lambda n: (layer_of(n), n.encode("utf-8")))


@dataclass(frozen=True)
class ModelShape:
    """What the rules read from the model's hyperparameters."""

    arch: str
    n_layer: int
    n_expert: int
    n_head: int
    n_head_kv: int
    is_70b: bool = False

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0


def _div(a: int, b: int) -> int:
    """C integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _more_bits(i: int, n: int) -> bool:
    """The layers the _M mixtures give more bits: the first and last eighth and every third one in between."""
    if i < _div(n, 8) or i >= _div(7 * n, 8):
        return True
    r = i - _div(n, 8)
    return (r - 3 * _div(r, 3)) == 2  # C's remainder


_IQ_LOW = ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M")


@dataclass
class _Counters:
    """llama-quantize's running counts: value-like tensors seen and visited, FFN tensors visited."""

    n_attention_wv: int = 0
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0
    has_tied: bool = True


class MixtureError(ValueError):
    """The rules cannot place a tensor (a block number outside the model, an MoE tensor outside a block)."""


def _layer(c_index: int, model: ModelShape, name: str) -> tuple[int, int]:
    """The (layer, layer count) the FFN rules use: the running index, or for MoE models the block in the name."""
    n_layer = model.n_layer
    if max(1, model.n_expert) > 1:
        i = layer_of(name)
        if not re.match(r"blk\.\s*[+-]?\d+\.", name):
            raise MixtureError(f"cannot tell the layer of tensor {name}")
        if i < 0 or i >= n_layer:
            raise MixtureError(f"tensor {name} is in layer {i}; the model has layers 0..{n_layer - 1}")
        return i, n_layer
    return c_index, n_layer


def _mixture_type(new: str, name: str, ne: Sequence[int], ftype: str, cat: Category, model: ModelShape,
                  c: _Counters, opts: MixtureOptions) -> str:
    """The preset's rule for one tensor (llama-quantize's standard mixture), updating the counters."""
    arch = model.arch
    gqa = model.n_gqa
    n_expert = model.n_expert
    if arch == "glm5-next" and any(s in name for s in ("attn_q_a", "attn_q_b", "nextn.eh_proj")):
        if new not in ("F32", "BF16", "F16"):
            return "Q8_0"
    if cat == Category.OUTPUT or (c.has_tied and cat == Category.TOKEN_EMBD):
        if opts.output_tensor_type is not None:
            return opts.output_tensor_type
        if ftype == "MXFP4_MOE":
            return "Q8_0"
        if arch == "falcon" or ne[0] % ggml_type(new).block_elems:
            return "Q8_0"
        if ftype in ("IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"):
            return "Q5_K"
        return new if new == "Q8_0" else "Q6_K"
    if ftype == "MXFP4_MOE":
        if arch == "bailingmoe3":
            expert = cat in (Category.FFN_UP, Category.FFN_GATE, Category.FFN_DOWN)
            return "MXFP4" if len(ne) > 2 and ne[2] > 1 and expert else "Q8_0"
        return "MXFP4" if len(ne) > 2 and ne[2] > 1 else "Q8_0"
    if cat == Category.TOKEN_EMBD:
        if opts.token_embedding_type is not None:
            return opts.token_embedding_type
        if ftype in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
            return "Q2_K"
        if ftype in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
            return "IQ3_S"
        if ftype in ("TQ1_0", "TQ2_0", "Q2_0"):
            return "Q4_K"
        return new
    if ftype in _IQ_LOW:
        s_or_m = ftype in ("IQ2_S", "IQ2_M")
        if cat in _VALUE_LIKE:
            if gqa >= 4 or n_expert >= 4:
                new = "Q4_K"
            else:
                new = "IQ3_S" if s_or_m else "Q2_K"
            c.i_attention_wv += 1
        elif n_expert == 8 and cat == Category.ATTN_K:
            new = "Q4_K"
        elif cat == Category.FFN_DOWN:
            if c.i_ffn_down < _div(model.n_layer, 8):
                new = "IQ3_S" if s_or_m else "Q2_K"
            c.i_ffn_down += 1
        elif cat == Category.ATTN_OUTPUT:
            if n_expert == 8:
                new = "Q5_K"
            elif ftype in ("IQ1_S", "IQ1_M"):
                new = "IQ2_XXS"
            elif s_or_m:
                new = "IQ3_S"
        return new
    if cat in _VALUE_LIKE:
        if ftype == "Q2_K":
            new = "Q4_K" if gqa >= 4 else "Q3_K"
        elif ftype == "Q2_K_S" and gqa >= 4:
            new = "Q4_K"
        elif ftype == "IQ3_XXS":
            new = "Q4_K" if gqa >= 4 else ("IQ3_S" if not opts.has_imatrix else "IQ3_XXS")
        elif ftype in ("IQ3_XS", "IQ3_S") and gqa >= 4:
            new = "Q4_K"
        elif ftype == "IQ3_M":
            new = "Q4_K"
        elif ftype == "Q3_K_M":
            new = "Q5_K" if c.i_attention_wv < 2 else "Q4_K"
        elif ftype == "Q3_K_L":
            new = "Q5_K"
        elif ftype in ("IQ4_NL", "IQ4_XS") and gqa >= 4:
            new = "Q5_K"
        elif ftype in ("Q4_K_M", "Q5_K_M") and _more_bits(c.i_attention_wv, c.n_attention_wv):
            new = "Q6_K"
        elif ftype == "Q4_K_S" and c.i_attention_wv < 4:
            new = "Q5_K"
        if model.is_70b and new in ("Q3_K", "Q4_K"):
            new = "Q5_K"
        if n_expert == 8:
            new = "Q8_0"
        c.i_attention_wv += 1
        return new
    if cat == Category.ATTN_K:
        if n_expert == 8:
            return "Q8_0"
        if ftype == "IQ3_XS":
            return "IQ3_XXS"
        if ftype == "IQ3_XXS":
            return "IQ2_S"
        return new
    if cat == Category.ATTN_Q:
        if ftype == "IQ3_XS":
            return "IQ3_XXS"
        if ftype == "IQ3_XXS":
            return "IQ2_S"
        return new
    if cat == Category.FFN_DOWN:
        i, n = _layer(c.i_ffn_down, model, name)
        falcon = arch == "falcon"
        if ftype == "Q2_K":
            new = "Q3_K"
        elif ftype == "Q2_K_S":
            if i < _div(n, 8):
                new = "Q4_K"
        elif ftype == "IQ3_XXS" and not opts.has_imatrix:
            new = "Q4_K" if i < _div(n, 8) else "Q3_K"
        elif ftype == "Q3_K_M":
            new = "Q5_K" if i < _div(n, 16) else ("Q4_K" if not falcon or _more_bits(i, n) else "Q3_K")
        elif ftype == "IQ3_M" and (i < _div(n, 8) or (n_expert == 8 and _more_bits(i, n))):
            new = "Q4_K"
        elif ftype == "Q3_K_L":
            new = "Q4_K" if falcon else "Q5_K"
        elif ftype == "Q4_K_M":
            if falcon:
                new = "Q6_K" if i < _div(n, 16) else ("Q5_K" if _more_bits(i, n) else "Q4_K")
            elif _more_bits(i, n):
                new = "Q6_K"
        elif i < _div(n, 8) and ftype in ("IQ4_NL", "IQ4_XS") and not opts.has_imatrix:
            new = "Q5_K"
        elif ftype == "Q5_K_M" and _more_bits(i, n):
            new = "Q6_K"
        elif ftype == "Q4_K_S" and not falcon and i < _div(n, 8):
            new = "Q5_K"
        elif ftype in ("Q4_0", "Q5_0") and opts.has_imatrix and i < _div(n, 8):
            new = "Q4_1" if ftype == "Q4_0" else "Q5_1"
        c.i_ffn_down += 1
        return new
    if cat == Category.ATTN_OUTPUT:
        if arch != "falcon":
            if n_expert == 8:
                if ftype in ("Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S",
                             "IQ3_M", "IQ4_XS"):
                    new = "Q5_K"
            else:
                new = {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K",
                       "IQ3_M": "Q4_K"}.get(ftype, new)
        elif ftype == "Q3_K_L":
            new = "Q4_K"
        return new
    if cat == Category.ATTN_QKV:
        if ftype in ("Q3_K_M", "Q3_K_L", "IQ3_M"):
            return "Q4_K"
        if ftype == "Q4_K_M":
            return "Q5_K"
        if ftype == "Q5_K_M":
            return "Q6_K"
        return new
    if cat in (Category.FFN_GATE, Category.FFN_UP):
        idx = c.i_ffn_gate if cat == Category.FFN_GATE else c.i_ffn_up
        i, n = _layer(idx, model, name)
        if ftype == "IQ3_XS" and _div(n, 8) <= i < _div(7 * n, 8):
            new = "IQ3_XXS"
        if cat == Category.FFN_GATE:
            c.i_ffn_gate += 1
        else:
            c.i_ffn_up += 1
        return new
    return new


_FALLBACK = {**dict.fromkeys(("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS"), "IQ4_NL"),
             **dict.fromkeys(("Q2_0", "Q2_K", "Q3_K", "TQ1_0", "TQ2_0"), "Q4_0"),
             "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def fallback_type(target: str, ncols: int) -> tuple[str, bool]:
    """The type a row of ``ncols`` values can take when ``target``'s block does not divide it: the
    smaller-block type of about the same size, or F16 when even that does not fit. Returns (type, fell back)."""
    blk = ggml_type(target).block_elems
    if ncols % blk == 0:
        return target, False
    out = _FALLBACK.get(target)
    if out is None:
        if blk > 32:
            raise MixtureError(f"no fallback type for {target}")
        out = target
    if ncols % ggml_type(out).block_elems:
        out = "F16"
    return out, True


@dataclass(frozen=True)
class MixtureOptions:
    """The llama-quantize options that change type choices."""

    tensor_types: tuple[tuple[str, str], ...] = ()  # (lower-cased regular expression, type name), first match wins
    output_tensor_type: str | None = None
    token_embedding_type: str | None = None
    pure: bool = False
    quantize_output: bool = True  # False: --leave-output-tensor
    has_imatrix: bool = False
    _compiled: tuple[tuple[UserPattern, str], ...] = field(default=(), compare=False, repr=False)

    def patterns(self) -> tuple[tuple[UserPattern, str], ...]:
        """The rules compiled, each searched within a time budget (:mod:`~quantscope.core.userregex`)."""
        if not self._compiled and self.tensor_types:
            try:
                comp = tuple((UserPattern(p, "--tensor-type"), t) for p, t in self.tensor_types)
            except ValueError as exc:
                raise ValueError(f"--tensor-type: bad regular expression: {exc}") from None
            object.__setattr__(self, "_compiled", comp)
        return self._compiled


@dataclass(frozen=True)
class TypeChoice:
    """The type one tensor gets, and why."""

    name: str
    source: str  # the tensor's type in the input
    target: str
    reason: str  # "kept", "preset", "rule", "--tensor-type", "--output-tensor-type", "--token-embedding-type", ...
    fell_back_from: str | None = None


def choose_types(tensors: Sequence[tuple[str, Sequence[int], str]], model: ModelShape, preset: Preset,
                 opts: MixtureOptions) -> list[TypeChoice]:
    """The type of every tensor ``(name, ne, source type)``, in llama-quantize's order (:func:`tensor_order`)."""
    by_name = {t[0]: t for t in tensors}
    order = tensor_order(list(by_name))
    c = _Counters()
    for n in order:
        cat = category(n)
        if cat in _VALUE_LIKE:
            c.n_attention_wv += 1
        if cat == Category.OUTPUT:
            c.has_tied = False
    ftype = preset.ftype.name.removeprefix("MOSTLY_").removeprefix("ALL_")
    default = preset.default
    quantized_default = ggml_type(default).is_quantized
    pats = opts.patterns()
    out: list[TypeChoice] = []
    for n in order:
        _, ne, src = by_name[n]
        cat = category(n)
        if not allows_quantization(n, ne, model.arch, quantize_output=opts.quantize_output):
            out.append(TypeChoice(n, src, src, "kept"))
            continue
        if opts.token_embedding_type is not None and cat == Category.TOKEN_EMBD:
            named = n == "per_layer_token_embd.weight" and any(p.search(n) for p, _ in pats)
            if not named:
                out.append(TypeChoice(n, src, opts.token_embedding_type, "--token-embedding-type"))
                continue
        if opts.output_tensor_type is not None and cat == Category.OUTPUT:
            out.append(TypeChoice(n, src, opts.output_tensor_type, "--output-tensor-type"))
            continue
        new, reason = default, "preset"
        if quantized_default:
            manual = next((t for p, t in pats if p.search(n)), None)
            if manual is not None:
                new, reason = manual, "--tensor-type"
            elif not opts.pure:
                new = _mixture_type(default, n, ne, ftype, cat, model, c, opts)
                if new != default:
                    reason = "rule"
            fb, fell = fallback_type(new, ne[0])
            if fell:
                out.append(TypeChoice(n, src, fb, "fallback", new))
                continue
        out.append(TypeChoice(n, src, new, reason))
    return out


def requires_imatrix(name: str, target: str, preset: Preset) -> bool:
    """llama-quantize refuses these without importance data: the lattice types, and Q2_K inside Q2_K_S."""
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    if target in ("IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"):
        return True
    return target == "Q2_K" and preset.name == "Q2_K_S"

