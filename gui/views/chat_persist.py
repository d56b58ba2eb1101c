"""The chat pane's saved conversations: the store (opened lazily), saving, the list, opening, continuing with
another model, rename, delete and export. :class:`Conversations` owns the store and the list; the view composes
it and decides what else opening or starting a conversation changes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QFileDialog, QWidget

from quantscope.core.chat.controller import ChatController
from quantscope.core.chat.store import ChatStore, Conversation, StoreError, default_path, export
from quantscope.core.fsutil import portable_name

from .chat_conversations import ConversationPanel


def export_file_name(title: str, fmt: str) -> str:
    """The file name an export of the conversation ``title`` is proposed under (``fmt`` ``json`` or ``md``):
    letters, digits, ``-``, ``_`` and spaces of the title, at most 120 characters, a Windows device name (``con``)
    prefixed (:func:`~quantscope.core.fsutil.portable_name`); ``conversation`` when nothing is left."""
    suffix = ".json" if fmt == "json" else ".md"
    safe = "".join(c if c.isalnum() or c in "-_ " else "_" for c in title)[:120].strip() or "conversation"
    return portable_name(safe + suffix, "conversation" + suffix)


class Conversations:
    """The conversation store (``error`` says why there is none) and the list of saved conversations.
    ``owner`` is the pane (it tells whether the list shows, and parents the export dialog); ``settings`` gives the
    system prompt, mode and sampling settings saved with a conversation; ``busy`` whether a reply streams."""

    def __init__(self, panel: ConversationPanel, ctl: ChatController, owner: QWidget,
                 show_error: Callable[[str, str], None], settings: Callable[[], dict[str, Any]],
                 busy: Callable[[], bool], report: Callable[[str], None]) -> None:
        self.panel = panel
        self.ctl = ctl
        self.owner = owner
        self._show_error = show_error
        self._settings = settings
        self._busy = busy
        self._report = report
        self._store: ChatStore | None = None
        self.error = ""

    def use(self, store: ChatStore | None) -> None:
        """Use ``store`` (tests and the screenshot pass a temporary one); None reopens the default lazily."""
        if self._store is not None and self._store is not store:
            self._store.close()
        self._store = store
        self.error = ""
        self.refresh()

    def store(self) -> ChatStore | None:
        """The store, opened now if it is not yet (None, and the error shown, where it cannot be)."""
        if self._store is None and not self.error:
            try:
                self._store = ChatStore()
            except StoreError as exc:
                self.error = str(exc)
                self._show_error("Conversations cannot be saved.", self.error)
            else:
                if self._store.moved_aside is not None:  # kept, never dropped: say where
                    self._show_error("The conversation database could not be read; a new one was started.",
                                     f"The old file was kept as {self._store.moved_aside}")
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def save(self) -> None:
        """Save the open conversation (nothing while it is empty)."""
        store = self.store()
        if store is None or not self.ctl.messages:
            return
        try:
            self.ctl.save(store, self._settings())
        except (StoreError, KeyError) as exc:
            self._show_error("The conversation could not be saved.", str(exc))
            return
        self.refresh()

    def refresh(self) -> None:
        """The list again, the open conversation selected."""
        store = self._store
        if store is None and self.owner.isVisible() and default_path().exists():
            store = self.store()  # an existing database is opened to list it; a new one is made on first save
        if store is None:
            self.panel.fill([], None)
            self.panel.store_label.setText(self.error or f"Conversations will be saved in {default_path()}")
        else:
            self.panel.fill(store.list_conversations(), self.ctl.conv_id)
            self.panel.store_label.setText(f"Saved in {store.path}")
        self.update_buttons()

    def update_buttons(self) -> None:
        self.panel.update_buttons(self._busy(), self.ctl.conv_id is not None)

    def open(self, conv_id: int) -> Conversation | None:
        """Make ``conv_id`` the open conversation; None (and the list refreshed) when it is gone."""
        store = self.store()
        if store is None:
            return None
        try:
            return self.ctl.open(store, conv_id)
        except KeyError:
            self.refresh()
            return None

    def continue_with_model(self) -> None:
        """The explicit choice: continue the open conversation (a copy) with the opened file's model."""
        store = self.store()
        try:
            self.ctl.continue_with(store, self._settings())
        except (StoreError, KeyError) as exc:
            self._show_error("The conversation could not be copied.", str(exc))

    def rename(self, conv_id: int, title: str) -> None:
        store = self.store()
        if store is None:
            return
        try:
            store.rename(conv_id, title)
        except (ValueError, KeyError, StoreError) as exc:
            self._show_error("The conversation could not be renamed.", str(exc))
        self.refresh()

    def delete(self, conv_id: int) -> None:
        """Delete a saved conversation (the view starts a new one first when it is the open one)."""
        store = self.store()
        if store is None:
            return
        try:
            store.delete(conv_id)
        except StoreError as exc:
            self._show_error("The conversation could not be deleted.", str(exc))
        self.refresh()

    def export(self, path: str | Path, fmt: str | None = None) -> Path | None:
        """Write the open conversation to ``path`` (Markdown or JSON, by ``fmt`` or the suffix)."""
        store = self.store()
        if store is None or self.ctl.conv_id is None:
            return None
        try:
            return export(store.get(self.ctl.conv_id), path, fmt)
        except (OSError, KeyError, ValueError) as exc:
            self._show_error("The conversation could not be exported.", str(exc))
            return None

    def export_dialog(self, fmt: str) -> None:
        if self.ctl.conv_id is None or (store := self.store()) is None:
            return
        name = export_file_name(store.get(self.ctl.conv_id).title, fmt)
        path, _ = QFileDialog.getSaveFileName(self.owner, "Export the conversation", str(Path.home() / name),
                                              "JSON (*.json)" if fmt == "json" else "Markdown (*.md)")
        if path:
            out = self.export(path, fmt)
            if out is not None:
                self._report(f"exported to {out.name}")
