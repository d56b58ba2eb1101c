"""The chat pane's model loading: the CUDA probe, the memory the model will need (checked against what is free
before loading), loading with progress and cancel, and what the loaded engine is. A mixin of
:class:`~quantscope.gui.views.chat.ChatView`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from quantscope.core.model.memory import memory_plan
from quantscope.core.summary import human_bytes

from ..chat_engine import EngineInfo, cuda_availability

if TYPE_CHECKING:
    from .chat import ChatView


def available_memory() -> int | None:
    """Bytes the system can still give (``MemAvailable``), or None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


class LoadingMixin:
    """Model loading of the chat view."""

    def _probe_cuda(self: ChatView) -> None:
        if self.cuda[0] is not None or self.cuda[1] != "not checked yet":
            self._show_cuda()
            return
        self.cuda = (None, "checking")
        self.runner.start("cuda-check", lambda _r, _t: cuda_availability(), on_done=self._cuda_checked,
                          on_failed=lambda m, _d: self._cuda_checked((False, m)),
                          on_cancelled=self._cuda_check_cancelled)

    def _cuda_check_cancelled(self: ChatView) -> None:
        self.cuda = (None, "not checked yet")
        if not self.runner.closed:
            self._probe_cuda()  # cancelled by a file switch: ask again (the probe result is cached)

    def _cuda_checked(self: ChatView, result: tuple[bool | None, str]) -> None:
        self.cuda = result
        self._show_cuda()

    def _show_cuda(self: ChatView) -> None:
        self.model_bar.show_cuda(*self.cuda)

    def plan(self: ChatView) -> Any:
        if self.doc is None or self.doc.gguf is None:
            return None
        try:
            return memory_plan(self.doc.gguf, self.ctx_spin.value(), "F16")
        except Exception:
            return None

    def _update_memory(self: ChatView) -> None:
        self.model_bar.show_memory(self.plan(), available_memory())

    # ================================================================== loading
    def load_model(self: ChatView) -> bool:
        """Load the open file in the model thread (memory is checked first; errors appear in the pane)."""
        if self.doc is None or self.host.state == "loading":
            return False
        self.clear_error()
        p = self.plan()
        avail = available_memory()
        if p is not None and avail is not None and p.total_bytes > avail:
            self.show_error("The model is too large for the memory available.",
                            f"It needs about {human_bytes(p.total_bytes)} (weights {human_bytes(p.weights_bytes)} "
                            f"+ KV cache {human_bytes(p.kv_bytes)}) and {human_bytes(avail)} is free; lower the "
                            "context size or close other programs.")
            self._script = []
            self.script_active = False
            return False
        self.load_progress.setValue(0)
        self.load_progress.show()
        self.model_state.setText("loading…")
        backend = str(self.backend_combo.currentData() or "cpu")
        self.host.load(self.doc.path, self.ctx_spin.value(), self.threads_spin.value(), backend)
        self._update_controls()
        return True

    def unload_model(self: ChatView) -> None:
        self._abort_reply("the model was unloaded")
        self.host.unload()
        self.model_state.setText("not loaded")
        self._update_controls()

    def _on_load_progress(self: ChatView, stage: str, fraction: float) -> None:
        self.model_bar.show_progress(stage, fraction)

    def _on_loaded(self: ChatView, info: EngineInfo) -> None:
        self.load_progress.hide()
        self._loaded_note = f" · loaded in {info.load_s:.2f} s"
        self.model_state.setText(f"ready{self._loaded_note}")
        self._show_engine_info()
        if info.backend_note:
            self.show_error("Running on the CPU.", info.backend_note)
        self.reset_stats()
        self.ctx_bar.setRange(0, info.n_ctx)  # a new engine: nothing measured yet, its context size
        self.max_spin.setMaximum(info.n_ctx)
        if not info.has_template:
            self.set_mode("completion")
        self._update_controls()
        self._ensure_bundle()
        if self.isVisible():  # ready to type: the message box, not the list the Load button left the focus in
            self.composer.setFocus()
        self.engineLoaded.emit(info)
        if self.script_active:
            self._script_next()

    def _show_engine_info(self: ChatView) -> None:
        info = self.host.info
        if info is None:
            return
        self.model_bar.show_engine(info)

    def _on_load_failed(self: ChatView, message: str, detail: str) -> None:
        self.load_progress.hide()
        self.model_state.setText("not loaded")
        self.show_error(message, detail)
        self._script = []
        self.script_active = False
        self._update_controls()
        self._ensure_bundle()

    def _on_load_cancelled(self: ChatView) -> None:
        self.load_progress.hide()
        self.model_state.setText("loading cancelled")
        self._script = []
        self.script_active = False
        self._update_controls()
        self._ensure_bundle()

