"""The probe: one prompt's forward pass with its insides kept, and what they show (docs/probe.md).

:func:`run_probe` runs a prompt (at most :data:`MAX_PROBE_TOKENS`) through a fresh session of the model with a
:class:`~.session.ForwardTrace`, keeping the residual stream entering every layer and leaving the last, and every
attention layer's queries. From those:

- :func:`logit_lens`: each residual row through the final norm and the output head, as if the model ended there:
  the top tokens per layer and position, and the rank/probability of a target token (the model's final prediction,
  or the prompt's next token);
- :meth:`Probe.attention`: a layer's attention weights per head, by the native attention's own code against the
  session's cached keys;
- :func:`activations`: the residual stream's RMS per position and per channel, and its largest channels;
- :func:`channel_links`: the weight columns and rows that read and write one channel of the stream.

Residual index ``i`` is the stream entering layer ``i``: 0 is the (scaled) token embeddings, ``n_layers`` the
stream after the last layer, before the final norm.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ..jobs import CancelFlag, check_cancel
from .session import ForwardTrace, InferenceSession, Model

MAX_PROBE_TOKENS = 1024
TARGETS = ("final", "next")


class ProbeError(ValueError):
    """A probe that cannot run (no tokens, too many, a recurrent layer's attention, …)."""


@dataclass
class Probe:
    """One prompt's forward pass, kept. ``resid[i]``: (T, n_embd) float32 entering layer ``i`` (see the module
    docstring); ``queries[layer]``: (T, n_head, head_dim) as the attention used them; ``session``: the session
    whose KV cache holds the prompt (for :meth:`attention`), on either backend."""

    model: Model
    tokens: list[int]
    pieces: list[str]
    resid: list[np.ndarray]
    queries: dict[int, np.ndarray]
    positions: np.ndarray
    session: InferenceSession

    @property
    def n_layers(self) -> int:
        return self.model.config.n_layers

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @staticmethod
    def resid_label(index: int) -> str:
        """``emb`` for the embeddings, else the layer that wrote the stream (``0`` for index 1)."""
        return "emb" if index == 0 else str(index - 1)

    def has_attention(self, layer: int) -> bool:
        return layer in self.queries

    def window(self, layer: int) -> int:
        """The layer's sliding window in positions (0: it sees the whole prefix)."""
        return self.model.config.layer_window(layer)

    def attention(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s attention weights ``(n_head, T, T)`` (query, key) float32, NaN where a query does not
        see a key (a later position, or outside the layer's sliding window)."""
        if not 0 <= layer < self.n_layers:
            raise ProbeError(f"layer {layer} is outside 0..{self.n_layers - 1}")
        if layer not in self.queries:
            raise ProbeError(f"layer {layer} is a recurrent (delta-net) layer: it has no attention weights")
        w = self.session.attention_weights(layer, self.queries[layer], self.positions)
        out = np.ascontiguousarray(w.transpose(1, 0, 2))
        out[:, ~visible_mask(self.n_tokens, self.window(layer))] = np.nan
        return out


def head_average(weights: np.ndarray) -> np.ndarray:
    """The mean over heads of :meth:`Probe.attention`'s ``(n_head, T, T)`` weights, NaN where they are masked."""
    hidden = np.isnan(weights[0])
    out = np.nan_to_num(weights, nan=0.0).mean(axis=0, dtype=np.float64).astype(np.float32)
    out[hidden] = np.nan
    return out


def visible_mask(n: int, window: int) -> np.ndarray:
    """(query, key) pairs that attention sees: the causal triangle, cut to the last ``window`` keys when > 0."""
    q = np.arange(n)[:, None]
    k = np.arange(n)[None, :]
    m = k <= q
    if window > 0:
        m &= k > q - window
    return m


def run_probe(model: Model, tokens: Iterable[int], pieces: list[str] | None = None,
              cancel: CancelFlag | None = None, progress: Callable[[float], None] | None = None,
              kv_dtype: type = np.float16,
              make_session: Callable[[int, type], InferenceSession] | None = None) -> Probe:
    """Run ``tokens`` (1..:data:`MAX_PROBE_TOKENS`) from position 0 in a fresh session of ``model`` (an F16 KV
    cache, as the chat's) and keep what the probe shows; ``progress`` gets the fraction of layers done, ``cancel``
    stops between layers with :class:`~quantscope.core.jobs.Cancelled`. ``make_session(n_ctx, kv_dtype)``: the
    session to run in (e.g. a GPU one); default the CPU's."""
    ids = [int(t) for t in tokens]
    if not ids:
        raise ProbeError("the prompt has no tokens")
    if len(ids) > MAX_PROBE_TOKENS:
        raise ProbeError(f"the prompt has {len(ids)} tokens; the probe takes at most {MAX_PROBE_TOKENS}")
    c = model.config
    if min(ids) < 0 or max(ids) >= c.n_vocab:
        raise ProbeError(f"token ids must lie in 0..{c.n_vocab - 1}")
    check_cancel(cancel)
    session = make_session(len(ids), kv_dtype) if make_session is not None else model.session(len(ids), kv_dtype)

    def after(li: int) -> None:
        check_cancel(cancel)
        if progress is not None:
            progress((li + 1) / c.n_layers)

    trace = ForwardTrace(after)
    session.forward(ids, logits=False, trace=trace)
    return Probe(model, ids, list(pieces) if pieces is not None else [str(t) for t in ids], trace.resid,
                 trace.queries, trace.positions, session)


@dataclass
class LogitLens:
    """The logit lens of a probe: per residual index (rows; see :meth:`Probe.resid_label`) and position. ``top_ids``
    / ``top_probs``: the ``k`` likeliest tokens (descending); ``targets``: the token followed per position;
    ``target_rank`` (0: the likeliest), ``target_prob``; ``entropy`` in nats."""

    target_kind: str
    targets: np.ndarray  # (T,) int64
    top_ids: np.ndarray  # (L + 1, T, k) int32
    top_probs: np.ndarray  # (L + 1, T, k) float32
    target_rank: np.ndarray  # (L + 1, T) int64
    target_prob: np.ndarray  # (L + 1, T) float32
    entropy: np.ndarray  # (L + 1, T) float32


def _lens_rows(session: InferenceSession, x: np.ndarray, targets: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """Top-k, the targets (-1: the row's argmax), their rank and probability, and the entropy of rows ``x``. The
    logits are float32 (as the head computes them), and so are the exponentials and their pairwise sums (no BLAS:
    its threads would compete with the engine's)."""
    logits = session.head(x)
    n, v = logits.shape
    rows = np.arange(n)
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    total = e.sum(axis=1).astype(np.float64)  # (numpy's pairwise float32 sums: ~1e-7 relative here)
    np.multiply(e, z, out=e)
    entropy = np.log(total) - e.sum(axis=1).astype(np.float64) / total
    kk = min(k, v)
    # the k-th largest value per row (a value partition is cheaper than an index one), then every entry at or
    # above it, ordered by row, value (descending) and index: the first k of each row, ties to the lower index
    kth = np.partition(z, v - kk, axis=1)[:, v - kk]
    flat = np.flatnonzero(z >= kth[:, None])
    r, c = flat // v, flat % v
    order = np.lexsort((c, -z[r, c], r))
    r, c = r[order], c[order]
    starts = np.concatenate(([0], np.cumsum(np.bincount(r, minlength=n))[:-1]))
    top = c[starts[:, None] + np.arange(kk)[None, :]]
    top_p = np.exp(np.take_along_axis(z, top, 1).astype(np.float64)) / total[:, None]
    tgt = np.where(targets < 0, top[:, 0], targets)
    zt = z[rows, tgt]
    rank = (z > zt[:, None]).sum(axis=1)
    prob = np.exp(zt.astype(np.float64)) / total
    return (top.astype(np.int32), top_p.astype(np.float32), tgt.astype(np.int64), rank.astype(np.int64),
            prob.astype(np.float32), entropy.astype(np.float32))


def logit_lens(probe: Probe, top: int = 5, target: str = "final", cancel: CancelFlag | None = None,
               progress: Callable[[float], None] | None = None, chunk: int = 32) -> LogitLens:
    """:class:`LogitLens` of ``probe``: every residual row through :meth:`~.session.Session.head`. ``target``:
    ``final``, the model's own prediction at each position (the last row's top token); ``next``, the prompt's next
    token (the final prediction at the last position)."""
    if target not in TARGETS:
        raise ProbeError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
    if not 1 <= top <= 100:
        raise ProbeError(f"top must lie in 1..100, not {top}")
    L1, T = len(probe.resid), probe.n_tokens
    top_ids = np.zeros((L1, T, top), np.int32)
    top_probs = np.zeros((L1, T, top), np.float32)
    rank = np.zeros((L1, T), np.int64)
    prob = np.zeros((L1, T), np.float32)
    ent = np.zeros((L1, T), np.float32)
    targets = np.full(T, -1, np.int64)  # -1: the final row's argmax, filled in by the first pass
    if target == "next":
        targets[:-1] = probe.tokens[1:]
    order = [L1 - 1, *range(L1 - 1)]  # the last row first: it gives the final prediction
    for n, i in enumerate(order):
        for a in range(0, T, chunk):
            check_cancel(cancel)
            b = min(T, a + chunk)
            ti, tp, tg, rk, pr, en = _lens_rows(probe.session, probe.resid[i][a:b], targets[a:b], top)
            w = ti.shape[1]
            top_ids[i, a:b, :w], top_probs[i, a:b, :w] = ti, tp
            rank[i, a:b], prob[i, a:b], ent[i, a:b] = rk, pr, en
            if n == 0:
                targets[a:b] = tg
        if progress is not None:
            progress((n + 1) / L1)
    return LogitLens(target, targets, top_ids, top_probs, rank, prob, ent)


@dataclass
class Activations:
    """The residual stream's size per residual index (rows, see :meth:`Probe.resid_label`): ``rms`` per position,
    ``channel_rms`` (RMS over the positions) and ``channel_max`` (largest magnitude) per channel."""

    rms: np.ndarray  # (L + 1, T) float32
    channel_rms: np.ndarray  # (L + 1, n_embd) float32
    channel_max: np.ndarray  # (L + 1, n_embd) float32

    def layer_rms(self) -> np.ndarray:
        """The RMS over all positions of each residual index, ``(L + 1,)`` float64 (the positions' RMS combined)."""
        return np.sqrt((self.rms.astype(np.float64) ** 2).mean(axis=1))

    def top_channels(self, index: int, n: int = 8) -> list[tuple[int, float, float]]:
        """The ``n`` channels of largest RMS at residual ``index``: (channel, rms, max |x|), largest first."""
        row = self.channel_rms[index]
        idx = np.argsort(-row, kind="stable")[:n]
        return [(int(c), float(row[c]), float(self.channel_max[index, c])) for c in idx]

    def outlier_ratio(self, index: int) -> float:
        """The largest channel RMS over the median channel's: how far the outlier dimensions stand out."""
        row = self.channel_rms[index]
        med = float(np.median(row))
        return float(row.max()) / med if med > 0 else float("inf")


def activations(probe: Probe) -> Activations:
    """:class:`Activations` of ``probe`` (float64 sums)."""
    rs = [r.astype(np.float64) for r in probe.resid]
    rms = np.stack([np.sqrt((r * r).mean(axis=1)) for r in rs]).astype(np.float32)
    ch = np.stack([np.sqrt((r * r).mean(axis=0)) for r in rs]).astype(np.float32)
    mx = np.stack([np.abs(r).max(axis=0) for r in rs]).astype(np.float32)
    return Activations(rms, ch, mx)


#: the matrices of a layer that read the (normed) residual stream: one column per channel
_READERS = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ffn_gate", "ffn_up",
            "ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp")
#: the matrices of a layer that write into it: one row per channel
_WRITERS = ("attn_output", "ssm_out", "ffn_down", "ffn_down_shexp")


def channel_links(tensor_names: Iterable[str], n_layers: int, index: int) -> list[tuple[str, str]]:
    """The 2-D weights that touch a channel of residual ``index``, as (tensor name, ``column`` or ``row``: the
    channel's column or row there): the columns of the matrices that read the stream (layer ``index``, or the
    output head after the last layer) and the rows of those that wrote it (layer ``index - 1``; the embedding
    table's column at index 0)."""
    names = set(tensor_names)
    out: list[tuple[str, str]] = []
    if index == 0:
        out.append(("token_embd.weight", "column"))
    else:
        out += [(f"blk.{index - 1}.{w}.weight", "row") for w in _WRITERS]
    if index < n_layers:
        out += [(f"blk.{index}.{r}.weight", "column") for r in _READERS]
    else:
        out.append(("output.weight" if "output.weight" in names else "token_embd.weight", "column"))
    seen: set[str] = set()
    return [(n, a) for n, a in out if n in names and not (n in seen or seen.add(n))]
