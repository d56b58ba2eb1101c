"""Publishing a quantized GGUF to the Hugging Face hub: the model card written from the file's own header (base
model, architecture, parameters, every tensor type with its share, the importance matrix and calibration text, the
``--tensor-type`` rules) with the YAML front matter the hub reads (``base_model``, ``tags: [gguf, quantscope]``,
``quantized_by``), and the upload of the file (every shard of a set) with its card in one commit through
``huggingface_hub``."""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .gguf import GGUFFile
from .jobs import CancelFlag, Cancelled, check_cancel
from .summary import human_bytes, type_summary

_REPO_URL = re.compile(r"^https?://(?:huggingface\.co|hf\.co)/([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)/?$")


class PublishError(Exception):
    """What stops a publish, in one line."""


@dataclass
class CardInputs:
    """What the card says beyond the header: the base model (else the header's ``general.base_model.*``), who
    quantized it, the calibration text used for the imatrix, the ``--tensor-type`` rule file."""

    base_model: str | None = None
    quantized_by: str = "quantscope"
    calibration: Path | None = None
    rules: str | None = None
    target: dict[str, Any] | None = None  # ``quantscope quantize --target-size … --json``'s "summary"


def target_summary(text: str) -> dict[str, Any]:
    """The "summary" of ``quantscope quantize --target-size … --json`` output (what the card's measurements come
    from); :class:`PublishError` when the text is not that."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PublishError(f"the target report is not JSON ({exc})") from None
    summary = data.get("summary") if isinstance(data, dict) else None
    if not isinstance(summary, dict) or "predicted_kld" not in summary:
        raise PublishError("the target report is not the JSON of `quantscope quantize --target-size … --json`")
    return summary


def _text(f: GGUFFile, key: str) -> str | None:
    v = f.get(key)
    return v if isinstance(v, str) and v.strip() else None


def base_model_of(f: GGUFFile) -> str | None:
    """The base model's hub id from the header (``general.base_model.0.repo_url``, else organization/name)."""
    url = _text(f, "general.base_model.0.repo_url")
    m = _REPO_URL.match(url or "")
    if m:
        return m.group(1)
    org, name = _text(f, "general.base_model.0.organization"), _text(f, "general.base_model.0.name")
    if org and name and re.fullmatch(r"[\w.-]+", org) and re.fullmatch(r"[\w.-]+", name):
        return f"{org}/{name}"
    return None


def saved_token() -> str | None:
    """The token the client would use: HF_TOKEN, else the one ``hf auth login`` saved (None: neither)."""
    from huggingface_hub import get_token

    return get_token()


def _yaml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


def _cell(s: object) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _params(n: int) -> str:
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def model_card(f: GGUFFile, repo: str, files: list[str], inputs: CardInputs | None = None) -> str:
    """The README.md for ``repo`` holding ``files`` (the set's names in the repo), from ``f``'s header."""
    from .hub import quant_of

    inputs = inputs or CardInputs()
    base = inputs.base_model or base_model_of(f)
    name = _text(f, "general.name") or Path(files[0]).stem
    types = type_summary(f)
    ftype = ((f.file_type_name or "").removeprefix("MOSTLY_").removeprefix("ALL_") or quant_of(files[0])
             or (types[0]["type"] if types else "GGUF"))
    params = sum(t.n_elements for t in f.tensors)
    front = ["---"]
    if base:
        front.append(f"base_model: {_yaml_str(base)}")
    front += ["tags:", "- gguf", "- quantscope", f"quantized_by: {_yaml_str(inputs.quantized_by)}"]
    if _text(f, "general.license"):
        front.append(f"license: {_yaml_str(_text(f, 'general.license') or '')}")
    front.append("---")
    out = [*front, "", f"# {name} {ftype} GGUF", ""]
    made = f"quantized from [{base}](https://huggingface.co/{base})" if base else "quantized"
    out += [f"{_cell(', '.join(f'`{x}`' for x in files))}: {name} {made} to {ftype} with Quantscope.", ""]
    arch = f.architecture or "?"
    ctx = f.arch_get("context_length")
    out += ["| | |", "|---|---|", f"| Architecture | {_cell(arch)} |",
            f"| Parameters | {_params(params)} ({params:,}) |", f"| File type | {_cell(ftype)} |",
            f"| Size | {human_bytes(f.file_size)} ({f.file_size:,} bytes) |"]
    if isinstance(ctx, int):
        out.append(f"| Trained context | {ctx:,} tokens |")
    if len(files) > 1:
        out.append(f"| Shards | {len(files)} (open the first; llama.cpp finds the others) |")
    out += ["", "## Tensor types", "", "| Type | Tensors | Share of the file | Bits per weight |",
            "|---|---:|---:|---:|"]
    for row in types:
        share = f"{100 * row['share']:.1f}%" if row["share"] is not None else "?"
        bpw = f"{row['bits_per_weight']:.2f}" if row["bits_per_weight"] is not None else "?"
        out.append(f"| {_cell(row['type'])} | {row['tensors']:,} | {share} | {bpw} |")
    out += ["", "## Importance matrix", ""]
    im_file, im_data = _text(f, "quantize.imatrix.file"), _text(f, "quantize.imatrix.dataset")
    if not (im_file or im_data or inputs.calibration):
        out.append("None was used.")
    if im_file or im_data:
        out.append(f"- imatrix: `{_cell(im_file or '?')}`")
        if im_data:
            out.append(f"- calibration data: `{_cell(im_data)}`")
        for key, label in (("quantize.imatrix.entries_count", "entries"), ("quantize.imatrix.chunks_count",
                                                                             "chunks")):
            v = f.get(key)
            if isinstance(v, int):
                out.append(f"- {label}: {v:,}")
    if inputs.calibration is not None:
        data = inputs.calibration.read_bytes()
        out.append(f"- calibration text: `{_cell(inputs.calibration.name)}`, {len(data):,} bytes, SHA-256 "
                   f"`{hashlib.sha256(data).hexdigest()}`")
    t = inputs.target
    if t:
        def num(v: Any, fmt: str) -> str:
            return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "?"

        out += ["", "## Measured against the base", "",
                "Types chosen per tensor by measured cost (mean KL divergence from the base's next-token "
                "distributions on the calibration text) under a byte budget:", "", "| | |", "|---|---|"]
        if isinstance(t.get("target_bytes"), int):
            out.append(f"| Target size | {human_bytes(t['target_bytes'])} |")
        out.append(f"| Bits per weight | {num(t.get('bpw_out'), '.3f')} |")
        out.append(f"| Predicted mean KLD | {num(t.get('predicted_kld'), '.5f')} |")
        refine = t.get("refine")
        if isinstance(refine, dict):
            out.append(f"| Measured mean KLD of the whole mix | {num(refine.get('measured_kld'), '.5f')} |")
        if isinstance(t.get("preset"), str):
            out.append(f"| Base preset | {_cell(t['preset'])} |")
    if inputs.rules:
        out += ["", "## Tensor type rules (`--tensor-type`)", "", "```text", inputs.rules.rstrip("\n"), "```"]
    out += ["", "## Use", "", "```sh", f"quantscope pull {repo}:{ftype}", f"llama-cli -m {files[0]}", "```", ""]
    return "\n".join(out)


class _Watched(io.BufferedReader):
    """A file handed to the client as a file object: each read reports ``(phase, bytes of this pass, size)`` and
    stops with :class:`~quantscope.core.jobs.Cancelled` once ``cancel`` is set (the client reads it once to hash
    it, once to upload it)."""

    def __init__(self, path: Path, report: Callable[[str, int, int], None], cancel: CancelFlag | None) -> None:
        super().__init__(io.FileIO(path, "rb"), 1 << 20)
        self.size = path.stat().st_size
        self.report = report
        self.cancel = cancel
        self.phase = "hashing"

    def read(self, n: int | None = -1) -> bytes:
        check_cancel(self.cancel)
        data = super().read(n)
        self.report(self.phase, self.tell(), self.size)
        return data


def publish(repo: str, files: list[Path], card: str, *, private: bool = False,
            progress: Callable[[str], None] | None = None, token: str | None = None,
            transfer: Callable[[str, int, int], None] | None = None, cancel: CancelFlag | None = None) -> str:
    """Create ``repo`` (kept if it exists) and commit ``files`` and the card (README.md) in one commit; the
    commit's URL. Needs a token with write access (``token``, else HF_TOKEN or a saved one). ``transfer`` (then the
    files go to the client as file objects, by the LFS protocol) is told ``(what, done, total)`` as each file is
    hashed and uploaded; ``cancel`` is looked at with each read: set, the publish stops with
    :class:`~quantscope.core.jobs.Cancelled` (a commit is all or nothing: nothing is committed)."""
    from huggingface_hub import CommitOperationAdd, HfApi

    from .hub import hub_errors

    api = HfApi(token=token)
    opened: list[_Watched] = []
    try:
        with hub_errors(repo):
            check_cancel(cancel)
            if progress:
                progress(f"creating {repo} (kept if it exists)")
            api.create_repo(repo, private=private, exist_ok=True)
            ops = []
            for p in files:
                check_cancel(cancel)
                if transfer is None and cancel is None:
                    ops.append(CommitOperationAdd(path_in_repo=p.name, path_or_fileobj=str(p)))
                    continue
                w = _Watched(p, lambda phase, d, t, n=p.name: (transfer or _quiet)(f"{phase} {n}", d, t), cancel)
                opened.append(w)
                ops.append(CommitOperationAdd(path_in_repo=p.name, path_or_fileobj=w))  # reads it: the hash
                w.phase = "uploading"
            ops.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode()))
            if progress:
                progress(f"uploading {len(files)} file{'s' * (len(files) != 1)} and the model card")
            info: Any = api.create_commit(repo, operations=ops,
                                          commit_message=f"Upload {files[0].name} (Quantscope)")
    except Exception:
        if cancel is not None and cancel.cancelled:  # the client wraps our read's Cancelled in its own error
            raise Cancelled("cancelled") from None
        raise
    finally:
        for w in opened:
            w.close()
    return str(getattr(info, "commit_url", info))


def _quiet(_what: str, _done: int, _total: int) -> None:
    pass
