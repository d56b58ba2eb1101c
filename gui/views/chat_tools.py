"""The chat pane's Template and Tokenizer tabs: the exact prompt the chat template makes of the conversation (with
its token ids), and any text's pieces, ids and token types. Both work in the task runner's threads from a
:class:`TokBundle` (the file's tokenizer and template)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QMimeData, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QTableView,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.chat import ChatTemplate
from quantscope.core.chat.conversation import encode_prompt, prompt_text

from ..guard import mime_data, qt_guarded
from ..models import KeyValueModel
from ..workers import TaskRunner
from .chat_widgets import (
    TOKEN_TYPES,
    WORD_JOINER,
    SpecialTokenHighlighter,
    chips_html,
    legend_html,
    mono_font,
    unbreakable,
    visible,
)

MAX_TOKEN_ROWS = 5000


@dataclass
class TokBundle:
    """The opened file's tokenizer and template, built in a worker for the template preview and the lab."""

    path: Path
    tokenizer: Any
    template: ChatTemplate | None
    template_error: str
    specials: list[str]

    @classmethod
    def of(cls, path: Path, tok: Any, template: ChatTemplate | None, error: str = "") -> TokBundle:
        return cls(path, tok, template, error, [tok.pieces[i] for i in tok.special_ids])


def read_bundle(path: Path) -> TokBundle:
    """Read the file's tokenizer and template (in a worker: it takes a while for a large vocabulary)."""
    from quantscope.core.chat import ChatTemplateError
    from quantscope.core.gguf import GGUFFile
    from quantscope.core.tokenizer import Tokenizer

    from ..chat_engine import gc_paused

    f = GGUFFile(path)
    with gc_paused():  # see gc_paused: a full collection mid-build would stall the event loop
        tok = Tokenizer(f)
    err = ""
    try:
        tpl = ChatTemplate.from_gguf(f)
    except ChatTemplateError as exc:
        tpl, err = None, str(exc)
    return TokBundle.of(path, tok, tpl, err)


@qt_guarded
class PromptEdit(QPlainTextEdit):
    """The rendered prompt: copying gives the prompt's own text, without the word joiners shown in it."""

    def createMimeDataFromSelection(self) -> QMimeData:
        return mime_data(self.textCursor().selection().toPlainText().replace(WORD_JOINER, ""))


class TemplatePreview(QWidget):
    """The rendered prompt with special tokens highlighted, its token ids and a status line."""

    def __init__(self, runner: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        lay = QVBoxLayout(self)
        self.status = QLabel("The exact prompt the model will read for this conversation.")
        self.status.setObjectName("muted")
        self.status.setWordWrap(True)
        self.status.setAccessibleName("Template preview status")
        self.text = PromptEdit()
        self.text.setReadOnly(True)
        self.text.setAccessibleName("Rendered prompt")
        self.text.setFont(mono_font())
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.highlighter = SpecialTokenHighlighter(self.text.document())
        ids_label = QLabel("Token ids")
        ids_label.setObjectName("heading")
        self.ids = QPlainTextEdit()
        self.ids.setReadOnly(True)
        self.ids.setAccessibleName("Prompt token ids")
        self.ids.setFont(mono_font())
        self.ids.setMaximumHeight(150)
        lay.addWidget(self.status)
        lay.addWidget(self.text, 3)
        lay.addWidget(ids_label)
        lay.addWidget(self.ids, 1)

    def prompt(self) -> str:
        """The rendered prompt shown, as the model reads it (without the word joiners that keep its special
        tokens whole on screen)."""
        return self.text.toPlainText().replace(WORD_JOINER, "")

    def render(self, b: TokBundle, prompt: list[dict[str, str]] | str, stand_in: bool) -> None:
        """Render ``prompt`` (messages or completion text) with ``b`` in a worker, then show it."""
        tok, tpl = b.tokenizer, b.template

        def run(_r: Any, _t: Any) -> tuple[str, list[int], str]:
            if isinstance(prompt, str):
                return prompt, tok.encode(prompt), "plain completion: the text as it is"
            if tpl is None:
                return prompt_text(None, prompt), encode_prompt(tok, None, prompt), "no chat template in this file"
            text = prompt_text(tpl, prompt)
            has_bos = bool(tpl.bos_token) and text.startswith(tpl.bos_token)
            note = "BOS from the template" if has_bos else ("BOS added by the tokenizer" if tok.add_bos
                                                             and tok.bos_id is not None else "no BOS")
            return text, encode_prompt(tok, tpl, prompt), note

        def done(r: tuple[str, list[int], str]) -> None:
            text, ids, note = r
            self.text.setPlainText(unbreakable(text, self.highlighter.pattern))
            self.ids.setPlainText(" ".join(map(str, ids)))
            self.status.setText(
                f"<b>{len(ids):,} tokens</b> · {len(text):,} characters · {note}"
                + (" · special tokens in red" if tpl and isinstance(prompt, list) else "")
                + (" · “(your next message)” stands in for the composer" if stand_in else ""))

        def failed(msg: str, _d: str) -> None:
            self.status.setText(f"The chat template failed: {html.escape(msg)}")
            self.text.setPlainText("")
            self.ids.setPlainText("")

        self.runner.cancel("template")
        self.runner.start("template", run, on_done=done, on_failed=failed)


@qt_guarded
class TokenizerLab(QWidget):
    """Type text, see its tokens as coloured chips, ids and a table. ``wanted`` asks for a bundle when there is
    none yet."""

    wanted = Signal()

    def __init__(self, runner: TaskRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.bundle: TokBundle | None = None
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(150)
        self._timer.timeout.connect(self.tokenize)
        lay = QVBoxLayout(self)
        self.input = QPlainTextEdit()
        self.input.setAccessibleName("Text to tokenize")
        self.input.setPlaceholderText("Type text to see how this model tokenizes it…")
        self.input.setFixedHeight(90)
        self.input.textChanged.connect(lambda: self._timer.start())
        opts = QHBoxLayout()
        self.special = QCheckBox("Special tokens")
        self.special.setToolTip("Recognise special-token text such as <|im_start|> as one control token")
        self.special.setChecked(True)
        self.special.setAccessibleName("Parse special tokens")
        self.bos = QCheckBox("Add BOS/EOS")
        self.bos.setToolTip("Add the begin/end-of-sequence tokens the model's metadata asks for")
        self.bos.setAccessibleName("Add BOS and EOS as the model does")
        for c in (self.special, self.bos):
            c.toggled.connect(lambda _c: self._timer.start())
            opts.addWidget(c)
        opts.addStretch(1)
        self.count = QLabel("—")
        self.count.setObjectName("statValue")
        self.count.setAccessibleName("Token count")
        self.chips = QTextBrowser()
        self.chips.setAccessibleName("Tokens coloured by type")
        self.chips.setFont(mono_font())
        self.legend = QLabel(legend_html())
        self.legend.setWordWrap(True)
        self.legend.setObjectName("muted")
        self.legend.setAccessibleName("Token type colours")
        self.model = KeyValueModel(headers=("#", "Id", "Piece", "Type"), mono_columns=(0, 1, 2))
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setAccessibleName("Tokens: index, id, piece and type")
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(20)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)  # the piece takes the room; long ones elide
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.ids = QPlainTextEdit()
        self.ids.setReadOnly(True)
        self.ids.setAccessibleName("Token ids")
        self.ids.setFont(mono_font())
        self.ids.setMaximumHeight(70)
        lay.addWidget(self.input)
        lay.addLayout(opts)
        lay.addWidget(self.count)
        lay.addWidget(self.chips, 2)
        lay.addWidget(self.legend)
        lay.addWidget(self.ids)
        lay.addWidget(self.table, 2)

    def set_bundle(self, b: TokBundle | None) -> None:
        self.bundle = b
        if b is not None:
            self.tokenize()

    def tokenize(self) -> None:
        """Tokenize the input in a worker (asks for a bundle first when there is none)."""
        b = self.bundle
        text = self.input.toPlainText()
        if b is None:
            self.wanted.emit()
            return
        if not text:
            self.count.setText("0 tokens")
            self.chips.setHtml("")
            self.ids.setPlainText("")
            self.model.set_rows([])
            return
        tok = b.tokenizer
        add, special = self.bos.isChecked(), self.special.isChecked()

        def run(_r: Any, _t: Any) -> tuple[list[int], list[str], list[int]]:
            ids = tok.encode(text, add_special=add, parse_special=special)
            pieces = []
            for i in ids:
                raw = tok.token_bytes(i)
                s = raw.decode("utf-8", errors="replace")
                pieces.append(s if "\ufffd" not in s else "".join(f"\\x{x:02x}" for x in raw))
            return ids, pieces, [int(tok.types[i]) for i in ids]

        def done(r: tuple[list[int], list[str], list[int]]) -> None:
            ids, pieces, types = r
            self.count.setText(f"{len(ids):,} tokens · {len(text):,} characters")
            self.chips.setHtml(chips_html(pieces, ids, types))
            self.ids.setPlainText(" ".join(map(str, ids)))
            self.model.set_rows([(str(k), str(i), visible(p), TOKEN_TYPES.get(t, str(t)))
                                 for k, (i, p, t) in enumerate(zip(ids, pieces, types, strict=True))
                                 if k < MAX_TOKEN_ROWS])

        self.runner.cancel("tokenize")
        self.runner.start("tokenize", run, on_done=done,
                          on_failed=lambda m, _d: self.count.setText(f"cannot tokenize: {m}"))
