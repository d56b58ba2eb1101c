"""The chat pane's saved conversations: the store (opened lazily), saving, the list, new, open (with the model
binding), continue with another model, rename, delete and export. A mixin of
:class:`~quantscope.gui.views.chat.ChatView`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtWidgets import QFileDialog

from quantscope.core.chat.store import ChatStore, StoreError, default_path, export

if TYPE_CHECKING:
    from .chat import ChatView


class PersistMixin:
    """Conversation persistence of the chat view."""

    # ================================================================== persistence
    def use_store(self: ChatView, store: ChatStore | None) -> None:
        """Use ``store`` (tests and the screenshot pass a temporary one); None reopens the default lazily."""
        if self._store is not None and self._store is not store:
            self._store.close()
        self._store = store
        self.store_error = ""
        self._refresh_list()

    def store(self: ChatView) -> ChatStore | None:
        if self._store is None and not self.store_error:
            try:
                self._store = ChatStore()
            except StoreError as exc:
                self.store_error = str(exc)
                self.show_error("Conversations cannot be saved.", self.store_error)
            else:
                if self._store.moved_aside is not None:  # kept, never dropped: say where
                    self.show_error("The conversation database could not be read; a new one was started.",
                                    f"The old file was kept as {self._store.moved_aside}")
        return self._store

    def _settings(self: ChatView) -> dict[str, Any]:
        return {"system_prompt": self.system_edit.toPlainText(), "mode": self.mode, "params": self.params_dict()}

    def _save(self: ChatView) -> None:
        store = self.store()
        if store is None or not self.messages:
            return
        try:
            self.ctl.save(store, self._settings())
        except (StoreError, KeyError) as exc:
            self.show_error("The conversation could not be saved.", str(exc))
            return
        self._refresh_list()

    def _refresh_list(self: ChatView) -> None:
        store = self._store
        if store is None and self.isVisible() and default_path().exists():
            store = self.store()  # an existing database is opened to list it; a new one is made on first save
        if store is None:
            self.side.fill([], None)
            self.store_label.setText(self.store_error or f"Conversations will be saved in {default_path()}")
        else:
            self.side.fill(store.list_conversations(), self.conv_id)
            self.store_label.setText(f"Saved in {store.path}")
        self._update_buttons_for_list()

    def _update_buttons_for_list(self: ChatView) -> None:
        self.side.update_buttons(self.host.state == "generating", self.conv_id is not None)

    def new_conversation(self: ChatView) -> None:
        self._abort_reply("a new conversation was started")
        self.ctl.new()
        self.cancel_edit()
        self.notice.hide()
        self.reset_stats()
        self._show_binding()
        self._rebuild_views()
        self.side.clear_selection()
        self._update_controls()

    def open_conversation(self: ChatView, conv_id: int) -> bool:
        """Show a saved conversation with its system prompt, mode and sampling settings."""
        store = self.store()
        if store is None or (conv_id == self.conv_id and self.views):
            return conv_id == self.conv_id
        if self.host.state == "generating":
            return False
        try:
            conv = self.ctl.open(store, conv_id)
        except KeyError:
            self._refresh_list()
            return False
        self.reset_stats()
        self._show_binding()
        self.system_edit.setPlainText(conv.system_prompt)
        self.set_mode(conv.mode if self.settings.chat_available else "completion")
        self.set_params(conv.params)
        self.cancel_edit()
        self.notice.hide()
        self.clear_error()
        self._rebuild_views()
        self._refresh_list()
        self._update_controls()
        return True

    def _show_binding(self: ChatView) -> None:
        """Say which model the open conversation belongs to when it is not the opened file's, with the explicit
        choice to continue it with this one."""
        owner, model = self.ctl.owner, self.ctl.model
        self.notices.show_binding(owner if self.ctl.foreign else None, model)
        self.model_name.setToolTip(model.label if model is not None else "")

    def continue_with_model(self: ChatView) -> None:
        """The explicit choice: continue the open conversation (a copy) with the opened file's model."""
        store = self.store()
        try:
            self.ctl.continue_with(store, self._settings())
        except (StoreError, KeyError) as exc:
            self.show_error("The conversation could not be copied.", str(exc))
        self._show_binding()
        self._refresh_list()
        self._update_controls()

    def rename_conversation(self: ChatView, conv_id: int, title: str) -> None:
        store = self.store()
        if store is None:
            return
        try:
            store.rename(conv_id, title)
        except (ValueError, KeyError, StoreError) as exc:
            self.show_error("The conversation could not be renamed.", str(exc))
        self._refresh_list()

    def delete_conversation(self: ChatView, conv_id: int) -> None:
        store = self.store()
        if store is None:
            return
        if conv_id == self.conv_id:
            self.new_conversation()
        try:
            store.delete(conv_id)
        except StoreError as exc:
            self.show_error("The conversation could not be deleted.", str(exc))
        self._refresh_list()

    def export_conversation(self: ChatView, path: str | Path, fmt: str | None = None) -> Path | None:
        store = self.store()
        if store is None or self.conv_id is None:
            return None
        try:
            return export(store.get(self.conv_id), path, fmt)
        except (OSError, KeyError, ValueError) as exc:
            self.show_error("The conversation could not be exported.", str(exc))
            return None

    def export_dialog(self: ChatView, fmt: str) -> None:
        if self.conv_id is None or (store := self.store()) is None:
            return
        title = store.get(self.conv_id).title
        safe = "".join(c if c.isalnum() or c in "-_ " else "_" for c in title).strip() or "conversation"
        suffix = ".json" if fmt == "json" else ".md"
        path, _ = QFileDialog.getSaveFileName(self, "Export the conversation", str(Path.home() / (safe + suffix)),
                                              "JSON (*.json)" if fmt == "json" else "Markdown (*.md)")
        if path:
            out = self.export_conversation(path, fmt)
            if out is not None:
                self.activity.setText(f"exported to {out.name}")

