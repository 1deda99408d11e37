"""What the loaded model can take, said before it is tried (issue 27, finding 1): capability chips, attaching
off for a text-only model with the reason, an image never stored for a model that cannot take it and
a chat that holds one never locked; and raw prompt mode for a file without a chat template."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QMimeData, QUrl
from PySide6.QtGui import QImage, Qt

from app.chat_records import COMPLETE, Attachment, Message
from app.chat_engine import ModelInfo
from app.ui.capability_chips import chips_of
from conftest import Recorder

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "fixture-q8_0.gguf"


def _png(tmp_path) -> Path:
    path = tmp_path / "pic.png"
    image = QImage(40, 30, QImage.Format_RGB32)
    image.fill(Qt.red)
    image.save(str(path))
    return path


def test_the_header_chips_say_what_the_demo_model_takes(window):
    chips = window.chat.chips.chips
    assert chips["vision"].text() == "no vision" and "takes no images" in chips["vision"].toolTip()
    assert chips["kv"].text() == "KV f16" and chips["cards"].text() == "CPU" and chips["backend"].text() == "reference"
    assert chips["mtp"].text() == "no MTP"  # the demo model has no MTP head


def test_chip_texts_for_a_vision_model_split_over_cards():
    info = ModelInfo("m", "", "cuda", 4096, "k8v3", (0, 1), vision=True, mtp=True)
    texts = {name: text for name, text, _tip in chips_of(info)}
    assert texts == {"vision": "vision", "mtp": "MTP", "kv": "KV k8v3", "cards": "cards 0, 1", "backend": "cuda"}
    assert "speculative decoding" in dict((n, t) for n, _x, t in chips_of(info))["mtp"]  # split models speculate too


def test_attaching_is_off_for_a_text_only_model_and_says_why(qtbot, window, tmp_path):
    composer = window.chat.composer
    assert not composer.attach_button.isEnabled() and "takes no images" in composer.attach_button.toolTip()
    errors = Recorder(composer.error)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(_png(tmp_path)))])
    composer.add_from_mime(mime)  # a drop or a paste is refused the same way
    assert composer.attachments == [] and "takes no images" in errors.calls[0][0]


def test_an_image_for_a_text_only_model_is_refused_before_it_is_stored(qtbot, window, tmp_path):
    notices = Recorder(window.chat.notice)
    image = Attachment("pic.png", "image/png", _png(tmp_path).read_bytes())
    window.chat.send("what is this?", [image])
    assert any("takes no images" in args[0] for args in notices.calls)
    assert window.chat.conversation_id is None and window.chat.messages == []  # nothing stored, nothing locked


def test_a_chat_holding_an_image_still_answers_on_a_text_only_model(qtbot, window, tmp_path):
    cid = window.store.create_conversation("old")
    image = Attachment("pic.png", "image/png", _png(tmp_path).read_bytes())
    window.store.add_message(cid, Message("user", "look", attachments=[image]))  # e.g. sent to a vision model
    window.store.add_message(cid, Message("assistant", "a red square"))
    window.chat.show_conversation(cid)
    window.chat.send("and now?", [])
    qtbot.waitUntil(lambda: window.chat.stream is None, timeout=60_000)
    assert window.chat.messages[-1].role == "assistant" and window.chat.messages[-1].status == COMPLETE


def test_a_file_without_a_chat_template_opens_in_raw_prompt_mode_and_continues_the_text(qtbot, bare_window):
    win = bare_window
    win.start_default_model(FIXTURE)
    qtbot.waitUntil(lambda: win.engine is not None, timeout=120_000)
    assert not win.engine.info.chat_template and win.settings.raw_prompt and win.chat.raw_prompt.isChecked()
    assert win.chat.chips.chips["mtp"].text() == "MTP"  # the fixture has an MTP head and runs on the CPU
    win.settings = replace(win.settings, max_tokens=3, temperature=0.0, speculative=False)
    win.chat.composer.text.setPlainText("\n12+30=")
    win.chat.composer.send_button.click()
    qtbot.waitUntil(lambda: win.chat.stream is None, timeout=60_000)
    user, answer = win.chat.messages
    assert user.content == "\n12+30="  # sent as typed: raw mode keeps the leading newline
    assert answer.content.startswith("42")  # the trained fixture adds, given its own prompt format
    win.chat.raw_prompt.setChecked(False)
    assert not win.settings.raw_prompt and not win.chat.composer.keep_whitespace
