"""Publish… from the Quant lab's Budget page after a Write (gui/views/publish_dialog.py), against the hub that runs
here (tests/hubserver.py) with the real ``huggingface_hub`` client in-process: the card preview with the page's
figures (target, bits per weight, predicted and measured mean KLD, the calibration text, the rules), the upload in the
dialog's worker (one commit: the file and README.md, the file uploaded by LFS byte for byte), a missing token refused
in one line, and Cancel at an exact point of the upload leaving nothing committed. Nothing is timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantscope.core.gguf import GGUFFile
from quantscope.gui.views.publish_dialog import PublishDialog

from .gui_helpers import cancel_when, window  # noqa: F401
from .hubserver import HubServer
from .test_gui_budget import TEXT, _measure, _page, llama  # noqa: F401

TOKEN = "hf_testtoken"


@pytest.fixture
def server(tmp_path, monkeypatch):
    from huggingface_hub import constants

    s = HubServer()
    with s:
        for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGING_FACE_HUB_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setattr(constants, "ENDPOINT", s.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            s.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))  # no saved token
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        yield s


def _written(qtbot, window, llama, tmp_path, check: bool) -> tuple[object, Path]:  # noqa: F811
    page = _page(window, llama, tmp_path / "costs")
    _measure(qtbot, page)
    page.set_budget_to_preset("Q4_K_M")
    if check:
        with qtbot.waitSignal(page.refineFinished, timeout=120000) as sig:
            assert page.refine()
        assert sig.args[0] is not None
    out = tmp_path / "out" / "tiny-mix.gguf"
    out.parent.mkdir()
    page.output.setText(str(out))
    assert not page.publish_btn.isEnabled()  # nothing written yet
    with qtbot.waitSignal(page.writeFinished, timeout=120000) as sig:
        assert page.write()
    assert sig.args == [out]
    qtbot.waitUntil(lambda: page.publish_btn.isEnabled(), timeout=10000)
    return page, out


def _dialog(qtbot, page) -> PublishDialog:
    page.publish_btn.click()
    dlg = page.publish_dialog
    assert isinstance(dlg, PublishDialog) and dlg.isVisible()
    qtbot.waitUntil(lambda: dlg.card != "" and not dlg.job.busy, timeout=60000)
    return dlg


def test_publish_after_a_write_uploads_the_file_and_a_card_with_the_figures(
        qtbot, server, window, llama, tmp_path, monkeypatch):  # noqa: F811
    page, out = _written(qtbot, window, llama, tmp_path, check=True)
    measured = page.refined.measured_kld
    # no token anywhere: the dialog says so, and the hub's refusal is one line
    dlg = _dialog(qtbot, page)
    assert "No token found" in dlg.token_note.text()
    assert dlg.repo.text() == "your-name/tiny-mix-GGUF"
    dlg.repo.setText("org/tiny-mix-GGUF")
    qtbot.waitUntil(lambda: "# " in dlg.preview.toPlainText() and "quantscope pull org/tiny-mix-GGUF"
                    in dlg.preview.toPlainText(), timeout=10000)
    card = dlg.preview.toPlainText()
    assert card.startswith("---\n") and "- quantscope" in card
    assert "## Measured against the base" in card
    assert f"| Measured mean KLD of the whole mix | {measured:.5f} |" in card
    assert f"| Predicted mean KLD | {page.refined.plan.predicted_cost:.5f} |" in card
    assert f"calibration text: `{TEXT.name}`" in card and "## Tensor type rules (`--tensor-type`)" in card
    assert dlg.strip.run_btn.isEnabled()
    dlg.strip.run_btn.click()
    qtbot.waitUntil(lambda: dlg.state == "failed", timeout=60000)
    assert "HTTP 401" in dlg.strip.status.text() and "\n" not in dlg.strip.status.text()
    assert server.commits == []
    # a pasted token (the saved one would do as well): one commit, the file byte for byte and the card
    dlg.token.setText(TOKEN)
    dlg.private.setChecked(True)
    with qtbot.waitSignal(dlg.published, timeout=60000) as sig:
        dlg.strip.run_btn.click()
    assert dlg.state == "done" and sig.args[0].startswith(f"{server.url}/org/tiny-mix-GGUF/commit/")
    assert server.commits == [{"repo": "org/tiny-mix-GGUF", "summary": "Upload tiny-mix.gguf (Quantscope)",
                               "files": ["README.md", "tiny-mix.gguf"]}]
    repo = server.repos["org/tiny-mix-GGUF"]
    assert repo.files["tiny-mix.gguf"] == out.read_bytes()
    assert repo.files["README.md"].decode() == dlg.card
    assert server.cards[-1]["tags"] == ["gguf", "quantscope"]
    assert "Published tiny-mix.gguf" in dlg.strip.status.text()
    with GGUFFile(out) as f:
        assert f.file_size == len(repo.files["tiny-mix.gguf"])
    dlg.close()
    assert dlg.runner.closed and dlg.gguf is None


def test_cancel_during_the_upload_commits_nothing(qtbot, server, window, llama, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # found by the client, as a user's would be
    page, _out = _written(qtbot, window, llama, tmp_path, check=False)
    dlg = _dialog(qtbot, page)
    assert "A token was found" in dlg.token_note.text()
    assert "Measured mean KLD" not in dlg.card and "| Predicted mean KLD |" in dlg.card  # not checked: predicted
    dlg.repo.setText("org/cancelled-GGUF")
    qtbot.waitUntil(lambda: "org/cancelled-GGUF" in dlg.card, timeout=10000)
    seen: list[tuple[int, int, str]] = []
    # cancelled at the first report of the upload (after the file was hashed): the next read stops it
    with cancel_when(dlg.runner, "hub-publish", lambda d, _t, what: what.startswith("uploading") and d > 0, seen):
        dlg.strip.run_btn.click()
        qtbot.waitUntil(lambda: dlg.state == "cancelled", timeout=60000)
    assert dlg.strip.status.text() == "Publishing cancelled: nothing was committed."
    assert any(w.startswith("hashing tiny-mix.gguf") for _d, _t, w in seen)
    assert server.commits == [] and not server.repos["org/cancelled-GGUF"].files
    dlg.close()
