"""One message in the chat pane: text, collapsible thinking, tool calls, images, stats and actions."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication, QPixmap
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from app.chat_records import FAILED, INTERRUPTED, STOPPED, STREAMING, Message
from app.theme import set_style
from app.ui.markdown_view import MarkdownView

_ROLE = {"user": "You", "assistant": "Assistant", "system": "System"}
_STATUS = {INTERRUPTED: "interrupted: the app closed before the answer finished",
           STOPPED: "stopped", FAILED: "failed", STREAMING: "generating..."}


def stats_text(message: Message) -> str:
    s = message.stats
    parts = []
    if "tokens" in s:
        parts.append(f"{int(s['tokens'])} tokens")
    if "tokens_per_second" in s:
        parts.append(f"{s['tokens_per_second']:.1f} tok/s")
    if "prompt_tokens_per_second" in s:
        parts.append(f"prompt {s['prompt_tokens_per_second']:.0f} tok/s")
    if "ttft_seconds" in s:
        parts.append(f"first token {s['ttft_seconds']:.2f} s")
    if "draft_acceptance" in s:
        parts.append(f"MTP drafts {s['draft_acceptance']:.0%} accepted")
    if "cards" in s:
        parts.append("CPU" if s["cards"] == "CPU" else
                     f"card{'s' if ',' in str(s['cards']) else ''} {str(s['cards']).replace(',', ', ')}")
    return " · ".join(parts)


class MessageWidget(QFrame):
    edit_requested = Signal(object)  # Message
    regenerate_requested = Signal()

    def __init__(self, message: Message, parent: QWidget | None = None):
        super().__init__(parent)
        self.message = message
        self.phase = ""  # while streaming: the prompt phase or the generation's progress
        self.setObjectName(f"message-{message.role}")
        self.setFrameShape(QFrame.StyledPanel)
        layout = QVBoxLayout(self)
        header = QHBoxLayout()
        self.role_label = QLabel(f"<b>{_ROLE.get(message.role, message.role)}</b>")
        self.status_label = QLabel()
        set_style(self.status_label, "warning")
        header.addWidget(self.role_label)
        header.addWidget(self.status_label)
        header.addStretch(1)
        self.copy_button = QToolButton(text="Copy")
        self.copy_button.setToolTip("Copy the message text")
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.message.content))
        header.addWidget(self.copy_button)
        self.edit_button = QToolButton(text="Edit")
        self.edit_button.setToolTip("Edit this message and send it again (drops the answers after it)")
        self.edit_button.clicked.connect(lambda: self.edit_requested.emit(self.message))
        self.edit_button.setVisible(message.role == "user")
        header.addWidget(self.edit_button)
        self.regenerate_button = QToolButton(text="Regenerate")
        self.regenerate_button.setToolTip("Answer the last message again")
        self.regenerate_button.clicked.connect(self.regenerate_requested.emit)
        self.regenerate_button.setVisible(False)
        header.addWidget(self.regenerate_button)
        layout.addLayout(header)

        self.thinking_toggle = QToolButton()
        self.thinking_toggle.setCheckable(True)
        self.thinking_toggle.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.thinking_toggle.setArrowType(Qt.RightArrow)
        self.thinking_toggle.toggled.connect(self._toggle_thinking)
        self.thinking_view = MarkdownView()
        set_style(self.thinking_view, "thinking")
        self.thinking_view.setVisible(False)
        layout.addWidget(self.thinking_toggle)
        layout.addWidget(self.thinking_view)

        self.images = QHBoxLayout()
        for att in message.attachments:
            label = QLabel()
            pix = QPixmap()
            pix.loadFromData(att.data)
            label.setPixmap(pix.scaled(160, 160, Qt.KeepAspectRatio, Qt.SmoothTransformation))
            label.setToolTip(att.name)
            self.images.addWidget(label)
        self.images.addStretch(1)
        layout.addLayout(self.images)

        self.content_view = MarkdownView()
        layout.addWidget(self.content_view)
        self.tools_label = QLabel()
        self.tools_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        layout.addWidget(self.tools_label)
        self.stats_label = QLabel()
        set_style(self.stats_label, "muted")
        layout.addWidget(self.stats_label)
        self.refresh()

    def _toggle_thinking(self, shown: bool) -> None:
        self.thinking_view.setVisible(shown)
        self.thinking_toggle.setArrowType(Qt.DownArrow if shown else Qt.RightArrow)

    def refresh(self) -> None:
        """Show the message's current state (called as an answer streams in)."""
        m = self.message
        if m.role == "assistant":
            self.content_view.set_markdown(m.content)
        else:  # the user's (or a summary's) own words, as typed
            self.content_view.set_plain(m.content)
        self.content_view.setVisible(bool(m.content) or m.role != "assistant")
        has_thinking = bool(m.reasoning)
        self.thinking_toggle.setVisible(has_thinking)
        if has_thinking:
            took = f" for {m.reasoning_seconds:.1f} s" if m.reasoning_seconds is not None else "..."
            self.thinking_toggle.setText(f"Thought{took}" if m.reasoning_seconds is not None else "Thinking...")
            self.thinking_view.set_markdown(m.reasoning)
        calls = [f"tool call: {c['function']['name']}({c['function']['arguments']})" for c in m.tool_calls]
        self.tools_label.setText("\n".join(calls))
        self.tools_label.setVisible(bool(calls))
        self.status_label.setText(self.phase if m.status == STREAMING and self.phase else _STATUS.get(m.status, ""))
        self.stats_label.setText(stats_text(m))
        self.stats_label.setVisible(bool(m.stats))

    def set_phase(self, text: str) -> None:
        self.phase = text
        self.status_label.setText(text if self.message.status == STREAMING and text else _STATUS.get(self.message.status, ""))

    def set_regenerate_visible(self, visible: bool) -> None:
        self.regenerate_button.setVisible(visible)
