"""The Serve tab and the Overview with an embedding model (issue 51, docs/embeddings.md): the tab serves the
BERT fixture with the embedding server (no slots or context to choose), lists its endpoints, shows an embeddings
example, answers the real openai and ollama clients, counts their requests, and stops; the Overview shows the
pooling and the head; the chat says plainly the model does not chat."""

from __future__ import annotations

import numpy as np
import ollama
import openai

from quantscope.core.engine.encoder import Encoder

from .bert_fixtures import write_fixture
from .gui_helpers import fit_problems, window  # noqa: F401
from .test_gui_serve import in_loop, port_free


def test_serve_an_embedding_model(window, qtbot, tmp_path):  # noqa: F811
    path = write_fixture("bert-mean", tmp_path / "bge-tiny.gguf")
    assert window.open_path(path)
    sv = window.serve_view
    window.show_view("serve")
    assert sv.embedding is not None and sv.embedding["pooling"] == "mean"
    assert not sv.slots_spin.isVisible() and not sv.ctx_spin.isVisible() and sv.endpoints_label.isVisible()
    assert "/api/embed" in sv.endpoints_label.full_text() and "/v1/embeddings" in sv.endpoints_label.full_text()
    assert "embedding model" in sv.status_label.full_text()
    sv.port_spin.setValue(0)
    in_loop(qtbot, sv.start_btn.click)
    qtbot.waitUntil(lambda: sv.state != "loading", timeout=120000)
    assert sv.state == "serving", sv.message
    url, port = sv.server.url, sv.server.port
    assert "/v1/embeddings" in sv.example.toPlainText() and url in sv.example.toPlainText()
    sv.example_combo.setCurrentIndex(1)
    assert "client.embeddings.create(" in sv.example.toPlainText()

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    r = client.embeddings.create(model=sv.model_id, input=["hello", "world"])
    with Encoder(path) as enc:
        want = enc.embed(["hello", "world"])
    assert all(np.allclose(d.embedding, w, atol=1e-6) for d, w in zip(r.data, want, strict=True))
    oc = ollama.Client(host=url, timeout=60)
    o = oc.embed(model=sv.model_id, input="hello")
    assert np.allclose(o.embeddings[0], want[0], atol=1e-6)
    client.close()  # (the clients close their kept-alive connections first: no TIME_WAIT on the server's port)
    oc.close()
    qtbot.waitUntil(lambda: "2 requests answered" in sv.status_label.full_text(), timeout=10000)
    assert "mean pooling, 64 values a vector" in sv.status_label.full_text()
    window.resize(1100, 700)
    qtbot.wait(50)
    assert fit_problems(window) == []
    in_loop(qtbot, sv.start_btn.click)
    qtbot.waitUntil(lambda: sv.state == "idle", timeout=60000)
    assert sv.server is None and port_free(port)


def test_overview_shows_the_pooling_and_the_head(window, qtbot, tmp_path):  # noqa: F811
    assert window.open_path(write_fixture("bert-cls", tmp_path / "bge-cls.gguf"))
    ov = window.overview
    rows = dict(ov.hyper_model.rows)
    assert rows["pooling"] == "cls (bert.pooling_type = 2)"
    assert rows["head"] == "none (the pooled vector, 64 values)"
    assert "embedding model, cls pooling" in ov.cards["Architecture"].sub.full_text()


def test_the_chat_says_an_embedding_model_does_not_chat(window, qtbot, tmp_path):  # noqa: F811
    assert window.open_path(write_fixture("bert-mean", tmp_path / "bge-tiny.gguf"))
    window.show_view("chat")
    qtbot.wait(50)
    chat = window.chat_view
    assert chat.error == "This is an embedding model: it does not chat or generate text."
    assert chat.error_banner.isVisible() and "Serve tab" in chat.error_banner.text()
    assert chat.is_embedding and chat.stream.empty_label.text() == ""
    window.resize(1100, 700)
    qtbot.wait(50)
    assert fit_problems(window) == []
