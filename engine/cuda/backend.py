"""The CUDA backend on one card: weights uploaded once, prefill in chunks, decode replayed from a CUDA graph.

Implements the generation layer's `Backend` (`forward_last` returns the last token's logits, for
backend comparisons and the host sampler) and adds `decode_on_device`, the fast path where a token
never leaves the card except as a 4-byte id: each step the host writes the id and position
(12 bytes), replays the captured graph (embedding → all layers → LM head → GPU sampler) and reads 4 bytes.
All calls must come from the thread that created the backend (one card, one thread: architecture.md).
"""

from __future__ import annotations

from typing import Collection, Iterator, Sequence

import numpy as np

from engine.cuda.driver import CudaCard
from engine.cuda.forward import ForwardPass
from engine.cuda.sampling import GpuSampler
from engine.cuda.sequence import DeviceSequence
from engine.cuda.weights import upload_weights
from engine.errors import RigllmError
from engine.generation.kv_formats import kv_format
from engine.generation.memory_plan import CardProfile, MemoryPlan, plan
from engine.generation.model_footprint import footprint_of
from engine.generation.sampler import SamplingParams
from engine.gguf.loader import LoadedModel

DEFAULT_CHUNK = 256


class DecodeGraph:
    """One token of decode captured as a CUDA graph on a sequence slot, ending in the GPU sampler.

    Each `step` writes the token id and position (12 bytes, pinned, stream-ordered), replays
    embedding → layers → LM head → arg-max (or the full sampler, whose parameters, token counts and
    draw counter live on the device), and reads back the 4-byte id.
    """

    def __init__(self, fwd: ForwardPass, sampler: GpuSampler, seq: DeviceSequence, sample: bool = False):
        self.fwd, self.sampler, self.seq, self.card = fwd, sampler, seq, fwd.card
        pick = sampler.sample if sample else sampler.argmax
        self._host_step = self.card.pinned(3, np.int32)  # ids[0], pos, n_tokens
        self._host_token = self.card.pinned(1, np.int32)
        # Capturing executes nothing, but kernels must have run once (loading, argument types): one
        # eager step on the slot first, which is then reset.
        fwd.set_batch(np.zeros(1, np.int32), 0)
        fwd.run(1, seq)
        pick(fwd.logits)
        self.card.synchronize()
        with self.card.capture("decode") as graph:
            fwd.run(1, seq)
            pick(fwd.logits)
        self.graph = graph
        seq.reset()
        self.card.synchronize()

    def step(self, token: int, pos: int) -> int:
        """Feed `token` at `pos`; return the next token (-1 on NaN/inf logits)."""
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

    def __init__(self, loaded: LoadedModel, context: int | None = None, chunk: int = DEFAULT_CHUNK, card_index: int = 0,
                 card_bytes: int | None = None):
        """`card_bytes` caps the card (a "logical card", e.g. 16 GiB to act as a CMP 100-210 on a bigger GPU)."""
        self.config = cfg = loaded.config
        self.context = min(context or cfg.context_length, cfg.context_length)
        self.chunk = chunk
        self.card = CudaCard(card_index, capacity_bytes=card_bytes)
        try:  # a failed load must not leave the context pushed (pycuda aborts the process at exit)
            self.plan = self._plan(loaded)
            self.weights = upload_weights(self.card, loaded.file, cfg)
            self.fwd = ForwardPass(self.card, cfg, self.weights, chunk)
            self.sampler = GpuSampler(self.card, cfg.vocab_size)
            self.slot = DeviceSequence(self.card, cfg, self.context)
            self.greedy_decoder = DecodeGraph(self.fwd, self.sampler, self.slot)
            self.sampling_decoder = DecodeGraph(self.fwd, self.sampler, self.slot, sample=True)
        except BaseException:
            self.card.close()
            raise

    def _plan(self, loaded: LoadedModel) -> MemoryPlan:
        """The memory plan for this card, made before any allocation; refuses what will not fit."""
        total = self.card.capacity_bytes or self.card.total_bytes
        other = 0 if self.card.capacity_bytes else max(0, total - self.card.free_bytes())
        profile = CardProfile(self.card.name, total, other_used_bytes=other)
        return plan(footprint_of(loaded), [profile], self.context, kv_format("f16"), prefill_chunk=self.chunk)

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

    def decode_on_device(self, seq: DeviceSequence, params: SamplingParams, history: Sequence[int], max_tokens: int,
                         stop_ids: Collection[int] = ()) -> Iterator[int]:
        """Tokens after a prefill of `seq` (whose logits are in `fwd.logits`), chosen on the card.

        Plain greedy uses the arg-max graph; anything else the sampler graph, with `params` and the
        penalty history (`history`: every token so far) written to the device once per request.
        Only token ids cross PCIe. Stops before a stop id, at `max_tokens` or at the context's end.
        """
        if seq is not self.slot:
            raise ValueError("decoding runs on the backend's sequence slot")
        if params.plain_greedy:
            decoder = self.greedy_decoder
            self.sampler.argmax(self.fwd.logits)
        else:
            decoder = self.sampling_decoder
            self.sampler.configure(params)
            self.sampler.reset_counts()
            ids = np.asarray(history, dtype=np.int32)
            for start in range(0, len(ids), self.chunk):
                part = ids[start : start + self.chunk]
                self.fwd.ids.view(0, 4 * len(part)).upload(part)
                self.sampler.count_tokens(self.fwd.ids, len(part))
            self.sampler.sample(self.fwd.logits)
        token = self.sampler.read_token()
        for produced in range(max_tokens):
            if token < 0:
                raise RigllmError("the model produced NaN or infinite logits")
            if token in stop_ids:
                return
            yield token
            if produced + 1 == max_tokens or seq.next_position >= seq.capacity:
                return
            token = decoder.step(token, seq.next_position)
            seq.next_position += 1

    def close(self) -> None:
        self.card.close()
