"""The Serve tab (issue 38): start serving the open file, a real client's request shows in the Requests panel
live then finished, opening it shows the reply's tokens, "Probe this prompt" opens the Probe on its prompt, Stop
frees the port, a port in use is one line, and closing the window while serving shuts everything down. Driven
through the event loop, so the watchdog (tests/watchdog.py) times every slot."""

from __future__ import annotations

import socket
import threading

import openai
from PySide6.QtCore import QTimer

from quantscope.core.chat.tokens import answer_text

from .gui_helpers import fit_problems, window  # noqa: F401


def in_loop(qtbot, fn) -> None:  # type: ignore[no-untyped-def]
    """Run ``fn`` from the event loop, as a click does."""
    done: list[bool] = []
    QTimer.singleShot(0, lambda: (fn(), done.append(True)))
    qtbot.waitUntil(lambda: bool(done), timeout=60000)


def serve(qtbot, win, port: int = 0, slots: int = 2):  # type: ignore[no-untyped-def]
    sv = win.serve_view
    win.show_view("serve")
    assert win.current_view() == "serve"
    sv.port_spin.setValue(port)
    sv.slots_spin.setValue(slots)
    sv.ctx_spin.setValue(512)
    in_loop(qtbot, sv.start_btn.click)
    qtbot.waitUntil(lambda: sv.state != "loading", timeout=120000)
    return sv


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_serve_a_request_live_then_finished_open_it_and_stop(window, qtbot, model_path):  # noqa: F811
    assert window.open_path(model_path("smollm2"))
    sv = serve(qtbot, window)
    assert sv.state == "serving", sv.message
    url = sv.server.url
    port = sv.server.port
    assert url in sv.status_label.full_text() and url in sv.example.toPlainText()
    assert "curl" in sv.example.toPlainText()
    sv.example_combo.setCurrentIndex(1)
    assert "OpenAI(base_url=" in sv.example.toPlainText()
    in_loop(qtbot, sv.copy_btn.click)
    from PySide6.QtGui import QGuiApplication

    assert QGuiApplication.clipboard().text() == sv.example.toPlainText()

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    got: list[str] = []
    release = threading.Event()

    def run() -> None:
        stream = client.chat.completions.create(model=sv.model_id, stream=True, max_tokens=40, temperature=0,
                                                messages=[{"role": "user", "content": "Name three colours."}])
        parts = []
        for c in stream:
            for ch in c.choices:
                parts.append(ch.delta.content or "")
            if len(parts) == 3:
                release.wait(120)  # (the client waits too)
        got.append("".join(parts))

    sched, log = sv.server.scheduler, sv.server.app.log

    def hold_reply() -> None:  # on the scheduler's thread: the reply stops once it has text, until released
        recs = log.records()
        if recs and recs[-1].text and not release.is_set():
            release.wait(120)  # a hang guard; the panel shows the request live meanwhile

    # the server itself holds the reply mid-way (a client that stops reading does not: 40 tokens fit in the
    # socket's buffer, and the request could end before a slow GUI thread showed it live)
    sched.before_step.append(hold_reply)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    model = sv.model
    qtbot.waitUntil(lambda: model.rowCount() == 1 and model.rows[0].status in ("prompt", "generating"),
                    timeout=120000)
    status = model.index(0, 3).data()
    assert status in ("reading prompt", "generating")
    assert model.index(0, 1).data() == "/chat/completions · stream"
    assert model.index(0, 2).data().startswith("127.0.0.1:")
    assert model.index(0, 8).data() == "OpenAI"
    # opened while it streams: the text so far, tinted as it comes
    in_loop(qtbot, lambda: sv.table.selectRow(0))
    qtbot.waitUntil(lambda: sv.reply_view.streaming and bool(sv.reply_view.content), timeout=120000)
    assert sv.reply_view.records and model.rows[0].text.startswith(sv.reply_view.content)
    release.set()
    sched.before_step.remove(hold_reply)
    qtbot.waitUntil(lambda: not t.is_alive() and model.rows[0].done, timeout=120000)
    qtbot.waitUntil(lambda: sv._shown_done and not sv.reply_view.streaming, timeout=60000)
    qtbot.waitUntil(lambda: model.index(0, 3).data().startswith("done"), timeout=60000)
    rec = model.rows[0]
    assert int(model.index(0, 5).data()) == rec.completion_tokens > 0
    assert got and got[0] == rec.text

    # opening it: the prompt, the reply with its tokens (equal to the reply), tinted by probability
    assert sv._shown is rec
    assert "Name three colours." in sv.prompt_view.toPlainText()
    view = sv.reply_view
    assert view.content == got[0]
    assert answer_text(view.records) == got[0] and len(view.records) == rec.completion_tokens
    assert all(r.known and r.alternatives for r in view.records)
    assert view.color_mode == "probability" and sv.legend.isVisible()
    assert view.tooltip_for(0)  # the alternatives on hover
    runs = view.token_map().runs()  # the rendered reply's characters map back to its tokens
    assert len(runs) >= len(view.records) // 2
    i = runs[len(runs) // 2][2]
    assert view.token_point(i) is not None and view.token_at(view.token_point(i)) == i

    for size in ((1100, 700), (1024, 640)):  # a laptop screen: nothing cut, no sideways scrolling
        window.resize(*size)
        qtbot.wait(50)
        assert fit_problems(window) == [], size

    # "Probe this prompt": the Probe tab on the request's prompt
    assert sv.probe_btn.isEnabled()
    in_loop(qtbot, sv.probe_btn.click)
    assert window.current_view() == "probe"
    assert "Name three colours." in window.probe_view.prompt.toPlainText()
    qtbot.waitUntil(lambda: not window.probe_view.busy, timeout=120000)
    assert window.probe_view.result is not None

    # stop frees the port
    window.show_view("serve")
    in_loop(qtbot, sv.start_btn.click)
    qtbot.waitUntil(lambda: sv.state == "idle", timeout=60000)
    assert sv.server is None and sv.engine is None
    assert port_free(port)
    assert sv.status_label.full_text() == "Stopped."
    assert model.rowCount() == 1  # the finished requests stay to look at


def test_a_port_in_use_is_one_line(window, qtbot, model_path):  # noqa: F811
    assert window.open_path(model_path("smollm2"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        sv = serve(qtbot, window, port=port)
        assert sv.state == "idle" and sv.server is None and sv.engine is None
        msg = sv.status_label.full_text()
        assert msg == f"Port {port} is in use: choose another port (0 picks a free one)."
        assert "\n" not in msg and "Traceback" not in msg
        assert sv.start_btn.text() == "Start serving" and sv.port_spin.isEnabled()


def test_closing_the_window_while_serving_shuts_down(qtbot, tmp_path, model_path):
    from PySide6.QtCore import QSettings

    from quantscope.gui.mainwindow import MainWindow

    w = MainWindow(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(w)
    w.resize(1100, 700)
    w.show()
    assert w.open_path(model_path("smollm2"))
    sv = serve(qtbot, w)
    assert sv.state == "serving"
    port = sv.server.port
    threads = [t for t in threading.enumerate() if t.name.startswith("quantscope-")]
    assert any(t.name == "quantscope-http" for t in threads)
    qtbot.wait(50)
    assert fit_problems(w) == []
    w.close()
    assert port_free(port)
    assert not any(t.is_alive() for t in threads)


def test_screenshot_of_the_serve_view(tmp_path, model_path):
    """``--view serve``: serving after three real requests, one opened; the process ends (the server stopped)."""
    import os
    import subprocess
    import sys

    from PySide6.QtGui import QImage

    out = tmp_path / "serve.png"
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    r = subprocess.run([sys.executable, "-m", "quantscope.cli", str(model_path("smollm2")), "--screenshot", str(out),
                        "--view", "serve", "--size", "1100x700", "--theme", "dark"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    img = QImage(str(out))
    assert (img.width(), img.height()) == (1100, 700)


def test_reached_from_the_chat_an_api_key_and_cancel_while_loading(window, qtbot, model_path):  # noqa: F811
    import http.client as httplib
    import json

    assert window.open_path(model_path("smollm2"))
    window.show_view("chat")
    in_loop(qtbot, window.chat_view.model_bar.serve_btn.click)
    assert window.current_view() == "serve"
    sv = window.serve_view
    # Cancel while the model loads: back to idle, nothing left running
    sv.port_spin.setValue(0)
    in_loop(qtbot, sv.start_btn.click)
    assert sv.state == "loading" and sv.start_btn.text() == "Cancel"
    in_loop(qtbot, sv.start_btn.click)
    qtbot.waitUntil(lambda: sv.state == "idle", timeout=60000)
    assert sv.server is None and sv.engine is None
    assert not any(t.name.startswith("quantscope-serve") and t.is_alive() for t in threading.enumerate())
    # a key: the example sends it, a request without it is refused (401) and listed as such
    sv.key_edit.setText("sekrit-1")
    serve(qtbot, window)
    assert sv.state == "serving" and "API key required" in sv.status_label.full_text()
    assert 'Authorization: Bearer sekrit-1' in sv.example.toPlainText()
    c = httplib.HTTPConnection("127.0.0.1", sv.server.port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hi", "max_tokens": 2}),
              headers={"Content-Type": "application/json"})
    assert c.getresponse().status == 401
    c.close()
    ok = openai.OpenAI(base_url=sv.server.url + "/v1", api_key="sekrit-1", max_retries=0, timeout=120)
    text = ok.completions.create(model=sv.model_id, prompt="Hi", max_tokens=4, temperature=0).choices[0].text
    qtbot.waitUntil(lambda: sv.model.rowCount() == 2 and sv.model.rows[1].done, timeout=120000)
    assert sv.model.index(0, 3).data() == "refused 401" and "API key" in sv.model.rows[0].error
    assert sv.model.rows[1].text == text and sv.model.index(1, 3).data().startswith("done")
    in_loop(qtbot, sv.start_btn.click)
    qtbot.waitUntil(lambda: sv.state == "idle", timeout=60000)


def test_probe_this_prompt_reads_the_tokens_the_server_read(window, qtbot, model_path):  # noqa: F811
    """SmolLM2 has add_bos_token = False and its BOS text (<|im_start|>) opens every chat prompt: the Probe must
    read all of the server's tokens, not drop that first one as if its tokenizer added it back."""
    assert window.open_path(model_path("smollm2"))
    sv = serve(qtbot, window)
    assert sv.state == "serving", sv.message
    client = openai.OpenAI(base_url=sv.server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    client.chat.completions.create(model=sv.model_id, max_tokens=1, temperature=0,
                                   messages=[{"role": "user", "content": "Name three colours."}])
    qtbot.waitUntil(lambda: sv.model.rowCount() == 1 and sv.model.rows[0].done, timeout=120000)
    rec = sv.model.rows[0]
    in_loop(qtbot, lambda: sv.table.selectRow(0))
    qtbot.waitUntil(lambda: sv._shown is rec and sv.probe_btn.isEnabled(), timeout=60000)
    in_loop(qtbot, sv.probe_btn.click)
    pv = window.probe_view
    qtbot.waitUntil(lambda: not pv.busy and pv.result is not None, timeout=120000)
    assert pv.result.probe.tokens == rec.prompt_ids
    in_loop(qtbot, sv.start_btn.click)
    qtbot.waitUntil(lambda: sv.state == "idle", timeout=60000)


def test_idle_is_not_an_error_and_a_freed_port_is_said(window, qtbot, model_path):  # noqa: F811
    from quantscope.gui.theme import BAD_COLOR

    assert window.open_path(model_path("smollm2"))
    sv = window.serve_view
    window.show_view("serve")
    assert window.open_path(model_path("smollm2"))  # (the view is set up again: still idle, still no error)
    assert sv.status_label.full_text().startswith("Not serving") and BAD_COLOR not in sv.status_label.styleSheet()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        serve(qtbot, window, port=port)
        assert "is in use" in sv.status_label.full_text() and BAD_COLOR in sv.status_label.styleSheet()
    finally:
        s.close()
    # the other program let the port go: the page follows, without another click
    qtbot.waitUntil(lambda: "in use" not in sv.status_label.full_text(), timeout=60000)
    assert f"Port {port} is free now" in sv.status_label.full_text()
    assert BAD_COLOR not in sv.status_label.styleSheet()
    qtbot.waitUntil(lambda: not sv.timer.isActive(), timeout=60000)  # nothing left to follow


def test_the_reply_tooltip_offers_a_click_only_where_a_click_branches(qtbot):
    from quantscope.core.chat.tokens import Alternative, TokenRecord
    from quantscope.gui.views.chat_widgets import MessageView

    alt = [Alternative(5, "a", 0.6, 0.6), Alternative(6, "b", 0.4, 0.4)]
    rec = TokenRecord(5, "a", "a", 0.6, 0.6, 0.67, tuple(alt))
    v = MessageView(1, "assistant", "a", "chat")
    qtbot.addWidget(v)
    v.set_records([rec])
    assert not v.branchable and "Click the token" not in v.tooltip_for(0)  # the Serve tab's replies
    v.branchable = True
    assert "Click the token to continue with another one" in v.tooltip_for(0)  # the chat's, when idle


def test_the_api_column_names_each_request_s_dialect():
    from quantscope.core.server.requests import RequestRecord
    from quantscope.gui.views.serve import COLUMNS, RequestsModel

    col = COLUMNS.index("API")
    for path, shown in (("/v1/chat/completions", "OpenAI"), ("/completions", "OpenAI"), ("/api/chat", "Ollama"),
                        ("/api/generate", "Ollama"), ("/v1/messages", "Anthropic")):
        assert RequestsModel.text(RequestRecord(1, path, "127.0.0.1:1"), col) == shown
