"""What ``quantscope inspect`` (and the GUI overview) shows about a GGUF file, as plain data."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np

from .fsutil import printable
from .gguf import GGUFFile, MetadataValue, StringArray, ValueType
from .gguf.checks import layout_problems

#: Hyperparameters shown first, as ``{arch}.{suffix}``.
HYPERPARAMETER_KEYS = (
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.sliding_window",
    "rope.freq_base",
    "rope.dimension_count",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "full_attention_interval",
    "rope.dimension_sections",
    "ssm.conv_kernel",
    "ssm.inner_size",
    "ssm.state_size",
    "ssm.time_step_rank",
    "ssm.group_count",
    "vocab_size",
)
#: A mixture-of-experts tensor: every expert's matrix of one kind in one 3-D tensor (llama.cpp's ``*_exps``).
EXPERT_TENSOR = re.compile(r"^blk\.\d+\.ffn_(?:gate|up|down|gate_up)_exps\.(?:weight|bias)$")


def _short(v: Any, max_str: int) -> str:
    if isinstance(v, str):
        return repr(v if len(v) <= max_str else v[:max_str] + "…")
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.7g}"
    if isinstance(v, (np.bool_, bool)):
        return str(bool(v))
    if isinstance(v, np.integer):
        return str(int(v))
    return repr(v)


def format_value(kv: MetadataValue, max_items: int = 4, max_str: int = 60) -> str:
    """One-line rendering; arrays as ``[STRING × 151936] 'a', 'b', …``."""
    if kv.type != ValueType.ARRAY:
        return _short(kv.value, max_str)
    return _format_array(kv.value, kv.elem_type, max_items, max_str)


def _format_array(value: Any, etype: ValueType | None, max_items: int, max_str: int) -> str:
    n = len(value)
    label = etype.name if etype is not None else "?"
    items = [
        _format_array(value[i], None, 2, max_str) if isinstance(value[i], (list, StringArray, np.ndarray))
        and etype == ValueType.ARRAY else _short(value[i], max_str)
        for i in range(min(n, max_items))
    ]
    more = ", …" if n > max_items else ""
    return f"[{label} × {n}] {', '.join(items)}{more}".rstrip()


def value_preview(kv: MetadataValue, max_items: int = 8) -> Any:
    """JSON-friendly value: scalars as is, arrays as ``{type, count, head}``."""
    if kv.type != ValueType.ARRAY:
        return kv.value
    return _array_preview(kv.value, kv.elem_type, max_items)


def _array_preview(value: Any, etype: ValueType | None, max_items: int) -> dict[str, Any]:
    head: list[Any] = []
    for i in range(min(len(value), max_items)):
        v = value[i]
        if isinstance(v, (list, StringArray, np.ndarray)) and etype == ValueType.ARRAY:
            head.append(_array_preview(v, None, max_items))
        elif isinstance(v, np.generic):
            head.append(v.item())
        else:
            head.append(v)
    return {"type": etype.name if etype else None, "count": len(value), "head": head}


def hyperparameters(f: GGUFFile) -> dict[str, Any]:
    """Architecture hyperparameters found in the metadata (plus the vocabulary size)."""
    out: dict[str, Any] = {}
    arch = f.architecture
    if arch:
        for suffix in HYPERPARAMETER_KEYS:
            v = f.get(f"{arch}.{suffix}")
            if isinstance(v, StringArray):  # not a hyperparameter's type: shown as a preview, like the metadata
                out[suffix] = _array_preview(v, ValueType.STRING, 8)
            elif v is not None:
                out[suffix] = v.item() if isinstance(v, np.generic) else v.tolist() if isinstance(v, np.ndarray) else v
    toks = f.get("tokenizer.ggml.tokens")
    if isinstance(toks, (StringArray, np.ndarray, list)) and "vocab_size" not in out:
        out["vocab_size"] = len(toks)
    return out


def embedding_summary(f: GGUFFile) -> dict[str, Any] | None:
    """An embedding model's facts (docs/embeddings.md): its pooling (``{arch}.pooling_type``, llama.cpp's
    numbers; absent: none), whether the encoder runs it, and its head: the rerank classifier (``cls``,
    ``cls.output``: rows are its outputs, read by rank pooling only), the sentence-transformers dense projections
    (``dense_2``, ``dense_3``), or none (the pooled last-layer vector is the embedding). None for a text
    generation model or a file whose configuration cannot be read."""
    from .model import ModelError, UnsupportedModel, read_config

    try:
        cfg = read_config(f)
    except (UnsupportedModel, ModelError, ValueError):
        return None
    if not cfg.is_embedding:
        return None
    key = f"{cfg.arch}.pooling_type"
    names = {t.name: t for t in f.tensors}
    out_t = names.get("cls.output.weight") or names.get("cls.weight")
    dense = [n for n in ("dense_2.weight", "dense_3.weight") if n in names]
    if out_t is not None:
        labels = f.get(f"{cfg.arch}.classifier.output_labels")
        n_out = int(out_t.ne[1]) if len(out_t.ne) > 1 else 1
        head = (f"classifier ({', '.join(n[:-7] for n in ('cls.weight', 'cls.output.weight') if n in names)}): "
                f"{n_out} output{'s' if n_out != 1 else ''}"
                + (f" ({', '.join(str(x) for x in list(labels)[:4])})" if labels is not None else "")
                + "; read by rank pooling only")
    elif dense:
        dims = " → ".join([str(cfg.n_embd)] + [str(int(names[n].ne[1])) for n in dense])
        head = f"dense projection ({', '.join(n[:-7] for n in dense)}): {dims}"
    else:
        head = f"none (the pooled vector, {cfg.n_embd} values)"
    return {"pooling": cfg.pooling, "pooling_key": key if key in f.metadata else None,
            "pooling_value": f.get(key) if key in f.metadata else None, "width": cfg.n_embd, "head": head}


def _count_key(f: GGUFFile, suffix: str) -> int:
    """A positive integer hyperparameter (the largest of a per-layer array), else 0."""
    v = f.arch_get(suffix) if f.architecture else None
    if isinstance(v, np.ndarray):
        v = v.max() if v.size and v.dtype.kind in "iu" else None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        return 0
    return max(0, int(v))


def experts_summary(f: GGUFFile) -> dict[str, Any] | None:
    """A mixture-of-experts file's expert count, experts used per token, and the parameters and bytes a token
    reads (everything outside the experts plus ``used / count`` of the expert tensors) against the totals; None
    for a dense file. Every expert stays in memory: the active share is what one token's forward pass reads."""
    n, used = _count_key(f, "expert_count"), _count_key(f, "expert_used_count")
    if not n:
        return None
    used = min(used, n)
    total = sum(t.n_elements for t in f.tensors)
    total_bytes = sum(t.n_bytes or 0 for t in f.tensors)
    ex = [t for t in f.tensors if EXPERT_TENSOR.match(t.name)]
    ex_params = sum(t.n_elements for t in ex)
    ex_bytes = sum(t.n_bytes or 0 for t in ex)
    return {"count": n, "used": used, "layers": len({t.name.split(".")[1] for t in ex}),
            "expert_parameters": ex_params, "expert_bytes": ex_bytes,
            "active_parameters": total - ex_params + ex_params * used // n,
            "active_bytes": total_bytes - ex_bytes + ex_bytes * used // n}


def type_summary(f: GGUFFile) -> list[dict[str, Any]]:
    """Per ggml type: tensors, elements, bytes, share of the file, bits per weight; largest first. The share is
    None when the tensors' bytes do not fit the file (a truncated or overlapping layout): it would be wrong."""
    sound = not layout_problems(f)
    acc: dict[str, dict[str, Any]] = defaultdict(lambda: {"tensors": 0, "elements": 0, "bytes": 0})
    for t in f.tensors:
        row = acc[t.type_name]
        row["tensors"] += 1
        row["elements"] += t.n_elements
        row["bytes"] += t.n_bytes or 0
    rows = []
    for name, row in acc.items():
        row = {"type": name, **row}
        row["share"] = row["bytes"] / f.file_size if f.file_size and sound else None
        row["bits_per_weight"] = 8.0 * row["bytes"] / row["elements"] if row["elements"] else None
        rows.append(row)
    rows.sort(key=lambda r: (-r["bytes"], r["type"]))
    return rows


def summarize(f: GGUFFile, max_items: int = 8) -> dict[str, Any]:
    """Everything ``inspect`` prints, as JSON-ready data."""
    n_params = sum(t.n_elements for t in f.tensors)
    n_bytes = sum(t.n_bytes or 0 for t in f.tensors)
    out: dict[str, Any] = {
        "path": str(f.path) if f.path else None,
        "file_size": f.file_size,
        "version": f.version,
        "alignment": f.alignment,
        "data_offset": f.data_start,
        "tensor_count": len(f.tensors),
        "kv_count": len(f.metadata),
        "architecture": f.architecture,
        "name": f.get("general.name") if isinstance(f.get("general.name"), str) else None,
        "file_type": {"value": f.file_type, "name": f.file_type_name},
        "parameters": n_params,
        "tensor_bytes": n_bytes,
        "bits_per_weight": 8.0 * n_bytes / n_params if n_params else None,
        "hyperparameters": hyperparameters(f),
        "experts": experts_summary(f),
        "metadata": [
            {"key": kv.key, "type": kv.type_label, "offset": kv.offset, "value": value_preview(kv, max_items)}
            for kv in f.metadata.values()
        ],
        "tensors": [
            {
                "name": t.name,
                "type": t.type_name,
                "type_id": t.type_id,
                "shape": list(t.ne),
                "elements": t.n_elements,
                "bytes": t.n_bytes,
                "offset": t.data_offset,
                "bits_per_weight": t.bits_per_weight,
                "problem": t.problem,
            }
            for t in f.tensors
        ],
        "types": type_summary(f),
        "integrity": layout_problems(f),
        "problems": [str(p) for p in f.problems],
    }
    if f.is_split:  # a split model: its files; each tensor's offset is in its shard's file
        out["shards"] = [{"path": str(s.path), "file_size": s.file_size, "data_offset": s.data_start,
                          "tensors": s.n_tensors} for s in f.shards]
        for t, row in zip(f.tensors, out["tensors"], strict=True):
            row["shard"] = t.shard
    return out


def params_text(n: int | None) -> str:
    """A parameter count as people write it: 135M, 1.5B, 630M ("–" for none)."""
    if not n:
        return "–"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}" if n < 100 * div else f"{n / div:.0f}{unit}"
    return str(n)


def human_bytes(n: float) -> str:
    """``491400064`` -> ``468.6 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def render_text(f: GGUFFile, summary: dict[str, Any] | None = None) -> str:
    """The human-readable ``inspect`` report."""
    s = summary or summarize(f)
    lines: list[str] = []
    add = lines.append
    add(f"File        {s['path'] or '<buffer>'}")
    add(f"Size        {s['file_size']:,} bytes ({human_bytes(s['file_size'])})")
    for i, p in enumerate(s.get("integrity") or []):  # before anything else: the figures below may be wrong
        add(f"{'INTEGRITY' if i == 0 else '':<11} {p}")
    shards = s.get("shards") or []
    if shards:
        add(f"Split       {len(shards)} files (metadata in the first; tensor offsets are in their file)")
        for i, sh in enumerate(shards):
            add(f"  {i + 1:>5}  {sh['path']}  {sh['file_size']:,} bytes, {sh['tensors']} tensors")
    add(f"GGUF        version {s['version']}, alignment {s['alignment']}, data offset {s['data_offset']:,}")
    ft = s["file_type"]
    add(f"File type   {ft['name'] or '(general.file_type not set)'}" + (f" ({ft['value']})" if ft["value"] is not None
                                                                          else ""))
    add(f"Arch        {s['architecture'] or '(none)'}" + (f"   name {s['name']!r}" if s["name"] else ""))
    bpw = s["bits_per_weight"]
    add(f"Parameters  {s['parameters']:,} in {s['tensor_count']} tensors, {human_bytes(s['tensor_bytes'])}"
        + (f", {bpw:.3f} bits/weight" if bpw else ""))
    ex = s.get("experts")
    if ex:
        add(f"Experts     {ex['count']} per layer in {ex['layers']} layers, {ex['used']} per token: "
            f"{ex['active_parameters']:,} parameters active ({human_bytes(ex['active_bytes'])} of weights read per "
            f"token, of {human_bytes(s['tensor_bytes'])})")
    if s["hyperparameters"]:
        add("")
        add("Hyperparameters")
        for k, v in s["hyperparameters"].items():
            add(f"  {k:<34} {_short(v, 60)}")
    add("")
    add(f"Metadata ({s['kv_count']} keys)")
    kw = max((len(k) for k in f.metadata), default=10)
    tw = max((len(kv.type_label) for kv in f.metadata.values()), default=6)
    for kv in f.metadata.values():
        add(f"  {kv.key:<{kw}}  {kv.type_label:<{tw}}  {format_value(kv)}")
    add("")
    add(f"Tensors ({s['tensor_count']})")
    nw = max((len(t.name) for t in f.tensors), default=10)
    add(f"  {'name':<{nw}}  {'type':<8} {'shape (ne)':<18} {'elements':>12} {'bytes':>12} {'offset':>12}  bpw")
    for t in f.tensors:
        shape = "×".join(str(d) for d in t.ne) or "scalar"
        nb = f"{t.n_bytes:,}" if t.n_bytes is not None else "?"
        bpw_t = f"{t.bits_per_weight:.3f}" if t.bits_per_weight is not None else "?"
        flag = f"  ! {t.problem}" if t.problem else ""
        off = f"{t.shard + 1}:{t.data_offset:,}" if shards else f"{t.data_offset:,}"
        add(f"  {t.name:<{nw}}  {t.type_name:<8} {shape:<18} {t.n_elements:>12,} {nb:>12} {off:>12}"
            f"  {bpw_t}{flag}")
    add("")
    add("By type")
    add(f"  {'type':<10} {'tensors':>8} {'elements':>14} {'bytes':>14} {'share':>7} {'bpw':>7}")
    for r in s["types"]:
        bpw_r = f"{r['bits_per_weight']:.3f}" if r["bits_per_weight"] else "?"
        share = f"{r['share']:>6.1%}" if r["share"] is not None else f"{'-':>6}"
        add(f"  {r['type']:<10} {r['tensors']:>8} {r['elements']:>14,} {r['bytes']:>14,} {share}"
            f" {bpw_r:>7}")
    if s["problems"]:
        add("")
        add("Problems")
        for p in s["problems"]:
            add(f"  {p}")
    return "\n".join(printable(line) for line in lines)  # file-controlled text never reaches a terminal raw
