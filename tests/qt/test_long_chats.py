"""Long chats in the app: the context fill meter and its warning, continuing in a new chat from the
model's own summary, and restoring a saved conversation state after a restart (demo model, reference)."""

from __future__ import annotations

from app.chat_records import COMPLETE, Message
from app.ui.chat_pane import SUMMARY_PREFIX, SUMMARY_REQUEST
from engine.generation.snapshot_store import SUFFIX, default_root


def send_and_wait(qtbot, window, text: str) -> None:
    window.chat.send(text, [])
    qtbot.waitUntil(lambda: window.chat.stream is None, timeout=60_000)


def test_the_meter_shows_the_fill_and_warns_before_the_context_is_full(qtbot, window):
    send_and_wait(qtbot, window, "How full is the context?")
    chat = window.chat
    used = window.engine.context_used(chat.messages, window.settings)
    assert chat.context_meter.isVisibleTo(chat) and chat.context_meter.value() == used
    assert chat.context_meter.maximum() == window.engine.service.context_length
    assert not chat.context_warning.isVisibleTo(chat)  # the demo model's context is far from full

    window.engine.service.context_length = int(used / 0.85)
    chat.update_context_meter()
    assert chat.context_warning.isVisibleTo(chat) and "% full" in chat.context_warning.text()
    window.engine.service.context_length = used
    chat.update_context_meter()
    assert "context is full" in chat.context_warning.text() and chat.context_meter.value() == used


def test_a_full_chat_continues_in_a_new_chat_from_the_models_summary(qtbot, window):
    send_and_wait(qtbot, window, "first question about the rig and its many cards " * 8)
    send_and_wait(qtbot, window, "second question")
    old = window.chat.conversation_id
    engine, settings = window.engine, window.settings
    summary_prompt = window.chat.messages[2:] + [Message("user", SUMMARY_REQUEST)]
    context = window.engine.context_used(summary_prompt, settings) + 40
    assert engine.context_used(window.chat.messages + [Message("user", "third question")], settings) > context
    engine.service.context_length = context
    asked = []
    submit = engine.submit
    engine.submit = lambda history, s: (submit(history, s), asked.append(history))[0]  # the accepted requests

    window.chat.send("third question", [])
    assert window.chat.context_bar.isVisibleTo(window.chat) and window.chat.stream is None
    window.chat.summary_button.click()
    assert window.chat.summary is not None  # the model is writing the summary
    qtbot.waitUntil(lambda: window.chat.summary is None and window.chat.stream is None
                    and window.chat.conversation_id != old, timeout=60_000)

    assert asked[0][-1].content == SUMMARY_REQUEST and asked[0][0].content == "second question"  # the oldest turn did not fit
    system, user, answer = window.chat.messages
    assert system.role == "system" and system.content.startswith(SUMMARY_PREFIX)
    assert len(system.content) > len(SUMMARY_PREFIX)  # the model's answer, gibberish on the demo model
    assert (user.content, answer.status) == ("third question", COMPLETE)
    assert asked[1][0] is system  # the new chat's prompt starts from the summary
    stored = window.store.messages(window.chat.conversation_id)
    assert [m.role for m in stored] == ["system", "user", "assistant"]
    assert len(window.store.messages(old)) == 4  # the old chat keeps its turns, without the moved message


def test_turn_states_are_saved_beside_the_chats(qtbot, window):
    """The app's worker has the disk tier on: a finished turn leaves its state in the data folder."""
    send_and_wait(qtbot, window, "Remember this chat")
    send_and_wait(qtbot, window, "and this turn")
    cache = window.engine.worker._scheduler.cache
    cache.flush()
    assert list(default_root().glob(f"*/*{SUFFIX}"))
