"""A reference without the catalogue's quantization grid, computing the same function (issue 39's benchmark).

The catalogue models are already quantized (Q4_K_M, Q4_1), so their F16 requantization is a dequantized file: every
tensor lies on the grid of its original type and requantizes to that type almost losslessly, which flatters any mix
that happens to give a tensor its original type. :func:`degrid` removes that artefact without changing what the
model computes: it rescales channels in pairs whose product the network never sees separately,

- each channel j of a layer's pre-attention (pre-FFN) norm weight by s_j, and input column j of Q, K and V (gate
  and up) by 1/s_j -- the norm's output only ever reaches those matrices;
- each row i of ffn_up by t_i and input column i of ffn_down by 1/t_i -- the gated product is linear in up's output;
- each row (kv head h, dim d) of V (and its bias) by u_hd and every input column of attn_output that reads that value
  channel (one per query head of the group) by 1/u_hd -- attention mixes V's rows linearly;

with s, t, u drawn log-uniformly from [e^-spread, e^spread]. Blocks run along a matrix's input columns, so every
layer matrix ends up with different scales inside each block and none of them is on any grid (the token embedding,
which feeds the residual stream directly, is left as it is). The function changes only by the F16 rounding of the
rescaled weights; :func:`check` measures that (mean KL divergence between the two files, expected ~1e-6).

    .venv/bin/python tests/bench/degrid.py IN-F16.gguf OUT.gguf [--seed 39] [--spread 0.35]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import BinaryIO

import numpy as np

from quantscope.core.gguf.reader import TensorInfo


def _matrix(mm: np.ndarray, t: TensorInfo) -> np.ndarray:
    dt = {"F16": np.float16, "F32": np.float32}.get(t.type_name)
    if dt is None:
        raise ValueError(f"{t.name} is {t.type_name}: degrid needs an F16/F32 file")
    n = t.n_elements * np.dtype(dt).itemsize
    return mm[t.data_offset:t.data_offset + n].view(dt).reshape(t.shape)


def _rescale(fh: BinaryIO, src: str | os.PathLike[str], seed: int, spread: float) -> dict[str, int]:
    """Rescale the channel pairs of the copy of ``src`` open in ``fh``, in place; how many tensors per role."""
    from quantscope.core.gguf import GGUFFile

    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    with GGUFFile(src) as f:
        arch = f.architecture or ""
        n_head = int(f.metadata[f"{arch}.attention.head_count"].value)
        names = {t.name: t for t in f.tensors}
        n_layers = int(f.metadata[f"{arch}.block_count"].value)
        mm = np.memmap(fh, dtype=np.uint8, mode="r+")

        def scale(name: str, factor: np.ndarray, axis: int, role: str) -> None:
            t = names.get(name)
            if t is None:
                return
            a = _matrix(mm, t)
            v = a.astype(np.float32)
            v *= factor.reshape((-1, 1) if axis == 0 else (1, -1)) if a.ndim == 2 else factor
            if not np.isfinite(v).all() or (a.dtype == np.float16 and np.abs(v).max() > 65000):
                raise ValueError(f"{name}: rescaling leaves the F16 range")
            a[...] = v.astype(a.dtype)
            counts[role] = counts.get(role, 0) + 1

        def draw(n: int) -> np.ndarray:
            return np.exp(rng.uniform(-spread, spread, n)).astype(np.float32)

        for i in range(n_layers):
            p = f"blk.{i}."
            for norm, mats in (("attn_norm", ("attn_q", "attn_k", "attn_v")),
                               ("ffn_norm", ("ffn_gate", "ffn_up"))):
                t = names.get(p + norm + ".weight")
                if t is None or not all(p + m + ".weight" in names for m in mats):
                    continue
                s = draw(t.ne[0])
                scale(p + norm + ".weight", s, 1, "norm")
                for m in mats:
                    scale(p + m + ".weight", 1.0 / s, 1, "input columns")
            if p + "ffn_up.weight" in names and p + "ffn_down.weight" in names:
                up = names[p + "ffn_up.weight"]
                tt = draw(up.ne[1])
                scale(p + "ffn_up.weight", tt, 0, "ffn_up rows")
                scale(p + "ffn_down.weight", 1.0 / tt, 1, "ffn_down columns")
            if p + "attn_v.weight" in names and p + "attn_output.weight" in names:
                # value channels: kv heads x head size; each query head of a group reads its kv head's ones
                v = names[p + "attn_v.weight"]
                o = names[p + "attn_output.weight"]
                n_v = v.ne[1]
                if o.ne[0] % n_head or n_v % (o.ne[0] // n_head):
                    continue
                hd = o.ne[0] // n_head
                n_kv = n_v // hd
                u = draw(n_v)
                scale(p + "attn_v.weight", u, 0, "attn_v rows")
                scale(p + "attn_v.bias", u, 1, "attn_v bias")
                group = n_head // n_kv
                cols = np.concatenate([u[(h // group) * hd:(h // group + 1) * hd] for h in range(n_head)])
                scale(p + "attn_output.weight", 1.0 / cols, 1, "attn_output columns")
        mm.flush()
    return counts


def degrid(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, seed: int = 39,
           spread: float = 0.35) -> dict[str, int]:
    """Write ``dst``: ``src`` (an F16/F32 file of a llama-like architecture) with the channel pairs above rescaled;
    returns how many tensors were changed per role. Written through a temporary and a rename
    (:class:`~quantscope.core.fsutil.OutputSet`)."""
    from quantscope.core.fsutil import OutputSet

    with OutputSet([("output", dst)], inputs=[src]) as outs:
        with open(outs.open("output"), "r+b", closefd=False) as fh:  # the set closes it on commit
            with open(src, "rb") as fin:
                shutil.copyfileobj(fin, fh, 16 << 20)
            fh.flush()
            counts = _rescale(fh, src, seed, spread)
        outs.commit()
    return counts


def check(a: str | os.PathLike[str], b: str | os.PathLike[str], text: str, n_ctx: int = 128,
          threads: int = 2) -> float:
    """Mean KL divergence of ``b``'s next-token distribution from ``a``'s over one chunk of ``text``."""
    from quantscope.core.engine.session import Model
    from quantscope.core.gguf import GGUFFile
    from quantscope.core.tokenizer import Tokenizer

    with GGUFFile(a) as f:
        ids = Tokenizer(f).encode(text)[:n_ctx]
    out = []
    for p in (a, b):
        s = Model.load(str(p), threads=threads).session(n_ctx)
        lg = s.forward(ids, all_logits=True).astype(np.float64)
        lg -= lg.max(axis=1, keepdims=True)
        out.append(lg - np.log(np.exp(lg).sum(axis=1, keepdims=True)))
    return float((np.exp(out[0]) * (out[0] - out[1])).sum(axis=1).mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--seed", type=int, default=39)
    ap.add_argument("--spread", type=float, default=0.35)
    ap.add_argument("--check", type=Path, help="a text: print the KL divergence between the two files on it")
    args = ap.parse_args()
    print(degrid(args.src, args.dst, seed=args.seed, spread=args.spread))
    if args.check:
        print(f"mean KLD {check(args.src, args.dst, args.check.read_text(encoding='utf-8')):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
