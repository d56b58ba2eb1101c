"""The Metadata view's editors: a value (with its type, range-checked) or a new key, an array element, a special
token picked from the vocabulary, and the chat template with a live rendering of a sample conversation.

Every dialog builds a :mod:`quantscope.core.gguf.edit` operation and hands it to ``try_apply`` (the view's
:class:`~quantscope.core.gguf.edit.EditList`): a refused operation leaves the dialog open with the reason, so what
the core validates is what the user sees. Text is parsed by the core's own parsers (``parse_value``), the same as
``quantscope edit --set-typed``. The template preview renders in the task runner (the Jinja sandbox's budget guards
it) and never blocks the window.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.fsutil import printable
from quantscope.core.gguf import StringArray, ValueType
from quantscope.core.gguf.edit import (
    SPECIAL_TOKENS,
    AddKey,
    EditError,
    EditOp,
    MetadataState,
    SetArrayElement,
    SetSpecialToken,
    SetValue,
    TypedValue,
    check_key,
    known_type,
    parse_type,
    parse_value,
)

from ..guard import qt_guarded
from ..theme import BAD_COLOR, OK_COLOR
from ..widgets.blockwidgets import mono_font
from ..widgets.jinja import JinjaHighlighter
from ..workers import TaskRunner

TryApply = Callable[[EditOp], str | None]  # None when applied, else why it was refused

#: the conversation the template editor renders (a system prompt, two user turns and an assistant reply)
SAMPLE_CONVERSATION: list[dict[str, str]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is a GGUF file?"},
    {"role": "assistant", "content": "A single file holding a model's weights and its metadata."},
    {"role": "user", "content": "How many values does a Q4_K block hold?"},
]

SCALAR_TYPES = ("STRING", "UINT32", "INT32", "UINT64", "INT64", "FLOAT32", "FLOAT64", "BOOL", "UINT8", "INT8",
                "UINT16", "INT16")
ARRAY_TYPES = ("ARRAY[STRING]", "ARRAY[INT32]", "ARRAY[UINT32]", "ARRAY[FLOAT32]", "ARRAY[INT64]", "ARRAY[UINT8]",
               "ARRAY[BOOL]")


def _status(label: QLabel, ok: bool, text: str) -> None:
    label.setText(f"<span style='color:{OK_COLOR if ok else BAD_COLOR}'>{html.escape(printable(text))}</span>")


def value_text(tv_type: ValueType, value: Any, elem_type: ValueType | None) -> str:
    """A value as the text its editor shows (what :func:`parse_value` reads back): arrays as a JSON list."""
    if tv_type == ValueType.ARRAY:
        import json

        from quantscope.core.export import plain_value

        return json.dumps(plain_value(value), ensure_ascii=False)
    if tv_type == ValueType.BOOL:
        return "true" if value else "false"
    if tv_type in (ValueType.FLOAT32, ValueType.FLOAT64):
        return repr(float(value))
    return str(value)


@dataclass
class EditedValue:
    """An edited or added entry as the view shows it (the same attributes the views read of a
    :class:`~quantscope.core.gguf.MetadataValue`; no file offsets: it is not in a file yet)."""

    key: str
    type: ValueType
    elem_type: ValueType | None
    value: Any
    type_label: str
    status: str  # "changed" | "added"
    offset: int | None = None


@qt_guarded
class _Dialog(QDialog):
    """OK runs ``try_apply`` on :meth:`operation`'s result; a refusal is shown and the dialog stays open."""

    def __init__(self, title: str, try_apply: TryApply, parent: QWidget | None) -> None:
        super().__init__(parent)
        self.setWindowTitle(title)
        self.try_apply = try_apply
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setAccessibleName("Edit status")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setToolTip("Apply (Ctrl+Enter)")
        self.applied: EditOp | None = None

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        """Ctrl+Enter in a text editor applies (Enter alone makes a new line there)."""
        if event.type() == QEvent.Type.KeyPress and isinstance(event, QKeyEvent) \
                and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) \
                and event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self.accept()
            return True
        return super().eventFilter(obj, event)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and \
                event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self.accept()
            return
        super().keyPressEvent(event)

    def operation(self) -> EditOp:
        raise NotImplementedError

    def validate(self) -> bool:
        """Parse what is typed; show the result; enable OK when it parses."""
        try:
            op = self.operation()
        except EditError as exc:
            if str(exc) == "unchanged":  # not an error: nothing to apply yet
                self.status.setText("<span style='color:gray'>unchanged</span>")
            else:
                _status(self.status, False, str(exc))
            self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(False)
            return False
        _status(self.status, True, op.describe())
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(True)
        return True

    def accept(self) -> None:
        if not self.validate():
            return
        op = self.operation()
        why = self.try_apply(op)
        if why is not None:
            _status(self.status, False, why)
            return
        self.applied = op
        super().accept()


@qt_guarded
class ValueDialog(_Dialog):
    """Set a key's value (keeping or changing its type), or add a new key (``key=None``)."""

    def __init__(self, state: MetadataState, key: str | None, try_apply: TryApply,
                 parent: QWidget | None = None) -> None:
        super().__init__("Add a metadata key" if key is None else f"Edit {key}", try_apply, parent)
        self.state = state
        self.adding = key is None
        self.key_edit = QLineEdit(key or "")
        self.key_edit.setAccessibleName("Key")
        self.key_edit.setReadOnly(not self.adding)
        if not self.adding:  # the value is what is edited: the key is shown, not a stop on the way to it
            self.key_edit.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.key_edit.setPlaceholderText("e.g. general.description")
        self.type_combo = QComboBox()
        self.type_combo.setAccessibleName("Value type")
        self.type_combo.addItems([*SCALAR_TYPES, *ARRAY_TYPES])
        self.text = QPlainTextEdit()
        self.text.setAccessibleName("Value")
        self.text.setFont(mono_font(10))
        self.line = QLineEdit()
        self.line.setAccessibleName("Value")
        self.check = QCheckBox("true")
        self.check.setAccessibleName("Value")
        self.hint = QLabel()
        self.hint.setObjectName("muted")
        self.hint.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Key", self.key_edit)
        form.addRow("Type", self.type_combo)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.text, 1)
        lay.addWidget(self.line)
        lay.addWidget(self.check)
        lay.addWidget(self.hint)
        lay.addWidget(self.status)
        lay.addWidget(self.buttons)
        self.resize(620, 420)

        if key is not None:
            t = state.type_of(key)
            assert t is not None
            label = f"ARRAY[{t[1].name}]" if t[0] == ValueType.ARRAY and t[1] is not None else t[0].name
            if self.type_combo.findText(label) < 0:
                self.type_combo.addItem(label)
            self.type_combo.setCurrentText(label)
            self._set_editor_text(value_text(t[0], state.value(key), t[1]))
        self.type_combo.currentTextChanged.connect(self._type_changed)
        self.key_edit.textChanged.connect(self._key_changed)
        for sig in (self.text.textChanged, self.line.textChanged, self.check.toggled):
            sig.connect(lambda *_: self.validate())
        self._type_changed(self.type_combo.currentText(), keep=True)
        for w in (self.text, self.line):
            w.installEventFilter(self)
        editor = self.key_edit if self.adding else next(
            (w for w in (self.text, self.line, self.check) if not w.isHidden()), self.text)
        editor.setFocus()
        if editor is self.line:
            self.line.selectAll()
        elif editor is self.text:
            self.text.selectAll()

    def _key_changed(self, text: str) -> None:
        """A new key llama.cpp reads with a fixed type gets that type."""
        t = known_type(text.strip(), self.state.architecture)
        if t is not None and self.adding:
            label = f"ARRAY[{t[1].name}]" if t[0] == ValueType.ARRAY and t[1] is not None else t[0].name
            if self.type_combo.findText(label) >= 0:
                self.type_combo.setCurrentText(label)
        self.validate()

    def _types(self) -> tuple[ValueType, ValueType | None]:
        return parse_type(self.type_combo.currentText())

    def _set_editor_text(self, text: str) -> None:
        self.text.setPlainText(text)
        self.line.setText(text)
        self.check.setChecked(text == "true")

    def _type_changed(self, _label: str, keep: bool = False) -> None:
        vtype, _elem = self._types()
        old = self.text.toPlainText() if self.text.isVisible() else self.line.text()
        self.text.setVisible(vtype in (ValueType.STRING, ValueType.ARRAY))
        self.line.setVisible(vtype not in (ValueType.STRING, ValueType.ARRAY, ValueType.BOOL))
        self.check.setVisible(vtype == ValueType.BOOL)
        if not keep:
            self._set_editor_text(old)
        self.hint.setText({
            ValueType.STRING: "Text, exactly as typed (line breaks included).",
            ValueType.ARRAY: "A JSON list, e.g. [\"a\", \"b\"] or [1, 2, 3].",
            ValueType.BOOL: "",
            ValueType.FLOAT32: "A finite number that fits a 32-bit float.",
            ValueType.FLOAT64: "A finite number.",
        }.get(vtype, "An integer in the type's range (decimal, or hexadecimal with 0x)."))
        self.validate()

    def value_text(self) -> str:
        vtype, _ = self._types()
        if vtype == ValueType.BOOL:
            return "true" if self.check.isChecked() else "false"
        return self.text.toPlainText() if vtype in (ValueType.STRING, ValueType.ARRAY) else self.line.text()

    def operation(self) -> EditOp:
        key = check_key(self.key_edit.text().strip() if self.adding else self.key_edit.text())
        vtype, elem = self._types()
        tv = parse_value(self.value_text(), vtype, elem, what=key)
        if self.adding:
            if key in self.state:
                raise EditError(f"{key} exists already: edit it instead")
            return AddKey(key, tv)
        if self.state.type_of(key) == (tv.type, tv.elem_type) and vtype != ValueType.ARRAY \
                and self.state.value(key) == tv.value:
            raise EditError("unchanged")
        return SetValue(key, tv)


@qt_guarded
class ElementDialog(_Dialog):
    """Set one element of a flat array (a token's text, a score, a type)."""

    def __init__(self, state: MetadataState, key: str, index: int, try_apply: TryApply,
                 parent: QWidget | None = None) -> None:
        super().__init__(f"Edit an element of {key}", try_apply, parent)
        self.key = key
        t = state.type_of(key)
        assert t is not None and t[0] == ValueType.ARRAY and t[1] is not None
        self.elem = t[1]
        self.values: Sequence[Any] = state.value(key)
        self.index = QSpinBox()
        self.index.setAccessibleName("Element index")
        self.index.setRange(0, max(0, len(self.values) - 1))
        self.index.setValue(max(0, min(index, len(self.values) - 1)))
        self.current = QLabel()
        self.current.setObjectName("muted")
        self.current.setWordWrap(True)
        self.current.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.edit = QLineEdit()
        self.edit.setAccessibleName("New value")
        self.edit.setFont(mono_font(10))
        form = QFormLayout()
        form.addRow("Index", self.index)
        form.addRow("Now", self.current)
        form.addRow(f"New value ({self.elem.name})", self.edit)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.status)
        lay.addWidget(self.buttons)
        self.resize(560, 200)
        self.index.valueChanged.connect(self._index_changed)
        self.edit.textChanged.connect(lambda *_: self.validate())
        self._index_changed(self.index.value())

    def _index_changed(self, i: int) -> None:
        v = self.values[i] if 0 <= i < len(self.values) else ""
        text = value_text(self.elem, v, None) if not isinstance(v, (list, StringArray)) else str(v)
        self.current.setText(html.escape(printable(text)) or "<i>(empty)</i>")
        self.edit.setText(text)
        self.validate()

    def operation(self) -> EditOp:
        tv = parse_value(self.edit.text(), self.elem, None, what=f"{self.key}[{self.index.value()}]")
        return SetArrayElement(self.key, self.index.value(), tv.value)


#: one name per key (SPECIAL_TOKENS also has aliases)
SPECIAL_NAMES = ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "cls", "mask", "fim_pre", "fim_suf",
                 "fim_mid", "fim_pad", "fim_rep", "fim_sep", "prefix", "suffix", "middle")


@qt_guarded
class SpecialTokenDialog(_Dialog):
    """Pick a special token (BOS, EOS, padding, …) by id or from a search of the vocabulary."""

    MAX_HITS = 200

    def __init__(self, state: MetadataState, try_apply: TryApply, name: str = "eos",
                 parent: QWidget | None = None) -> None:
        super().__init__("Set a special token", try_apply, parent)
        self.state = state
        self.vocab = state.vocabulary()
        self.name = QComboBox()
        self.name.setAccessibleName("Special token")
        for n in SPECIAL_NAMES:
            self.name.addItem(f"{n}   ({SPECIAL_TOKENS[n]})", n)
        self.name.setCurrentIndex(max(0, self.name.findData(name)))
        self.current = QLabel()
        self.current.setObjectName("muted")
        self.current.setWordWrap(True)
        self.token_id = QSpinBox()
        self.token_id.setAccessibleName("Token id")
        self.token_id.setRange(0, max(0, len(self.vocab) - 1) if self.vocab is not None else 2**31 - 1)
        self.piece = QLabel()
        self.piece.setFont(mono_font(10))
        self.search = QLineEdit()
        self.search.setAccessibleName("Find a token by its text")
        self.search.setPlaceholderText("Find a token by its text, e.g. <|im_end|>")
        self.search.setClearButtonEnabled(True)
        self.hits = QListWidget()
        self.hits.setAccessibleName("Matching tokens")
        self.hits.setFont(mono_font(10))
        form = QFormLayout()
        form.addRow("Token", self.name)
        form.addRow("Now", self.current)
        row = QHBoxLayout()
        row.addWidget(self.token_id)
        row.addWidget(self.piece, 1)
        form.addRow("Id", row)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.search)
        lay.addWidget(self.hits, 1)
        lay.addWidget(self.status)
        lay.addWidget(self.buttons)
        self.resize(600, 460)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(150)
        self._timer.timeout.connect(self._find)
        self.name.currentIndexChanged.connect(self._name_changed)
        self.token_id.valueChanged.connect(self._id_changed)
        self.search.textChanged.connect(lambda *_: self._timer.start())
        self.hits.currentItemChanged.connect(self._hit_chosen)
        self._name_changed()

    def _piece(self, i: int) -> str:
        if self.vocab is None or not 0 <= i < len(self.vocab):
            return ""
        return str(self.vocab[i])

    def _name_changed(self) -> None:
        key = SPECIAL_TOKENS[self.name.currentData()]
        v = self.state.value(key)
        if isinstance(v, int) and not isinstance(v, bool):
            self.current.setText(f"{key} = {v} ({html.escape(printable(repr(self._piece(v))))})")
            self.token_id.setValue(v)
        else:
            self.current.setText(f"{key} is not set")
        self._id_changed(self.token_id.value())

    def _id_changed(self, i: int) -> None:
        self.piece.setText(html.escape(printable(repr(self._piece(i)))) if self.vocab is not None else "")
        self.validate()

    def _find(self) -> None:
        from quantscope.core.analysis import find_in_strings

        self.hits.clear()
        text = self.search.text()
        if not text or self.vocab is None:
            return
        if isinstance(self.vocab, StringArray):  # one pass over the file's bytes
            found = [int(i) for i in find_in_strings(self.vocab, text, ignore_case=False, limit=self.MAX_HITS)]
        else:  # a vocabulary with edited tokens
            found = [i for i, s in enumerate(self.vocab) if text in str(s)][: self.MAX_HITS]
        exact = [i for i in found if self._piece(int(i)) == text]
        for i in [*exact, *(i for i in found if int(i) not in exact)]:
            item = QListWidgetItem(f"{int(i):>8}  {printable(self._piece(int(i)))}")
            item.setData(Qt.ItemDataRole.UserRole, int(i))
            self.hits.addItem(item)

    def _hit_chosen(self, item: QListWidgetItem | None, _prev: object = None) -> None:
        if item is not None:
            self.token_id.setValue(int(item.data(Qt.ItemDataRole.UserRole)))

    def operation(self) -> EditOp:
        return SetSpecialToken(self.name.currentData(), self.token_id.value())


@qt_guarded
class TemplateDialog(_Dialog):
    """Edit the chat template; the sample conversation is rendered (in the sandbox, in a worker) as you type, with
    its tokens when the file's tokenizer is available."""

    def __init__(self, state: MetadataState, runner: TaskRunner, tokenizer: Any, try_apply: TryApply,
                 parent: QWidget | None = None) -> None:
        super().__init__("Edit the chat template", try_apply, parent)
        from .chat_widgets import SpecialTokenHighlighter

        self.state = state
        self.runner = runner
        self.tokenizer = tokenizer
        self.tokenizer_error = ""  # why the file's tokenizer did not load (no token ids then)
        src = state.value("tokenizer.chat_template")
        self.original = src if isinstance(src, str) else ""
        self.editor = QPlainTextEdit(self.original)
        self.editor.setAccessibleName("Chat template source")
        self.editor.setFont(mono_font(9.5))
        self.editor.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.editor.installEventFilter(self)
        self.jinja = JinjaHighlighter(self.editor.document())
        self.generation = QCheckBox("Add the generation prompt")
        self.generation.setChecked(True)
        self.rendered = QPlainTextEdit()
        self.rendered.setReadOnly(True)
        self.rendered.setAccessibleName("Rendered sample conversation")
        self.rendered.setFont(mono_font(9.5))
        self.rendered.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        specials = [tokenizer.pieces[i] for i in tokenizer.special_ids] if tokenizer is not None else []
        self.special_hl = SpecialTokenHighlighter(self.rendered.document(), specials)
        self.ids = QPlainTextEdit()
        self.ids.setReadOnly(True)
        self.ids.setAccessibleName("Token ids of the rendered conversation")
        self.ids.setFont(mono_font(9))
        self.ids.setMaximumHeight(110)
        self.render_status = QLabel()
        self.render_status.setWordWrap(True)
        self.render_status.setAccessibleName("Template rendering status")
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        title = QLabel("Template (Jinja)")
        title.setObjectName("heading")
        ll.addWidget(title)
        ll.addWidget(self.editor, 1)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        title = QLabel("A sample conversation, rendered")
        title.setObjectName("heading")
        rl.addWidget(title)
        rl.addWidget(self.generation)
        rl.addWidget(self.rendered, 1)
        rl.addWidget(self.render_status)
        rl.addWidget(self.ids)
        split = QSplitter()
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 1)
        lay = QVBoxLayout(self)
        lay.addWidget(split, 1)
        lay.addWidget(self.status)
        lay.addWidget(self.buttons)
        self.resize(1100, 640)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(250)
        self._timer.timeout.connect(self.render_sample)
        self.editor.textChanged.connect(self._changed)
        self.generation.toggled.connect(lambda *_: self._timer.start())
        self.validate()
        self.render_sample()

    def _changed(self) -> None:
        self.validate()
        self._timer.start()

    def _special_piece(self, name: str) -> str:
        v = self.state.value(SPECIAL_TOKENS[name])
        vocab = self.state.vocabulary()
        if vocab is None or not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < len(vocab):
            return ""
        return str(vocab[v])

    def render_sample(self) -> None:
        """Render the sample conversation with the template as typed (in the runner: the sandbox's budget stops a
        template that loops)."""
        from quantscope.core.chat import ChatTemplate
        from quantscope.core.chat.conversation import encode_prompt

        source = self.editor.toPlainText()
        bos, eos = self._special_piece("bos"), self._special_piece("eos")
        gen = self.generation.isChecked()
        tok = self.tokenizer

        def work(_report: Any, _token: Any) -> tuple[str, list[int] | None]:
            tpl = ChatTemplate(source, bos, eos)
            text = tpl.render(SAMPLE_CONVERSATION, add_generation_prompt=gen)
            ids = encode_prompt(tok, tpl, SAMPLE_CONVERSATION) if tok is not None and gen else None
            return text, ids

        def done(r: tuple[str, list[int] | None]) -> None:
            text, ids = r
            self.rendered.setPlainText(text)
            self.ids.setPlainText(" ".join(map(str, ids)) if ids is not None else "")
            count = f"{len(ids):,} tokens · " if ids is not None else ""
            if self.tokenizer_error:  # the file's tokenizer did not load: say so, not only the length
                _status(self.render_status, False, f"no token ids: {self.tokenizer_error} · {len(text):,} characters")
                return
            _status(self.render_status, True, f"{count}{len(text):,} characters")

        def failed(msg: str, _tb: str) -> None:
            self.rendered.setPlainText("")
            self.ids.setPlainText("")
            _status(self.render_status, False, msg)

        if not source.strip():
            self.rendered.setPlainText("")
            self.ids.setPlainText("")
            _status(self.render_status, False, "an empty template: chat falls back to plain completion")
            return
        self.runner.cancel("template-edit")
        self.runner.start("template-edit", work, on_done=done, on_failed=failed)

    def operation(self) -> EditOp:
        from quantscope.core.chat import ChatTemplate, ChatTemplateError

        text = self.editor.toPlainText()
        if not text.strip():
            raise EditError("the template is empty (delete the key instead to remove it)")
        if text == self.original:
            raise EditError("unchanged")
        try:
            ChatTemplate(text)  # a template that does not compile would break every chat with the file
        except ChatTemplateError as exc:
            raise EditError(str(exc)) from None
        return SetValue("tokenizer.chat_template", TypedValue(ValueType.STRING, text))
