"""Editing metadata in the GUI (issue 19, "Edit metadata and save"): a value with its type (range-checked), a new
key, a deletion, an array element, a special token picked from the vocabulary, the chat template with its live
rendering; the changes listed with undo/redo; Save As in the runner writing exactly what the core writes for the
same edits and opening the result; overwriting the open file only after confirming; unsaved changes guarded."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from quantscope.core.gguf import GGUFFile
from quantscope.core.gguf.edit import save_edited

from .gui_helpers import fit_problems, wait_idle, window  # noqa: F401

TOKENS = ["<unk>", "<s>", "</s>", "hello", "world", "<|im_start|>", "<|im_end|>", "café"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _write(path: Path) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(2048)
    w.add_block_count(1)
    w.add_tokenizer_model("llama")
    w.add_token_list(TOKENS)
    w.add_token_scores([0.0] * len(TOKENS))
    w.add_token_types([1] * len(TOKENS))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    rng = np.random.default_rng(7)
    w.add_tensor("token_embd.weight", rng.standard_normal((len(TOKENS), 64)).astype(np.float32))
    q = gguf.quants.quantize(rng.standard_normal((32, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tensor_hashes(path: Path) -> dict[str, str]:
    with GGUFFile(path) as f:
        return {t.name: hashlib.sha256(bytes(f.tensor_bytes(t))).hexdigest() for t in f.tensors}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return _write(tmp_path / "tiny.gguf")


def _ok(dlg) -> None:
    dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).click()


def test_edit_value_add_delete_undo_redo(window, qtbot, tiny):  # noqa: F811
    assert window.open_path(tiny)
    mv = window.metadata_view
    window.show_view("metadata")
    assert mv.select_key("general.name")
    dlg = mv.edit_current()
    assert dlg.key_edit.isReadOnly() and dlg.type_combo.currentText() == "STRING"
    assert dlg.text.toPlainText() == "tiny" and dlg.focusWidget() is dlg.text  # typing replaces the value
    assert not dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled() and "unchanged" in \
        dlg.status.text()
    dlg.text.setPlainText("renamed")
    qtbot.keyClick(dlg.text, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)  # Ctrl+Enter applies
    assert not dlg.isVisible()
    row = next(i for i in range(mv.model.rowCount()) if mv.model.item(i).key == "general.name")
    assert mv.model.item(row).value == "renamed" and mv.model.item(row).offset is None
    assert mv.model.data(mv.model.index(row, 3)) == "edited"
    assert mv.dirty and window.windowTitle().startswith("* ") and mv.changes.count() == 1
    # an integer out of its type's range: shown, OK disabled, nothing applied
    assert mv.select_key("llama.context_length")
    dlg = mv.edit_current()
    assert dlg.line.text() == "2048" and dlg.type_combo.currentText() == "UINT32"
    dlg.line.setText("4294967296")
    assert not dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()
    assert "4294967296" in dlg.status.text()
    dlg.line.setText("8192")
    _ok(dlg)
    assert mv.edits.state.value("llama.context_length") == 8192
    # a new key goes at the end; a known key gets llama.cpp's type
    dlg = mv.add_key()
    dlg.key_edit.setText("general.description")
    assert dlg.type_combo.currentText() == "STRING"
    dlg.text.setPlainText("a test model")
    _ok(dlg)
    assert mv.model.item(mv.model.rowCount() - 1).key == "general.description"
    assert mv.model.data(mv.model.index(mv.model.rowCount() - 1, 3)) == "new"
    dlg = mv.add_key()
    dlg.key_edit.setText("general.name")  # exists: refused in the dialog
    dlg.text.setPlainText("x")
    assert not dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()
    dlg.close()
    # delete; general.architecture cannot be deleted
    assert mv.select_key("tokenizer.ggml.scores")
    assert mv.delete_current()
    assert "tokenizer.ggml.scores" not in mv.edits.state
    assert mv.select_key("general.architecture")
    assert not mv.actions_["delete"].isEnabled()
    assert len(mv.edits) == 4 and mv.changes.count() == 4
    # undo twice, redo once: the list shows the undone one, the state follows the cursor
    mv.undo()
    mv.undo()
    assert "general.description" not in mv.edits.state and "tokenizer.ggml.scores" in mv.edits.state
    assert mv.changes.count() == 4 and mv.changes.item(3).text().endswith("(undone)")
    mv.redo()
    assert "general.description" in mv.edits.state and "tokenizer.ggml.scores" in mv.edits.state
    mv.discard_edits()
    assert not mv.dirty and not window.windowTitle().startswith("* ")


def test_array_element_special_token_and_template(window, qtbot, tiny):  # noqa: F811
    assert window.open_path(tiny)
    mv = window.metadata_view
    window.show_view("metadata")
    assert mv.select_key("tokenizer.ggml.tokens")
    dlg = mv.edit_element(3)
    assert dlg.edit.text() == "hello"
    dlg.edit.setText("howdy")
    _ok(dlg)
    assert list(mv.edits.state.value("tokenizer.ggml.tokens"))[3] == "howdy"
    # the special token dialog finds a token by its text and sets its id
    dlg = mv.edit_special_token("eos")
    assert dlg.token_id.value() == 2
    dlg.search.setText("<|im_end|>")
    dlg._find()
    assert dlg.hits.count() == 1
    dlg.hits.setCurrentRow(0)
    assert dlg.token_id.value() == 6
    _ok(dlg)
    assert mv.edits.state.value("tokenizer.ggml.eos_token_id") == 6
    # the template: rendered as typed, in the runner; a template that does not compile is refused
    dlg = mv.edit_template()
    qtbot.waitUntil(lambda: "What is a GGUF file?" in dlg.rendered.toPlainText(), timeout=120000)
    assert dlg.rendered.toPlainText().endswith("<|im_start|>assistant\n")
    qtbot.waitUntil(lambda: dlg.ids.toPlainText() != "", timeout=120000)  # the tokenizer was read in a worker
    dlg.editor.setPlainText("{% if %}")
    assert not dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()
    qtbot.waitUntil(lambda: "does not compile" in dlg.render_status.text(), timeout=120000)
    dlg.editor.setPlainText("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    qtbot.waitUntil(lambda: "[user] How many values" in dlg.rendered.toPlainText(), timeout=120000)
    _ok(dlg)
    assert mv.edits.state.value("tokenizer.chat_template").startswith("{% for m in messages %}[")
    wait_idle(qtbot, window)
    mv.discard_edits()


def test_save_as_writes_what_the_core_writes_and_opens_it(window, qtbot, tiny, tmp_path):  # noqa: F811
    assert window.open_path(tiny)
    mv = window.metadata_view
    assert mv.select_key("general.name")
    dlg = mv.edit_current()
    dlg.text.setPlainText("saved")
    _ok(dlg)
    ops = mv.edits.ops
    out = tmp_path / "out.gguf"
    mv.save_as(str(out))
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: window.doc is not None and Path(window.doc.path) == out, timeout=120000)
    assert not mv.dirty and window.doc.gguf.get("general.name") == "saved"
    assert _tensor_hashes(out) == _tensor_hashes(tiny)
    ref = tmp_path / "ref.gguf"
    save_edited(tiny, ref, ops)
    assert out.read_bytes() == ref.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.gguf", "ref.gguf", "tiny.gguf",
                                                                 "settings.ini"])


def test_overwriting_the_open_file_asks_first(window, qtbot, tiny):  # noqa: F811
    before = tiny.read_bytes()
    inode = tiny.stat().st_ino
    assert window.open_path(tiny)
    mv = window.metadata_view
    assert mv.select_key("general.name")
    dlg = mv.edit_current()
    dlg.text.setPlainText("in place")
    _ok(dlg)
    asked: list[str] = []
    assert mv.save_as(str(tiny), confirm=lambda p: asked.append(p) or False) is None
    assert asked == [str(tiny)] and tiny.read_bytes() == before and mv.dirty
    mv.save_as(str(tiny), confirm=lambda p: True)
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: window.doc is not None and window.doc.gguf.get("general.name") == "in place",
                    timeout=120000)
    assert tiny.stat().st_ino != inode  # a new file renamed over the old one, never written in place
    assert not mv.dirty and window.stale_bar.isHidden()
    assert sorted(p.name for p in tiny.parent.iterdir()) == ["settings.ini", "tiny.gguf"]


def test_unsaved_changes_are_guarded(window, qtbot, tiny, tmp_path, monkeypatch):  # noqa: F811
    other = _write(tmp_path / "other.gguf")
    assert window.open_path(tiny)
    mv = window.metadata_view
    assert mv.select_key("general.name")
    assert mv.delete_current()
    answers = [False]
    monkeypatch.setattr(window, "confirm_discard", lambda: not mv.dirty or answers[0])
    assert not window.open_path(other)
    assert Path(window.doc.path) == tiny and mv.dirty
    window.close_document()
    assert window.doc is not None
    answers[0] = True
    assert window.open_path(other)
    assert Path(window.doc.path) == other and not mv.dirty


@pytest.mark.parametrize("size", [(1100, 700), (1024, 640)])
def test_the_edit_toolbar_fits(window, qtbot, tiny, size):  # noqa: F811
    assert window.open_path(tiny)
    mv = window.metadata_view
    assert mv.select_key("general.name")
    assert mv.delete_current()  # the changes list is shown
    window.show_view("metadata")
    window.resize(*size)
    qtbot.wait(100)
    assert fit_problems(window) == []
    mv.discard_edits()


@pytest.mark.parametrize("button", ["Discard", "Cancel"])
def test_the_real_question_box(window, qtbot, tiny, button):  # noqa: F811
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    from quantscope.gui.mainwindow import MainWindow

    assert window.open_path(tiny)
    mv = window.metadata_view
    assert MainWindow.confirm_discard(window)  # nothing unsaved: no question
    assert mv.select_key("general.name") and mv.delete_current()
    seen: list[str] = []

    def answer() -> None:
        box = QApplication.activeModalWidget()
        assert isinstance(box, QMessageBox)
        seen.append(box.text())
        next(b for b in box.buttons() if b.text() == button).click()

    QTimer.singleShot(300, answer)
    assert MainWindow.confirm_discard(window) is (button == "Discard")
    assert seen and "1 unsaved change" in seen[0]
    mv.discard_edits()


def test_template_editor_says_why_token_ids_are_missing_when_the_tokenizer_does_not_load(window, qtbot, tmp_path):  # noqa: F811
    """Issue 33 item 8: the tokenizer's failure reached ``_status`` with two arguments of three (a TypeError in a
    slot); it must show as the editor's status line, the template still rendered."""
    w = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), "llama")
    w.add_tokenizer_model("no-such-model")
    w.add_token_list(TOKENS)
    w.add_chat_template(TEMPLATE)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert window.open_path(tmp_path / "odd.gguf")
    mv = window.metadata_view
    window.show_view("metadata")
    dlg = mv.edit_template()
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: "no token ids" in dlg.render_status.text(), timeout=120000)
    assert "no-such-model" in dlg.render_status.text()
    wait_idle(qtbot, window)
    dlg.reject()


@pytest.mark.parametrize("ending", ["done at once", "failed at once"])
def test_a_save_that_ends_at_once_leaves_the_view_idle(window, qtbot, tiny, tmp_path, monkeypatch, ending):  # noqa: F811
    """Issue 34: a save that ended before save_as() stored its task left the view "saving" for good (every edit
    action disabled). However it ends, the actions come back."""
    from .test_gui_jobs import run_at_once

    assert window.open_path(tiny)
    mv = window.metadata_view
    assert mv.select_key("general.name")
    dlg = mv.edit_current()
    dlg.text.setPlainText("at once")
    _ok(dlg)
    out = tmp_path / ("out.gguf" if ending == "done at once" else "missing-dir/out.gguf")
    run_at_once(window.runner, monkeypatch)
    mv.save_as(str(out))  # the whole save ran inside save_as()
    assert not mv.saving
    if ending == "done at once":
        qtbot.waitUntil(lambda: window.doc is not None and Path(window.doc.path) == out, timeout=120000)
        assert not mv.dirty
    else:
        assert mv.dirty and "Saving failed" in mv.edit_message.text()
        assert mv.actions_["save"].isEnabled() and mv.actions_["undo"].isEnabled()
    assert mv.actions_["save"].isEnabled() == (mv.edits is not None)
    wait_idle(qtbot, window)
