"""Pieces of the chat pane: a message (Markdown, auto-height, copy/edit/regenerate), the tokenizer lab's token
chips, and the template preview's highlighter."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from PySide6.QtCore import QEvent, QObject, QPoint, QSize, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QFontMetricsF,
    QHelpEvent,
    QMouseEvent,
    QPalette,
    QSyntaxHighlighter,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextOption,
    QWheelEvent,
)
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.chat.controller import chat_markdown
from quantscope.core.chat.tokens import TokenRecord, answer_spans

from ..guard import qt_guarded
from ..theme import is_dark
from ..widgets.fit import ElidedLabel
from .chat_tokens import TokenMap, color_document, token_color, tooltip_html

# token type ids of GGUF vocabularies (tokenizer.ggml.token_type)
TOKEN_TYPES = {1: "normal", 2: "unknown", 3: "control", 4: "user-defined", 5: "unused", 6: "byte"}


def mono_font() -> QFont:
    f = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    f.setStyleHint(QFont.StyleHint.Monospace)
    return f


def code_background() -> QColor:
    return QColor("#23272e") if is_dark() else QColor("#f1f3f6")


def style_code(doc: QTextDocument) -> None:
    """Give Markdown code blocks a tinted panel and a monospace font, and inline code a tint (Qt's Markdown
    importer only changes their font family)."""
    bg = code_background()
    mono = mono_font()
    block = doc.begin()
    cur = QTextCursor(doc)
    cur.beginEditBlock()
    prev_code = False
    while block.isValid():
        fmt = block.blockFormat()
        is_code = fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.hasProperty(
            QTextFormat.Property.BlockCodeLanguage)
        if is_code:
            nxt = block.next()
            next_code = nxt.isValid() and nxt.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence)
            bf = QTextBlockFormat(fmt)
            bf.setBackground(bg)
            bf.setLeftMargin(2)
            bf.setTopMargin(0 if prev_code else 4)
            bf.setBottomMargin(0 if next_code else 6)
            bf.setNonBreakableLines(False)  # code wraps at the reply's width instead of being cut off
            # a wrapped line goes on under its own text, not at the left edge (an editor's soft wrap): the
            # margin takes the line's indentation and the first line starts that much to the left
            text = block.text()
            lead = text[:len(text) - len(text.lstrip(" \t"))].expandtabs(4)
            hang = QFontMetricsF(mono).horizontalAdvance(lead) if lead else 0.0
            bf.setLeftMargin(2 + hang)
            bf.setTextIndent(-hang)
            cur.setPosition(block.position())
            cur.setBlockFormat(bf)
            cur.setPosition(block.position())
            cur.setPosition(block.position() + max(0, block.length() - 1), QTextCursor.MoveMode.KeepAnchor)
            cf = QTextCharFormat()
            cf.setFont(mono)
            cur.mergeCharFormat(cf)
        else:
            it = block.begin()
            spans = []
            while not it.atEnd():
                frag = it.fragment()
                if frag.isValid():
                    fam = frag.charFormat().fontFamilies()
                    fams = [str(x).lower() for x in fam] if isinstance(fam, (list, tuple)) else [str(fam).lower()]
                    if frag.charFormat().fontFixedPitch() or any("mono" in x for x in fams):
                        spans.append((frag.position(), frag.length()))
                it += 1
            for pos, n in spans:
                cur.setPosition(pos)
                cur.setPosition(pos + n, QTextCursor.MoveMode.KeepAnchor)
                cf = QTextCharFormat()
                cf.setBackground(bg)
                cf.setFont(mono)
                cur.mergeCharFormat(cf)
        prev_code = is_code
        block = block.next()
    cur.endEditBlock()


@qt_guarded
class AutoHeightBrowser(QTextBrowser):
    """A frameless text browser exactly as tall as its document (the surrounding scroll area scrolls)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(40)
        self.setLineWrapMode(QTextBrowser.LineWrapMode.WidgetWidth)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)  # long words and code wrap too
        self.setOpenExternalLinks(True)
        self.viewport().setAutoFillBackground(False)
        self.setStyleSheet("QTextBrowser { background: transparent; }")
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self._fit()

    def _fit(self, *_: object) -> None:
        h = int(self.document().size().height() + 0.999) + 2 * self.frameWidth()
        if h != self.height():
            self.setFixedHeight(max(h, 18))

    def sizeHint(self) -> QSize:
        return QSize(super().sizeHint().width(), self.height())

    def resizeEvent(self, event: object) -> None:
        super().resizeEvent(event)  # type: ignore[arg-type]
        self._fit()

    def wheelEvent(self, event: QWheelEvent) -> None:
        event.ignore()  # let the conversation's scroll area scroll


ROLE_TITLES = {("chat", "user"): "You", ("chat", "assistant"): "Assistant", ("chat", "system"): "System",
               ("completion", "user"): "Prompt", ("completion", "assistant"): "Continuation",
               ("completion", "system"): "System"}


@qt_guarded
class MessageView(QFrame):
    """One message: a header (role, numbers, buttons) over its text. Assistant replies in chat mode are rendered
    as Markdown once complete; while streaming, deltas are appended as plain text (no re-render per batch)."""

    editRequested = Signal(int)
    regenerateRequested = Signal()
    copied = Signal(int)
    tokenClicked = Signal(int, int, QPoint)  # message index, token (record) index, global position
    variantRequested = Signal(int, int)  # message index, version to show (0-based)

    def __init__(self, index: int, role: str, content: str, mode: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.index = index
        self.role = role
        self.mode = mode
        self.content = content
        self.streaming = False
        self.setObjectName("msgUser" if role == "user" else "msgAssistant")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 6, 12, 8)
        lay.setSpacing(2)
        head = QHBoxLayout()
        head.setSpacing(6)
        self.role_label = QLabel()
        self.role_label.setObjectName("msgRole")
        self.stats = ElidedLabel()
        self.stats.setObjectName("muted")
        self.note = QLabel()
        self.note.setObjectName("msgNote")
        self.note.hide()
        # the versions of a reply (regenerated, branched): "< 1/2 >"
        self.variant = 0
        self.n_variants = 1
        self.prev_btn = self._button("<", "Show the previous version of this reply")
        self.prev_btn.setObjectName("msgVariant")
        self.prev_btn.clicked.connect(lambda: self.variantRequested.emit(self.index, self.variant - 1))
        self.variant_label = QLabel()
        self.variant_label.setObjectName("muted")
        self.next_btn = self._button(">", "Show the next version of this reply")
        self.next_btn.setObjectName("msgVariant")
        self.next_btn.clicked.connect(lambda: self.variantRequested.emit(self.index, self.variant + 1))
        head.addWidget(self.role_label)
        for w in (self.prev_btn, self.variant_label, self.next_btn):
            w.hide()
            head.addWidget(w)
        head.addWidget(self.note)
        head.addWidget(self.stats, 1)
        self.copy_btn = self._button("Copy", "Copy this message")
        self.copy_btn.clicked.connect(self.copy)
        self.edit_btn = self._button("Edit", "Edit this message and send it again")
        self.edit_btn.clicked.connect(lambda: self.editRequested.emit(self.index))
        self.regen_btn = self._button("Regenerate", "Generate this reply again")
        self.regen_btn.clicked.connect(self.regenerateRequested.emit)
        for b in (self.copy_btn, self.edit_btn, self.regen_btn):
            head.addWidget(b)
        self.edit_btn.setVisible(role == "user")
        self.regen_btn.setVisible(False)
        lay.addLayout(head)
        # a harmony model's thinking (gpt-oss's analysis channel), apart from the answer: shown while it streams,
        # folded behind its toggle once the reply is complete
        self.thinking = ""
        self.think_btn = QToolButton()
        self.think_btn.setObjectName("msgThinking")
        self.think_btn.setCheckable(True)
        self.think_btn.setAutoRaise(True)
        self.think_btn.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.think_btn.setArrowType(Qt.ArrowType.RightArrow)
        self.think_btn.setAccessibleName("Show the model's thinking")
        self.think_btn.toggled.connect(self._show_thinking)
        self.think_btn.hide()
        self.think_body = AutoHeightBrowser()
        self.think_body.setObjectName("msgThinkingText")
        self.think_body.setAccessibleName("The model's thinking")
        self.think_body.hide()
        lay.addWidget(self.think_btn)
        lay.addWidget(self.think_body)
        self.body = AutoHeightBrowser()
        lay.addWidget(self.body)
        # the reply's tokens: hover shows their probabilities, a click their alternatives, colouring tints them
        self.records: list[TokenRecord] = []
        self.color_mode = "off"
        self.temperature: float | None = None
        self.branchable = False  # clicking a token offers its alternatives (set by the chat view)
        self._tmap: TokenMap | None = None
        self._press: QPoint | None = None
        self.body.viewport().installEventFilter(self)
        self.body.viewport().setMouseTracking(True)
        self.set_mode(mode)
        self.set_content(content)

    def _button(self, text: str, name: str) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setAutoRaise(True)
        b.setAccessibleName(name)
        b.setToolTip(name)
        b.setObjectName("msgAction")
        return b

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        title = ROLE_TITLES.get((mode, self.role), self.role.capitalize())
        self.role_label.setText(title)
        self.body.setAccessibleName(f"{title} message {self.index + 1}")
        self.setAccessibleName(f"{title} message {self.index + 1}")

    @property
    def markdown(self) -> bool:
        return self.role == "assistant" and self.mode == "chat" and not self.streaming

    def set_content(self, text: str) -> None:
        """Show ``text`` whole: Markdown for finished chat replies, plain text otherwise."""
        self.content = text
        if self.markdown:
            self.body.document().setMarkdown(chat_markdown(text), QTextDocument.MarkdownFeature.MarkdownDialectGitHub)
            style_code(self.body.document())
        else:
            self.body.setPlainText(text)
            if self.mode == "completion":
                self.body.setFont(mono_font())
        if self.role == "assistant" and not text and not self.streaming:
            self.body.setPlainText("(no text)")
        self._tmap = None
        self._apply_colors()

    # ------------------------------------------------------------------ tokens
    def set_records(self, records: list[TokenRecord]) -> None:
        """The reply's token records (hover, click and colouring use them)."""
        self.records = records
        self._tmap = None
        if not self.streaming:
            self._apply_colors()

    def set_color_mode(self, mode: str) -> None:
        """Tint the text by token probability or entropy ("off": as rendered)."""
        if mode == self.color_mode:
            return
        was = self.color_mode
        self.color_mode = mode
        if self.streaming:  # the plain text streamed so far: cleared of tints, then tinted anew
            cur = QTextCursor(self.body.document())
            cur.select(QTextCursor.SelectionType.Document)
            cur.setCharFormat(QTextCharFormat())
            self._tint_streamed(0)
            return
        if was != "off" or any(r.chosen for r in self.records):
            self.set_content(self.content)  # a fresh rendering without the old tints
        else:
            self._apply_colors()

    def _tint_streamed(self, start: int) -> None:
        """Tint the streamed text from document position ``start`` on. While a reply streams the document is its
        plain answer text, so the records' answer offsets are document positions (the records arrive before the
        text they wrote)."""
        if self.color_mode == "off" or not self.records or self.role != "assistant":
            return
        doc = self.body.document()
        end = doc.characterCount() - 1
        cur = QTextCursor(doc)
        cur.beginEditBlock()
        for s, e, i in answer_spans(self.records):
            if e <= start:
                continue
            if s >= end:
                break
            color = token_color(self.records[i], self.color_mode)
            if color is None:
                continue
            fmt = QTextCharFormat()
            fmt.setBackground(color)
            cur.setPosition(max(s, start))
            cur.setPosition(min(e, end), QTextCursor.MoveMode.KeepAnchor)
            cur.mergeCharFormat(fmt)
        cur.endEditBlock()

    def _apply_colors(self) -> None:
        if self.streaming or not self.records or self.role != "assistant":
            return
        if self.color_mode == "off" and not any(r.chosen for r in self.records):
            return
        color_document(self.body.document(), self.token_map(), self.color_mode)

    def token_map(self) -> TokenMap:
        """Which token wrote each character of the shown text (built when first needed)."""
        if self._tmap is None:
            self._tmap = TokenMap(self.body.document().toRawText(), self.records if self.role == "assistant" else [])
        return self._tmap

    def token_at(self, pos: QPoint) -> int:
        """The record index of the token under ``pos`` (viewport coordinates), -1 for none."""
        if not self.records:
            return -1
        doc = self.body.document()
        hit = doc.documentLayout().hitTest(pos + QPoint(self.body.horizontalScrollBar().value(),
                                                        self.body.verticalScrollBar().value()),
                                           Qt.HitTestAccuracy.ExactHit)
        if hit < 0:
            return -1
        cur = QTextCursor(doc)
        cur.setPosition(hit)
        if self.body.cursorRect(cur).x() > pos.x() and hit > 0:
            hit -= 1  # the point is right of the character before the cursor position
        return self.token_map().token(hit)

    def token_point(self, index: int) -> QPoint | None:
        """A viewport point inside the text of record ``index`` (None when it shows nowhere)."""
        p = self.token_map().position(index)
        if p < 0:
            return None
        cur = QTextCursor(self.body.document())
        cur.setPosition(p)
        r = self.body.cursorRect(cur)
        return QPoint(r.x() + 2, r.center().y())

    def tooltip_for(self, index: int) -> str:
        if not 0 <= index < len(self.records):
            return ""
        return tooltip_html(self.records[index], self.temperature, clickable=self.branchable)

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if obj is self.body.viewport() and self.records:
            t = event.type()
            if t == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
                i = self.token_at(event.pos())
                if i >= 0:
                    QToolTip.showText(event.globalPos(), self.tooltip_for(i), self.body.viewport())
                else:
                    QToolTip.hideText()
                    event.ignore()
                return True
            if t == QEvent.Type.MouseButtonPress and isinstance(event, QMouseEvent):
                self._press = event.position().toPoint()
            elif (t == QEvent.Type.MouseButtonRelease and isinstance(event, QMouseEvent)
                  and event.button() == Qt.MouseButton.LeftButton and self.branchable and self._press is not None):
                pos = event.position().toPoint()
                moved = (pos - self._press).manhattanLength() > 4
                self._press = None
                if not moved and not self.body.textCursor().hasSelection() and not self.body.anchorAt(pos):
                    i = self.token_at(pos)
                    if i >= 0 and self.records[i].alternatives:
                        self.tokenClicked.emit(self.index, i, self.body.viewport().mapToGlobal(pos))
        return super().eventFilter(obj, event)

    def set_variants(self, which: int, n: int) -> None:
        """Show "< which+1/n >" when the message has more than one version."""
        self.variant, self.n_variants = which, n
        many = n > 1
        for w in (self.prev_btn, self.variant_label, self.next_btn):
            w.setVisible(many)
        self.variant_label.setText(f"{which + 1}/{n}")
        self.variant_label.setAccessibleName(f"Version {which + 1} of {n}")
        self.prev_btn.setEnabled(which > 0)
        self.next_btn.setEnabled(which < n - 1)

    def start_streaming(self) -> None:
        self.streaming = True
        self.content = ""
        self.records = []
        self._tmap = None
        self.body.setPlainText("")
        self.set_stats("thinking…")
        self.copy_btn.setEnabled(False)

    def set_thinking(self, text: str, open_: bool = False) -> None:
        """The reply's thinking (empty: no thinking section); ``open_`` unfolds it."""
        self.thinking = text
        self.think_body.setPlainText(text)
        self.think_btn.setVisible(bool(text))
        self._label_thinking()
        self.think_btn.setChecked(open_ and bool(text))
        self._show_thinking(self.think_btn.isChecked())

    def append_thinking(self, text: str) -> None:
        """Streamed thinking: shown open while the model thinks."""
        if not self.thinking:
            self.think_btn.show()
            self.think_btn.setChecked(True)
        self.thinking += text
        cur = QTextCursor(self.think_body.document())
        cur.movePosition(QTextCursor.MoveOperation.End)
        cur.insertText(text)
        self._label_thinking()

    def _label_thinking(self) -> None:
        words = len(self.thinking.split())
        self.think_btn.setText(("Thinking…" if self.streaming and not self.content else "Thought")
                               + f" ({words:,} word{'s' if words != 1 else ''})")

    def _show_thinking(self, on: bool) -> None:
        self.think_btn.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.think_body.setVisible(on and bool(self.thinking))

    def append(self, text: str) -> None:
        """Add a batch of streamed text at the end (O(len(text)), the rest of the document is untouched)."""
        self.content += text
        cur = QTextCursor(self.body.document())
        cur.movePosition(QTextCursor.MoveOperation.End)
        start = cur.position()
        cur.insertText(text, QTextCharFormat())  # (not the tint of the text before it)
        self._tmap = None
        if self.color_mode != "off":
            self._tint_streamed(start)

    def finish(self, text: str, stats: str) -> None:
        self.streaming = False
        self.copy_btn.setEnabled(True)
        self.set_content(text)
        self.set_stats(stats)
        if self.thinking:  # the answer is what the reply is read for: its thinking folds away
            self.set_thinking(self.thinking, open_=not text)

    def set_stats(self, text: str) -> None:
        self.stats.setText(text)
        self.stats.setAccessibleName(f"Numbers of message {self.index + 1}")

    def set_dropped(self, dropped: bool) -> None:
        """Mark a message that no longer fits in the context (it stays visible, but the model does not see it)."""
        self.note.setText("not in context" if dropped else "")
        self.note.setToolTip("The context is full: this older message was left out of the prompt" if dropped else "")
        self.note.setVisible(dropped)
        self.body.setEnabled(not dropped)

    def copy(self) -> None:
        QApplication.clipboard().setText(self.content)
        self.copied.emit(self.index)


# ---------------------------------------------------------------------------------------------- tokenizer lab
def visible(text: str) -> str:
    """Whitespace made visible for a token chip (the text itself otherwise unchanged)."""
    return text.replace(" ", "·").replace("\n", "↵").replace("\t", "→").replace("\r", "␍")


def _chip_colors(dark: bool) -> dict[str, tuple[str, ...]]:
    """Background tints per token type; normal tokens cycle through three cool tints so that neighbours stay
    apart, the other types have one warm or grey tint each."""
    if dark:
        return {"normal": ("#2c4a6e", "#2e5a3c", "#2a5558"), "control": ("#7a2e36",), "user-defined": ("#5b3a70",),
                "byte": ("#7a5426",), "unknown": ("#55595f",), "unused": ("#55595f",)}
    return {"normal": ("#cfe0f7", "#d3efcd", "#c9ecec"), "control": ("#f6c3c8",), "user-defined": ("#e3cff0",),
            "byte": ("#fbd9ad",), "unknown": ("#d9dbde",), "unused": ("#d9dbde",)}


def chips_html(pieces: Sequence[str], ids: Sequence[int], types: Sequence[int], limit: int = 4000) -> str:
    """Token chips: each token's text on a background coloured by its type (alternating tints for normal tokens
    so that neighbours stay apart); a tooltip-free, copyable rendering."""
    colors = _chip_colors(is_dark())
    out = []
    for i, (p, t) in enumerate(zip(pieces, types, strict=False)):
        if i >= limit:
            out.append(f"<span> … {len(ids) - limit:,} more tokens</span>")
            break
        kind = TOKEN_TYPES.get(int(t), "normal")
        tints = colors.get(kind, colors["normal"])
        bg = tints[i % len(tints)]
        text = html.escape(visible(p)) or "&nbsp;"
        weight = "font-weight:600;" if kind in ("control", "user-defined") else ""
        out.append(f'<span style="background-color:{bg};{weight}">{text}</span>'
                   + ("<br>" if p.endswith("\n") else "&#8203;"))
    return f'<div style="line-height:160%;">{"".join(out)}</div>'


def legend_html() -> str:
    colors = _chip_colors(is_dark())
    kinds = ("normal", "control", "user-defined", "byte", "unknown")
    # one labelled chip per type (normal tokens alternate tints in the chips, the legend shows the first)
    items = [f'<span style="background-color:{colors[k][0]};">&nbsp;{k.replace("-", "&#8209;")}&nbsp;</span>'
             for k in kinds]
    return "Types: " + " ".join(items) + " &nbsp;·&nbsp; spaces as ·, newlines as ↵"


#: U+2060: no line break on either side of it, and drawn as nothing
WORD_JOINER = "\u2060"


def unbreakable(text: str, pattern: re.Pattern[str] | None) -> str:
    """``text`` with the characters of each match of ``pattern`` (the special tokens) joined by word joiners, so
    that a wrapping view never breaks a token such as ``<|im_end|>`` after its ``|``."""
    if pattern is None:
        return text
    return pattern.sub(lambda m: WORD_JOINER.join(m.group(0).replace(WORD_JOINER, "")), text)


@qt_guarded
class SpecialTokenHighlighter(QSyntaxHighlighter):
    """Highlights the special-token strings (``<|im_start|>`` …) in the template preview."""

    def __init__(self, doc: QTextDocument, specials: Sequence[str] = ()) -> None:
        super().__init__(doc)
        self.fmt = QTextCharFormat()
        self.fmt.setFontWeight(QFont.Weight.Bold)
        self.set_specials(specials)

    def set_specials(self, specials: Sequence[str]) -> None:
        toks = sorted({s for s in specials if s}, key=len, reverse=True)[:2000]
        # a token matches as it is or as the preview shows it, its characters joined by word joiners
        self.pattern = re.compile("|".join(f"{WORD_JOINER}?".join(map(re.escape, s)) for s in toks)) if toks else None
        pal = QApplication.palette()
        self.fmt.setForeground(QColor("#e0707a") if is_dark() else QColor("#b3261e"))
        self.fmt.setBackground(pal.color(QPalette.ColorRole.AlternateBase))
        self.rehighlight()

    def highlightBlock(self, text: str) -> None:
        if self.pattern is None:
            return
        for m in self.pattern.finditer(text):
            self.setFormat(m.start(), m.end() - m.start(), self.fmt)
