"""The chat pane's model bar: the file, its state, backend (with why CUDA is or is not there), threads, context,
the memory it will need, load progress with cancel, and what the loaded engine is."""

from __future__ import annotations

import os
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QWidget,
)

from quantscope.core.cpu import default_threads, isa
from quantscope.core.summary import human_bytes

from ..guard import qt_guarded
from ..widgets.fit import ElidedLabel
from ..widgets.progress import ProgressBar
from .chat_settings import ispin

DEFAULT_CTX = 4096
#: the KV cache choices (label, (K type, V type)): llama.cpp's -ctk / -ctv, the common pairs
KV_CHOICES = (("F16", ("f16", "f16")), ("Q8_0", ("q8_0", "q8_0")), ("Q8_0 K · Q4_0 V", ("q8_0", "q4_0")),
              ("Q4_0", ("q4_0", "q4_0")), ("BF16", ("bf16", "bf16")), ("F32", ("f32", "f32")))


@qt_guarded
class ModelBar(QFrame):
    """The model card above the conversation (the view connects its buttons and spin boxes)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("card")
        self.setAccessibleName("Model")
        g = QGridLayout(self)
        g.setContentsMargins(10, 8, 10, 8)
        g.setHorizontalSpacing(10)
        g.setVerticalSpacing(4)
        self.model_name = ElidedLabel("No model", Qt.TextElideMode.ElideMiddle)
        self.model_name.setObjectName("modelName")
        self.model_name.setAccessibleName("Model file")
        self.model_state = ElidedLabel("not loaded")
        self.model_state.setObjectName("muted")
        self.model_state.setAccessibleName("Model state")
        self.backend_combo = QComboBox()
        self.backend_combo.setAccessibleName("Backend")
        self.backend_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.backend_combo.addItem(f"CPU · {isa()}", "cpu")
        self.backend_combo.addItem("CUDA", "cuda")
        self.backend_combo.setToolTip("Where the model runs: the CPU with Quantscope's native kernels "
                                      f"(instruction set in use: {isa()}), or an NVIDIA GPU")
        self.cuda_label = ElidedLabel("CUDA: checking…")
        self.cuda_label.setObjectName("muted")
        self.cuda_label.setAccessibleName("CUDA status")
        self.threads_spin = ispin(1, max(1, os.cpu_count() or 1), "Threads",
                                   "CPU threads for the kernels (applies from the next reply)")
        self.threads_spin.setValue(default_threads())
        self.ctx_spin = ispin(256, 1 << 20, "Context size",
                               "Tokens the KV cache holds (the conversation plus the reply); applies on load")
        self.ctx_spin.setSingleStep(512)
        self.ctx_spin.setValue(DEFAULT_CTX)
        self.kv_combo = QComboBox()
        self.kv_combo.setAccessibleName("KV cache type")
        self.kv_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        for label, types in KV_CHOICES:
            self.kv_combo.addItem(label, types)
        self.kv_combo.setToolTip("The KV cache's element types (llama.cpp's --cache-type-k/-v): Q8_0 takes about "
                                 "half of F16's memory at a small cost in accuracy, Q4_0 about a quarter at a larger "
                                 "one; a cache other than F16 runs on the CPU. Applies on load")
        self.load_btn = QPushButton("Load model")
        self.load_btn.setAccessibleName("Load the model")
        self.unload_btn = QPushButton("Unload")
        self.unload_btn.setAccessibleName("Unload the model")
        self.serve_btn = QPushButton("Serve…")
        self.serve_btn.setAccessibleName("Serve this model over the OpenAI API")
        self.serve_btn.setToolTip("Serve this model to other programs over a local OpenAI-compatible API, and look "
                                  "inside each request (the Serve tab)")
        self.memory_label = QLabel()
        self.memory_label.setObjectName("muted")
        self.memory_label.setWordWrap(True)
        self.memory_label.setAccessibleName("Memory the model will use")
        self.load_progress = ProgressBar()
        self.load_progress.setRange(0, 100)
        self.load_progress.setAccessibleName("Loading progress")
        self.load_progress.setMinimumWidth(120)
        self.load_progress.setMaximumWidth(220)
        self.load_cancel = QPushButton("Cancel")
        self.load_cancel.setAccessibleName("Cancel loading")
        self.engine_label = QLabel()
        self.engine_label.setObjectName("muted")
        self.engine_label.setAccessibleName("Loaded engine")
        self.engine_label.setWordWrap(True)
        self.engine_label.hide()
        top = QHBoxLayout()
        self.model_name.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)  # whole if it can
        top.addWidget(self.model_name)
        top.addSpacing(8)
        top.addWidget(self.model_state, 1)
        top.addWidget(self.load_btn)
        top.addWidget(self.unload_btn)
        top.addWidget(self.serve_btn)
        opts = QHBoxLayout()
        opts.setSpacing(6)
        for label, widget in (("Backend", self.backend_combo), ("Threads", self.threads_spin),
                              ("Context", self.ctx_spin)):
            lab = QLabel(label)
            lab.setBuddy(widget)
            opts.addWidget(lab)
            opts.addWidget(widget)
            opts.addSpacing(4)
        opts.addWidget(self.cuda_label, 1)  # elided where the row is narrow; the reason is in its tooltip
        bottom = QHBoxLayout()  # the KV cache type beside the memory estimate it changes (the row above is full)
        kv_label = QLabel("KV cache")
        kv_label.setBuddy(self.kv_combo)
        bottom.addWidget(kv_label)
        bottom.addWidget(self.kv_combo)
        bottom.addSpacing(4)
        bottom.addWidget(self.memory_label, 1)
        bottom.addWidget(self.load_progress)
        bottom.addWidget(self.load_cancel)
        g.addLayout(top, 0, 0)
        g.addWidget(self.engine_label, 1, 0)
        g.addLayout(opts, 2, 0)
        g.addLayout(bottom, 3, 0)

    def show_cuda(self, ok: bool | None, why: str) -> None:
        """The CUDA probe's answer: the CUDA item enabled or not, a short reason (the whole one in tooltips)."""
        item = self.backend_combo.model().item(1)  # type: ignore[attr-defined]
        item.setEnabled(bool(ok))
        if ok is None and why == "checking":
            text = "CUDA: checking…"
        elif ok is None:
            text = "CUDA: not built"
        elif ok:
            text = f"CUDA: {why}"
        else:
            short = why.split(" (")[0].split(":")[0].split(";")[0].strip()
            text = f"CUDA unavailable: {short}" if short else "CUDA unavailable"
        self.cuda_label.setText(text)
        self.cuda_label.setToolTip(why)
        item.setToolTip(why)
        # the item stays "CUDA" (a short combo box); why it is disabled is in the CUDA label and the tooltips
        if not ok and self.backend_combo.currentData() == "cuda":
            self.backend_combo.setCurrentIndex(0)


    def show_memory(self, plan: Any, avail: int | None) -> None:
        """What the model will need (weights + KV cache for the chosen context) against what is free."""
        if plan is None:
            self.memory_label.setText("Open a GGUF file to chat with it.")
            return
        tail = f" · {human_bytes(avail)} available" if avail is not None else ""
        self.memory_label.setText(
            f"Needs ≈ <b>{human_bytes(plan.total_bytes)}</b>: {human_bytes(plan.weights_bytes)} of weights "
            f"(memory-mapped) + {human_bytes(plan.kv_bytes)} KV cache for {plan.context:,} tokens ({plan.kv_type})"
            + (f" + {human_bytes(plan.state_bytes)} recurrent state" if plan.state_bytes else "") + tail)

    def cache_types(self) -> tuple[str, str]:
        """The chosen (K, V) cache types."""
        return tuple(self.kv_combo.currentData() or ("f16", "f16"))  # type: ignore[return-value]

    def show_progress(self, stage: str, fraction: float) -> None:
        self.load_progress.setValue(int(fraction * 100))
        self.load_progress.setFormat(f"{stage} %p%")
        self.model_state.setText(f"loading: {stage}…")

    def show_engine(self, info: Any) -> None:
        """The loaded engine in one wrapped line (threads as chosen now for the CPU)."""
        threads = self.threads_spin.value() if info.backend.startswith("CPU") else info.threads
        kv = "" if info.cache_types == ("f16", "f16") else f" ({'/'.join(t.upper() for t in info.cache_types)})"
        self.engine_label.setText(
            f"{info.arch} · {info.backend} · {threads} threads · context {info.n_ctx:,} of "
            f"{info.n_ctx_train:,} trained · KV cache {human_bytes(info.kv_bytes)}{kv} · vocabulary {info.n_vocab:,}"
            + ("" if info.has_template else " · no chat template: plain completion"))
        self.engine_label.show()
