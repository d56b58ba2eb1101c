"""Syntax highlighting of Jinja2 chat templates (the Metadata view's template pane and the template editor)."""

from __future__ import annotations

import re

from PySide6.QtGui import QColor, QFont, QSyntaxHighlighter, QTextCharFormat, QTextDocument

from ..guard import qt_guarded
from ..theme import is_dark


@qt_guarded
class JinjaHighlighter(QSyntaxHighlighter):
    """Jinja2 template highlighting: ``{% statements %}``, ``{{ expressions }}``, ``{# comments #}``, strings,
    keywords, and the special tokens (``<|im_start|>``, ``<start_of_turn>``...) that chat templates emit."""

    KEYWORDS = ("for", "endfor", "if", "elif", "else", "endif", "set", "endset", "in", "not", "and", "or", "is",
                "macro", "endmacro", "call", "endcall", "filter", "endfilter", "raise_exception", "loop",
                "namespace", "true", "false", "none", "True", "False", "None", "defined", "length")

    def __init__(self, doc: QTextDocument) -> None:
        super().__init__(doc)
        dark = is_dark()

        def fmt(color: str, bold: bool = False, italic: bool = False) -> QTextCharFormat:
            f = QTextCharFormat()
            f.setForeground(QColor(color))
            if bold:
                f.setFontWeight(QFont.Weight.Bold)
            f.setFontItalic(italic)
            return f

        self.delim = fmt("#c586c0" if dark else "#a626a4", bold=True)
        self.expr = fmt("#9cdcfe" if dark else "#0550ae")
        self.keyword = fmt("#569cd6" if dark else "#cf222e", bold=True)
        self.string = fmt("#ce9178" if dark else "#0a7d32")
        self.comment = fmt("#6a9955" if dark else "#6e7781", italic=True)
        self.special = fmt("#dcdcaa" if dark else "#953800", bold=True)
        self.tag_re = re.compile(r"(\{%-?|-?%\}|\{\{-?|-?\}\}|\{#.*?#\})")
        self.block_re = re.compile(r"\{%-?.*?-?%\}|\{\{-?.*?-?\}\}", re.S)
        self.kw_re = re.compile(r"\b(" + "|".join(self.KEYWORDS) + r")\b")
        self.str_re = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")
        self.special_re = re.compile(r"<\|?[A-Za-z_/][\w/|]*\|?>|\[/?INST\]|<s>|</s>")

    def highlightBlock(self, text: str) -> None:
        for m in self.special_re.finditer(text):
            self.setFormat(m.start(), m.end() - m.start(), self.special)
        for m in self.block_re.finditer(text):
            a, b = m.start(), m.end()
            self.setFormat(a, b - a, self.expr)
            inner = text[a:b]
            for k in self.kw_re.finditer(inner):
                self.setFormat(a + k.start(), k.end() - k.start(), self.keyword)
            for s in self.str_re.finditer(inner):
                self.setFormat(a + s.start(), s.end() - s.start(), self.string)
        for m in self.tag_re.finditer(text):
            is_comment = m.group(0).startswith("{#")
            self.setFormat(m.start(), m.end() - m.start(), self.comment if is_comment else self.delim)
