"""What the chat view shows while a user reads and waits (issue 27, findings 5, 6, 7 and 10): line breaks
as written, one-line chat titles, following the stream unless scrolled up, one context count, the
prompt phase with its progress, stats kept for stopped answers, and the edit notice cleared on send."""

from __future__ import annotations

from dataclasses import replace

from app.chat_records import STOPPED, Message
from app.ui.chat_pane import _Stream
from app.ui.message_widget import MessageWidget
from conftest import Recorder
from engine.generation.serving.generation_job import Progress


def send_and_wait(qtbot, window, text: str) -> None:
    window.chat.send(text, [])
    qtbot.waitUntil(lambda: window.chat.stream is None, timeout=60_000)


def shown_lines(widget: MessageWidget) -> list[str]:
    return [line for line in widget.content_view.toPlainText().splitlines() if line]


def test_single_line_breaks_are_kept_in_user_and_assistant_messages(qtbot):
    user = MessageWidget(Message("user", "Line one\nLine two with *stars*"))
    answer = MessageWidget(Message("assistant", "Line one\nLine two\n\n- a\n- b\n\n```\ncode\n```"))
    qtbot.addWidget(user)
    qtbot.addWidget(answer)
    assert shown_lines(user) == ["Line one", "Line two with *stars*"]  # plain text: asterisks as typed
    assert shown_lines(answer)[:2] == ["Line one", "Line two"]
    assert "code" in shown_lines(answer) and "a" in shown_lines(answer)


def test_a_chat_title_is_one_line(qtbot, window):
    send_and_wait(qtbot, window, "First line\nsecond line\n\nthird")
    title = window.store.conversation(window.chat.conversation_id).title
    assert "\n" not in title and title.startswith("First line second line third")
    old = window.store.create_conversation("stored\nwith\nnewlines")  # a title written by an older version
    window.conversations.refresh(select=old)
    texts = [window.conversations.list.item(i).text() for i in range(window.conversations.list.count())]
    assert "stored with newlines" in texts and not any("\n" in t for t in texts)


def _long_chat(window, turns: int = 30) -> int:
    cid = window.store.create_conversation("long")
    for i in range(turns):
        window.store.add_message(cid, Message("user", f"question {i}\n" * 3))
        window.store.add_message(cid, Message("assistant", f"answer {i}\n" * 3))
    return cid


def test_the_view_opens_at_the_latest_message_and_follows_the_stream_unless_scrolled_up(qtbot, window):
    chat = window.chat
    bar = chat.scroll.verticalScrollBar()
    chat.show_conversation(_long_chat(window))
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=5000)
    bar.setValue(0)  # the user scrolls up to read, then sends
    window.settings = replace(window.settings, max_tokens=40)
    chat.send("a new question", [])
    qtbot.waitUntil(lambda: bar.value() == bar.maximum(), timeout=5000)  # what was sent is shown
    bar.setValue(bar.maximum() // 2)  # scrolled up while the answer streams: stay there
    assert not chat.follower.following
    qtbot.waitUntil(lambda: chat.stream is None, timeout=60_000)
    qtbot.wait(100)
    assert bar.value() == bar.maximum() // 2 or bar.value() < bar.maximum()
    assert chat.follower.jump_button.isVisible()
    chat.follower.jump_button.click()
    assert bar.value() == bar.maximum() and not chat.follower.jump_button.isVisible()
    chat.show_conversation(None)
    chat.show_conversation(_long_chat(window, 20))  # switching chats opens at the latest message too
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=5000)


def _status_count(window) -> int:
    text = window.status_line.text()
    return int(text.split("ctx ")[1].split("/")[0])


def test_the_meter_and_the_status_line_show_one_count_and_follow_chat_switches_and_stop(qtbot, window):
    chat = window.chat
    window.settings = replace(window.settings, thinking=True, max_tokens=30)
    send_and_wait(qtbot, window, "count me")
    first = chat.conversation_id
    assert _status_count(window) == chat.context_meter.value() > 0
    chat.show_conversation(None)
    assert _status_count(window) == chat.context_meter.value() == 0
    send_and_wait(qtbot, window, "a longer message for a second chat " * 5)
    second = _status_count(window)
    assert second == chat.context_meter.value()
    chat.show_conversation(first)
    assert _status_count(window) == chat.context_meter.value() != second
    window.settings = replace(window.settings, max_tokens=3000)
    chat.send("and now a long answer", [])
    qtbot.waitUntil(lambda: bool(chat.stream and chat.stream.message.content), timeout=60_000)
    chat.stop()
    assert _status_count(window) == chat.context_meter.value() == window.engine.context_used(chat.messages,
                                                                                             window.settings)


def test_the_prompt_phase_shows_progress_and_the_stats_keep_prompt_speed_and_cards(qtbot, window):
    chat = window.chat
    reports = Recorder(window.engine.progress)
    phases = []
    chat.send("word " * 1500, [])  # several prefill chunks (512 tokens each) on the reference backend
    widget = chat.stream.widget
    original = widget.set_phase
    widget.set_phase = lambda text: (phases.append(text), original(text))
    qtbot.waitUntil(lambda: chat.stream is None, timeout=120_000)
    prefill = [p for (_job, p) in reports.calls if p.generated == 0]
    assert len({p.prompt_done for p in prefill}) >= 3 and prefill[-1].prompt_done == prefill[-1].prompt_tokens
    assert any(t.startswith("processing prompt ") and " / " in t and "tokens/s" in t for t in phases)
    # the generation's own reports arrive too; whether a render tick falls inside the demo's short reply (6
    # tokens, ~40 ms on an idle CPU) is timing, so the generation's phase text is checked on its own below
    assert any(p.generated > 0 for (_job, p) in reports.calls)
    answer = chat.messages[-1]
    assert answer.stats["prompt_tokens_per_second"] > 0 and answer.stats["cards"] == "CPU"
    assert "prompt" in chat.widgets[-1].stats_label.text() and "CPU" in chat.widgets[-1].stats_label.text()


def test_the_phase_text_of_a_prompt_and_of_a_generation():
    stream = _Stream(1, Message("assistant", ""), None)
    assert stream.phase() == "processing the prompt..."
    stream.take(Progress(512, 1400, 200, 0, 0.5))
    assert stream.phase() == "processing prompt 512 / 1400 tokens (200 kept from before) · 624 tokens/s"
    stream.take(Progress(1400, 1400, 200, 1, 2.0))
    stream.take(Progress(1400, 1400, 200, 11, 3.0))
    assert stream.phase() == "generating... 11 tokens"
    assert stream.stopped_stats() == {"tokens": 11, "prompt_tokens_per_second": 624.0, "tokens_per_second": 10.0}


def test_a_stopped_answer_keeps_its_speed(qtbot, window):
    chat = window.chat
    window.settings = replace(window.settings, max_tokens=3000)
    chat.send("Tell me a long story", [])
    qtbot.waitUntil(lambda: bool(chat.stream and chat.stream.progress and chat.stream.progress.generated >= 5),
                    timeout=60_000)
    chat.stop()
    answer = chat.messages[-1]
    assert answer.status == STOPPED
    assert answer.stats["tokens"] >= 5 and answer.stats["tokens_per_second"] > 0
    assert "tok/s" in chat.widgets[-1].stats_label.text()
    assert window.store.messages(chat.conversation_id)[-1].stats["tokens_per_second"] > 0


def test_the_editing_notice_goes_away_once_the_edit_is_sent(qtbot, window):
    chat = window.chat
    send_and_wait(qtbot, window, "first question")
    chat.widgets[0].edit_button.click()
    assert chat.edit_bar.isVisibleTo(chat) and "Editing a message" in chat.edit_label.text()
    chat.composer.text.setPlainText("first question, edited")
    chat.composer.send_button.click()
    assert not chat.edit_bar.isVisibleTo(chat)
    assert "Editing" not in window.message.text()
    qtbot.waitUntil(lambda: chat.stream is None, timeout=60_000)
