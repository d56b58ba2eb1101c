"""The chat pane's Settings tab: mode, system prompt, sampling presets and values, and the control-token toggle."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QWidget,
)

from quantscope.core.chat import SamplerParams
from quantscope.core.chat.tokens import N_ALTERNATIVES

from ..guard import qt_guarded

#: Sampling presets (llama.cpp meanings). "Greedy" is temperature 0: the same text as `quantscope generate --temp 0`.
PRESETS: dict[str, dict[str, float]] = {
    "Balanced": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0},
    "Precise": {"temperature": 0.2, "top_k": 20, "top_p": 0.9, "min_p": 0.1, "repeat_penalty": 1.1},
    "Creative": {"temperature": 1.1, "top_k": 100, "top_p": 0.98, "min_p": 0.02, "repeat_penalty": 1.05},
    "Greedy": {"temperature": 0.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0},
}


def spin(lo: float, hi: float, step: float, decimals: int, name: str, tip: str) -> QDoubleSpinBox:
    w = QDoubleSpinBox()
    w.setRange(lo, hi)
    w.setSingleStep(step)
    w.setDecimals(decimals)
    w.setAccessibleName(name)
    w.setToolTip(tip)
    return w


def ispin(lo: int, hi: int, name: str, tip: str) -> QSpinBox:
    w = QSpinBox()
    w.setRange(lo, hi)
    w.setAccessibleName(name)
    w.setToolTip(tip)
    w.setGroupSeparatorShown(True)
    return w


@qt_guarded
class SamplingPanel(QWidget):
    """Mode, system prompt and sampling settings. ``modeChanged`` when the mode changes, ``systemChanged`` when
    the system prompt is edited."""

    modeChanged = Signal(str)
    systemChanged = Signal()
    colorModeChanged = Signal(str)  # "off", "probability", "entropy"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._applying_preset = False
        form = QFormLayout(self)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.mode_combo = QComboBox()
        self.mode_combo.setAccessibleName("Mode")
        self.mode_combo.addItem("Chat (template)", "chat")
        self.mode_combo.addItem("Plain completion", "completion")
        self.mode_combo.setToolTip("Chat renders the conversation with the file's chat template; plain "
                                   "completion continues the text as it is (for models without a template)")
        self.mode_combo.currentIndexChanged.connect(self._mode_changed)
        self.system_edit = QPlainTextEdit()
        self.system_edit.setAccessibleName("System prompt")
        self.system_edit.setPlaceholderText("System prompt (optional)")
        self.system_edit.setFixedHeight(84)
        self.system_edit.textChanged.connect(self.systemChanged.emit)
        self.preset_combo = QComboBox()
        self.preset_combo.setAccessibleName("Sampling preset")
        self.preset_combo.addItems([*PRESETS, "Custom"])
        self.preset_combo.activated.connect(lambda i: self.apply_preset(self.preset_combo.itemText(i)))
        self.temp_spin = spin(0.0, 2.0, 0.05, 2, "Temperature", "0 picks the most likely token (greedy)")
        self.topk_spin = ispin(0, 1000, "Top-k", "Keep the k most likely tokens (0: all)")
        self.topp_spin = spin(0.0, 1.0, 0.01, 2, "Top-p", "Keep the smallest set whose probability reaches p")
        self.minp_spin = spin(0.0, 1.0, 0.01, 2, "Min-p", "Drop tokens less likely than min-p × the best one")
        self.repeat_spin = spin(1.0, 2.0, 0.05, 2, "Repeat penalty", "Penalise the last 64 tokens (1.0: no penalty)")
        self.seed_spin = ispin(-1, 2**31 - 1, "Seed", "Same seed, same text; -1 picks a new one each time")
        self.seed_spin.setSpecialValueText("random")
        self.seed_spin.setValue(-1)
        self.seed_spin.setGroupSeparatorShown(False)
        self.max_spin = ispin(1, 1 << 20, "Max tokens", "Most tokens a reply may have")
        self.max_spin.setValue(512)
        self.lookup_spin = ispin(0, 16, "Prompt lookup",
                                 "Speculative decoding by prompt lookup: the longest n-gram of the conversation's "
                                 "last tokens looked up earlier in it, whose continuation the model checks in one "
                                 "pass (faster where the reply repeats the prompt: code edits, summaries; the text "
                                 "is the same). 0: off")
        self.lookup_spin.setSpecialValueText("off")
        self.special_check = QCheckBox("Show control tokens")
        self.special_check.setAccessibleName("Show control tokens")
        self.special_check.setToolTip("Print control tokens such as <|im_end|> or <start_of_image> in replies "
                                      "(normally left out); end-of-generation tokens always stop the reply")
        self.color_combo = QComboBox()
        self.color_combo.setAccessibleName("Colour replies by")
        for text, mode in (("Off", "off"), ("Probability", "probability"), ("Entropy", "entropy")):
            self.color_combo.addItem(text, mode)
        self.color_combo.setToolTip("Tint each token of the replies: by its probability (clear: certain, yellow to "
                                    "red: unlikely) or by the entropy of its choice (clear: one choice, blue to "
                                    "violet: many). Hover a token for its alternatives; click it to branch.")
        self.color_combo.currentIndexChanged.connect(lambda _i: self.colorModeChanged.emit(self.color_mode))
        for sp in (self.temp_spin, self.topp_spin, self.minp_spin, self.repeat_spin):
            sp.valueChanged.connect(self._param_edited)
        self.topk_spin.valueChanged.connect(self._param_edited)
        for label, w in (("Mode", self.mode_combo), ("System", self.system_edit), ("Preset", self.preset_combo),
                         ("Temperature", self.temp_spin), ("Top-k", self.topk_spin), ("Top-p", self.topp_spin),
                         ("Min-p", self.minp_spin), ("Repeat penalty", self.repeat_spin), ("Seed", self.seed_spin),
                         ("Max tokens", self.max_spin), ("Prompt lookup", self.lookup_spin), ("", self.special_check),
                         ("Colour by", self.color_combo)):
            form.addRow(label, w)
        hint = QLabel("Presets: <b>Precise</b> (low temperature, mild repeat penalty), <b>Creative</b> (high "
                      "temperature, wide top-k), <b>Greedy</b> (always the most likely token: the same text as "
                      "<code>quantscope generate --temp 0</code>).")
        hint.setObjectName("muted")
        hint.setWordWrap(True)
        form.addRow(hint)
        self.apply_preset("Balanced")

    # ------------------------------------------------------------------ presets
    def apply_preset(self, name: str) -> None:
        if name not in PRESETS:
            self.preset_combo.setCurrentText("Custom")
            return
        v = PRESETS[name]
        self._applying_preset = True
        try:
            self.temp_spin.setValue(v["temperature"])
            self.topk_spin.setValue(int(v["top_k"]))
            self.topp_spin.setValue(v["top_p"])
            self.minp_spin.setValue(v["min_p"])
            self.repeat_spin.setValue(v["repeat_penalty"])
        finally:
            self._applying_preset = False
        self.preset_combo.setCurrentText(name)

    def _param_edited(self, *_: object) -> None:
        if not self._applying_preset:
            self.preset_combo.setCurrentText(self._matching_preset())

    def _matching_preset(self) -> str:
        cur = self.params_dict()
        for name, v in PRESETS.items():
            if all(abs(float(cur[k]) - float(x)) < 1e-9 for k, x in v.items()):
                return name
        return "Custom"

    # ------------------------------------------------------------------ values
    def params_dict(self) -> dict[str, Any]:
        seed = self.seed_spin.value()
        return {"temperature": round(self.temp_spin.value(), 4), "top_k": self.topk_spin.value(),
                "top_p": round(self.topp_spin.value(), 4), "min_p": round(self.minp_spin.value(), 4),
                "repeat_penalty": round(self.repeat_spin.value(), 4), "seed": None if seed < 0 else seed,
                "max_tokens": self.max_spin.value(), "special": self.special_check.isChecked(),
                "lookup": self.lookup_spin.value()}

    def set_params(self, p: dict[str, Any]) -> None:
        self._applying_preset = True
        try:
            for key, w in (("temperature", self.temp_spin), ("top_p", self.topp_spin), ("min_p", self.minp_spin),
                           ("repeat_penalty", self.repeat_spin)):
                if isinstance(p.get(key), (int, float)):
                    w.setValue(float(p[key]))
            for key, iw in (("top_k", self.topk_spin), ("max_tokens", self.max_spin), ("lookup", self.lookup_spin)):
                if isinstance(p.get(key), int):
                    iw.setValue(int(p[key]))
            seed = p.get("seed")
            self.seed_spin.setValue(int(seed) if isinstance(seed, int) else -1)
            self.special_check.setChecked(p.get("special") is True)
        finally:
            self._applying_preset = False
        self.preset_combo.setCurrentText(self._matching_preset())

    def sampler_params(self) -> SamplerParams:
        d = self.params_dict()
        return SamplerParams(temperature=d["temperature"], top_k=d["top_k"], top_p=d["top_p"], min_p=d["min_p"],
                             repeat_penalty=d["repeat_penalty"], seed=d["seed"], max_tokens=d["max_tokens"],
                             special=d["special"], alternatives=N_ALTERNATIVES)

    @property
    def color_mode(self) -> str:
        return str(self.color_combo.currentData() or "off")

    def set_color_mode(self, mode: str) -> None:
        i = self.color_combo.findData(mode)
        if i >= 0:
            self.color_combo.setCurrentIndex(i)

    # ------------------------------------------------------------------ mode
    @property
    def mode(self) -> str:
        return str(self.mode_combo.currentData() or "chat")

    def set_mode(self, mode: str) -> None:
        i = self.mode_combo.findData(mode)
        if i >= 0:
            self.mode_combo.setCurrentIndex(i)

    @property
    def chat_available(self) -> bool:
        return bool(self.mode_combo.model().item(0).isEnabled())  # type: ignore[attr-defined]

    def set_mode_available(self, chat: bool) -> None:
        item = self.mode_combo.model().item(0)  # type: ignore[attr-defined]
        item.setEnabled(chat)
        item.setToolTip("" if chat else "This model has no chat template: plain completion only")

    def _mode_changed(self, _i: int) -> None:
        self.system_edit.setEnabled(self.mode == "chat")
        self.modeChanged.emit(self.mode)
