"""The explorer on odd-but-legal and hostile files (issue 12, item 3): every file opens, every view shows, the
integrity panel lists the problem, and the window keeps answering. pytest-qt fails a test on any exception that
escapes a Qt slot, so "no exception" is checked by every test here."""

from __future__ import annotations

import sys
import threading

import pytest
from PySide6.QtCore import QTimer

from quantscope.core.bump import ConvertJob, open_bump
from quantscope.core.gguf import GGUFFile
from quantscope.core.gguf.checks import INT32_MAX, integrity_checks

from .gui_helpers import wait_idle, window  # noqa: F401
from .hostile_files import ODD_FILES, V, vocab_with
from .test_bump import write_model

VIEWS = ("overview", "metadata", "tensors", "block", "chat", "probe")

#: per odd file: text the integrity panel must show (check name, detail substring)
EXPECTED = {
    "vocab-only": ("tensors", "no tensors (a vocabulary-only file?)"),
    "zero-dim": ("tensor shapes", "tensor blk.0.empty.weight with ne = [0, 3]"),
    "huge-context": ("llama.context_length", "llama.context_length = 1,099,511,627,776 is larger than any"),
    "string-context": ("llama.context_length", "llama.context_length is a string ('4096'), not an integer"),
    "wrong-types": ("llama.block_count", "llama.block_count is a string ('two'), not an integer"),
    "empty-arrays": ("empty arrays", "5 metadata arrays have no elements: general.tags"),
    "scalars-for-arrays": ("tokenizer.ggml.tokens", "tokenizer.ggml.tokens is an integer (5), not an array of"),
    "unknown-type": ("known tensor types", "blk.0.attn_q.weight: unknown type 200"),
    "huge-ne": ("tensors inside the file", "token_embd.weight: data [416, 35184372089248) lies outside"),
}


def responsive(qtbot) -> None:
    """The event loop still runs: a zero-delay timer fires."""
    fired: list[bool] = []
    QTimer.singleShot(0, lambda: fired.append(True))
    qtbot.waitUntil(lambda: bool(fired), timeout=60000)  # a hang guard: pending repaints may come first


@pytest.fixture(scope="module")
def smol(model_path):
    return model_path("smollm2")


@pytest.mark.parametrize("kind", list(ODD_FILES))
def test_odd_file_opens_in_every_view(window, qtbot, tmp_path, smol, kind):  # noqa: F811
    path = ODD_FILES[kind](tmp_path / f"{kind}.gguf", smol)
    before = path.read_bytes()
    assert window.open_path(path), window.error_box and window.error_box.informativeText()
    assert window.doc is not None and window.doc.gguf is not None
    name, detail = EXPECTED[kind]
    rows = window.overview.checks_model.rows
    assert any(r[0] == name and detail in r[2] for r in rows), rows
    for view in VIEWS:
        window.show_view(view)
        assert window.current_view() == view
        wait_idle(qtbot, window)
    f = window.doc.gguf
    window.show_view("tensors")
    for t in f.tensors:  # statistics and heatmap of every tensor, then its first block
        window.tensors_view.select_tensor(t.name)
        wait_idle(qtbot, window)
        window.inspect_block(t.name, 0, 0, 0)
        wait_idle(qtbot, window)
    window.show_view("metadata")
    for key in list(f.metadata):
        assert window.metadata_view.select_key(key)
    window.show_view("probe")  # the probe loads the odd file's model: a result, or the reason it cannot run
    probe = window.probe_view
    probe.prompt.setPlainText("Hello there")
    probe.run()
    qtbot.waitUntil(lambda: not probe.busy, timeout=120000)
    assert probe.result is not None or probe.error, kind
    responsive(qtbot)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "settings.ini") == [path.name]


def test_zero_dimension_tensor_explains_itself(window, qtbot, tmp_path, smol):  # noqa: F811
    path = ODD_FILES["zero-dim"](tmp_path / "z.gguf", smol)
    assert window.open_path(path)
    window.show_view("tensors")
    window.tensors_view.select_tensor("blk.0.empty.weight")
    wait_idle(qtbot, window)
    assert window.tensors_view.progress_label.text() == (
        "blk.0.empty.weight has no values: its shape ne = [0, 3] has a zero dimension.")
    window.inspect_block("blk.0.empty.weight", 0, 0, 0)
    assert window.current_view() == "block"
    assert window.block_view.message.text().startswith("blk.0.empty.weight has no blocks: its shape ne = [0, 3]")
    window.inspect_block("token_embd.weight", 3, 0, 0)  # a normal tensor still decodes afterwards
    assert window.block_view.decoded is not None and window.block_view.row_spin.value() == 3


def test_spin_boxes_clamp_huge_values(window, qtbot, tmp_path, smol):  # noqa: F811
    path = ODD_FILES["huge-context"](tmp_path / "h.gguf", smol)
    assert window.open_path(path)
    assert window.chat_view.ctx_spin.maximum() == INT32_MAX
    assert window.overview.ctx_spin.value() == 8192
    dlg = window.show_convert()
    assert dlg is not None and dlg.ctx.value() == 10_000_000
    dlg.close()
    huge = ODD_FILES["huge-ne"](tmp_path / "n.gguf", smol)
    assert window.open_path(huge)
    with GGUFFile(huge, strict=False) as f:
        assert f.tensor("token_embd.weight").n_rows == 2**40
    window.inspect_block("token_embd.weight", 0, 0, 0)
    assert window.block_view.row_spin.maximum() == INT32_MAX
    assert "token_embd.weight cannot be decoded" in window.block_view.message.text()
    responsive(qtbot)


def test_integrity_checks_list_every_wrong_type(tmp_path, smol):
    path = ODD_FILES["wrong-types"](tmp_path / "w.gguf", smol)
    with GGUFFile(path, strict=False) as f:
        details = [c.detail for c in integrity_checks(f) if c.ok is False]
    for want in ("general.name is an integer (42), not a string",
                 "general.file_type is a string ('Q4_K'), not an integer",
                 "llama.context_length is an array of 2, not an integer",
                 "llama.embedding_length is a float (8.5), not an integer",
                 "llama.feed_forward_length is a boolean (True), not an integer",
                 "llama.attention.head_count_kv = -3 is negative",
                 "llama.rope.freq_base is a string ('fast'), not a number",
                 "llama.attention.layer_norm_rms_epsilon is an array of 1, not a number",
                 "tokenizer.ggml.model is an integer (7), not a string",
                 "tokenizer.ggml.tokens is an array of 3, not an array of strings",
                 "tokenizer.ggml.bos_token_id is a string ('1'), not an integer",
                 "tokenizer.chat_template is an integer (5), not a string"):
        assert want in details, details


def test_nested_loop_template_is_refused_by_the_shared_guard(window, qtbot, tmp_path, smol):  # noqa: F811
    nested = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"
    path = vocab_with(tmp_path / "t.gguf", smol, tokenizer__chat_template=(nested, V.STRING, None))
    assert window.open_path(path)
    window.show_view("chat")
    cv = window.chat_view
    cv.tools.setCurrentIndex(1)  # the Template tab renders the conversation in a worker
    # the budget counts steps (not seconds): the bound is a hang guard, the message says the budget stopped it
    qtbot.waitUntil(lambda: "The chat template failed" in cv.preview_status.text(), timeout=120000)
    assert "template exceeded its budget: more than 1,000,000 steps" in cv.preview_status.text()
    wait_idle(qtbot, window)
    responsive(qtbot)


MANIFESTS = {
    "not JSON": ("{not json", "manifest.json beside the bump is malformed: JSONDecodeError"),
    "a list": ("[1, 2]", "manifest.json beside the bump is malformed: a JSON list, not an object"),
    "deep": ("[" * 100_000 + "]" * 100_000, "manifest.json beside the bump is malformed: RecursionError"),
    "wrong types": ('{"profile": "ckernel", "num_kv_heads": "x", "intermediate_size": [1]}',
                    "manifest.json beside the bump does not describe it: its ckernel layout (num_kv_heads 'x'"),
    "wrong counts": ('{"profile": "ckernel", "num_kv_heads": 3, "intermediate_size": 999}',
                     "does not describe it: its ckernel layout (num_kv_heads 3, intermediate_size 999)"),
    "unknown profile": ('{"profile": {"a": 1}}', "names an unknown profile"),
}


@pytest.fixture(scope="module")
def bump_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("bump")
    src = write_model(d / "m.gguf")
    out = d / "w.bump"
    ConvertJob(src, out).run()
    return out


@pytest.mark.parametrize("case", list(MANIFESTS))
def test_bump_with_hostile_manifest_and_config_opens(window, qtbot, tmp_path, bump_file, case):  # noqa: F811
    import shutil

    text, note = MANIFESTS[case]
    b = tmp_path / "w.bump"
    shutil.copyfile(bump_file, b)
    (tmp_path / "manifest.json").write_text(text)
    (tmp_path / "config.json").write_text('{"num_key_value_heads": "lots", ' * 3)
    assert open_bump(b).profile_source == "inferred"
    assert window.open_path(b)
    assert window.current_view() == "bump"
    rows = window.bump_view.header_model.rows
    problems = [r[1] for r in rows if r[0] == "problem"]
    assert len(problems) == 1 and note in problems[0], problems
    assert ("profile", "ckernel (inferred)") in rows
    wait_idle(qtbot, window)
    assert window.bump_view.checksum_ok is True
    responsive(qtbot)


def test_manifest_fifo_is_not_read(tmp_path, bump_file):
    import os
    import shutil

    b = tmp_path / "w.bump"
    shutil.copyfile(bump_file, b)
    os.mkfifo(tmp_path / "manifest.json")
    # opening a FIFO nobody writes to blocks for ever: read it in a thread and allow it a generous hang guard
    box: list = []
    reader = threading.Thread(target=lambda: box.append(open_bump(b)), daemon=True)
    reader.start()
    reader.join(120)
    assert not reader.is_alive(), "open_bump blocked on the FIFO"
    (got,) = box
    assert got.notes == ["manifest.json beside the bump is malformed: is a FIFO (named pipe), not a regular file; "
                         "ignored, the layout is inferred"]


def test_uncaught_slot_exception_is_shown_and_the_app_keeps_running(window, qtbot):  # noqa: F811
    from quantscope.gui.app import install_excepthook

    saved = sys.excepthook
    try:
        install_excepthook(window)
        try:
            raise RuntimeError("a view failed")
        except RuntimeError as exc:
            sys.excepthook(type(exc), exc, exc.__traceback__)
    finally:
        sys.excepthook = saved
    assert window.error_box is not None
    assert window.error_box.text() == "Unexpected error: RuntimeError: a view failed"
    assert "Quantscope keeps running" in window.error_box.informativeText()
    window.error_box.close()
    responsive(qtbot)


def test_a_damaged_tensor_shows_nothing_of_the_block_shown_before(window, qtbot, tmp_path, smol):  # noqa: F811
    """After a good block, a tensor that cannot be decoded (unknown type id): its message, and no header, fields,
    fp16 bits nor plot left over from the other tensor."""
    path = ODD_FILES["unknown-type"](tmp_path / "u.gguf", smol)
    assert window.open_path(path)
    bv = window.block_view
    window.inspect_block("token_embd.weight", 3, 0, 0)
    assert bv.decoded is not None and bv.bars is not None and bv.info.text()
    assert len(bv.marker.data) == 1
    window.inspect_block("blk.0.attn_q.weight", 0, 0, 0)
    assert bv.message.isVisible() and "blk.0.attn_q.weight cannot be decoded" in bv.message.text()
    assert bv.decoded is None and bv.bars is None
    assert "token_embd" not in bv.info.text() and "Q8_0" not in bv.info.text() and "offset" not in bv.info.text()
    assert len(bv.marker.data) == 0 and len(bv.hover_marker.data) == 0 and not bv.vline.isVisible()
    assert bv.fp16_layout.count() == 0 and bv.fields_model.rowCount() == 0 and not bv.formula.text()


@pytest.mark.parametrize("kind", ["unknown-type", "huge-ne"])
def test_a_damaged_file_is_not_given_a_clean_scale_scan(window, qtbot, tmp_path, smol, kind):  # noqa: F811
    """The scan reads only the tensors it can: a damaged one is said to be left out, and nothing is green."""
    from quantscope.gui.theme import OK_COLOR

    path = ODD_FILES[kind](tmp_path / f"{kind}.gguf", smol)
    assert window.open_path(path)
    ov = window.overview
    qtbot.waitUntil(lambda: ov.scan_result is not None and not ov.scan_job.busy, timeout=120000)
    text = ov.scan_label.text()
    damaged = [t.name for t in window.doc.gguf.tensors if t.type is None or t.problem]
    assert damaged and OK_COLOR not in text and "✓" not in text, text
    assert f"{damaged[0]} could not be read: not scanned" in text, text
