"""Bounds on what one request may ask of the server, checked before any work is done for it.

Every bound here is cheap to check from the request's structure alone (counts, lengths, an image's
header), so a hostile request is refused in microseconds instead of costing tokenizer, decoder or
generation time that other requests wait for. `rigllm serve` sets them from its flags; the desktop
app's API toggle uses the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import RigllmError

DEFAULT_MAX_TOKENS = 4096  # OpenAI clients expect a finite default; the rest of the context is still one flag away
MAX_STOP_STRINGS = 4  # OpenAI's own limit
MAX_STOP_CHARS = 1024
DEFAULT_MAX_IMAGES = 8
DEFAULT_MAX_IMAGE_PIXELS = 25_000_000  # e.g. 5000 x 5000: ~75 MB decoded; a 13000 x 13000 bomb is refused
MAX_DEADLINE_SECONDS = 3600.0
# a few base64 photos; far below what parsing or tokenizing makes slow (the HTTP layer refuses larger bodies)
DEFAULT_MAX_BODY_BYTES = 8 << 20


class LimitExceeded(RigllmError):
    """A request over one of the bounds; `param` names the request field (the API answers 400)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class RequestLimits:
    """`default_max_tokens`: the reply's length when the request gives none (never more than the
    context's room); `max_images` / `max_image_pixels`: images per request, and pixels per image as
    its header states them (refused before it is decoded)."""

    default_max_tokens: int = DEFAULT_MAX_TOKENS
    max_images: int = DEFAULT_MAX_IMAGES
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS

    def __post_init__(self) -> None:
        for name in ("default_max_tokens", "max_images", "max_image_pixels"):
            if getattr(self, name) < 1:
                raise RigllmError(f"{name} must be at least 1")


def check_stops(stop: str | Sequence[str] | None) -> list[str]:
    """The request's stop strings as a list, refused when too many or too long (matching is linear,
    but a megabyte stop string is still a megabyte held per request)."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise LimitExceeded(f"at most {MAX_STOP_STRINGS} stop sequences are allowed", "stop")
    for i, s in enumerate(stops):
        if len(s) > MAX_STOP_CHARS:
            raise LimitExceeded(f"stop[{i}] is {len(s)} characters; a stop sequence may have at most "
                                f"{MAX_STOP_CHARS}", "stop")
    return stops


def check_deadline(seconds: float | None) -> float | None:
    """A per-request deadline (seconds from arrival) in (0, MAX_DEADLINE_SECONDS], or None for none."""
    if seconds is None:
        return None
    if not 0 < seconds <= MAX_DEADLINE_SECONDS:
        raise LimitExceeded(f"deadline_seconds must be above 0 and at most {MAX_DEADLINE_SECONDS:.0f} seconds", "deadline_seconds")
    return seconds


def text_length(messages: Sequence[Mapping[str, Any]]) -> int:
    """Characters of text in the messages (string contents, text parts, tool-call arguments): what the
    template renders, give or take its markup."""
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, (list, tuple)):
            total += sum(len(p.get("text") or "") for p in content if isinstance(p, Mapping))
        total += len(str(message.get("tool_calls") or ""))
        total += len(message.get("reasoning_content") or "")
    return total


def check_prompt_length(chars: int, context_length: int, max_token_chars: int, param: str) -> None:
    """Refuse text that cannot fit the context whatever it tokenizes to, before tokenizing it.

    A token stands for at most `max_token_chars` characters (the vocabulary's longest), so text longer
    than context × that is more tokens than the context holds: a sound bound that costs nothing.
    """
    bound = context_length * max(max_token_chars, 1)
    if chars > bound:
        raise LimitExceeded(f"the text is {chars} characters, more than the {context_length}-token context can "
                            f"hold ({bound} characters at most)", param)
