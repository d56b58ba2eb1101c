"""The chat pane's model loading: the CUDA probe, the memory the model will need (checked against what is free
before loading), loading with progress and cancel, and what the loaded engine is. :class:`ModelLoader` owns the
model bar's behaviour; the view composes it and decides what else a load changes."""

from __future__ import annotations

from collections.abc import Callable

from quantscope.core import sysinfo
from quantscope.core.model.memory import MemoryPlan, memory_plan
from quantscope.core.summary import human_bytes

from ..chat_engine import EngineHost, EngineInfo, cuda_availability
from ..document import Document
from ..workers import TaskRunner
from .chat_modelbar import ModelBar


def available_memory() -> int | None:
    """Bytes the system can still give (Linux ``MemAvailable``, macOS ``vm_stat``, Windows
    ``GlobalMemoryStatusEx``), or None where it cannot be read."""
    return sysinfo.memory_available()


class ModelLoader:
    """The model bar's behaviour: whether CUDA can run (``cuda``: ok or not, and why), the memory the open file
    will need, starting a load in the model thread, its progress, its end, and the bar's buttons for the model
    thread's state. ``doc`` gives the open document (or None)."""

    def __init__(self, runner: TaskRunner, host: EngineHost, bar: ModelBar,
                 doc: Callable[[], Document | None]) -> None:
        self.runner = runner
        self.host = host
        self.bar = bar
        self._doc = doc
        self.cuda: tuple[bool | None, str] = (None, "not checked yet")
        self.loaded_note = ""  # " · loaded in 1.23 s" after the state, while the engine is ready

    # ------------------------------------------------------------------ CUDA
    def probe_cuda(self) -> None:
        """Ask (once, in a worker) whether the CUDA backend can run here; show what is known."""
        if self.cuda[0] is not None or self.cuda[1] != "not checked yet":
            self.show_cuda()
            return
        self.cuda = (None, "checking")
        self.runner.start("cuda-check", lambda _r, _t: cuda_availability(), on_done=self.cuda_checked,
                          on_failed=lambda m, _d: self.cuda_checked((False, m)),
                          on_cancelled=self._cuda_check_cancelled)

    def _cuda_check_cancelled(self) -> None:
        self.cuda = (None, "not checked yet")
        if not self.runner.closed:
            self.probe_cuda()  # cancelled by a file switch: ask again (the probe result is cached)

    def cuda_checked(self, result: tuple[bool | None, str]) -> None:
        self.cuda = result
        self.show_cuda()

    def show_cuda(self) -> None:
        self.bar.show_cuda(*self.cuda)

    # ------------------------------------------------------------------ memory
    def plan(self) -> MemoryPlan | None:
        """The memory the open file needs at the chosen context (None without a file or where it cannot say)."""
        doc = self._doc()
        if doc is None or doc.gguf is None:
            return None
        try:
            k, v = self.bar.cache_types()
            return memory_plan(doc.gguf, self.bar.ctx_spin.value(), k.upper(), v.upper())
        except Exception:
            return None

    def update_memory(self) -> None:
        self.bar.show_memory(self.plan(), available_memory())

    def too_large(self) -> tuple[str, str] | None:
        """Why the model cannot be loaded now (message, detail) when it needs more memory than is free."""
        p = self.plan()
        avail = available_memory()
        if p is None or avail is None or p.total_bytes <= avail:
            return None
        return ("The model is too large for the memory available.",
                f"It needs about {human_bytes(p.total_bytes)} (weights {human_bytes(p.weights_bytes)} "
                f"+ KV cache {human_bytes(p.kv_bytes)}) and {human_bytes(avail)} is free; lower the "
                "context size or close other programs.")

    # ------------------------------------------------------------------ loading
    def start(self) -> bool:
        """Load the open file in the model thread with the bar's backend, context and threads."""
        doc = self._doc()
        if doc is None:
            return False
        self.bar.load_progress.setValue(0)
        self.bar.load_progress.show()
        self.bar.model_state.setText("loading…")
        backend = str(self.bar.backend_combo.currentData() or "cpu")
        self.host.load(doc.path, self.bar.ctx_spin.value(), self.bar.threads_spin.value(), backend,
                       self.bar.cache_types())
        return True

    def unload(self) -> None:
        self.host.unload()
        self.bar.model_state.setText("not loaded")

    def show_progress(self, stage: str, fraction: float) -> None:
        self.bar.show_progress(stage, fraction)

    def loaded(self, info: EngineInfo) -> None:
        """The engine is ready: the time it took and what it is."""
        self.bar.load_progress.hide()
        self.loaded_note = f" · loaded in {info.load_s:.2f} s"
        self.bar.model_state.setText(f"ready{self.loaded_note}")
        self.show_engine_info()

    def show_engine_info(self) -> None:
        if self.host.info is not None:
            self.bar.show_engine(self.host.info)

    def ended(self, state: str) -> None:
        """Loading ended without an engine (``state``: "not loaded", "loading cancelled")."""
        self.bar.load_progress.hide()
        self.bar.model_state.setText(state)

    def update_controls(self, has_doc: bool) -> None:
        """The bar's buttons and state for the model thread's state."""
        st, b = self.host.state, self.bar
        b.load_btn.setEnabled(has_doc and st in ("empty", "ready"))
        b.load_btn.setText("Reload" if st in ("ready", "generating") else "Load model")
        b.load_btn.setToolTip("Load again with the backend and context chosen here" if st == "ready" else "")
        b.unload_btn.setEnabled(st in ("ready", "generating", "loading"))
        b.load_cancel.setVisible(st == "loading")
        b.load_progress.setVisible(st == "loading")
        for w in (b.backend_combo, b.ctx_spin, b.kv_combo):
            w.setEnabled(has_doc and st in ("empty", "ready"))
        if st == "empty" and not b.model_state.full_text().startswith(("loading cancelled", "not loaded")):
            b.model_state.setText("not loaded")
        b.engine_label.setVisible(st in ("ready", "generating"))
        if st == "generating":
            b.model_state.setText("generating…")
        elif st == "ready":
            b.model_state.setText(f"ready{self.loaded_note}")
