"""System-prompt presets (issue 27, finding 9): built-ins are read-only and cannot be overwritten by
clearing the text box, user presets are stored apart from them, "Reset to default" returns to the
default built-in, and a version-2 settings file whose built-in was blanked gets it back."""

from __future__ import annotations

from PySide6.QtCore import QSettings

from app import settings as settings_io
from app.settings import DEFAULT_PRESET, DEFAULT_PRESETS, AppSettings
from app.ui.settings_dialog import SettingsDialog


def test_clearing_the_box_of_a_built_in_preset_changes_nothing(qtbot):
    dialog = SettingsDialog(AppSettings())
    qtbot.addWidget(dialog)
    assert dialog.preset.currentText() == DEFAULT_PRESET and dialog.preset_text.isReadOnly()
    assert "read-only" in dialog.preset_note.text() and not dialog.delete_preset.isEnabled()
    dialog.preset_text.setPlainText("")  # what a user clearing the box does (programmatically: read-only is a UI lock)
    result = dialog.result_settings(AppSettings())
    assert result.system_prompt == DEFAULT_PRESETS[DEFAULT_PRESET] and result.presets == {}


def test_user_presets_are_saved_apart_from_the_built_ins_and_reset_goes_back(qtbot, monkeypatch, qsettings):
    dialog = SettingsDialog(AppSettings())
    qtbot.addWidget(dialog)
    monkeypatch.setattr("app.ui.settings_dialog.QInputDialog.getText", lambda *a, **k: ("Mine", True))
    dialog._add_preset()
    assert not dialog.preset_text.isReadOnly() and dialog.preset_text.toPlainText() == DEFAULT_PRESETS[DEFAULT_PRESET]
    dialog.preset_text.setPlainText("")  # a user preset may be empty
    result = dialog.result_settings(AppSettings())
    assert result.system_preset == "Mine" and result.system_prompt == "" and result.presets == {"Mine": ""}
    settings_io.save(qsettings, result)
    assert qsettings.value("user_presets") == {"Mine": ""} and not qsettings.contains("presets")
    dialog.reset_preset.click()
    assert dialog.result_settings(AppSettings()).system_preset == DEFAULT_PRESET
    dialog.preset.setCurrentText("Mine")
    dialog.delete_preset.click()
    assert dialog.result_settings(AppSettings()).presets == {}


def test_a_built_in_blanked_by_version_2_comes_back(tmp_path):
    store = QSettings(str(tmp_path / "old.ini"), QSettings.IniFormat)
    store.setValue("version", 2)
    store.setValue("presets", {"Helpful assistant": "", "Concise": "Two words.", "Pirate": "Arr."})
    store.setValue("system_preset", "Concise")
    loaded = settings_io.load(store)
    assert loaded.presets == {"Concise (edited)": "Two words.", "Pirate": "Arr."}
    assert loaded.system_preset == "Concise (edited)" and loaded.system_prompt == "Two words."
    assert AppSettings(system_preset="Helpful assistant", presets=loaded.presets).system_prompt == \
        DEFAULT_PRESETS["Helpful assistant"]
