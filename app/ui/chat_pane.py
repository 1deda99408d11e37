"""The chat pane: the conversation's messages, the composer, and the streaming of an answer.

An answer is stored the moment it starts (status `streaming`) and re-saved as it grows (at most
every `SAVE_INTERVAL` seconds), so a crash keeps what was generated. Rendering is throttled to one
repaint per `RENDER_INTERVAL_MS`: re-rendering markdown on every token would starve the GUI.

A meter under the conversation shows how much of the context its prompt takes, with a warning from
`WARN_FRACTION` on; a conversation that no longer fits is never cut silently: the bar offers to drop
the oldest turns, to continue in a new chat with the last message, or to continue in a new chat that
starts from the model's own summary of this one (a real generation request).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QHBoxLayout, QLabel, QProgressBar, QPushButton, QScrollArea, QVBoxLayout,
                               QWidget)

from engine.errors import RigllmError
from engine.generation.output_parser import ContentDelta, ReasoningDelta, ToolCall
from engine.generation.serving.generation_job import Finished, Progress
from engine.generation.serving.worker import Unavailable

from app.chat_engine import ChatEngine, ImageInputError
from app.chat_records import COMPLETE, FAILED, STOPPED, STREAMING, Attachment, Message
from app.chat_store import ChatStore
from app.remote_engine import RemoteChatEngine
from app.settings import AppSettings
from app.theme import set_style
from app.ui.capability_chips import CapabilityChips
from app.ui.composer import Composer
from app.ui.follow_scroll import FollowScroll
from app.ui.message_widget import MessageWidget

SAVE_INTERVAL = 0.5
RENDER_INTERVAL_MS = 60
TITLE_LENGTH = 48
WARN_FRACTION = 0.8  # the meter warns once the prompt takes this much of the context
SUMMARY_REQUEST = "Summarize the conversation so far in a few sentences."
SUMMARY_TOKENS = 256
SUMMARY_PREFIX = "Summary of an earlier conversation, which this chat continues:\n\n"


def chat_title(text: str) -> str:
    """A chat's title from its first message: one line (its whitespace collapsed), at most TITLE_LENGTH."""
    return " ".join(text.split())[:TITLE_LENGTH] or "Images"


class _Stream:
    """The answer being generated and its timing."""

    def __init__(self, job_id: int, message: Message, widget: MessageWidget):
        self.job_id = job_id
        self.message = message
        self.widget = widget
        self.submitted = time.perf_counter()
        self.first_piece: float | None = None
        self.reasoning_started: float | None = None
        self.saved = 0.0
        self.progress: Progress | None = None  # the engine's last report (local engines)
        self.first_token_seconds: float | None = None  # Progress.seconds when the first token was reported
        self.prompt_rate: float | None = None  # prompt tokens/s the prefill ran at (tokens not from a kept state)

    def take(self, p: Progress) -> None:
        """Keep a Progress report and what it says about the prompt phase."""
        self.progress = p
        if p.generated and self.first_token_seconds is None:
            self.first_token_seconds = p.seconds
        prefilled = p.prompt_done - p.cached_tokens
        if prefilled > 0 and p.seconds > 0 and self.first_token_seconds is None:
            self.prompt_rate = prefilled / p.seconds

    def phase(self) -> str:
        """"processing prompt N / M tokens" while the prompt is prefilled, then the generation's count."""
        p = self.progress
        if p is None:
            return "processing the prompt..." if self.first_piece is None else "generating..."
        if not p.generated:
            rate = f" · {self.prompt_rate:.0f} tokens/s" if self.prompt_rate else ""
            kept = f" ({p.cached_tokens} kept from before)" if p.cached_tokens else ""
            return f"processing prompt {p.prompt_done} / {p.prompt_tokens} tokens{kept}{rate}"
        return f"generating... {p.generated} tokens"

    def stopped_stats(self) -> dict[str, float]:
        """The speed stats an answer stopped before its `Finished` still has (from the engine's reports)."""
        p, stats = self.progress, {}
        if p is None or not p.generated:
            return stats
        stats["tokens"] = p.generated
        if self.prompt_rate:
            stats["prompt_tokens_per_second"] = self.prompt_rate
        decode = p.seconds - (self.first_token_seconds or p.seconds)
        if p.generated > 1 and decode > 0:
            stats["tokens_per_second"] = (p.generated - 1) / decode
        return stats


class _Summary:
    """The summary being generated for "continue in a new chat with a summary"."""

    def __init__(self, job_id: int):
        self.job_id = job_id
        self.text = ""


class ChatPane(QWidget):
    conversations_changed = Signal()
    answer_speed = Signal(float)  # tokens/s of the last finished answer (for the rig monitor)
    notice = Signal(str)  # one-line messages for the status bar
    context_changed = Signal(int, int)  # tokens this chat's prompt takes, the context (-1 used: not known)
    raw_prompt_toggled = Signal(bool)

    def __init__(self, store: ChatStore, settings: Callable[[], AppSettings], parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self._settings = settings
        self.engine: ChatEngine | RemoteChatEngine | None = None
        self.conversation_id: int | None = None
        self.messages: list[Message] = []
        self.widgets: list[MessageWidget] = []
        self.stream: _Stream | None = None
        self.skip = 0
        self._editing: Message | None = None
        self.summary: _Summary | None = None
        self.context_used = -1  # the one context count the meter and the status line show
        self._remote_used = -1  # a rig's engine counts no tokens here: its last answer's usage

        layout = QVBoxLayout(self)
        header = QHBoxLayout()
        self.chips = CapabilityChips()
        self.raw_prompt = QCheckBox("Raw prompt")
        self.raw_prompt.setToolTip("No chat template: the conversation's text goes to the model as written, and the "
                                   "answer continues it (for base models and the trained fixtures)")
        self.raw_prompt.toggled.connect(self.raw_prompt_toggled.emit)
        header.addWidget(self.chips, 1)
        header.addWidget(self.raw_prompt)
        layout.addLayout(header)
        self.banner = QLabel()
        self.banner.setWordWrap(True)
        set_style(self.banner, "banner", "padding: 4px;")
        layout.addWidget(self.banner)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.container = QWidget()
        self.column = QVBoxLayout(self.container)
        self.column.addStretch(1)
        self.scroll.setWidget(self.container)
        self.follower = FollowScroll(self.scroll)
        layout.addWidget(self.scroll, 1)
        meter_row = QWidget()
        meter = QHBoxLayout(meter_row)
        meter.setContentsMargins(0, 0, 0, 0)
        self.context_meter = QProgressBar()
        self.context_meter.setFormat("context: %v of %m tokens (%p%)")
        self.context_meter.setToolTip("How much of the model's context this chat's prompt takes")
        self.context_warning = QLabel()
        set_style(self.context_warning, "warning")
        self.context_warning.setWordWrap(True)
        meter.addWidget(self.context_meter, 1)
        meter.addWidget(self.context_warning, 2)
        layout.addWidget(meter_row)
        self.context_bar = QWidget()
        bar = QHBoxLayout(self.context_bar)
        self.context_label = QLabel()
        self.context_label.setWordWrap(True)
        self.drop_button = QPushButton("Drop oldest turns")
        self.drop_button.setToolTip("Leave the oldest messages out of the prompt; they stay in this chat")
        self.drop_button.clicked.connect(self.drop_oldest_turns)
        self.new_chat_button = QPushButton("Continue in a new chat")
        self.new_chat_button.setToolTip("Start a new chat with your last message")
        self.new_chat_button.clicked.connect(self.continue_in_new_chat)
        self.summary_button = QPushButton("Continue with a summary")
        self.summary_button.setToolTip("Ask the model to summarize this chat, then start a new chat from that "
                                       "summary with your last message")
        self.summary_button.clicked.connect(self.continue_with_summary)
        bar.addWidget(self.context_label, 1)
        bar.addWidget(self.drop_button)
        bar.addWidget(self.new_chat_button)
        bar.addWidget(self.summary_button)
        self.context_bar.setVisible(False)
        layout.addWidget(self.context_bar)
        self.edit_bar = QWidget()
        edit_row = QHBoxLayout(self.edit_bar)
        edit_row.setContentsMargins(0, 0, 0, 0)
        self.edit_label = QLabel("Editing a message: sending replaces it and the answers after it")
        set_style(self.edit_label, "warning")
        cancel_edit = QPushButton("Cancel editing")
        cancel_edit.clicked.connect(self.cancel_edit)
        edit_row.addWidget(self.edit_label, 1)
        edit_row.addWidget(cancel_edit)
        self.edit_bar.setVisible(False)
        layout.addWidget(self.edit_bar)
        self.input_refusal = QLabel()  # why what the user tried to add or send was refused, next to where they did
        self.input_refusal.setWordWrap(True)
        set_style(self.input_refusal, "error")
        self.input_refusal.setVisible(False)
        layout.addWidget(self.input_refusal)
        self.composer = Composer()
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.stop)
        self.composer.error.connect(self._refuse_input)
        layout.addWidget(self.composer)
        self._render_timer = QTimer(self, singleShot=True, interval=RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render_stream)
        self.set_engine(None)

    # engine

    def set_engine(self, engine: ChatEngine | RemoteChatEngine | None) -> None:
        if self.engine is not None:
            self.engine.piece.disconnect(self._on_piece)
            self.engine.finished.disconnect(self._on_finished)
            self.engine.failed.disconnect(self._on_failed)
            self.engine.progress.disconnect(self._on_progress)
        self.engine = engine
        if engine is not None:
            engine.piece.connect(self._on_piece)
            engine.finished.connect(self._on_finished)
            engine.failed.connect(self._on_failed)
            engine.progress.connect(self._on_progress)
        label = engine.info.label if engine else "No model loaded: use Model > Load model..."
        self.banner.setText(label)
        self.banner.setVisible(bool(label))
        self.chips.show_info(engine.info if engine else None)
        self.raw_prompt.setVisible(isinstance(engine, ChatEngine))
        self.raw_prompt.blockSignals(True)
        self.raw_prompt.setChecked(self._settings().raw_prompt)
        self.raw_prompt.blockSignals(False)
        reason = engine.info.no_images_reason if engine else ""
        self.composer.set_images_allowed(not reason, reason)
        self.composer.keep_whitespace = self._settings().raw_prompt
        self._remote_used = -1
        self.update_context_meter()

    def update_context_meter(self) -> None:
        """Show how full the context is, and tell the status line the same number (a rig's engine has no
        local tokenizer: no meter then, and the status line shows its last answer's usage)."""
        engine = self.engine
        counts = engine is not None and hasattr(engine, "context_used")
        self.context_meter.setVisible(counts)
        if not counts:
            self.context_warning.setVisible(False)
            self.context_used = self._remote_used
            self.context_changed.emit(self.context_used, engine.info.context if engine else 0)
            return
        assert isinstance(engine, ChatEngine)
        total = engine.service.context_length
        used = engine.context_used(self.messages[self.skip:], self._settings())
        self.context_used = used
        self.context_changed.emit(used, total)
        self.context_meter.setRange(0, total)
        self.context_meter.setValue(min(used, total))
        if used >= total:
            self.context_warning.setText("The context is full: drop the oldest turns or continue in a new chat")
        elif used >= WARN_FRACTION * total:
            self.context_warning.setText(f"The context is {100 * used // total}% full: the chat will soon need its "
                                         "oldest turns dropped or a new chat")
        else:
            self.context_warning.setText("")
        self.context_warning.setVisible(bool(self.context_warning.text()))

    # conversations

    def show_conversation(self, conversation_id: int | None) -> None:
        if self.stream is not None:
            self.stop()
        if self.summary is not None and self.engine is not None:  # the user left the chat being summarized
            self.engine.stop(self.summary.job_id)
            self.summary = None
        self.conversation_id = conversation_id
        self.cancel_edit()
        self._remote_used = -1
        self.skip = 0  # leading messages left out of the prompt (the user chose "Drop oldest turns")
        self.context_bar.setVisible(False)
        self.messages = self.store.messages(conversation_id) if conversation_id is not None else []
        for w in self.widgets:
            w.deleteLater()
        self.widgets = []
        for m in self.messages:
            self._add_widget(m)
        self.follower.follow()  # a chat opens at its latest message
        self._update_regenerate()
        self.update_context_meter()

    def _add_widget(self, message: Message) -> MessageWidget:
        widget = MessageWidget(message)
        widget.edit_requested.connect(self.edit)
        widget.regenerate_requested.connect(self.regenerate)
        self.column.insertWidget(self.column.count() - 1, widget)
        self.widgets.append(widget)
        return widget

    def _update_regenerate(self) -> None:
        last = len(self.messages) - 1
        for i, widget in enumerate(self.widgets):
            widget.set_regenerate_visible(i == last and widget.message.role == "assistant" and self.stream is None)

    # sending

    def send(self, text: str, attachments: list[Attachment]) -> None:
        if self.engine is None:
            self.notice.emit("Load a model first (Model > Load model...)")
            return
        refusal = self.engine.info.no_images_reason if attachments else ""
        if refusal:  # refused before it is stored, so the chat never holds a message its model cannot take
            self._refuse_input(refusal)
            return
        self.input_refusal.setVisible(False)
        if self.conversation_id is None:
            self.conversation_id = self.store.create_conversation(chat_title(text))
            self.conversations_changed.emit()
        if self._editing is not None:
            self._truncate(self.messages.index(self._editing))
            self.cancel_edit()
        user = Message("user", text, attachments=attachments)
        self.store.add_message(self.conversation_id, user)
        self.messages.append(user)
        self._add_widget(user)
        self.follower.follow()  # what the user sends is shown, however far up they had scrolled
        self.composer.clear()
        self._answer()
        self.conversations_changed.emit()

    def _refuse_input(self, message: str) -> None:
        self.input_refusal.setText(message)
        self.input_refusal.setVisible(True)
        self.notice.emit(message)

    def regenerate(self) -> None:
        if self.stream is not None or not self.messages or self.messages[-1].role != "assistant":
            return
        self._truncate(len(self.messages) - 1)
        self._answer()

    def edit(self, message: Message) -> None:
        """Put the message back in the composer; sending replaces it and everything after it."""
        if self.stream is not None:
            return
        self._editing = message
        self.composer.text.setPlainText(message.content)
        for att in message.attachments:
            self.composer.add_attachment(att)
        self.edit_bar.setVisible(True)

    def cancel_edit(self) -> None:
        """Leave editing (sending did, or the user chose not to); the composer keeps its text."""
        self._editing = None
        self.edit_bar.setVisible(False)

    def _truncate(self, keep: int) -> None:
        assert self.conversation_id is not None
        self.store.truncate(self.conversation_id, keep)
        self.skip = min(self.skip, keep)
        for widget in self.widgets[keep:]:
            widget.deleteLater()
        del self.widgets[keep:], self.messages[keep:]

    def _answer(self) -> None:
        assert self.engine is not None and self.conversation_id is not None
        self.update_context_meter()
        try:
            job_id = self.engine.submit(self.messages[self.skip:], self._settings())
        except ImageInputError as err:
            self.notice.emit(str(err))
            return
        except Unavailable as err:  # a full queue or a dead worker: say so, keep the chat as it is
            self.notice.emit(str(err))
            return
        except RigllmError as err:
            self.context_label.setText(str(err))
            self.context_bar.setVisible(True)
            return
        self.context_bar.setVisible(False)
        answer = Message("assistant", "", status=STREAMING)
        self.store.add_message(self.conversation_id, answer)
        self.messages.append(answer)
        self.stream = _Stream(job_id, answer, self._add_widget(answer))
        self.stream.widget.set_phase(self.stream.phase())
        self.composer.set_generating(True)
        self._update_regenerate()

    def drop_oldest_turns(self) -> None:
        """Answer the last message with only as many recent turns in the prompt as fit."""
        assert self.engine is not None
        try:
            self.skip += self.engine.oldest_to_drop(self.messages[self.skip:], self._settings())
        except RigllmError as err:
            self.context_label.setText(str(err))
            return
        self.notice.emit(f"the oldest {self.skip} message(s) are left out of the prompt (they stay in the chat)")
        self._answer()

    def continue_in_new_chat(self, summary: str = "") -> None:
        """Move the unanswered last message into a new chat and answer it there; a `summary` of this
        chat becomes the new chat's system message."""
        last = self.messages[-1]
        self._truncate(len(self.messages) - 1)
        self.show_conversation(None)
        if summary:
            self.conversation_id = self.store.create_conversation(chat_title(last.content))
            system = Message("system", SUMMARY_PREFIX + summary)
            self.store.add_message(self.conversation_id, system)
            self.messages.append(system)
            self._add_widget(system)
        self.send(last.content, last.attachments)

    def continue_with_summary(self) -> None:
        """Ask the model for a summary of this chat (without its unanswered last message); its answer
        starts a new chat (`_summary_done`). What does not fit the context is said, not cut silently."""
        if self.engine is None or self.summary is not None or not self.messages:
            return
        settings = replace(self._settings(), thinking=False, max_tokens=min(self._settings().max_tokens, SUMMARY_TOKENS))
        history = self.messages[self.skip:-1] + [Message("user", SUMMARY_REQUEST)]
        if isinstance(self.engine, ChatEngine):
            try:
                dropped = self.engine.oldest_to_drop(history, settings)
            except RigllmError as err:
                self.context_label.setText(str(err))
                return
            if dropped:
                self.notice.emit(f"the summary covers the last {len(history) - 1 - dropped} message(s): "
                                 "the oldest did not fit the context")
            history = history[dropped:]
        try:
            job_id = self.engine.submit(history, settings)
        except RigllmError as err:
            self.context_label.setText(str(err))
            return
        self.summary = _Summary(job_id)
        self.context_label.setText("Summarizing the conversation...")
        for button in (self.drop_button, self.new_chat_button, self.summary_button):
            button.setEnabled(False)

    def _summary_done(self, text: str, failure: str = "") -> None:
        self.summary = None
        for button in (self.drop_button, self.new_chat_button, self.summary_button):
            button.setEnabled(True)
        if failure or not text.strip():
            self.context_label.setText(f"The summary failed: {failure or 'the model answered nothing'}")
            return
        self.continue_in_new_chat(text.strip())

    def stop(self) -> None:
        """End the answer now: the text so far stays, marked stopped."""
        if self.stream is None or self.engine is None:
            return
        self.engine.stop(self.stream.job_id)
        self.stream.message.stats.update(self.stream.stopped_stats())
        self._end(STOPPED)

    # streaming

    def _on_piece(self, job_id: int, events: list) -> None:
        if self.summary is not None and job_id == self.summary.job_id:
            self.summary.text += "".join(e.text for e in events if isinstance(e, ContentDelta))
            return
        stream = self.stream
        if stream is None or job_id != stream.job_id:
            return
        now = time.perf_counter()
        if stream.first_piece is None:
            stream.first_piece = now
            stream.message.stats["ttft_seconds"] = now - stream.submitted
        m = stream.message
        for event in events:
            if isinstance(event, ReasoningDelta):
                stream.reasoning_started = stream.reasoning_started or now
                m.reasoning += event.text
            elif isinstance(event, ContentDelta):
                if m.reasoning and m.reasoning_seconds is None:
                    m.reasoning_seconds = now - (stream.reasoning_started or stream.submitted)
                m.content += event.text
            elif isinstance(event, ToolCall):
                m.tool_calls.append(event.as_openai())
        if now - stream.saved > SAVE_INTERVAL:
            self.store.update_message(m)
            stream.saved = now
        if not self._render_timer.isActive():
            self._render_timer.start()

    def _on_progress(self, job_id: int, progress: Progress) -> None:
        stream = self.stream
        if stream is None or job_id != stream.job_id:
            return
        stream.take(progress)
        if not self._render_timer.isActive():
            self._render_timer.start()

    def _render_stream(self) -> None:
        if self.stream is not None:
            self.stream.widget.set_phase(self.stream.phase())
            self.stream.widget.refresh()

    def _on_finished(self, job_id: int, result: Finished) -> None:
        if self.summary is not None and job_id == self.summary.job_id:
            self._summary_done(self.summary.text)
            return
        stream = self.stream
        if stream is None or job_id != stream.job_id:
            return
        m = stream.message
        if m.reasoning and m.reasoning_seconds is None:
            m.reasoning_seconds = result.prefill_seconds + result.decode_seconds
        m.stats["tokens"] = result.completion_tokens
        prefilled = result.prompt_tokens - result.cached_tokens
        if prefilled > 0 and result.prefill_seconds > 0:
            m.stats["prompt_tokens_per_second"] = prefilled / result.prefill_seconds
        if not isinstance(self.engine, ChatEngine):  # a rig's answer: its usage is the count the status line shows
            self._remote_used = result.prompt_tokens + result.completion_tokens
        if result.draft_tokens:
            m.stats["draft_acceptance"] = result.accepted_draft_tokens / result.draft_tokens
        if result.decode_seconds > 0 and result.completion_tokens > 1:
            m.stats["tokens_per_second"] = (result.completion_tokens - 1) / result.decode_seconds
            self.answer_speed.emit(m.stats["tokens_per_second"])
        self._end(COMPLETE)

    def _on_failed(self, job_id: int, message: str) -> None:
        if self.summary is not None and job_id == self.summary.job_id:
            self._summary_done("", message)
            return
        stream = self.stream
        if stream is None or job_id != stream.job_id:
            return
        stream.message.content += f"\n\n**Generation failed:** {message}"
        self._end(FAILED)

    def _end(self, status: str) -> None:
        stream = self.stream
        assert stream is not None
        self.stream = None
        stream.message.status = status
        if self.engine is not None:
            stream.message.stats["cards"] = ",".join(map(str, self.engine.info.cards)) or "CPU"
        self.store.update_message(stream.message)
        stream.widget.set_phase("")
        stream.widget.refresh()
        self.composer.set_generating(False)
        self._update_regenerate()
        self.update_context_meter()
        self.conversations_changed.emit()
