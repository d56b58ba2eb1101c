"""The bound weights: matrices as zero-copy :class:`Weight` views of the mapped file, vectors as float32 copies,
grouped per layer (:class:`LayerWeights`) and for the whole model (:class:`ModelWeights`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..base.ggml_types import GGMLType
from .config import ModelConfig


@dataclass(frozen=True)
class Weight:
    """A weight matrix (``rows`` × ``k``, raw bytes of ``type``) or vector, viewed in the mapped file."""

    name: str
    type: GGMLType
    data: np.ndarray
    rows: int
    k: int

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass
class GDNWeights:
    """A gated delta-net layer's own tensors beyond attn_qkv (the layer's wq) and ssm_out (its wo)."""

    z: Weight  # attn_gate: value heads x state rows (the output gate)
    beta: Weight  # ssm_beta: one row per value head
    alpha: Weight  # ssm_alpha
    conv: np.ndarray  # ssm_conv1d: [channels][taps], flattened
    dt_bias: np.ndarray  # ssm_dt.bias (value heads)
    a: np.ndarray  # ssm_a: -exp(A_log) (value heads)
    norm: np.ndarray  # ssm_norm (state)


@dataclass
class LayerWeights:
    attn_norm: np.ndarray | None
    wq: Weight
    wk: Weight | None  # None: the layer reads an earlier layer's KV cache (ModelConfig.kv_source)
    wv: Weight | None  # wk again where V is K's projection (gemma4 without attn_v)
    wo: Weight
    ffn_norm: np.ndarray | None
    w_gate: Weight
    w_up: Weight
    w_down: Weight
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    ple_gate: Weight | None = None  # gemma4's per-layer embedding: ple_dim x n_embd
    ple_proj: Weight | None = None  # n_embd x ple_dim
    ple_post_norm: np.ndarray | None = None
    out_scale: np.ndarray | None = None  # gemma4: the layer's output multiplied by this one value
    router: Weight | None = None  # experts: ffn_gate_inp (n_expert x n_embd); w_gate/w_up/w_down then hold every
    # expert's matrix back to back (ffn_*_exps)
    bo: np.ndarray | None = None  # gpt-oss: attn_output.bias (n_embd)
    sinks: np.ndarray | None = None  # attn_sinks.weight (n_head)
    b_router: np.ndarray | None = None  # ffn_gate_inp.bias (n_expert)
    b_gate: np.ndarray | None = None  # ffn_gate_exps.bias, ffn_up_exps.bias (n_expert x n_ff), ffn_down_exps.bias
    b_up: np.ndarray | None = None  # (n_expert x n_embd), expert-major
    b_down: np.ndarray | None = None
    gdn: GDNWeights | None = None  # qwen35's gated delta-net layers (wq is then attn_qkv, wo ssm_out; no wk, wv)
    sh_gate: Weight | None = None  # qwen35moe's shared expert: ffn_{gate,up}_shexp (n_ff_shexp x n_embd),
    sh_up: Weight | None = None  # ffn_down_shexp (n_embd x n_ff_shexp) and its gate ffn_gate_inp_shexp (n_embd)
    sh_down: Weight | None = None
    sh_gate_inp: np.ndarray | None = None

    def matrices(self) -> list[Weight]:
        """The distinct matrices of the layer (a V that is K's projection counted once)."""
        out: list[Weight] = []
        g = self.gdn
        for w in (self.wq, self.wk, self.wv, self.wo, self.w_gate, self.w_up, self.w_down, self.ple_gate,
                  self.ple_proj, self.router, *((g.z, g.beta, g.alpha) if g else ()), self.sh_gate, self.sh_up,
                  self.sh_down):
            if w is not None and all(w is not x for x in out):
                out.append(w)
        return out


@dataclass
class ModelWeights:
    config: ModelConfig
    tok_embd: Weight
    output: Weight
    output_norm: np.ndarray
    layers: list[LayerWeights]
    tied: bool
    rope_freqs: np.ndarray | None = None  # Llama 3: rope_dim/2 divisors of the RoPE frequencies
    rope_long: np.ndarray | None = None  # Phi-3.5/4 LongRoPE: divisors for contexts beyond rope_orig_ctx
    rope_short: np.ndarray | None = None  # ... and for contexts up to it
    ple_tok_embd: Weight | None = None  # gemma4: n_vocab rows of n_layers x ple_dim
    ple_model_proj: Weight | None = None  # n_layers * ple_dim x n_embd
    ple_proj_norm: np.ndarray | None = None  # ple_dim

    def rope_factors(self, n_ctx: int) -> np.ndarray | None:
        """The RoPE frequency divisors a session of ``n_ctx`` positions uses (llama.cpp's choice), or None."""
        if self.rope_freqs is not None or self.rope_long is None:
            return self.rope_freqs
        orig = self.config.rope_orig_ctx or self.config.n_ctx_train
        return self.rope_long if n_ctx > orig else self.rope_short

    @property
    def nbytes(self) -> int:
        n = self.tok_embd.nbytes + (0 if self.tied else self.output.nbytes)
        n += sum(w.nbytes for w in (self.ple_tok_embd, self.ple_model_proj) if w is not None)
        for lw in self.layers:
            n += sum(w.nbytes for w in lw.matrices())
        return n

