"""The API toggle serves the loaded model (the app's own worker) to an OpenAI client, with a keyring key."""

from __future__ import annotations

import socket

import openai
import pytest

from conftest import free_port

from engine.api_keys import KEYRING_SERVICE, KEYRING_USER, key_from_keyring


def test_toggle_serves_a_request_with_the_stored_key(qtbot, window, memory_keyring):
    panel = window.api
    panel.port.setValue(free_port())
    panel.toggle.setChecked(True)
    assert panel.server is not None, window.message.text()
    key = memory_keyring.values[(KEYRING_SERVICE, KEYRING_USER)]
    assert key_from_keyring() == key and len(key) >= 32  # the key `rigllm serve` would read
    assert panel.key.text() == key and panel.key.echoMode() == panel.key.EchoMode.Password
    panel.copy_key.click()
    from PySide6.QtWidgets import QApplication

    assert QApplication.clipboard().text() == key
    client = openai.OpenAI(base_url=panel.url.text(), api_key=key, max_retries=0, timeout=60)
    reply = client.chat.completions.create(model=window.engine.service.model_id, max_tokens=4,
                                           messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content is not None and reply.usage.completion_tokens <= 4
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=panel.url.text(), api_key="wrong", max_retries=0).models.list()
    panel._refresh_clients()
    assert "127.0.0.1" in panel.clients.text()
    # the chat pane still works while the server shares the worker
    window.chat.send("still here?", [])
    qtbot.waitUntil(lambda: window.chat.stream is None, timeout=60_000)
    assert window.chat.messages[-1].status == "complete"
    url = panel.url.text()
    panel.toggle.setChecked(False)
    assert panel.server is None and panel.url.text() == "off"
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=5).models.list()


def test_new_key_replaces_the_old_one_on_a_running_server(qtbot, window, memory_keyring):
    panel = window.api
    panel.port.setValue(free_port())
    panel.toggle.setChecked(True)
    old = panel.key.text()
    panel.new_key.click()
    new = panel.key.text()
    assert new != old and memory_keyring.values[(KEYRING_SERVICE, KEYRING_USER)] == new
    assert openai.OpenAI(base_url=panel.url.text(), api_key=new, max_retries=0).models.list().data
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=panel.url.text(), api_key=old, max_retries=0).models.list()
    panel.toggle.setChecked(False)


def test_a_port_in_use_is_reported_and_the_toggle_stays_off(qtbot, window, memory_keyring):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        window.api.port.setValue(busy.getsockname()[1])
        window.api.toggle.setChecked(True)
    assert window.api.server is None and not window.api.toggle.isChecked()
    assert "cannot listen" in window.message.text()
