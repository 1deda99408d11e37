"""A reference backend that prefills a multimodal prompt: the one way `rigllm generate --image` runs images today.

`TokenStream` drives any backend with plain token ids; this adapter gives the prompt's image rows
and M-RoPE positions to the first forward of a fresh sequence (the prefill, which must be exactly
the prompt's ids) and runs every later call as text, continuing at the sequence's next position
(largest position + 1, spec §9.6).
"""

from __future__ import annotations

from typing import Sequence

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
