"""The Quantize dialog: the plan follows the options and the per-tensor overrides, a run in the worker writes
llama-quantize's bytes and opens, cancel leaves nothing, refusals are shown and the window keeps running."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from quantscope.core.gguf import GGUFFile
from quantscope.core.quant.imatrix import read_imatrix
from quantscope.core.quant.quantize import QuantizeOptions, quantize_file

from . import quantize_models
from .gui_helpers import wait_idle, window  # noqa: F401

META = json.loads((Path(__file__).parent / "data" / "quantize" / "files.json").read_text())


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("gui-quantize")
    for m in ("llama", "qwen3moe"):
        quantize_models.write_model(m, d / f"{m}.gguf")
    return d


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_plan_follows_options_and_overrides(window, qtbot, models):  # noqa: F811
    assert window.open_path(models / "llama.gguf")
    dlg = window.show_quantize()
    assert dlg is not None and dlg.isVisible() and dlg.preset_name() == "Q4_K_M"
    assert dlg.output.text().endswith("llama-Q4_K_M.gguf")
    rows = {dlg.table.item(r, 0).text(): r for r in range(dlg.table.rowCount())}
    assert dlg.table.item(rows["output.weight"], 3).text() == "Q6_K"
    assert dlg.table.item(rows["blk.0.attn_norm.weight"], 3).text() == "F32"
    rec = next(c for c in META["runs"] if c["model"] == "llama" and c["args"] == ["Q4_K_M"])
    assert f"{rec['size']:,} bytes" in dlg.estimate.text()
    # another preset: the output name and every type follow
    dlg.preset.setCurrentIndex(dlg.preset.findData("Q8_0"))
    assert dlg.output.text().endswith("llama-Q8_0.gguf")
    assert dlg.table.item(rows["blk.1.ffn_up.weight"], 3).text() == "Q8_0"
    # an override in the table changes that tensor only, and the size estimate
    before = dlg.plan.file_bytes
    combo = dlg.table.cellWidget(rows["blk.1.ffn_up.weight"], 5)
    combo.setCurrentText("Q4_0")
    assert dlg.overrides == {"blk.1.ffn_up.weight": "Q4_0"}
    assert dlg.table.item(rows["blk.1.ffn_up.weight"], 3).text() == "Q4_0"
    assert dlg.table.item(rows["blk.2.ffn_up.weight"], 3).text() == "Q8_0"
    assert dlg.plan.file_bytes < before
    # a preset that needs an imatrix: refused with the reason, Quantize disabled
    dlg.preset.setCurrentIndex(dlg.preset.findData("Q2_K_S"))
    assert "needs an importance matrix" in dlg.estimate.text() and not dlg.start_btn.isEnabled()
    # the lattice presets are listed but cannot be chosen
    i = dlg.preset.findData("IQ2_XXS")
    assert i >= 0 and not dlg.preset.model().item(i).isEnabled()


def test_run_writes_llama_quantize_bytes_and_opens(window, qtbot, models, tmp_path):  # noqa: F811
    assert window.open_path(models / "qwen3moe.gguf")
    dlg = window.show_quantize()
    imat = tmp_path / "qwen3moe.imatrix.gguf"
    imat.write_bytes((Path(__file__).parent / "data" / "quantize" / "qwen3moe.imatrix.gguf").read_bytes())
    dlg.imatrix_path.setText(str(imat))
    dlg._load_imatrix()
    qtbot.waitUntil(lambda: dlg.imatrix is not None, timeout=120000)
    assert "16 entries" in dlg.imatrix_info.text() and dlg.imatrix_info.isVisible()
    assert all(j.has_imatrix for j in dlg.plan.jobs if "exps" in j.info.name)
    dlg.preset.setCurrentIndex(dlg.preset.findData("IQ4_XS"))
    out = tmp_path / "q.gguf"
    dlg.output.setText(str(out))
    progress = []

    def record(task) -> None:  # type: ignore[no-untyped-def]  # connected before the task is queued: every report
        if task.name == "quantize":
            task.signals.progress.connect(lambda d, t, _s: progress.append((d, t)))

    dlg.job_slot.runner.on_start.append(record)
    try:
        with qtbot.waitSignal(dlg.quantizeFinished, timeout=120000) as sig:
            dlg.start()
    finally:
        dlg.job_slot.runner.on_start.remove(record)
    assert sig.args[0] is not None and dlg.state == "done"
    assert progress and progress[-1][0] == progress[-1][1]
    assert "✓ Quantized" in dlg.summary.toPlainText()
    # llama-quantize wrote this file but for the imatrix path in the metadata (given relative there): the same
    # options with that label give its bytes, and every tensor of the dialog's output is byte-identical to them
    rec = next(c for c in META["runs"] if c["model"] == "qwen3moe" and c["args"][-1] == "IQ4_XS"
               and "--imatrix" in c["args"])
    ref = tmp_path / "ref.gguf"
    quantize_file(models / "qwen3moe.gguf", ref, QuantizeOptions("IQ4_XS", read_imatrix(imat), "qwen3moe.imatrix.gguf"))
    assert _sha(ref) == rec["sha256"]
    with GGUFFile(out) as a, GGUFFile(ref) as b:
        assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
        for ta, tb in zip(a.tensors, b.tensors, strict=True):
            assert ta.type_name == tb.type_name and (a.tensor_bytes(ta) == b.tensor_bytes(tb)).all(), ta.name
        assert a.get("quantize.imatrix.file") == str(imat)
    dlg.open_btn.click()
    assert window.doc is not None and window.doc.path == out
    assert window.doc.gguf.get("quantize.imatrix.entries_count") == 16


def test_cancel_leaves_nothing_and_refusals_are_shown(window, qtbot, models, tmp_path):  # noqa: F811
    assert window.open_path(models / "qwen3moe.gguf")
    dlg = window.show_quantize()
    dlg.output.setText(str(models / "qwen3moe.gguf"))  # the source itself
    dlg.start()
    assert dlg.state == "idle" and "input file" in dlg.status.text()
    outdir = tmp_path / "out"
    outdir.mkdir()
    dlg.output.setText(str(outdir / "never.gguf"))
    dlg.preset.setCurrentIndex(dlg.preset.findData("Q2_K"))
    with qtbot.waitSignal(dlg.quantizeFinished, timeout=120000) as sig:
        dlg.start()
        dlg.cancel()
    assert sig.args[0] is None and dlg.state == "cancelled" and "nothing was written" in dlg.status.text()
    assert list(outdir.iterdir()) == []
    # a broken imatrix: the note says why, the plan still works without it
    bad = tmp_path / "bad.dat"
    bad.write_bytes(b"\x05\x00\x00\x00garbage")
    dlg.imatrix_path.setText(str(bad))
    dlg._load_imatrix()
    qtbot.waitUntil(lambda: "Reading" not in dlg.imatrix_info.text(), timeout=120000)
    assert "cannot fit" in dlg.imatrix_info.text() and dlg.imatrix is None and dlg.plan is not None
    bad.unlink()
    assert window.isVisible()
