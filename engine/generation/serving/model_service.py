"""The loaded model as the serving layer sees it: its id, tokenizer, chat template, context and vision.

`prepare_chat` turns chat messages into the prompt's token ids (and encoded images); the HTTP front
end's request checks (engine.server.request_jobs) and the desktop app's chat both build their jobs
from it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.generation.chat_prompt import build_chat_prompt
from engine.generation.chat_template import ChatTemplate
from engine.generation.tokenizer import Tokenizer
from engine.gguf.loader import LoadedModel
from engine.generation.serving.multimodal_chat import PreparedChat, Vision, open_vision, with_images
from engine.generation.serving.request_limits import RequestLimits


@dataclass
class ModelService:
    model_id: str
    tokenizer: Tokenizer
    template: ChatTemplate
    context_length: int
    created: int = field(default_factory=lambda: int(time.time()))
    vision: Vision = field(default_factory=lambda: Vision(None))
    limits: RequestLimits = field(default_factory=RequestLimits)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """Characters the longest token of the vocabulary decodes to (bytes, which bound characters)."""
        return max((len(self.tokenizer.token_bytes(i)) for i in range(self.tokenizer.vocab_size)), default=1)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, mmproj: str | Path | None = None) -> ModelService:
        """The model id clients send is the file name without `.gguf`; images use `mmproj`, else the
        mmproj found beside the model (engine.vision.mmproj_pairing), else they are refused."""
        tokenizer = Tokenizer.from_model_file(loaded.file)
        return cls(model_id=loaded.path.stem, tokenizer=tokenizer, template=ChatTemplate.for_model(loaded.file.fields),
                   context_length=loaded.config.context_length, vision=open_vision(loaded, tokenizer, mmproj))

    def prepare_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                     enable_thinking: bool | None = None, reply_prefix: str = "",
                     backend_takes_images: bool = True) -> PreparedChat:
        """Render, tokenize and (when the messages hold image parts) encode their images; raises RigllmError.

        Image parts are OpenAI's `{"type": "image_url", "image_url": {"url": "data:..."}}` or the app's
        `{"type": "image", "image": <PIL image>}`. The tower runs on the calling thread. Build the job
        from `.token_ids` and put `.multimodal` on it. Pass `GenerationWorker.supports_images` as
        `backend_takes_images`, so images the backend cannot run are refused before the tower runs.
        """
        chat = build_chat_prompt(self.template, self.tokenizer, messages, tools=tools, enable_thinking=enable_thinking,
                                 context_length=self.context_length, reply_prefix=reply_prefix)
        return with_images(chat, messages, self.vision, self.tokenizer, self.context_length, backend_takes_images,
                           self.limits)

    def turn_start(self, prompt_ids: list[int]) -> int:
        """Tokens before the prompt's generation header (its last `<|im_start|>`): a turn boundary that
        the next request of the same chat repeats, so the state there is worth keeping."""
        marker = self.tokenizer.token_to_id("<|im_start|>")
        for i in range(len(prompt_ids) - 1, 0, -1):
            if prompt_ids[i] == marker:
                return i
        return 0
