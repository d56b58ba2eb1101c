"""The view contract: every tab of the main window is a :class:`View`, described once by a :class:`ViewEntry` in
:data:`VIEWS`; every ``--screenshot --view NAME`` is a :class:`Shot` in :data:`SHOTS`. The main window builds its tabs,
its View menu and the Ctrl+1… shortcuts from :data:`VIEWS` and hands each view the open document through it; the
``--view`` choices and :func:`quantscope.gui.app.render_screenshot` read :data:`SHOTS`. No Qt is imported
here: ``quantscope --help`` and the argument errors stay fast."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..document import Document


class View(Protocol):
    """A tab: it is shown the open document (or None, or one it does not take: see :attr:`ViewEntry.release`)."""

    def set_document(self, doc: Document | None) -> None: ...


@dataclass(frozen=True)
class ViewEntry:
    """One tab: ``key`` names it (``show_view``, the ``view-KEY`` action), ``label`` is its tab text, ``menu`` its
    View menu text (with the mnemonic), ``shortcut`` its key, ``attr`` the window's attribute holding the widget,
    ``kind`` the document kind it shows ("gguf" or "bump"), ``release``: told ``set_document(None)`` when the open
    document is not of its kind (else it keeps the last one until the next of its kind), ``find``: Find (Ctrl+F)
    focuses its ``filter`` field, ``whole_file``: what it does that reads the whole file (a remote document is not
    shown to it: its tab says so and offers Download instead)."""

    key: str
    label: str
    menu: str
    shortcut: str
    attr: str
    kind: str
    release: bool = False
    find: bool = False
    whole_file: str = ""

    def accepts(self, doc: Document | None) -> bool:
        return doc is not None and doc.kind == self.kind and not (self.whole_file and doc.remote is not None)

    def tab_shown(self, doc: Document | None) -> bool:
        """Its tab is shown: it takes ``doc``, or ``doc`` is remote and the tab says why it does not."""
        return self.accepts(doc) or bool(doc is not None and doc.kind == self.kind and self.whole_file)

    def widget(self, win: object) -> View:
        return getattr(win, self.attr)  # type: ignore[no-any-return]

    def show_document(self, win: object, doc: Document | None) -> None:
        """Hand ``doc`` to this view in ``win``: the document when it takes it, None when it lets go of others."""
        if self.accepts(doc):
            self.widget(win).set_document(doc)
        elif self.release:
            self.widget(win).set_document(None)


#: The tabs, in the order of the tab bar and of View ▸ Ctrl+1… (the README lists the same).
VIEWS: tuple[ViewEntry, ...] = (
    ViewEntry("overview", "Overview", "&Overview", "Ctrl+1", "overview", "gguf"),
    ViewEntry("metadata", "Metadata", "&Metadata", "Ctrl+2", "metadata_view", "gguf", find=True),
    ViewEntry("tensors", "Tensors", "&Tensors", "Ctrl+3", "tensors_view", "gguf", find=True),
    ViewEntry("block", "Block inspector", "&Block inspector", "Ctrl+4", "block_view", "gguf"),
    ViewEntry("chat", "Chat", "&Chat", "Ctrl+5", "chat_view", "gguf", release=True, whole_file="Chat runs the model"),
    ViewEntry("probe", "Probe", "&Probe", "Ctrl+6", "probe_view", "gguf", release=True,
              whole_file="Probe runs the model"),
    ViewEntry("lab", "Quant lab", "Quant &lab", "Ctrl+7", "lab_view", "gguf", release=True,
              whole_file="The Quant lab requantizes every weight"),
    ViewEntry("bump", "Bump file", "B&ump file", "Ctrl+8", "bump_view", "bump", release=True, find=True),
    ViewEntry("serve", "Serve", "&Serve", "Ctrl+9", "serve_view", "gguf", release=True,
              whole_file="Serving runs the model"),
)


def view(key: str) -> ViewEntry | None:
    return next((e for e in VIEWS if e.key == key), None)


def first_view(doc: Document | None) -> ViewEntry | None:
    """The tab a freshly opened ``doc`` shows: the first that takes it (None: the start page)."""
    return next((e for e in VIEWS if e.accepts(doc)), None)


@dataclass(frozen=True)
class Shot:
    """``--view NAME``: ``tab`` (a :data:`VIEWS` key, or None for a dialog) is shown first, by ``setup`` itself when
    ``setup_shows`` (the chat takes its throw-away store before it is shown; the block inspector is given its block
    first; the bump view shows the file the conversion wrote); then ``setup`` (given a
    :class:`quantscope.gui.screenshots.ShotContext`) runs the view's real work and returns the widget to grab (None:
    the window), or raises :class:`quantscope.gui.screenshots.ShotFailed`."""

    name: str
    tab: str | None
    setup: Callable[..., object] | None = None
    setup_shows: bool = False


def _shots() -> tuple[Shot, ...]:
    from .. import screenshots as s

    return (
        Shot("overview", "overview"),
        Shot("metadata", "metadata"),
        Shot("metadata-edit", "metadata", s.metadata_edit),  # the chat template editor (a dialog over the tab)
        Shot("tensors", "tensors", s.tensors),
        Shot("block", "block", s.block, setup_shows=True),
        Shot("chat", "chat", s.chat, setup_shows=True),
        Shot("convert", None, s.convert),
        Shot("bump", "bump", s.convert, setup_shows=True),
        Shot("quantize", None, s.quantize),
        Shot("requantize", "lab", s.lab),
        Shot("quant-stats", "lab", s.lab),
        Shot("budget", "lab", s.lab),
        Shot("compare", None, s.compare),
        Shot("imatrix", None, s.imatrix),
        Shot("diff", None, s.diff),
        Shot("probe", "probe", s.probe),
        Shot("probe-attention", "probe", s.probe),
        Shot("probe-activations", "probe", s.probe),
        Shot("chat-tokens", "chat", s.chat_tokens, setup_shows=True),
        Shot("serve", "serve", s.serve),
        Shot("library", None, s.library),
        Shot("hub", None, s.hub),  # File ▸ Models from the hub, searched on the hub HF_ENDPOINT names
    )


#: Every ``--view NAME``, in the order ``--help`` lists them.
SHOTS: tuple[Shot, ...] = _shots()


def shot(name: str) -> Shot | None:
    return next((s for s in SHOTS if s.name == name), None)
