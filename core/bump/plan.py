"""Plan a GGUF -> BUMPWGT3 conversion: hyperparameters, the ordered sections, refusals, the lm_head decision.

Everything here is decided before a byte is written, so every refusal is a clear message and never a half-written
file. See docs/bump.md for the layout (§2 sections, §5 refusals, §7 lm_head).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..gguf import GGUFFile, TensorInfo
from .format import ACCEPTED_WEIGHTS, PER_LAYER, PROFILES, BumpHeader, align_context


class BumpRefusal(ValueError):
    """The file cannot be converted as asked; the message says which tensor and why."""


@dataclass(frozen=True)
class Hyper:
    """Model dimensions as BUMPWGT3 and config.json need them."""

    arch: str
    n_layers: int
    embed: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    context: int
    rope_theta: float
    rms_eps: float


@dataclass(frozen=True)
class Section:
    """One section of the body: ``kind`` raw (tensor bytes, concatenated), zeros, or f32 (converted vector)."""

    name: str
    type_name: str
    code: int
    size: int
    kind: str
    tensors: tuple[TensorInfo, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class LmHead:
    """What happens to an untied ``output.weight``."""

    present: bool
    decision: str  # "tied" | "copy" | "dropped" | "pending"
    relative_rmse: float | None = None
    message: str = ""


@dataclass
class BumpPlan:
    """A complete, validated conversion plan."""

    profile: str
    hyper: Hyper
    sections: list[Section]
    lm_head: LmHead
    biases: list[str] = field(default_factory=list)

    @property
    def codes(self) -> bytes:
        return bytes(s.code for s in self.sections)

    @property
    def body_offset(self) -> int:
        """File offset of the first section (after header, count and codes)."""
        return 128 + 4 + len(self.sections)

    @property
    def total_size(self) -> int:
        return self.body_offset + sum(s.size for s in self.sections)

    def header(self, checksum: bytes = b"\0" * 32) -> BumpHeader:
        h = self.hyper
        return BumpHeader(h.n_layers, h.vocab, h.embed, h.context, h.heads, h.head_dim, h.embed, h.head_dim,
                          align_context(h.context), checksum)

    def offsets(self) -> list[int]:
        out, pos = [], self.body_offset
        for s in self.sections:
            out.append(pos)
            pos += s.size
        return out


VECTOR_TYPES = ("F32", "F16", "BF16")
_KNOWN = re.compile(r"^(token_embd\.weight|output_norm\.weight|output\.weight|blk\.\d+\.(attn_norm\.weight|"
                    r"ffn_norm\.weight|attn_[qkv]\.(weight|bias)|attn_output\.weight|ffn_(gate|up|down)\.weight))$")
LAYER_TENSORS = ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                 "ffn_down")


def _num(f: GGUFFile, key: str) -> Any:
    v = f.get(key)
    return v.item() if isinstance(v, np.generic) else v


def read_hyper(f: GGUFFile, context: int | None = None) -> Hyper:
    """Hyperparameters per bump.md §5 (refusing what BUMPWGT3 cannot express)."""
    arch = f.architecture
    if not arch:
        raise BumpRefusal("The file has no general.architecture key, so its hyperparameters cannot be read.")
    p = f"{arch}."
    if not f.has_tensor("token_embd.weight"):
        raise BumpRefusal("Missing tensor token_embd.weight: BUMPWGT3 needs the token embedding.")
    emb = f.tensor("token_embd.weight")
    embed = int(_num(f, p + "embedding_length") or emb.ne[0])
    layers_seen = [int(m.group(1)) for t in f.tensors if (m := re.match(r"blk\.(\d+)\.", t.name))]
    n_layers = int(_num(f, p + "block_count") or (max(layers_seen) + 1 if layers_seen else 0))
    heads = _num(f, p + "attention.head_count")
    if not heads:
        raise BumpRefusal(f"Missing {p}attention.head_count: the number of attention heads is required.")
    heads = int(heads)
    kv = int(_num(f, p + "attention.head_count_kv") or heads)
    if embed % heads:
        raise BumpRefusal(f"embedding_length {embed} is not a multiple of head_count {heads}; BUMPWGT3 needs "
                          "head_dim = embed / heads.")
    hd = embed // heads
    key_len = _num(f, p + "attention.key_length")
    if key_len is not None and int(key_len) != hd:
        raise BumpRefusal(f"{arch} uses head_dim {key_len} ({p}attention.key_length) but BUMPWGT3 derives head_dim "
                          f"as embed/heads = {hd}; the attention weights have no slot of that shape.")
    ffn = _num(f, p + "feed_forward_length")
    if ffn is None:
        if not f.has_tensor("blk.0.ffn_gate.weight"):
            raise BumpRefusal("No feed_forward_length key and no blk.0.ffn_gate.weight to read it from.")
        ffn = f.tensor("blk.0.ffn_gate.weight").ne[1]
    ctx = context if context is not None else _num(f, p + "context_length")
    if not ctx or int(ctx) <= 0:
        raise BumpRefusal(f"Missing {p}context_length; give the context length with --context.")
    theta = _num(f, p + "rope.freq_base")
    eps = _num(f, p + "attention.layer_norm_rms_epsilon")
    return Hyper(arch, n_layers, embed, heads, kv, hd, int(ffn), emb.ne[1] if len(emb.ne) > 1 else 1, int(ctx),
                 float(np.float32(theta if theta is not None else 10000.0)),
                 float(np.float32(eps if eps is not None else 1e-5)))


def _group_names(names: list[str]) -> str:
    """``blk.N.x (18 layers), output.extra`` for a list of tensor names."""
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(re.sub(r"^blk\.\d+\.", "blk.N.", n), []).append(n)
    return ", ".join(f"{k} ({len(v)} layers)" if len(v) > 1 else v[0] for k, v in sorted(groups.items()))


def plan_conversion(f: GGUFFile, profile: str = "ckernel", context: int | None = None,
                    drop_untied_head: bool = False, check_head: bool = True) -> BumpPlan:
    """Validate ``f`` for BUMPWGT3 and lay out every section; raises :class:`BumpRefusal` with the reason.

    ``check_head=False`` leaves the lm_head decision ``pending`` (the converter decides it while writing)."""
    if profile not in PROFILES:
        raise BumpRefusal(f"Unknown profile {profile!r}; choose one of {', '.join(PROFILES)}.")
    if f.problems:
        raise BumpRefusal(f"The GGUF file has problems that make its tensors unreadable: {f.problems[0]}")
    leftover = [t.name for t in f.tensors if not _KNOWN.match(t.name)]
    if leftover:
        arch = f.architecture or "this model"
        raise BumpRefusal(f"{arch} has tensors with no slot in BUMPWGT3: {_group_names(leftover)}. Converting "
                          "would silently drop them and change the model, so the conversion is refused.")
    h = read_hyper(f, context)
    codes = PROFILES[profile]
    accepted = ACCEPTED_WEIGHTS[profile]
    used: set[str] = set()

    def tensor(name: str) -> TensorInfo:
        if not f.has_tensor(name):
            raise BumpRefusal(f"Missing tensor {name}: every BUMPWGT3 layer needs it.")
        used.add(name)
        return f.tensor(name)

    def expect_shape(t: TensorInfo, ne: tuple[int, ...]) -> None:
        if t.ne != ne:
            raise BumpRefusal(f"Tensor {t.name} has shape {list(t.ne)} but BUMPWGT3 expects {list(ne)} for "
                              f"embed {h.embed}, heads {h.heads}, kv heads {h.kv_heads}, ffn {h.ffn}.")

    def weight(name: str, ne: tuple[int, ...]) -> TensorInfo:
        t = tensor(name)
        expect_shape(t, ne)
        assert t.type is not None
        if t.type.name not in accepted:
            if t.type.name in codes:
                why = (f"the {profile} profile has a code for it, but neither the reference converter nor the runtime "
                       "accepts it")
            else:
                why = f"the {profile} profile has no dtype code for it"
            raise BumpRefusal(f"Tensor {name} is {t.type.name}: {why} (weights must be {', '.join(accepted)}). "
                              "Requantize the model or pick another profile.")
        if t.ne[0] % t.type.block_elems:
            raise BumpRefusal(f"Tensor {name}: rows of {t.ne[0]} are not a multiple of {t.type.name}'s block of "
                              f"{t.type.block_elems}.")
        return t

    def vector(name: str, n: int, *, optional: bool = False, exact: bool = True) -> TensorInfo | None:
        if optional and not f.has_tensor(name):
            return None
        t = tensor(name)
        assert t.type is not None
        if t.type.name not in VECTOR_TYPES or len(t.ne) != 1:
            raise BumpRefusal(f"Tensor {name} is a {t.type.name} tensor of shape {list(t.ne)}; norms and biases must "
                              "be 1-D F32, F16 or BF16.")
        if exact and t.ne[0] != n:
            raise BumpRefusal(f"Tensor {name} has {t.ne[0]} elements but its slot holds {n}.")
        return t

    E, hd = h.embed, h.head_dim
    q_dim, kv_dim = h.heads * hd, h.kv_heads * hd
    sections: list[Section] = []
    emb = weight("token_embd.weight", (E, h.vocab))
    sections.append(Section("token_emb", emb.type_name, codes[emb.type_name], emb.n_bytes or 0, "raw", (emb,)))
    sections.append(Section("pos_emb", "F32", 0, 4 * h.context * E, "zeros", note="zeros (RoPE model)"))
    biases: list[str] = []

    def f32_section(name: str, t: TensorInfo | None, n: int, note: str = "") -> Section:
        if t is None:
            return Section(name, "F32", 0, 4 * n, "zeros", note="zeros")
        return Section(name, "F32", 0, 4 * n, "f32", (t,), note or f"{t.name} as float32")

    for i in range(h.n_layers):
        b = f"blk.{i}."
        ln1 = vector(b + "attn_norm.weight", E)
        ln2 = vector(b + "ffn_norm.weight", E)
        wq = weight(b + "attn_q.weight", (E, q_dim))
        bq = vector(b + "attn_q.bias", q_dim, optional=True, exact=False)
        wk = weight(b + "attn_k.weight", (E, kv_dim))
        bk = vector(b + "attn_k.bias", kv_dim, optional=True, exact=False)
        wv = weight(b + "attn_v.weight", (E, kv_dim))
        bv = vector(b + "attn_v.bias", kv_dim, optional=True, exact=False)
        wo = weight(b + "attn_output.weight", (q_dim, E))
        gate = weight(b + "ffn_gate.weight", (E, h.ffn))
        up = weight(b + "ffn_up.weight", (E, h.ffn))
        if gate.type_name != up.type_name:
            raise BumpRefusal(f"Tensors {gate.name} ({gate.type_name}) and {up.name} ({up.type_name}) differ in type; "
                              "BUMPWGT3 stores them as one w1 section with one dtype.")
        down = weight(b + "ffn_down.weight", (h.ffn, E))
        for bias in (bq, bk, bv):
            if bias is not None:
                biases.append(bias.name)
        L = f"layer.{i}."
        sections += [
            f32_section(L + "ln1_gamma", ln1, E),
            f32_section(L + "ln2_gamma", ln2, E),
            Section(L + "wq", wq.type_name, codes[wq.type_name], wq.n_bytes or 0, "raw", (wq,)),
            f32_section(L + "bq", bq, q_dim),
            Section(L + "wk", wk.type_name, codes[wk.type_name], wk.n_bytes or 0, "raw", (wk,)),
            f32_section(L + "bk", bk, kv_dim),
            Section(L + "wv", wv.type_name, codes[wv.type_name], wv.n_bytes or 0, "raw", (wv,)),
            f32_section(L + "bv", bv, kv_dim),
            Section(L + "wo", wo.type_name, codes[wo.type_name], wo.n_bytes or 0, "raw", (wo,)),
            f32_section(L + "bo", None, E),
            Section(L + "w1", gate.type_name, codes[gate.type_name], (gate.n_bytes or 0) + (up.n_bytes or 0), "raw",
                    (gate, up), "ffn_gate then ffn_up"),
            f32_section(L + "b1", None, 2 * h.ffn),
            Section(L + "w2", down.type_name, codes[down.type_name], down.n_bytes or 0, "raw", (down,)),
            f32_section(L + "b2", None, E),
        ]
    final = vector("output_norm.weight", E)
    sections.append(f32_section("final_ln_gamma", final, E))
    sections.append(f32_section("final_ln_bias", None, E))
    assert len(sections) == 14 * h.n_layers + 4
    assert [s.name.split(".")[-1] for s in sections[2:16]] == list(PER_LAYER) or h.n_layers == 0

    leftover = [t.name for t in f.tensors if t.name not in used and t.name != "output.weight"]
    if leftover:
        raise BumpRefusal(f"{h.arch} has tensors with no slot in BUMPWGT3: {_group_names(leftover)}. Converting "
                          "would silently drop them and change the model, so the conversion is refused.")
    if check_head:
        lm = decide_lm_head(f, drop_untied_head)
    else:
        lm = LmHead(f.has_tensor("output.weight"), "pending")
    return BumpPlan(profile, h, sections, lm, biases)


#: Relative RMS difference below which output.weight counts as a requantized copy of token_embd. Two
#: quantizations of one matrix differ by a few percent; unrelated matrices by ~140%.
COPY_THRESHOLD = 0.15


def head_difference(f: GGUFFile, a: TensorInfo, b: TensorInfo, max_rows: int = 4096, run: int = 64) -> float:
    """sqrt(Σ(a-b)²/Σb²) over the dequantized matrices (native kernels), on up to ``max_rows`` rows taken as evenly
    spaced runs of ``run`` consecutive rows: two quantizations of one matrix differ by a few percent, unrelated ones
    by ~140%, so a sample decides it. Runs keep the reads sequential (few page faults); one thread, no BLAS, since
    this runs beside the writer and the hasher."""
    from ..native import kernels as K

    ra, rb = f.tensor_rows(a), f.tensor_rows(b)
    n = a.n_rows
    n_runs = max(1, min(n, max_rows) // run)
    starts = np.unique(np.linspace(0, max(0, n - run), n_runs).astype(np.int64))
    num = den = 0.0
    for r0 in starts.tolist():
        r1 = min(n, r0 + run)
        x = K.dequantize(ra[r0:r1], a.type, threads=1)  # type: ignore[arg-type]
        y = K.dequantize(rb[r0:r1], b.type, threads=1)  # type: ignore[arg-type]
        x -= y
        num += float(np.einsum("i,i->", x.reshape(-1), x.reshape(-1)))
        den += float(np.einsum("i,i->", y.reshape(-1), y.reshape(-1)))
        for t in (a, b):  # keep resident memory bounded: drop the rows' pages once compared
            row = t.row_bytes or 0
            f.release_pages(t.data_offset + r0 * row, (r1 - r0) * row, shard=t.shard)
    return float(np.sqrt(num / den)) if den > 0 else float("inf")


def decide_lm_head(f: GGUFFile, drop_untied_head: bool) -> LmHead:
    """Tied (no output.weight), a requantized copy (dropped harmlessly), or a distinct head (refused / dropped)."""
    if not f.has_tensor("output.weight"):
        return LmHead(False, "tied", None, "no output.weight: the model ties its lm_head to token_embd")
    out, emb = f.tensor("output.weight"), f.tensor("token_embd.weight")
    rel: float | None = None
    if out.ne == emb.ne and out.type is not None and emb.type is not None:
        rel = head_difference(f, out, emb)
        if rel < COPY_THRESHOLD:
            return LmHead(True, "copy", rel, f"output.weight ({out.type_name}) is a requantized copy of token_embd "
                          f"({emb.type_name}): relative RMS difference {rel:.2%}; dropped, the runtime uses tok_emb")
    why = (f"relative RMS difference {rel:.0%}" if rel is not None else f"shape {list(out.ne)} vs {list(emb.ne)}")
    if drop_untied_head:
        return LmHead(True, "dropped", rel, f"output.weight differs from token_embd ({why}); dropped as asked "
                      "(--drop-untied-head): the converted model uses token_embd as its lm_head")
    raise BumpRefusal(f"output.weight is a genuinely different lm_head ({why}) and BUMPWGT3 has no slot for it; the "
                      "runtime would use token_embd instead and produce a different model. Pass --drop-untied-head "
                      "to convert anyway.")
