"""The model card a quantized GGUF is published with (``quantscope publish``): the Hugging Face hub's README, its
YAML front matter made by ``huggingface_hub``'s own ``ModelCardData`` (``base_model``, ``tags: [gguf, quantscope]``,
``quantized_by``), then what the file says about itself: architecture, parameters, size, every tensor type with its
share, the importance matrix it was quantized with, the ``--tensor-type`` rules and the quality figures measured
against the base where a target-size report gives them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .gguf.reader import GGUFFile
from .summary import human_bytes, type_summary

TAGS = ["gguf", "quantscope"]
IMATRIX_KEYS = (("quantize.imatrix.file", "file"), ("quantize.imatrix.dataset", "calibration text"),
                ("quantize.imatrix.entries_count", "entries"), ("quantize.imatrix.chunks_count", "chunks"))


class CardError(ValueError):
    """A report that is not one ``quantscope quantize --target-size --json`` wrote."""


def _text(v: object) -> str | None:
    return v if isinstance(v, str) and v.strip() else None


def base_model(f: GGUFFile) -> str | None:
    """The base model's hub id as the file's ``general.base_model.0.*`` keys give it (its repo URL on
    huggingface.co, else its organisation and name), or None."""
    url = _text(f.get("general.base_model.0.repo_url"))
    if url and "huggingface.co/" in url:
        rest = url.split("huggingface.co/", 1)[1].strip("/").split("/")
        if len(rest) >= 2:
            return f"{rest[0]}/{rest[1]}"
    org, name = _text(f.get("general.base_model.0.organization")), _text(f.get("general.base_model.0.name"))
    return f"{org}/{name}".replace(" ", "-") if org and name else None


def read_report(path: str | Path) -> dict[str, Any]:
    """The ``summary`` of a ``quantscope quantize --target-size … --json`` report."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CardError(f"{path}: not a JSON report ({exc})") from None
    summary = data.get("summary") if isinstance(data, dict) else None
    if not isinstance(summary, dict) or "predicted_kld" not in summary:
        raise CardError(f"{path}: not the JSON of `quantscope quantize --target-size … --json` (no summary)")
    return summary


def _md(text: str) -> str:
    """Plain text safe in a Markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")


def model_card(f: GGUFFile, repo_id: str, file_name: str, *, base: str | None = None, rules: str | None = None,
               report: dict[str, Any] | None = None) -> str:
    """The README of ``repo_id`` holding ``file_name`` (the GGUF ``f``): front matter and body, as text."""
    from huggingface_hub import ModelCard, ModelCardData

    base = base or base_model(f)
    meta: dict[str, Any] = {"tags": TAGS, "quantized_by": "quantscope"}
    if base:
        meta["base_model"] = base
    arch = f.architecture or "unknown"
    name = _text(f.get("general.name")) or Path(file_name).stem
    n_params = sum(t.n_elements for t in f.tensors)
    n_bytes = sum(t.n_bytes or 0 for t in f.tensors)
    ft = f.file_type_name
    lines = [f"# {_md(name)} — GGUF", "",
             f"`{_md(file_name)}`, published with [Quantscope](https://pypi.org/project/quantscope/)"
             + (f" from [{base}](https://huggingface.co/{base})." if base else "."), "",
             "| | |", "|---|---|", f"| Architecture | {_md(arch)} |", f"| Parameters | {n_params:,} |",
             f"| File size | {human_bytes(f.file_size)} ({f.file_size:,} bytes) |",
             f"| Bits per weight | {8.0 * n_bytes / n_params:.3f} |" if n_params else "| Bits per weight | – |",
             f"| File type | {_md(ft.removeprefix('MOSTLY_')) if ft else '–'} |", "",
             "## Tensor types", "", "| Type | Tensors | Bytes | Share | Bits per weight |", "|---|---:|---:|---:|---:|"]
    for r in type_summary(f):
        share = f"{100 * r['share']:.1f} %" if r["share"] is not None else "–"
        bpw = f"{r['bits_per_weight']:.2f}" if r["bits_per_weight"] is not None else "–"
        lines.append(f"| {_md(r['type'])} | {r['tensors']} | {r['bytes']:,} | {share} | {bpw} |")
    im = [(label, f.get(key)) for key, label in IMATRIX_KEYS if f.get(key) is not None]
    lines += ["", "## Importance matrix", ""]
    lines += [f"- {label}: `{_md(str(v))}`" for label, v in im] if im else ["None was used."]
    if rules:
        lines += ["", "## Tensor type rules", "", "As `llama-quantize --tensor-type` takes them, one per line:", "",
                  "```", rules.rstrip("\n"), "```"]
    if report:
        lines += ["", "## Quality against the base", "", "| | |", "|---|---|"]
        if report.get("target_bytes"):
            lines.append(f"| Target size | {int(report['target_bytes']):,} bytes |")
        if report.get("bpw_out") is not None:
            lines.append(f"| Bits per weight (tensors) | {float(report['bpw_out']):.3f} |")
        lines.append(f"| Predicted mean KL divergence | {float(report['predicted_kld']):.5f} |")
        refine = report.get("refine")
        if isinstance(refine, dict) and refine.get("measured_kld") is not None:
            lines.append(f"| Measured mean KL divergence | {float(refine['measured_kld']):.5f} |")
        if report.get("preset"):
            lines.append(f"| Rules start from | {_md(str(report['preset']))} |")
    lines += ["", "## Use", "", "```sh", f"llama-cli --hf-repo {repo_id} --hf-file {file_name}",
              f"quantscope chat {file_name}", "```", ""]
    card = ModelCard(f"---\n{ModelCardData(**meta).to_yaml()}\n---\n\n" + "\n".join(lines))
    return str(card)
