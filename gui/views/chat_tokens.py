"""A reply's tokens in the chat: which token is under a point of its text, the tool tip with its probabilities and
alternatives, colouring the text by probability or entropy, and the menu of alternatives a branch starts from.

A finished chat reply is shown as rendered Markdown, whose text is the reply's without its markup: each character
of the document is matched to one of the reply (:func:`align`), then to the token that wrote it
(:func:`~quantscope.core.chat.tokens.answer_spans`). Streaming replies and plain completions are shown as they
are, so the match is exact."""

from __future__ import annotations

import bisect
import html
import math
from collections.abc import Sequence
from typing import ClassVar

from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor, QTextDocument
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMenu, QWidget

from quantscope.core.chat.tokens import TokenRecord, answer_spans, answer_text

from ..theme import is_dark

#: colouring modes of a reply's text
COLOR_MODES = ("off", "probability", "entropy")
#: the entropy (nats) shown at full strength
ENTROPY_FULL = 4.0
_LOOKAHEAD = 256
_SEPARATORS = "\u2029\u2028\ufdd0\ufdd1\ufdd2\ufffc"


def visible(text: str) -> str:
    """Whitespace made visible (a token's text in a tool tip or menu)."""
    return text.replace(" ", "·").replace("\n", "↵").replace("\t", "→").replace("\r", "␍")


def align(doc: str, raw: str) -> list[int]:
    """For each character of ``doc`` (the rendered text) the offset of the character of ``raw`` (the reply) it
    shows, or -1 (list numbers, separators). Markup characters of ``raw`` are skipped; whitespace matches
    whitespace; a character not found within a window is left unmatched so that one stray character cannot
    shift the rest."""
    if doc == raw:
        return list(range(len(doc)))
    out = [-1] * len(doc)
    j = 0
    n = len(raw)
    for i, c in enumerate(doc):
        if c in _SEPARATORS or c.isspace():
            if j < n and raw[j].isspace():
                out[i] = j
                j += 1
            continue
        k = raw.find(c, j, j + _LOOKAHEAD)
        if k >= 0:
            out[i] = k
            j = k + 1
    return out


class TokenMap:
    """Which token wrote each character of a rendered reply."""

    def __init__(self, doc_text: str, records: Sequence[TokenRecord]) -> None:
        self.records = list(records)
        spans = answer_spans(self.records)
        self._starts = [s for s, _e, _i in spans]
        self._spans = spans
        offsets = align(doc_text, answer_text(self.records))
        self.at: list[int] = [self._token_of(o) for o in offsets]

    def _token_of(self, offset: int) -> int:
        if offset < 0:
            return -1
        k = bisect.bisect_right(self._starts, offset) - 1
        if k < 0:
            return -1
        s, e, i = self._spans[k]
        return i if s <= offset < e else -1

    def token(self, pos: int) -> int:
        """The record index of the token at document position ``pos`` (-1: none)."""
        return self.at[pos] if 0 <= pos < len(self.at) else -1

    def runs(self) -> list[tuple[int, int, int]]:
        """``(start, end, record index)`` runs of document positions written by one token."""
        out: list[tuple[int, int, int]] = []
        start = 0
        for p in range(1, len(self.at) + 1):
            if p == len(self.at) or self.at[p] != self.at[start]:
                if self.at[start] >= 0:
                    out.append((start, p, self.at[start]))
                start = p
        return out

    def position(self, index: int) -> int:
        """The first document position of record ``index`` (-1 when it shows nowhere)."""
        try:
            return self.at.index(index)
        except ValueError:
            return -1


def token_color(r: TokenRecord, mode: str, dark: bool | None = None) -> QColor | None:
    """The background of a token coloured by ``mode`` (None: no tint): by probability, from clear (certain)
    through yellow to red (unlikely); by entropy, from clear (one choice) to violet (many). Translucent, so
    that the text stays readable on light and dark themes."""
    if mode not in ("probability", "entropy") or not r.known:
        return None
    dark = is_dark() if dark is None else dark
    if mode == "probability":
        t = 1.0 - max(0.0, min(1.0, r.prob))
        hue = round(55 * (1.0 - t))
    else:
        t = max(0.0, min(1.0, r.entropy / ENTROPY_FULL)) if not math.isnan(r.entropy) else 0.0
        hue = round(210 + 70 * t)
    alpha = round(165 * t)
    if alpha < 8:
        return None
    return QColor.fromHsv(hue, 210, 225 if dark else 255, alpha)


def color_document(doc: QTextDocument, tmap: TokenMap, mode: str, dark: bool | None = None) -> int:
    """Tint each token's text in ``doc`` by ``mode`` and underline the tokens a branch chose; returns the runs
    tinted. The document should be freshly rendered (formats are merged, never cleared here)."""
    cur = QTextCursor(doc)
    cur.beginEditBlock()
    n = 0
    for start, end, i in tmap.runs():
        r = tmap.records[i]
        color = token_color(r, mode, dark)
        if color is None and not r.chosen:
            continue
        fmt = QTextCharFormat()
        if color is not None:
            fmt.setBackground(color)
            n += 1
        if r.chosen:
            fmt.setFontUnderline(True)
            fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.DashUnderline)
        cur.setPosition(start)
        cur.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        cur.mergeCharFormat(fmt)
    cur.endEditBlock()
    return n


def _pct(p: float) -> str:
    if math.isnan(p):
        return "—"
    return f"{p * 100:.1f} %" if p >= 0.001 else f"{p * 100:.2g} %"


def tooltip_html(r: TokenRecord, temperature: float | None = None, clickable: bool = False) -> str:
    """The tool tip of a token: its text and id, probability raw and at the temperature, entropy, and the top
    alternatives with both probabilities (the picked one in bold); ``clickable``: a click on the token branches
    the reply (said only then: not while a reply streams, nor on the Serve tab's replies)."""
    piece = html.escape(visible(r.piece or r.text)) or "&nbsp;"
    head = f"<b>“{piece}”</b> <span style='color:gray'>token {r.token}</span>"
    if r.chosen:
        head += " · <i>chosen by you (a branch)</i>"
    if not r.known:
        return head + "<br>No probabilities were recorded for this token."
    temp = f" (temperature {temperature:g})" if temperature is not None else ""
    lines = [head, f"probability {_pct(r.prob)} · scaled{temp} {_pct(r.scaled_prob)}",
             f"entropy {r.entropy:.2f} nats"]
    if r.alternatives:
        rows = ["<tr><th align='left'>alternative</th><th align='right'>&nbsp;&nbsp;prob.</th>"
                "<th align='right'>&nbsp;&nbsp;scaled</th></tr>"]
        for a in r.alternatives:
            text = html.escape(visible(a.piece)) or "&nbsp;"
            b0, b1 = ("<b>", "</b>") if a.token == r.token else ("", "")
            rows.append(f"<tr><td>{b0}“{text}”{b1}</td><td align='right'>&nbsp;&nbsp;{b0}{_pct(a.prob)}{b1}</td>"
                        f"<td align='right'>&nbsp;&nbsp;{b0}{_pct(a.scaled_prob)}{b1}</td></tr>")
        lines.append(f"<table cellspacing='0' cellpadding='1'>{''.join(rows)}</table>")
        if clickable:
            lines.append("<span style='color:gray'>Click the token to continue with another one.</span>")
    return "<br>".join(lines[:3]) + "".join(lines[3:])


def alternatives_menu(r: TokenRecord, parent: QWidget | None = None) -> QMenu:
    """The menu of a token's alternatives: each action's data is the token id (the token itself is checked and
    disabled: it is what the reply already has)."""
    menu = QMenu(parent)
    menu.setAccessibleName("Alternatives of this token")
    menu.setToolTipsVisible(True)
    title = menu.addAction(f"Continue with another token than “{visible(r.piece or r.text)}”:")
    title.setEnabled(False)
    for a in r.alternatives:
        act = menu.addAction(f"“{visible(a.piece)}”   {_pct(a.prob)}  (scaled {_pct(a.scaled_prob)})")
        act.setData(a.token)
        act.setToolTip(f"token {a.token}")
        if a.token == r.token:
            act.setCheckable(True)
            act.setChecked(True)
            act.setEnabled(False)
    return menu


class ColorLegend(QWidget):
    """What the tint of a reply's tokens means: a strip from the clearest to the strongest tint of the mode, with
    its two ends named. Hidden while the replies are not coloured."""

    ENDS: ClassVar[dict[str, tuple[str, str, str]]] = {
        "probability": ("Probability:", "certain", "unlikely"),
        "entropy": ("Entropy:", "one choice", f"many ({ENTROPY_FULL:g} nats)")}

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Colour legend")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(6)
        self.title, self.low, self.high = QLabel(), QLabel(), QLabel()
        for w in (self.title, self.low, self.high):
            w.setObjectName("muted")
        self.strip = QLabel()
        self.strip.setAccessibleName("Colour scale")
        self.strip.setFixedSize(120, 12)
        for w in (self.title, self.low, self.strip, self.high):
            lay.addWidget(w)
        lay.addStretch(1)
        self.mode = "off"
        self.hide()

    def stops(self, dark: bool | None = None) -> list[QColor]:
        """The tints from one end of the scale to the other (clear where no tint is drawn)."""
        out = []
        for k in range(9):
            t = k / 8
            prob, ent = (1.0 - t, 0.0) if self.mode == "probability" else (1.0, t * ENTROPY_FULL)
            r = TokenRecord(token=0, text="", piece="", prob=prob, scaled_prob=prob, entropy=ent)
            out.append(token_color(r, self.mode, dark) or QColor(0, 0, 0, 0))
        for k in range(len(out) - 1, -1, -1):  # untinted stops: the next tint's hue, transparent (no grey blend)
            if out[k].alpha() == 0 and k + 1 < len(out):
                out[k] = QColor(out[k + 1].red(), out[k + 1].green(), out[k + 1].blue(), 0)
        return out

    def set_mode(self, mode: str) -> None:
        self.mode = mode if mode in self.ENDS else "off"
        if self.mode == "off":
            self.hide()
            return
        title, low, high = self.ENDS[self.mode]
        self.title.setText(title)
        self.low.setText(low)
        self.high.setText(high)
        grad = ", ".join(f"stop:{k / 8:g} rgba({c.red()},{c.green()},{c.blue()},{c.alpha()})"
                         for k, c in enumerate(self.stops()))
        self.strip.setStyleSheet("border: 1px solid palette(mid); "
                                 f"background: qlineargradient(x1:0, y1:0, x2:1, y2:0, {grad});")
        self.show()
