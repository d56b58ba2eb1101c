"""gemma4: Gemma 4's dense text model. The layers listed in ``sliding_window_pattern`` slide (their own head size,
rotated size and RoPE base), the others rotate with rope_freqs.weight (proportional RoPE); unscaled attention over
q/k RMSNorm and a weightless V RMSNorm (a layer without attn_v uses K's projection as V); the last
``shared_kv_layers`` layers read an earlier layer's cache; optional per-layer token embeddings; a per-layer output
scale; final soft-capping."""

from __future__ import annotations

import math

from ...gguf import GGUFFile
from ..config import MAX_CTX, MAX_EMBD, MAX_HEAD_DIM, MAX_LAYERS, ModelError, UnsupportedModel
from ..metadata import read_bools, read_float, read_int
from .base import Architecture, Common


def configure(f: GGUFFile, c: Common, keys: dict[str, str]) -> dict[str, object]:
    a, n = c["arch"], c["n_layers"]
    swa = read_bools(f, keys["swa_layers"], n)  # type: ignore[arg-type]
    hd_full = c["head_dim"]
    hd_swa = read_int(f, f"{a}.attention.key_length_swa", hd_full, hi=MAX_HEAD_DIM)
    if read_int(f, f"{a}.attention.value_length_swa", hd_swa, hi=MAX_HEAD_DIM) != hd_swa:
        raise ModelError(f"{a}.attention.value_length_swa: expected {hd_swa} (= {a}.attention.key_length_swa), "
                         f"found {f.get(a + '.attention.value_length_swa')}")
    rot_full = c["rope_dim"]
    rot_swa = read_int(f, f"{a}.rope.dimension_count_swa", rot_full, hi=MAX_HEAD_DIM)
    shared = read_int(f, keys["kv_from_start"], 0, lo=0, hi=MAX_LAYERS)
    if shared >= n:  # type: ignore[operator]
        raise ModelError(f"{keys['kv_from_start']}: expected fewer than {keys['n_layers']} = {n}, found {shared}")
    if f.has_tensor("blk.0.ffn_gate_inp.weight"):
        raise UnsupportedModel(f"{a}: the mixture-of-experts variant (ffn_gate_inp) is not supported by the engine")
    return {"swa_layers": tuple(swa), "swa_pattern": 0,
            "sliding_window": read_int(f, keys["sliding_window"], hi=MAX_CTX),
            "rope_base_swa": read_float(f, f"{a}.rope.freq_base_swa", 10000.0, 1e30),
            "layer_head_dim": tuple(hd_swa if w else hd_full for w in swa),
            "layer_rope_dim": tuple(rot_swa if w else rot_full for w in swa),
            "kv_from_start": n - shared if shared else 0,  # type: ignore[operator]
            "ple_dim": read_int(f, keys["ple_dim"], 0, lo=0, hi=MAX_EMBD),
            "embed_scale": math.sqrt(c["n_embd"]), "gelu": True, "qk_norm": True, "v_norm": True,  # type: ignore[arg-type]
            "post_norms": True, "attn_scale": 1.0, "rope_freqs_global_only": True,
            "final_softcap": read_float(f, f"{a}.final_logit_softcapping", 30.0, 1e30)}


DESCRIPTION = Architecture("gemma4", configure, rope_freqs=True, v_from_k=True, layer_output_scale=True)
