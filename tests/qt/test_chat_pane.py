"""Chatting with the demo model on the reference backend: streaming, Stop, Regenerate, Edit-and-resend,
images, and chats that survive a restart."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QImage
from PySide6.QtWidgets import QApplication

from app.chat_records import COMPLETE, STOPPED
from app.chat_store import ChatStore
from app.ui.composer import Composer
from app.ui.markdown_view import MarkdownView, code_blocks


def send_and_wait(qtbot, window, text: str) -> None:
    window.chat.send(text, [])
    qtbot.waitUntil(lambda: window.chat.stream is None, timeout=60_000)


def test_a_message_gets_a_streamed_answer_with_stats(qtbot, window):
    pieces = []
    window.engine.piece.connect(lambda job_id, events: pieces.append(events))
    send_and_wait(qtbot, window, "Hello there")
    user, answer = window.chat.messages
    assert (user.role, user.content) == ("user", "Hello there")
    assert answer.role == "assistant" and answer.status == COMPLETE and answer.content
    assert len(pieces) >= 2  # streamed, not delivered at once
    assert answer.stats["tokens"] == 6 and answer.stats["ttft_seconds"] > 0 and answer.stats["tokens_per_second"] > 0
    widget = window.chat.widgets[-1]
    assert widget.content_view.markdown == answer.content
    assert "6 tokens" in widget.stats_label.text()
    assert "ctx" in window.status_line.text() and "reference" in window.status_line.text()
    assert "gibberish" in window.chat.banner.text()
    stored = window.store.messages(window.chat.conversation_id)
    assert [(m.role, m.content, m.status) for m in stored] == [(m.role, m.content, m.status) for m in window.chat.messages]


def test_stop_ends_the_answer_and_keeps_the_text(qtbot, window):
    window.settings = replace(window.settings, max_tokens=3000)
    window.chat.send("Tell me a long story", [])
    qtbot.waitUntil(lambda: bool(window.chat.stream and window.chat.stream.message.content), timeout=60_000)
    assert window.chat.composer.send_button.text() == "Stop"
    window.chat.composer.send_button.click()
    assert window.chat.stream is None
    answer = window.chat.messages[-1]
    kept = answer.content
    assert answer.status == STOPPED and kept
    assert window.chat.composer.send_button.text() == "Send"
    qtbot.wait(300)  # tokens still in flight must not reach the stopped answer
    assert answer.content == kept
    assert window.store.messages(window.chat.conversation_id)[-1].status == STOPPED
    # the worker is free again: the next message is answered
    window.settings = replace(window.settings, max_tokens=4)
    send_and_wait(qtbot, window, "Shorter please")
    assert window.chat.messages[-1].status == COMPLETE


def test_regenerate_replaces_the_last_answer(qtbot, window):
    window.settings = replace(window.settings, temperature=1.0)
    send_and_wait(qtbot, window, "Pick a word")
    first = window.chat.messages[-1]
    assert window.chat.widgets[-1].regenerate_button.isVisibleTo(window.chat.widgets[-1])
    answers = set()
    for _ in range(3):
        window.chat.widgets[-1].regenerate_button.click()
        qtbot.waitUntil(lambda: window.chat.stream is None, timeout=60_000)
        answers.add(window.chat.messages[-1].content)
    assert len(window.chat.messages) == 2 and window.chat.messages[-1] is not first
    assert len(answers | {first.content}) > 1  # sampled at temperature 1: a new answer, not the stored one
    assert len(window.store.messages(window.chat.conversation_id)) == 2


def test_edit_and_resend_replaces_the_message_and_what_followed(qtbot, window):
    send_and_wait(qtbot, window, "first question")
    send_and_wait(qtbot, window, "second question")
    window.chat.widgets[0].edit_button.click()
    assert window.chat.composer.text.toPlainText() == "first question"
    window.chat.composer.text.setPlainText("edited question")
    window.chat.composer.send_button.click()
    qtbot.waitUntil(lambda: window.chat.stream is None, timeout=60_000)
    assert [m.content for m in window.chat.messages if m.role == "user"] == ["edited question"]
    assert len(window.store.messages(window.chat.conversation_id)) == 2


def _png(tmp_path, name="pic.png"):
    path = tmp_path / name
    image = QImage(40, 30, QImage.Format_RGB32)
    image.fill(Qt.red)
    image.save(str(path))
    return path


def test_dropping_or_pasting_an_image_attaches_it(qtbot, tmp_path):
    composer = Composer()  # a model that takes images: attaching is on
    qtbot.addWidget(composer)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(_png(tmp_path))), QUrl.fromLocalFile(str(tmp_path / "missing.png"))])
    errors = []
    composer.error.connect(errors.append)
    enter = QDragEnterEvent(QPoint(5, 5), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    assert QApplication.sendEvent(composer, enter) and enter.isAccepted()
    QApplication.sendEvent(composer, QDropEvent(QPointF(5, 5), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier))
    assert [a.name for a in composer.attachments] == ["pic.png"] and composer.attachments[0].mime == "image/png"
    assert len(errors) == 1 and "missing.png" in errors[0]
    assert composer.thumbs.count() == 2  # one thumbnail + the stretch
    pasted = QMimeData()
    pasted.setImageData(QImage(str(_png(tmp_path, "b.png"))))
    composer.text.insertFromMimeData(pasted)
    assert len(composer.attachments) == 2
    composer.remove_attachment(1)
    assert len(composer.attachments) == 1
    sent = []
    composer.send_requested.connect(lambda text, atts: sent.append((text, atts)))
    composer.text.setPlainText("what is this?")
    composer.send_button.click()
    assert sent[0][0] == "what is this?" and sent[0][1][0].data.startswith(b"\x89PNG")


def test_a_file_that_is_not_an_image_is_refused(qtbot, tmp_path):
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(bad))])
    composer = Composer()
    qtbot.addWidget(composer)
    errors = []
    composer.error.connect(errors.append)
    composer.add_from_mime(mime)
    assert composer.attachments == [] and "notes.png" in errors[0]


def test_chats_survive_an_app_restart(qtbot, window, tmp_path):
    send_and_wait(qtbot, window, "remember me")
    cid = window.chat.conversation_id
    expected = [(m.role, m.content, m.status) for m in window.chat.messages]
    path = window.store.path
    window.close()
    window.store.close()
    reopened = ChatStore(path)
    try:
        assert [c.id for c in reopened.conversations()] == [cid]
        assert [(m.role, m.content, m.status) for m in reopened.messages(cid)] == expected
    finally:
        reopened.close()


def test_conversation_list_rename_delete_undo_and_search(qtbot, window, monkeypatch):
    send_and_wait(qtbot, window, "about zebras")
    window.conversations.new_chat()
    assert window.chat.conversation_id is None and window.chat.messages == []
    send_and_wait(qtbot, window, "about lions")
    conv = window.conversations
    assert conv.list.count() == 2
    monkeypatch.setattr("app.ui.conversation_list.QInputDialog.getText", lambda *a, **k: ("Big cats", True))
    conv.rename_current()
    assert conv.list.currentItem().text() == "Big cats"
    conv.search.setText("zebra")
    assert [conv.list.item(i).text() for i in range(conv.list.count())] == ["about zebras"]
    conv.search.setText("")
    conv.list.setCurrentRow(0)
    deleted = conv.current_id()
    conv.delete_button.click()
    assert conv.list.count() == 1 and window.undo_button.isVisibleTo(window)
    window.undo_button.click()
    assert conv.list.count() == 2 and conv.current_id() == deleted
    assert window.chat.conversation_id == deleted


def test_the_stats_line_shows_the_mtp_acceptance_when_the_answer_speculated():
    from app.chat_records import Message
    from app.ui.message_widget import stats_text

    answer = Message("assistant", "text", stats={"tokens": 40, "tokens_per_second": 55.0, "draft_acceptance": 0.83})
    assert stats_text(answer) == "40 tokens · 55.0 tok/s · MTP drafts 83% accepted"
    assert "MTP" not in stats_text(Message("assistant", "text", stats={"tokens": 40}))


def test_code_blocks_get_copy_links(qtbot):
    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_markdown("text\n\n```python\nprint(1)\n```\n\nand\n\n```\nls -l\n```\n")
    assert code_blocks(view.markdown) == ["print(1)", "ls -l"]
    assert view.toHtml().count("copy:") == 2
    view.copy_code(1)
    assert QApplication.clipboard().text() == "ls -l"


def _shrink_context_so_only_the_last_turn_fits(window) -> None:
    from app.chat_records import Message

    settings = window.settings
    last = [Message("user", "third question")]
    alone = len(window.engine._prompt(last, settings).token_ids)
    everything = len(window.engine._prompt(window.chat.messages + last, settings).token_ids)
    assert everything > alone + 8
    window.engine.service.context_length = alone + 8


def test_a_full_context_offers_to_drop_the_oldest_turns(qtbot, window):
    send_and_wait(qtbot, window, "first question")
    send_and_wait(qtbot, window, "second question")
    _shrink_context_so_only_the_last_turn_fits(window)
    window.chat.send("third question", [])
    assert window.chat.stream is None and window.chat.context_bar.isVisibleTo(window.chat)
    assert "context holds" in window.chat.context_label.text()
    window.chat.drop_button.click()
    qtbot.waitUntil(lambda: window.chat.stream is None, timeout=60_000)
    assert window.chat.skip == 4 and window.chat.messages[-1].status == COMPLETE
    assert len(window.store.messages(window.chat.conversation_id)) == 6  # nothing was deleted
    assert not window.chat.context_bar.isVisibleTo(window.chat)


def test_a_full_context_can_continue_in_a_new_chat(qtbot, window):
    send_and_wait(qtbot, window, "first question")
    old = window.chat.conversation_id
    _shrink_context_so_only_the_last_turn_fits(window)
    window.chat.send("third question", [])
    window.chat.new_chat_button.click()
    qtbot.waitUntil(lambda: window.chat.stream is None, timeout=60_000)
    assert window.chat.conversation_id != old
    assert [m.content for m in window.chat.messages][0] == "third question"
    assert [m.content for m in window.store.messages(old)] == ["first question", window.store.messages(old)[1].content]


def test_export_and_import_through_the_window(qtbot, window, tmp_path, monkeypatch):
    send_and_wait(qtbot, window, "export me")
    original = [(m.role, m.content.strip()) for m in window.chat.messages]  # Markdown keeps no edge spaces
    for kind in ("json", "md"):
        target = tmp_path / f"chat.{kind}"
        monkeypatch.setattr("app.ui.main_window.QFileDialog.getSaveFileName", lambda *a, **k: (str(target), ""))
        window.export_chat(kind)
        cid = window.import_chat(str(target))
        assert window.chat.conversation_id == cid
        assert [(m.role, m.content.strip()) for m in window.store.messages(cid)] == original
    assert window.conversations.list.count() == 3
