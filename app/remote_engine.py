"""A model loaded on a remote rig, as the chat pane sees a local one: the same signals and calls.

Each answer is one streamed `POST /v1/chat/completions` on its own thread: the SSE chunks are turned
back into the parser events the chat pane already renders (reasoning, content, tool calls), and the
last chunk's usage into a `Finished`. Stop shuts the stream's socket down (closing an httpx response
from another thread does not wake a blocked read; a socket shutdown does, and the server sees the
client go away and cancels the job). The GUI thread only starts the thread, shuts a socket down and
receives queued signals, so a slow network never freezes the window.

Timings are measured here, so time to first token includes the network round trip.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from typing import Any

import httpx
from PySide6.QtCore import QObject, Signal

from engine.generation.output_parser import ContentDelta, ParseEvent, ReasoningDelta, ToolCall
from engine.generation.serving.generation_job import Finished

from app.chat_engine import ModelInfo, data_url_image_part, prompt_messages
from app.chat_records import Message
from app.rig_client import SLOW, RigLink, auth_headers, error_text
from app.settings import AppSettings


def request_body(model: str, history: list[Message], settings: AppSettings) -> dict[str, Any]:
    """The chat request the local engine would make of itself, in the OpenAI wire format."""
    s = settings.sampling()
    return {
        "model": model, "messages": prompt_messages(history, settings, data_url_image_part), "stream": True,
        "stream_options": {"include_usage": True}, "max_tokens": settings.max_tokens,
        "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p,
        "repetition_penalty": s.repetition_penalty, "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty, "chat_template_kwargs": {"enable_thinking": settings.thinking},
        "speculative": settings.speculative,
    }


class _Calls:
    """Tool calls stream as a head chunk (index, id, name) then argument fragments; the chat pane shows
    whole calls, so they are assembled here and handed over when the choice finishes."""

    def __init__(self) -> None:
        self._heads: dict[int, tuple[str, str]] = {}
        self._arguments: dict[int, list[str]] = {}

    def feed(self, part: dict[str, Any]) -> None:
        index = part["index"]
        if "id" in part:
            self._heads[index] = (part["id"], part["function"]["name"])
        self._arguments.setdefault(index, []).append(part.get("function", {}).get("arguments") or "")

    def finish(self) -> list[ToolCall]:
        calls = [ToolCall(i, *self._heads[i], "".join(self._arguments[i])) for i in sorted(self._heads)]
        self._heads, self._arguments = {}, {}
        return calls


def delta_events(choice: dict[str, Any], calls: _Calls) -> list[ParseEvent]:
    """The parser events in one streamed choice (its finishing chunk releases the assembled tool calls)."""
    delta = choice["delta"]
    events: list[ParseEvent] = []
    if delta.get("reasoning_content"):
        events.append(ReasoningDelta(delta["reasoning_content"]))
    if delta.get("content"):
        events.append(ContentDelta(delta["content"]))
    for part in delta.get("tool_calls") or ():
        calls.feed(part)
    if choice.get("finish_reason"):
        events += calls.finish()
    return events


class RemoteChatEngine(QObject):
    piece = Signal(int, object)  # job id, list[ParseEvent]
    finished = Signal(int, object)  # job id, Finished
    failed = Signal(int, str)  # job id, message
    progress = Signal(int, object)  # the local engine's prompt progress; a rig's stream has none before its first token

    def __init__(self, link: RigLink, model_id: str, info: ModelInfo):
        super().__init__()
        self.link = link
        self.model_id = model_id
        self.info = info
        self._http = httpx.Client(base_url=link.base_url, headers=auth_headers(link.key),
                                  timeout=SLOW)  # Stop ends a stream at once, not the timeout
        self._ids = itertools.count(1)
        self._stops: dict[int, threading.Event] = {}
        self._sockets: dict[int, socket.socket] = {}  # each running stream's connection

    def submit(self, history: list[Message], settings: AppSettings) -> int:
        """Start streaming an answer; every outcome (a refusal too) arrives as a signal with the job id."""
        job_id = next(self._ids)
        stop = self._stops[job_id] = threading.Event()
        body = request_body(self.model_id, history, settings)
        threading.Thread(target=self._stream, args=(job_id, body, stop), name=f"rigllm-remote-{job_id}",
                         daemon=True).start()
        return job_id

    def stop(self, job_id: int) -> None:
        """End the answer's stream; as with the local engine, no further signal is promised for it."""
        stop = self._stops.get(job_id)
        if stop is None:
            return
        stop.set()  # a stream whose socket is not registered yet sees this right after registering
        sock = self._sockets.get(job_id)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # the stream ended meanwhile
                pass

    def close(self) -> None:
        """Stop every stream of this app; the model stays loaded on the rig (unloading is the loader's)."""
        for job_id in list(self._stops):
            self.stop(job_id)

    def _stream(self, job_id: int, body: dict[str, Any], stop: threading.Event) -> None:  # on its own thread
        try:
            self._read(job_id, body, stop)
        except httpx.HTTPError as err:
            if not stop.is_set():
                self.failed.emit(job_id, f"lost the rig at {self.link.name}: {err or type(err).__name__}")
        finally:
            self._sockets.pop(job_id, None)
            self._stops.pop(job_id, None)

    def _read(self, job_id: int, body: dict[str, Any], stop: threading.Event) -> None:
        started = time.perf_counter()
        first = last = None
        finish_reason, calls = "stop", _Calls()
        with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
            self._sockets[job_id] = response.extensions["network_stream"].get_extra_info("socket")
            if stop.is_set():
                return
            if response.status_code >= 400:
                response.read()
                self.failed.emit(job_id, error_text(response))
                return
            for line in response.iter_lines():
                if stop.is_set():
                    return  # leaving the block closes the connection; the server cancels the job
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    self.failed.emit(job_id, chunk["error"]["message"])
                    return
                for choice in chunk.get("choices") or ():
                    events = delta_events(choice, calls)
                    if events:
                        last = time.perf_counter()
                        first = first or last
                        self.piece.emit(job_id, events)
                    finish_reason = choice.get("finish_reason") or finish_reason
                usage = chunk.get("usage")
                if usage:
                    first, last = first or time.perf_counter(), last or time.perf_counter()
                    details = usage["completion_tokens_details"]
                    accepted = details.get("accepted_prediction_tokens", 0)
                    self.finished.emit(job_id, Finished(
                        finish_reason, usage["prompt_tokens"], usage["completion_tokens"], details["reasoning_tokens"],
                        usage["prompt_tokens_details"]["cached_tokens"], first - started, last - first,
                        draft_tokens=accepted + details.get("rejected_prediction_tokens", 0),
                        accepted_draft_tokens=accepted))
                    return
        if not stop.is_set():
            self.failed.emit(job_id, "the rig ended the answer without its usage report")
