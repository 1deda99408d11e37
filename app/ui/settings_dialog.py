"""Settings: sampling, max tokens, system-prompt presets, thinking, theme and the API port.

Built-in presets are shown read-only (a new preset starts from the one shown, to edit a copy);
the user's own can be edited and deleted; "Reset to default" goes back to the default built-in."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout,
                               QHBoxLayout, QInputDialog, QLabel, QPlainTextEdit, QPushButton, QSpinBox,
                               QVBoxLayout, QWidget)

from engine.errors import RigllmError

from app.settings import DEFAULT_PRESET, DEFAULT_PRESETS, THEMES, AppSettings
from app.theme import set_style


def _double(low: float, high: float, step: float, decimals: int = 2) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    return box


class SettingsDialog(QDialog):
    def __init__(self, settings: AppSettings, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self._presets = dict(settings.presets)
        form = QFormLayout()
        self.temperature = _double(0, 2, 0.05)
        self.top_p = _double(0.01, 1, 0.05)
        self.top_k = QSpinBox(maximum=1000)
        self.min_p = _double(0, 1, 0.01)
        self.repetition_penalty = _double(0.5, 2, 0.05)
        self.presence_penalty = _double(-2, 2, 0.1)
        self.frequency_penalty = _double(-2, 2, 0.1)
        self.max_tokens = QSpinBox(minimum=1, maximum=262144)
        self.thinking = QCheckBox("Let the model think before answering")
        self.speculative = QCheckBox("Speculative decoding with the model's MTP head (same output; faster on GPU)")
        self.theme = QComboBox()
        self.theme.addItems(THEMES)
        self.api_port = QSpinBox(minimum=1, maximum=65535)
        self.preset = QComboBox()
        self.preset.currentTextChanged.connect(self._show_preset)
        self.preset_text = QPlainTextEdit()
        self.preset_text.setMaximumHeight(80)
        self.preset_text.textChanged.connect(self._store_preset)
        add = QPushButton("New preset...")
        add.setToolTip("A preset of your own, starting from the text shown")
        add.clicked.connect(self._add_preset)
        self.delete_preset = QPushButton("Delete")
        self.delete_preset.clicked.connect(self._delete_preset)
        self.reset_preset = QPushButton("Reset to default")
        self.reset_preset.setToolTip(f"Use the built-in '{DEFAULT_PRESET}' system prompt")
        self.reset_preset.clicked.connect(lambda: self.preset.setCurrentText(DEFAULT_PRESET))
        self.preset_note = QLabel()
        set_style(self.preset_note, "muted")
        presets = QHBoxLayout()
        presets.addWidget(self.preset, 1)
        presets.addWidget(add)
        presets.addWidget(self.delete_preset)
        presets.addWidget(self.reset_preset)
        for label, widget in (("Temperature", self.temperature), ("Top-p", self.top_p), ("Top-k (0 = off)", self.top_k),
                              ("Min-p", self.min_p), ("Repetition penalty", self.repetition_penalty),
                              ("Presence penalty", self.presence_penalty),
                              ("Frequency penalty", self.frequency_penalty), ("Max tokens", self.max_tokens),
                              ("Thinking", self.thinking), ("Speculation", self.speculative), ("System prompt", presets), ("", self.preset_text), ("", self.preset_note),
                              ("Theme", self.theme), ("API server port", self.api_port)):
            form.addRow(label, widget)
        self.error = QLabel()
        set_style(self.error, "error")
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.show_settings(settings)

    def show_settings(self, s: AppSettings) -> None:
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty", "max_tokens", "api_port"):
            getattr(self, name).setValue(getattr(s, name))
        self.thinking.setChecked(s.thinking)
        self.speculative.setChecked(s.speculative)
        self.theme.setCurrentText(s.theme)
        self.preset.blockSignals(True)
        self.preset.clear()
        self.preset.addItems(list(DEFAULT_PRESETS) + list(self._presets))
        self.preset.blockSignals(False)
        self.preset.setCurrentText(s.system_preset)
        self._show_preset(self.preset.currentText())

    def _show_preset(self, name: str) -> None:
        built_in = name in DEFAULT_PRESETS
        self.preset_text.blockSignals(True)
        self.preset_text.setPlainText(DEFAULT_PRESETS[name] if built_in else self._presets.get(name, ""))
        self.preset_text.blockSignals(False)
        self.preset_text.setReadOnly(built_in)
        self.delete_preset.setEnabled(not built_in)
        self.preset_note.setText("built-in preset, read-only: 'New preset...' makes a copy to edit" if built_in else "")

    def _store_preset(self) -> None:
        name = self.preset.currentText()
        if name and name not in DEFAULT_PRESETS:
            self._presets[name] = self.preset_text.toPlainText()

    def _add_preset(self) -> None:
        name, ok = QInputDialog.getText(self, "New system prompt preset", "Name:")
        name = name.strip()
        if not ok or not name:
            return
        if name in DEFAULT_PRESETS or name in self._presets:
            self.error.setText(f"a preset named '{name}' exists already")
            return
        self._presets[name] = self.preset_text.toPlainText()
        self.preset.addItem(name)
        self.preset.setCurrentText(name)

    def _delete_preset(self) -> None:
        name = self.preset.currentText()
        if name in self._presets:
            del self._presets[name]
            self.preset.removeItem(self.preset.currentIndex())
            self.preset.setCurrentText(DEFAULT_PRESET)

    def result_settings(self, base: AppSettings) -> AppSettings:
        return replace(base, temperature=self.temperature.value(), top_p=self.top_p.value(), top_k=self.top_k.value(),
                       min_p=self.min_p.value(), repetition_penalty=self.repetition_penalty.value(),
                       presence_penalty=self.presence_penalty.value(),
                       frequency_penalty=self.frequency_penalty.value(), max_tokens=self.max_tokens.value(),
                       thinking=self.thinking.isChecked(), speculative=self.speculative.isChecked(), system_preset=self.preset.currentText(),
                       presets=dict(self._presets), theme=self.theme.currentText(), api_port=self.api_port.value())

    def accept(self) -> None:
        try:
            self.result_settings(AppSettings()).validate()
        except RigllmError as err:
            self.error.setText(str(err))
            return
        super().accept()
