"""The CUDA backend on one card: weights uploaded once, prefill in chunks, decode replayed from a CUDA graph.

Implements the generation layer's `Backend` (`forward_last` returns the last token's logits, for
backend comparisons and the host sampler) and adds `decode_greedy`, the fast path where the token
never leaves the card except as a 4-byte id: each step the host writes the id and position
(12 bytes), replays the captured graph (embedding → all layers → LM head → arg-max) and reads 4 bytes.
All calls must come from the thread that created the backend (one card, one thread: architecture.md).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from engine.cuda.driver import CudaCard
from engine.cuda.forward import ForwardPass
from engine.cuda.sampling import GpuSampler
from engine.cuda.sequence import DeviceSequence
from engine.cuda.weights import upload_weights
from engine.errors import RigllmError
from engine.gguf.loader import LoadedModel

DEFAULT_CHUNK = 256


class DecodeGraph:
    """One token of greedy decode captured as a CUDA graph on a sequence slot.

    Each `step` writes the token id and position (12 bytes, pinned, stream-ordered), replays
    embedding → layers → LM head → arg-max, and reads back the 4-byte id.
    """

    def __init__(self, fwd: ForwardPass, sampler: GpuSampler, seq: DeviceSequence):
        self.fwd, self.sampler, self.seq, self.card = fwd, sampler, seq, fwd.card
        self._host_step = self.card.pinned(3, np.int32)  # ids[0], pos, n_tokens
        self._host_token = self.card.pinned(1, np.int32)
        # Capturing executes nothing, but kernels must have run once (loading, argument types): one
        # eager step on the slot first, which is then reset.
        fwd.set_batch(np.zeros(1, np.int32), 0)
        fwd.run(1, seq)
        sampler.argmax(fwd.logits)
        self.card.synchronize()
        with self.card.capture("decode") as graph:
            fwd.run(1, seq)
            sampler.argmax(fwd.logits)
        self.graph = graph
        seq.reset()
        self.card.synchronize()

    def step(self, token: int, pos: int) -> int:
        """Feed `token` at `pos`; return the arg-max next token (-1 on NaN/inf logits)."""
        self._host_step[:] = (token, pos, 1)
        self.fwd.ids.view(0, 4).upload_async(self._host_step[:1])
        self.fwd.step.upload_async(self._host_step[1:])
        self.card.replay(self.graph)
        self.sampler.token.download_async(self._host_token)
        self.card.stream.synchronize()
        return int(self._host_token[0])


class CudaBackend:
    """One model on one card with one sequence slot (the scheduler issue adds more slots)."""

    name = "cuda"

    def __init__(self, loaded: LoadedModel, context: int | None = None, chunk: int = DEFAULT_CHUNK, card_index: int = 0):
        self.config = cfg = loaded.config
        self.context = min(context or cfg.context_length, cfg.context_length)
        self.chunk = chunk
        self.card = CudaCard(card_index)
        self.weights = upload_weights(self.card, loaded.file, cfg)
        self.fwd = ForwardPass(self.card, cfg, self.weights, chunk)
        self.sampler = GpuSampler(self.card, cfg.vocab_size)
        self.slot = DeviceSequence(self.card, cfg, self.context)
        self.decoder = DecodeGraph(self.fwd, self.sampler, self.slot)

    # ---- the Backend protocol --------------------------------------------------------------------
    def new_sequence(self) -> DeviceSequence:
        """The card's one sequence slot, reset (a new request replaces the previous one)."""
        self.slot.reset()
        return self.slot

    def forward_last(self, token_ids: Sequence[int], sequence: DeviceSequence) -> np.ndarray:
        self.prefill(token_ids, sequence)
        return self.fwd.logits.download(np.float32, self.config.vocab_size)

    # ---- CUDA paths ------------------------------------------------------------------------------
    def prefill(self, token_ids: Sequence[int], seq: DeviceSequence) -> None:
        """Run the tokens through the model in chunks; the last token's logits end in `fwd.logits`."""
        ids = np.asarray(token_ids, dtype=np.int32)
        if seq.next_position + len(ids) > seq.capacity:
            raise RigllmError(f"{seq.next_position + len(ids)} tokens exceed the context of {seq.capacity}")
        for start in range(0, len(ids), self.chunk):
            part = ids[start : start + self.chunk]
            self.fwd.set_batch(part, seq.next_position)
            self.fwd.run(len(part), seq)
            seq.next_position += len(part)

    def decode_greedy(self, first_token: int, seq: DeviceSequence, max_tokens: int, stop_ids=()) -> Iterator[int]:
        """Greedy tokens after `first_token` (already chosen, not yet fed), replaying the decode graph."""
        if seq is not self.slot:
            raise ValueError("decode_greedy runs on the backend's sequence slot")
        token = first_token
        for _ in range(max_tokens):
            if seq.next_position >= seq.capacity:
                return
            token = self.decoder.step(token, seq.next_position)
            seq.next_position += 1
            if token < 0:
                raise RigllmError("the model produced NaN or infinite logits")
            if token in stop_ids:
                return
            yield token

    def close(self) -> None:
        self.card.close()
