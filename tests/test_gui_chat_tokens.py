"""The chat's token view on SmolLM2 (issue 20, chat part, GUI): hovering a reply's token shows its probabilities
and alternatives, the colouring toggle tints the document by probability or entropy, clicking a token offers its
alternatives and picking one branches the reply (a second version, "‹ 1/2 ›" switches between them and the
conversation keeps both, saved)."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QHelpEvent, QTextCursor
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QToolTip

from quantscope.core.chat.store import ChatStore
from quantscope.core.chat.tokens import answer_text

from .gui_helpers import window  # noqa: F401

LOAD_TIMEOUT = 120_000
REPLY_TIMEOUT = 240_000


@pytest.fixture(autouse=True)
def chat_data(monkeypatch, tmp_path):
    d = tmp_path / "qs-data"
    monkeypatch.setenv("QUANTSCOPE_DATA", str(d))
    return d


def backgrounds(doc) -> list[tuple[int, int, str]]:
    """``(position, length, colour)`` of every fragment of ``doc`` with a background."""
    out = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            f = it.fragment()
            if f.isValid() and f.charFormat().background().style() != Qt.BrushStyle.NoBrush:
                out.append((f.position(), f.length(), f.charFormat().background().color().name(
                    f.charFormat().background().color().NameFormat.HexArgb)))
            it += 1
        block = block.next()
    return out


def test_hover_colour_click_branch_and_switch(window, qtbot, model_path, chat_data):  # noqa: F811
    assert window.open_path(model_path("smollm2"))
    window.show_view("chat")
    chat = window.chat_view
    with qtbot.waitSignal(chat.engineLoaded, timeout=LOAD_TIMEOUT):
        assert chat.load_model()
    chat.apply_preset("Greedy")
    chat.max_spin.setValue(14)
    with qtbot.waitSignal(chat.replyFinished, timeout=REPLY_TIMEOUT):
        assert chat.send("Name three colours.")
    reply = chat.messages[-1]
    view = chat.views[-1]
    recs = reply.tokens
    assert len(recs) == 14 and all(len(r.alternatives) == 10 for r in recs)
    assert answer_text(recs) == reply.content and view.records == recs
    assert not view.prev_btn.isVisible() and reply.n_variants == 1

    # hover: the token's tool tip with both probabilities, entropy and the ten alternatives
    k = next(i for i, r in enumerate(recs) if i >= 2 and r.text.strip() and r.alternatives[1].prob > 0.01)
    pt = view.token_point(k)
    assert pt is not None and view.token_at(pt) == k
    vp = view.body.viewport()
    QApplication.sendEvent(vp, QHelpEvent(QEvent.Type.ToolTip, pt, vp.mapToGlobal(pt)))
    tip = QToolTip.text()
    r = recs[k]
    assert f"token {r.token}" in tip and f"probability {r.prob * 100:.1f} %" in tip
    assert "temperature 0" in tip and f"entropy {r.entropy:.2f} nats" in tip
    assert tip.count("<tr>") == 11  # the header and ten alternatives
    assert all(f"{a.prob * 100:.1f} %" in tip or a.prob < 0.001 for a in r.alternatives)
    QToolTip.hideText()

    # colouring: off has no tints, probability and entropy tint the tokens differently
    doc = view.body.document()
    plain = backgrounds(doc)  # inline code only, if any
    chat.color_combo.setCurrentIndex(chat.color_combo.findData("probability"))
    by_prob = backgrounds(view.body.document())
    assert len(by_prob) > len(plain)
    chat.color_combo.setCurrentIndex(chat.color_combo.findData("entropy"))
    by_ent = backgrounds(view.body.document())
    assert by_ent and by_ent != by_prob
    # the least likely token is tinted where it is written
    low = min(range(len(recs)), key=lambda i: recs[i].prob)
    pos = view.token_map().position(low)
    chat.color_combo.setCurrentIndex(chat.color_combo.findData("probability"))
    if recs[low].prob < 0.9 and pos >= 0:
        cur = QTextCursor(view.body.document())
        cur.setPosition(pos + 1)
        assert cur.charFormat().background().style() != Qt.BrushStyle.NoBrush
    chat.color_combo.setCurrentIndex(chat.color_combo.findData("off"))
    assert backgrounds(view.body.document()) == plain

    # click the token: its alternatives; picking the second one branches the reply there
    QTest.mouseClick(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, view.token_point(k))
    menu = chat.reply.alt_menu
    assert menu is not None
    acts = [a for a in menu.actions() if a.data() is not None]
    assert [a.data() for a in acts] == [a.token for a in r.alternatives]
    current = next(a for a in acts if a.data() == r.token)
    assert current.isChecked() and not current.isEnabled()
    alt = next(a for a in acts if a.data() != r.token)
    with qtbot.waitSignal(chat.replyFinished, timeout=REPLY_TIMEOUT):
        alt.trigger()
    new = chat.messages[-1]
    assert len(chat.messages) == 2 and new.n_variants == 2 and new.variant == 1
    assert [t.token for t in new.tokens[:k]] == [t.token for t in recs[:k]]
    assert new.tokens[k].token == alt.data() and new.tokens[k].chosen
    assert new.content.startswith(answer_text(recs[:k])) and new.content != reply.content
    view = chat.views[-1]
    assert view.prev_btn.isVisible() and view.variant_label.text() == "2/2" and not view.next_btn.isEnabled()

    # the switcher shows the first version and back
    view.prev_btn.click()
    view = chat.views[-1]
    assert chat.messages[-1].content == reply.content and view.variant_label.text() == "1/2"
    view.next_btn.click()
    view = chat.views[-1]
    assert chat.messages[-1].content == new.content and view.variant_label.text() == "2/2"
    # a follow-up continues from the shown version; switching back keeps it with that version
    chat.max_spin.setValue(4)
    with qtbot.waitSignal(chat.replyFinished, timeout=REPLY_TIMEOUT):
        assert chat.send("More.")
    assert len(chat.messages) == 4
    assert chat.switch_variant(1, 0) and len(chat.messages) == 2 and chat.messages[1].content == reply.content
    assert chat.switch_variant(1, 1) and len(chat.messages) == 4

    # saved with both versions and the tokens
    with ChatStore() as s:
        saved = s.get(chat.conv_id).messages
    assert [m.content for m in saved] == [m.content for m in chat.messages]
    assert saved[1].variant == 1 and saved[1].variants[0].message.content == reply.content
    assert saved[1].tokens[k].chosen and len(saved[1].variants[0].message.tokens) == 14
    assert chat.views[1].variant_label.text() == "2/2" and chat.views[1].records[k].chosen


def test_a_streaming_reply_is_tinted_as_it_grows(qtbot):
    """Colouring does not wait for the end: each streamed batch is tinted by its tokens' records (which arrive
    before their text), a token without a tint stays clear after a tinted one, and switching the mode while it
    streams re-tints what is there (off: no tint at all)."""
    from quantscope.core.chat.tokens import TokenRecord
    from quantscope.gui.views.chat_widgets import MessageView

    v = MessageView(0, "assistant", "", "chat")
    qtbot.addWidget(v)
    v.color_mode = "probability"
    v.start_streaming()
    recs = [TokenRecord(1, "Hello", "Hello", 0.3, 0.3, 2.0), TokenRecord(2, " world", " world", 0.999, 0.999, 0.01),
            TokenRecord(3, "!", "!", 0.05, 0.05, 3.0)]
    v.records.extend(recs[:2])
    v.append("Hello world")
    tinted = backgrounds(v.body.document())
    assert [(p, n) for p, n, _c in tinted] == [(0, 5)]  # " world" is near certain: no tint, not the previous one
    v.records.append(recs[2])
    v.append("!")
    assert [(p, n) for p, n, _c in backgrounds(v.body.document())] == [(0, 5), (11, 1)]
    v.set_color_mode("entropy")
    assert [(p, n) for p, n, _c in backgrounds(v.body.document())] == [(0, 5), (11, 1)]
    assert backgrounds(v.body.document())[0][2] != tinted[0][2]  # the other scale
    v.set_color_mode("off")
    assert backgrounds(v.body.document()) == []
    assert v.body.toPlainText() == "Hello world!"


def test_the_colour_choice_is_remembered(window, qtbot):  # noqa: F811
    from quantscope.gui.mainwindow import MainWindow

    assert window.chat_view.settings.color_mode == "off"
    window.chat_view.settings.set_color_mode("entropy")
    window.settings.sync()
    again = MainWindow(window.settings)
    qtbot.addWidget(again)
    assert again.chat_view.settings.color_mode == "entropy"
    again.close()


def test_the_colouring_has_a_legend_that_follows_the_mode(window, qtbot, model_path):  # noqa: F811
    """Issue 34: colouring by probability or entropy had no legend. Under the replies a strip shows what the tint
    means, its two ends named, while the replies are coloured."""
    chat = window.chat_view
    assert window.open_path(model_path("smollm2"))
    window.show_view("chat")
    legend = chat.color_legend
    assert chat.settings.color_mode == "off" and legend.isHidden()
    chat.settings.set_color_mode("probability")
    assert legend.isVisible()
    assert (legend.title.text(), legend.low.text(), legend.high.text()) == ("Probability:", "certain", "unlikely")
    stops = legend.stops()
    assert stops[0].alpha() == 0 and stops[-1].alpha() > 100  # clear when certain, strongest when unlikely
    assert stops[-1].hue() < 20  # red at the unlikely end
    chat.settings.set_color_mode("entropy")
    assert not legend.isHidden() and legend.low.text() == "one choice" and legend.high.text().startswith("many")
    assert 260 <= legend.stops()[-1].hue() <= 290  # violet at the many-choices end
    chat.settings.set_color_mode("off")
    assert legend.isHidden()


def test_after_branching_esc_stops_and_keys_reach_the_composer(window, qtbot, model_path):  # noqa: F811
    """Picking an alternative rebuilds the reply views, the clicked one (which had the focus) included: the focus
    goes to the composer, so Esc stops the branch's reply and typed keys are not lost."""
    assert window.open_path(model_path("smollm2"))
    window.show_view("chat")
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    chat = window.chat_view
    with qtbot.waitSignal(chat.engineLoaded, timeout=LOAD_TIMEOUT):
        assert chat.load_model()
    chat.apply_preset("Greedy")
    chat.max_spin.setValue(6)
    with qtbot.waitSignal(chat.replyFinished, timeout=REPLY_TIMEOUT):
        assert chat.send("Tell me a long story about a dragon.")
    view = chat.views[-1]
    recs = chat.messages[-1].tokens
    k = next(i for i, r in enumerate(recs) if i >= 1 and r.text.strip())
    vp = view.body.viewport()
    view.body.setFocus()
    QTest.mouseClick(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, view.token_point(k))
    menu = chat.reply.alt_menu
    qtbot.waitUntil(menu.isVisible)
    alt = next(a for a in menu.actions() if a.data() is not None and a.data() != recs[k].token)
    chat.max_spin.setValue(400)
    # the branch's reply waits after its first token until Esc was pressed (it cannot end on its own first)
    held, go = threading.Event(), threading.Event()

    def hold(_req, _text, _stats) -> None:  # on the model thread
        if not held.is_set():
            held.set()
            go.wait(REPLY_TIMEOUT / 1000)

    worker = chat.host._worker
    worker.delta.connect(hold, Qt.ConnectionType.DirectConnection)
    try:
        with qtbot.waitSignal(chat.replyFinished, timeout=REPLY_TIMEOUT) as sig:
            menu.setActiveAction(alt)
            QTest.keyClick(menu, Qt.Key.Key_Return)  # as a user picks it: the menu closes, the reply branches
            qtbot.waitUntil(lambda: not menu.isVisible() and chat.host.state == "generating", timeout=60000)
            window.activateWindow()  # the window manager's part once the popup is gone (offscreen has none)
            qtbot.waitUntil(window.isActiveWindow)
            focus = QApplication.focusWidget()
            assert focus is chat.composer
            qtbot.waitUntil(held.is_set, timeout=REPLY_TIMEOUT)
            QTest.keyClick(focus, Qt.Key.Key_Escape)
            go.set()
    finally:
        go.set()
        worker.delta.disconnect(hold)
    assert sig.args[0].stop_reason == "cancelled" and sig.args[0].n_generated < 400 - k
    QTest.keyClicks(QApplication.focusWidget(), "next")
    assert chat.composer.toPlainText() == "next"
