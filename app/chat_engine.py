"""The loaded model as the GUI sees it: submit a conversation, receive its answer as Qt signals.

The engine's `GenerationWorker` is the one owner of the backend (its own thread runs the scheduler),
shared with the API server when that is switched on. A job's sink runs on that thread and only
emits a signal; Qt queues it to the GUI thread, so no widget is touched off the GUI thread and the
GUI never waits on the engine (`submit` only puts a job on a queue).
"""

from __future__ import annotations

import base64
import io
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal

from engine.errors import RigllmError
from engine.generation.chat_prompt import ChatPrompt, build_chat_prompt
from engine.gguf.loader import LoadedModel
from engine.generation.serving.generation_job import Failed, Finished, Job, Piece
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.worker import GenerationWorker

from app.chat_records import Attachment, Message
from app.settings import AppSettings


@dataclass(frozen=True)
class ModelInfo:
    """What the status line and the rig monitor say about the loaded model."""

    name: str
    label: str  # e.g. "demo model, random weights: output is gibberish"
    backend: str
    context: int
    kv_format: str
    cards: tuple[int, ...]  # card indices (PCI bus order) the model runs on; () for the CPU
    vision: bool | None = False  # takes images (a vision projector loaded and a backend that prefills them); None: unknown
    mtp: bool = False  # speculates with the model's MTP head (it has one, and the backend runs it: one card or the CPU)
    chat_template: bool = True  # the file carries its own chat template (without one, raw prompts are the default)
    path: str = ""  # the GGUF the model was loaded from ("" for the generated demo model or a rig's)
    split: tuple[int, ...] | None = None  # layers per card as asked for (None: the memory plan's)

    @property
    def no_images_reason(self) -> str:
        """Why images cannot be attached ("" when they can, or when it is not known)."""
        if self.vision is False:
            return (f"{self.name} takes no images: it was loaded without a vision projector "
                    "(put its mmproj*.gguf next to the model file to load one)")
        return ""


ImagePart = Callable[[Attachment], dict[str, Any]]


class ImageInputError(RigllmError):
    """The message's images cannot go to this model (no vision projector, an unreadable image, a backend
    without image input): shown as a notice, unlike a full context, which offers to drop turns."""


def pil_image_part(attachment: Attachment) -> dict[str, Any]:
    """An attached image as the engine's own content part (a local model encodes it in-process)."""
    from PIL import Image

    return {"type": "image", "image": Image.open(io.BytesIO(attachment.data))}


def data_url_image_part(attachment: Attachment) -> dict[str, Any]:
    """An attached image as OpenAI's `image_url` data-URL part (for a rig's API)."""
    encoded = base64.b64encode(attachment.data).decode("ascii")
    return {"type": "image_url", "image_url": {"url": f"data:{attachment.mime};base64,{encoded}"}}


def prompt_messages(history: list[Message], settings: AppSettings,
                    image_part: ImagePart | None = None) -> list[dict[str, Any]]:
    """The conversation as the chat template wants it: system preset first (for a local model and for a
    rig's, whose OpenAI API takes the same messages).

    With `image_part`, a user message's image attachments go before its text as content parts; without
    it the text alone (what token counts for the fill meter use, so they need no vision tower run). A
    chat's own system message (the summary a chat continued from another one starts with) joins the
    preset's in the one system message the template takes.
    """
    out: list[dict[str, Any]] = []
    system = [settings.system_prompt] if settings.system_prompt else []
    if history and history[0].role == "system":
        system.append(history[0].content)
        history = history[1:]
    if system:
        out.append({"role": "system", "content": "\n\n".join(system)})
    for m in history:
        msg: dict[str, Any] = {"role": m.role, "content": m.content}
        images = [a for a in m.attachments if a.mime.startswith("image/")] if image_part else []
        if m.role == "user" and images:
            msg["content"] = [image_part(a) for a in images] + [{"type": "text", "text": m.content}]
        if m.role == "assistant" and m.reasoning:
            msg["reasoning_content"] = m.reasoning
        if m.tool_calls:
            msg["tool_calls"] = m.tool_calls
        out.append(msg)
    return out


def raw_prompt_text(history: list[Message]) -> str:
    """Raw prompt mode (no chat template, for base models and the trained fixtures): the conversation's
    texts joined as written, so each answer continues the text before it."""
    return "".join(m.content for m in history if m.role != "system")


class ChatEngine(QObject):
    piece = Signal(int, object)  # job id, list[ParseEvent]
    finished = Signal(int, object)  # job id, Finished
    failed = Signal(int, str)  # job id, message
    progress = Signal(int, object)  # job id, Progress (prompt tokens processed, tokens generated)

    def __init__(self, loaded: LoadedModel, service: ModelService, worker: GenerationWorker, info: ModelInfo):
        super().__init__()
        self.loaded = loaded
        self.service = service
        self.worker = worker
        self.info = info
        self._ids = itertools.count(1)
        self._jobs: dict[int, Job] = {}

    def _prompt(self, history: list[Message], settings: AppSettings) -> ChatPrompt | list[int]:
        """The prompt for `history` (its token ids alone in raw mode); raises RigllmError when it does not fit."""
        if settings.raw_prompt:
            ids = self._raw_ids(history)
            if len(ids) >= self.service.context_length:
                raise RigllmError(f"the prompt is {len(ids)} tokens, the context holds {self.service.context_length}")
            return ids
        return build_chat_prompt(self.service.template, self.service.tokenizer, prompt_messages(history, settings),
                                 enable_thinking=settings.thinking, context_length=self.service.context_length)

    def _raw_ids(self, history: list[Message]) -> list[int]:
        return self.service.tokenizer.encode(raw_prompt_text(history), parse_special=True)

    def context_used(self, history: list[Message], settings: AppSettings) -> int:
        """Tokens the prompt for `history` takes (also when it is over the context), for the fill meter;
        0 before the first user message (the template renders no prompt without one)."""
        if not any(m.role == "user" for m in history):
            return 0
        if settings.raw_prompt:
            return len(self._raw_ids(history))
        return len(build_chat_prompt(self.service.template, self.service.tokenizer, prompt_messages(history, settings),
                                     enable_thinking=settings.thinking).token_ids)

    def oldest_to_drop(self, history: list[Message], settings: AppSettings) -> int:
        """How many leading messages to leave out of the prompt so the rest fits (whole turns: the kept
        part starts at a user message). Raises RigllmError when even the last user message does not fit."""
        starts = [i for i, m in enumerate(history) if m.role == "user"]
        for start in starts:
            try:
                self._prompt(history[start:], settings)
                return start
            except RigllmError:
                continue
        raise RigllmError("the last message alone does not fit the context: shorten it or load the model with a "
                          "longer context")

    def submit(self, history: list[Message], settings: AppSettings) -> int:
        """Queue an answer to `history`; returns the job id the signals carry.

        Raises RigllmError (one line, shown to the user) when the conversation does not fit the context;
        it is never truncated silently (contracts.md): the chat pane offers to drop the oldest turns.
        """
        raw = self._prompt(history, settings)  # refuses a conversation over the context before any image is encoded
        last = history[-1] if history else None
        if last is not None and last.attachments and self.info.no_images_reason:
            raise ImageInputError(self.info.no_images_reason)
        job_id = next(self._ids)
        if isinstance(raw, list):
            return self._queue(job_id, raw, settings, thinking=False, turn_start=0, multimodal=None)
        # a model without vision still answers a chat that holds images: earlier images stay out of its prompt
        image_part = pil_image_part if self.info.vision else None
        try:
            prepared = self.service.prepare_chat(prompt_messages(history, settings, image_part),
                                                 enable_thinking=settings.thinking,
                                                 backend_takes_images=self.worker.supports_images)
        except RigllmError as err:
            raise ImageInputError(str(err)) from None
        return self._queue(job_id, prepared.token_ids, settings, prepared.chat.thinking,
                           self.service.turn_start(prepared.token_ids), prepared.multimodal)

    def _queue(self, job_id: int, token_ids: list[int], settings: AppSettings, thinking: bool, turn_start: int,
               multimodal: Any) -> int:
        room = self.service.context_length - len(token_ids)

        def sink(item: Piece | Finished | Failed) -> None:  # on the worker thread
            if isinstance(item, Piece):
                self.piece.emit(job_id, item.events)
            elif isinstance(item, Finished):
                self._jobs.pop(job_id, None)
                self.finished.emit(job_id, item)
            else:
                self._jobs.pop(job_id, None)
                self.failed.emit(job_id, item.message)

        job = Job(token_ids, settings.sampling(), min(settings.max_tokens, room), thinking, None, [],
                  sink=sink, turn_start=turn_start, speculative=settings.speculative, multimodal=multimodal,
                  on_progress=lambda p: self.progress.emit(job_id, p))
        self._jobs[job_id] = job
        self.worker.submit(job)
        return job_id

    def stop(self, job_id: int) -> None:
        """Ask the worker to end the job (within one token). No further signal is promised for it: a
        cancelled job may leave its slot without a `Finished`, so the caller finalises the answer itself."""
        job = self._jobs.get(job_id)
        if job is not None:
            job.cancelled.set()

    def close(self) -> None:
        """Cancel what is running and end the worker thread (frees the backend and its cards)."""
        for job in list(self._jobs.values()):
            job.cancelled.set()
        self.worker.stop()
