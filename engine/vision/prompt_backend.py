"""Backends that prefill one multimodal prompt: how `rigllm generate --image` runs images.

`TokenStream` drives any backend with plain token ids; these adapters give the prompt's image rows
and M-RoPE positions to the first forward of a fresh sequence (the prefill, which must be exactly
the prompt's ids) and run every later call as text, continuing at the sequence's next position
(largest position + 1, spec §9.6). `ImagePromptBackend` wraps the numpy reference model;
`EmbeddedPromptBackend` a backend that prefills image rows itself (CUDA: `forward_embedded`), keeping
its on-device decode.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from engine.gguf.config import ModelConfig
from engine.reference.model import ReferenceModel
from engine.reference.state import SequenceState
from engine.vision.multimodal_prompt import MultimodalPrompt


class ImagePromptBackend:
    """The numpy reference model with one multimodal prompt to prefill."""

    name = "reference"

    def __init__(self, model: ReferenceModel, prompt: MultimodalPrompt):
        self.model = model
        self.prompt = prompt
        self.config: ModelConfig = model.cfg

    def new_sequence(self) -> SequenceState:
        return self.model.new_state()

    def forward_last(self, token_ids: Sequence[int], sequence: SequenceState) -> np.ndarray:
        if sequence.n_tokens == 0:
            if list(token_ids) != self.prompt.token_ids:
                raise ValueError("the first call on a fresh sequence must prefill exactly the multimodal prompt")
            p = self.prompt
            hidden = self.model.forward_hidden(token_ids, sequence, p.positions, p.embeddings, p.embedding_rows)
        else:
            hidden = self.model.forward_hidden(token_ids, sequence)
        return self.model.logits(hidden[-1:])[0]

    def close(self) -> None:
        """Nothing to release: the weights are ordinary numpy arrays."""


class EmbeddedPromptBackend:
    """A backend with `forward_embedded(segment, sequence)` (the CUDA backends) and one multimodal prompt."""

    def __init__(self, backend: Any, prompt: MultimodalPrompt):
        self.backend = backend
        self.prompt = prompt
        self.name: str = backend.name
        self.config: ModelConfig = backend.config
        self._fresh: Any = None

    def new_sequence(self) -> Any:
        self._fresh = self.backend.new_sequence()
        return self._fresh

    def forward_last(self, token_ids: Sequence[int], sequence: Any) -> np.ndarray:
        if sequence is self._fresh:
            self._fresh = None
            if list(token_ids) != self.prompt.token_ids:
                raise ValueError("the first call on a fresh sequence must prefill exactly the multimodal prompt")
            return self.backend.forward_embedded(self.prompt.segment(0, len(self.prompt.token_ids)), sequence)
        return self.backend.forward_last(token_ids, sequence)

    def decode_on_device(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped backend's on-device decoding (the slot continues at its rope position)."""
        return self.backend.decode_on_device(*args, **kwargs)

    def close(self) -> None:
        self.backend.close()
