"""Compute an importance matrix with Quantscope's engine (docs/quantize.md, "Computing one").

The text is cut into chunks as llama-perplexity and llama-imatrix cut it (each chunk's first token replaced by BOS
when the model adds one). Each chunk runs as one prompt through the native blocks, whose statistics hooks add
up the squares of each product's inputs: the attention projections' input (shared by q, k and v, or by a
delta-net layer's projections), attn_output's, the FFN's gate/up input and ffn_down's. For experts, each expert
gets its own rows and count. The result is an :class:`~quantscope.core.quant.imatrix.Imatrix` in llama-imatrix's
terms (one count per dense tensor, the tokens it saw); :func:`~quantscope.core.quant.imatrix.write_imatrix`
writes the GGUF llama-quantize reads.

Not collected (llama-quantize then quantizes them without importance data, as it does for any missing entry):
the output head (llama-imatrix skips it too unless ``--process-output``), a shared expert's products, a delta-net
layer's output projection and Gemma 4's per-layer-embedding products.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..quant.imatrix import Imatrix, ImatrixEntry
from . import kld

#: products whose input is the attention block's normalized input
_ATTN_IN = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_qkv.weight", "attn_gate.weight",
            "ssm_beta.weight", "ssm_alpha.weight")


class ImatrixCancelled(Exception):
    """The computation was cancelled."""


@dataclass
class _Layer:
    stats: dict[str, np.ndarray]
    names: dict[str, list[str]]  # stat key -> the tensors it belongs to


def _layer(f: object, li: int, E: int, A: int, F: int, NE: int) -> _Layer:
    from ..gguf import GGUFFile

    assert isinstance(f, GGUFFile)
    b = f"blk.{li}."

    def present(name: str, n_cols: int, n_mat: int = 1) -> bool:
        if not f.has_tensor(b + name):
            return False
        t = f.tensor(b + name)
        return t.ne[0] == n_cols and (t.ne[2] if len(t.ne) > 2 else 1) == n_mat

    names: dict[str, list[str]] = {"attn": [b + n for n in _ATTN_IN if present(n, E)]}
    if present("attn_output.weight", A):
        names["wo"] = [b + "attn_output.weight"]
    if NE:
        names["ffn"] = [b + n for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight") if present(n, E, NE)]
        names["down"] = [b + "ffn_down_exps.weight"] if present("ffn_down_exps.weight", F, NE) else []
    else:
        names["ffn"] = [b + n for n in ("ffn_gate.weight", "ffn_up.weight") if present(n, E)]
        names["down"] = [b + "ffn_down.weight"] if present("ffn_down.weight", F) else []
    sizes = {"attn": E, "wo": A, "ffn": E * max(NE, 1), "down": F * max(NE, 1)}
    stats = {k: np.zeros(sizes[k], np.float32) for k, v in names.items() if v}
    if NE:
        stats["count"] = np.zeros(NE, np.int64)
    return _Layer(stats, {k: v for k, v in names.items() if v})


def compute_imatrix(model: str | Path, text: str, *, n_ctx: int = 512, max_chunks: int = 0, threads: int = 0,
                    dataset: str = "", progress: Callable[[int, int, str], None] | None = None,
                    cancel: Callable[[], bool] | None = None, backend: str = "cpu") -> Imatrix:
    """The importance matrix of ``model`` over ``text`` in chunks of ``n_ctx`` tokens (``max_chunks``: 0 = all).
    ``dataset`` is recorded as the data set's name (llama-imatrix records the text file's path). ``backend``: as
    :class:`~.generate.Engine`'s (the GPU collects the same statistics, except per-expert ones)."""
    from .generate import Engine

    say = progress or (lambda _d, _t, _m: None)
    say(0, 1, "loading the model")
    eng = Engine(str(model), n_ctx=n_ctx, threads=threads, backend=backend)
    try:
        c = eng.model.config
        if n_ctx > c.n_ctx_train:
            raise ValueError(f"a context of {n_ctx} is longer than the model's {c.n_ctx_train}")
        if c.ple_dim or c.layer_n_ff or c.layer_n_head_kv:
            raise ValueError(f"{c.arch}: layers of different widths are not supported by the statistics hooks yet")
        chunks = kld.chunk_ids(eng.tokenizer.encode(text), n_ctx, max_chunks, min_chunks=1)
        sess = eng.session  # the engine's own (n_ctx positions): one copy of the weights on a GPU
        E, A, F, NE = c.n_embd, c.n_head * c.head_dim, c.n_ff, c.n_expert
        layers = [_layer(eng.file, li, E, A, F, NE) for li in range(c.n_layers)]
        sess.set_activation_stats([lay.stats for lay in layers])
        tok = eng.tokenizer
        t0 = time.perf_counter()
        for i, chunk in enumerate(chunks):
            if cancel is not None and cancel():
                raise ImatrixCancelled("the importance matrix was cancelled")
            ids = [int(t) for t in chunk]
            if tok.add_bos and tok.bos_id is not None:
                ids[0] = tok.bos_id
            sess.reset()
            sess.forward(ids, logits=False)
            rate = (i + 1) * n_ctx / max(time.perf_counter() - t0, 1e-9)
            say(i + 1, len(chunks), f"chunk {i + 1}/{len(chunks)} ({rate:,.0f} tokens/s)")
        sess.set_activation_stats(None)
        n_tokens = len(chunks) * n_ctx
        entries: dict[str, ImatrixEntry] = {}
        for lay in layers:
            for key, names in lay.names.items():
                sums = lay.stats[key]
                per_expert = NE and key in ("ffn", "down")
                counts = lay.stats["count"].copy() if per_expert else np.array([n_tokens], np.int64)
                for name in names:
                    entries[name] = ImatrixEntry(sums.copy(), counts.copy())
        bad = [n for n, e in entries.items() if not np.all(np.isfinite(e.sums))]
        if bad:
            raise ValueError(f"the activations of {bad[0]} overflowed (not finite); the model is not usable")
        return Imatrix(Path(model), entries, [dataset] if dataset else [], len(chunks), n_ctx)
    finally:
        eng.close()
