"""The chat data the store keeps and exports: conversations, messages and image attachments (no Qt, no SQL)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COMPLETE = "complete"
STREAMING = "streaming"  # being written; found on open only after a crash
INTERRUPTED = "interrupted"  # the app died (or was stopped) mid-answer: the partial text is kept
STOPPED = "stopped"  # the user pressed Stop
FAILED = "failed"


@dataclass(frozen=True)
class Attachment:
    name: str
    mime: str
    data: bytes


@dataclass
class Message:
    role: str  # "system", "user", "assistant"
    content: str
    reasoning: str = ""
    reasoning_seconds: float | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    status: str = COMPLETE
    stats: dict[str, Any] = field(default_factory=dict)  # tokens, tokens_per_second, ttft_seconds, cards, ...
    attachments: list[Attachment] = field(default_factory=list)
    id: int | None = None


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created: float
    updated: float
