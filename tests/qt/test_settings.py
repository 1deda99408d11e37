"""Settings: persistence across restarts, the version migration, bad stored values, the dialog, themes."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

from app import settings as settings_io
from app.chat_engine import prompt_messages
from app.settings import SETTINGS_VERSION, AppSettings
from app.theme import apply_theme
from app.ui.settings_dialog import SettingsDialog


def reopen(qsettings: QSettings) -> QSettings:
    return QSettings(qsettings.fileName(), QSettings.IniFormat)


def test_settings_survive_a_restart(qsettings):
    changed = replace(AppSettings(), temperature=0.3, top_k=7, max_tokens=99, thinking=False, theme="dark",
                      presets={"Pirate": "Talk like a pirate."}, system_preset="Pirate", api_port=9000)
    settings_io.save(qsettings, changed)
    again = reopen(qsettings)
    assert settings_io.load(again) == changed
    assert int(again.value("version")) == SETTINGS_VERSION
    assert settings_io.load(again).system_prompt == "Talk like a pirate."


def test_version_1_system_prompt_becomes_a_preset(qsettings):
    qsettings.setValue("version", 1)
    qsettings.setValue("system_prompt", "Old prompt")
    qsettings.setValue("temperature", 0.4)
    qsettings.sync()
    loaded = settings_io.load(reopen(qsettings))
    assert loaded.system_preset == "Custom" and loaded.system_prompt == "Old prompt" and loaded.temperature == 0.4
    assert not reopen(qsettings).contains("system_prompt")


def test_bad_stored_values_fall_back_to_defaults(qsettings):
    qsettings.setValue("top_k", "many")
    assert settings_io.load(qsettings).top_k == AppSettings().top_k
    qsettings.setValue("top_k", 5)
    qsettings.setValue("top_p", 7.0)  # out of range: the whole set is invalid, defaults are safer
    assert settings_io.load(qsettings) == AppSettings()


def test_dialog_edits_every_field_and_the_window_persists_them(qtbot, window, monkeypatch):
    dialog = window.open_settings()
    dialog.temperature.setValue(1.2)
    dialog.top_p.setValue(0.5)
    dialog.top_k.setValue(3)
    dialog.min_p.setValue(0.05)
    dialog.repetition_penalty.setValue(1.1)
    dialog.presence_penalty.setValue(0.5)
    dialog.frequency_penalty.setValue(-0.5)
    dialog.max_tokens.setValue(77)
    dialog.thinking.setChecked(True)
    dialog.theme.setCurrentText("dark")
    dialog.api_port.setValue(8999)
    monkeypatch.setattr("app.ui.settings_dialog.QInputDialog.getText", lambda *a, **k: ("Terse", True))
    dialog._add_preset()
    dialog.preset_text.setPlainText("One line answers.")
    dialog.accept()
    s = window.settings
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.repetition_penalty, s.presence_penalty, s.frequency_penalty,
            s.max_tokens, s.thinking, s.theme, s.api_port) == (1.2, 0.5, 3, 0.05, 1.1, 0.5, -0.5, 77, True, "dark", 8999)
    assert s.system_preset == "Terse" and s.system_prompt == "One line answers."
    assert settings_io.load(reopen(window.qsettings)) == s
    assert QApplication.instance().palette().window().color().name() == "#2b2b2b"
    apply_theme(QApplication.instance(), "system")


def test_dialog_refuses_invalid_sampling(qtbot):
    dialog = SettingsDialog(AppSettings())
    qtbot.addWidget(dialog)
    dialog.top_p.setMinimum(0)
    dialog.top_p.setValue(0)
    dialog.accept()
    assert "top_p" in dialog.error.text() and dialog.result() == 0


def test_the_system_prompt_reaches_the_model(qtbot, window):
    window.settings = replace(window.settings, presets={"Test": "You are a test."}, system_preset="Test")
    messages = prompt_messages([], window.settings)
    assert messages == [{"role": "system", "content": "You are a test."}]
