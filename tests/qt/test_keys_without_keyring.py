"""Keys on an install with no usable OS keyring (keyring's fail backend, or only keyrings.alt's files):
the API toggle serves with a session key, a file store only after the user ticks it (mode 0600), and
Connect to rig's Remember starts unticked and never stops a connection."""

from __future__ import annotations

import stat

import keyring
import openai
import pytest
from jaraco.classes import properties
from keyring.backends import fail

from conftest import MemoryKeyring, free_port

from engine.api_keys import key_from_file

from app.key_store import keys_dir, secure_keyring


@pytest.fixture
def keys(tmp_path, monkeypatch):
    """A fresh per-user data folder, so each test starts with no key files."""
    monkeypatch.setenv("RIGLLM_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data" / "keys"


@pytest.fixture
def no_keyring(keys):
    old = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield keys
    keyring.set_keyring(old)


class BrokenKeyring(MemoryKeyring):
    """A backend that looks usable but cannot store (a Secret Service that refuses the write)."""

    @properties.classproperty
    def priority(cls):  # not viable, so keyring's discovery never picks it for other tests
        raise RuntimeError("set only by the test that uses it")

    def set_password(self, service, username, password):
        raise keyring.errors.PasswordSetError("the collection is locked")


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def models(url: str, key: str):
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60).models.list().data


def test_plaintext_and_fail_backends_are_no_keyring(no_keyring):
    assert secure_keyring()[0] is None and "keyring.backends.fail" in secure_keyring()[1]
    plaintext = pytest.importorskip("keyrings.alt.file").PlaintextKeyring()
    keyring.set_keyring(plaintext)
    backend, why = secure_keyring()
    assert backend is None and "PlaintextKeyring" in why


def test_without_a_keyring_the_toggle_serves_with_a_session_key(qtbot, no_keyring, window):
    panel = window.api
    assert panel.key_file.isVisibleTo(panel) and not panel.key_file.isChecked()
    panel.port.setValue(free_port())
    panel.toggle.setChecked(True)
    assert panel.server is not None, window.message.text()
    key = panel.key.text()
    assert len(key) >= 32 and models(panel.url.text(), key)
    assert "For this session only, stored nowhere" in panel.key_place.text()
    assert not no_keyring.exists()  # nothing written anywhere
    panel.new_key.click()
    assert panel.key.text() != key and models(panel.url.text(), panel.key.text())
    assert not no_keyring.exists()
    panel.toggle.setChecked(False)


def test_the_file_store_is_opt_in_private_and_used_next_session(qtbot, no_keyring, window):
    panel = window.api
    panel.port.setValue(free_port())
    panel.toggle.setChecked(True)
    key = panel.key.text()
    panel.key_file.setChecked(True)
    path = no_keyring / "api-key"
    assert mode(path) == 0o600 and mode(no_keyring) == 0o700
    assert key_from_file(str(path)) == key  # what `rigllm serve --api-key-file` reads
    assert str(path) in panel.key_place.text() and "readable only by you" in panel.key_place.text()
    assert models(panel.url.text(), key)  # the running server kept its key
    panel.new_key.click()
    assert key_from_file(str(path)) == panel.key.text() != key
    panel.toggle.setChecked(False)

    from app.ui.api_panel import ApiPanel

    later = ApiPanel(free_port())  # the next session finds the file it was told to keep
    qtbot.addWidget(later)
    assert later.key_file.isChecked() and later.api_key.current() == panel.key.text()
    later.key_file.setChecked(False)
    assert not path.exists() and "session only" in later.key_place.text()


def test_a_key_file_others_can_read_is_refused(qtbot, no_keyring, window):
    no_keyring.mkdir(parents=True)
    path = no_keyring / "api-key"
    path.write_text("shared-key\n")
    path.chmod(0o644)
    panel = window.api
    panel.port.setValue(free_port())
    panel.toggle.setChecked(True)
    assert panel.server is None and not panel.toggle.isChecked()
    assert "chmod 600" in window.message.text()


def test_with_a_keyring_the_file_box_is_hidden_and_the_key_goes_to_the_keyring(qtbot, keys, memory_keyring,
                                                                               window):
    panel = window.api
    panel._show_key_place()
    assert not panel.key_file.isVisibleTo(panel) and "system keyring" in panel.key_place.text()
    panel.port.setValue(free_port())
    panel.toggle.setChecked(True)
    assert memory_keyring.values[("rigllm", "api-key")] == panel.key.text() and not keys.exists()
    panel.toggle.setChecked(False)


def test_remember_starts_unticked_without_a_keyring_and_connects_either_way(qtbot, no_keyring):
    from app.ui.connect_dialog import ConnectDialog

    dialog = ConnectDialog("rig.local", 8123)
    qtbot.addWidget(dialog)
    assert not dialog.remember.isChecked() and "file only you can read" in dialog.remember.text()
    dialog.key.setText("typed-key")
    with qtbot.waitSignal(dialog.accepted, timeout=1000):
        dialog.accept()
    assert not no_keyring.exists()  # unticked: kept nowhere
    dialog = ConnectDialog("rig.local", 8123)
    qtbot.addWidget(dialog)
    dialog.key.setText("typed-key")
    dialog.remember.setChecked(True)
    dialog.accept()
    path = no_keyring / "rig-key_rig.local_8123"
    assert dialog.result() == dialog.DialogCode.Accepted and mode(path) == 0o600
    again = ConnectDialog("rig.local", 8123)
    qtbot.addWidget(again)
    assert again.key.text() == "typed-key" and again.remember.isChecked()


def test_remember_starts_ticked_with_a_keyring_and_a_failed_store_does_not_block(qtbot, keys):
    from app.ui.connect_dialog import ConnectDialog

    old = keyring.get_keyring()
    keyring.set_keyring(BrokenKeyring())
    try:
        dialog = ConnectDialog("rig.local", 8123)
        qtbot.addWidget(dialog)
        assert dialog.remember.isChecked() and "system keyring" in dialog.remember.text()
        dialog.key.setText("typed-key")
        with qtbot.waitSignal(dialog.notice, timeout=1000) as notice:
            dialog.accept()
    finally:
        keyring.set_keyring(old)
    assert dialog.result() == dialog.DialogCode.Accepted
    assert "without remembering the key" in notice.args[0] and "locked" in notice.args[0]
    assert not keys.exists()  # a keyring that fails never falls back to a file on its own


def test_the_status_bar_shows_a_long_reason_whole(qtbot, bare_window):
    reason = ("the system keyring is not usable here (keyring found only keyring.backends.fail.Keyring); "
              "the key is kept for this session only: tick 'Keep the key in a file only you can read' to keep it "
              "in " + "/very/long/path" * 6)
    bare_window.resize(700, 500)
    bare_window.notify(reason)
    label = bare_window.message
    qtbot.waitUntil(lambda: label.height() >= label.heightForWidth(label.width()), timeout=2000)
    assert label.text() == reason and label.wordWrap()
    assert label.heightForWidth(label.width()) > label.fontMetrics().height()  # it did wrap onto more lines
    assert label.geometry().right() <= bare_window.statusBar().width()
