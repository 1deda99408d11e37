"""The CUDA backend on one card: the memory plan, the weights uploaded once, and the sequence slots.

It implements the generation layer's `Backend` (`forward_last` returns the last token's logits, for
backend comparisons and the host sampler; `decode_on_device`, the single-sequence fast path) and
`SlotBackend` (engine.generation.slots, the scheduler's batched interface) through its
`SlotDecoder`. All calls must come from the thread that created the backend (one card, one thread:
architecture.md).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence

import numpy as np

from engine.cuda.driver import CudaCard
from engine.cuda.sequence import DeviceSequence
from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.weights import trunk_bytes, upload_weights
from engine.generation.kv_formats import kv_format
from engine.generation.load_progress import ProgressCallback, ProgressCounter
from engine.generation.memory_plan import CardProfile, MemoryPlan, plan
from engine.generation.model_footprint import footprint_of
from engine.generation.sampler import SamplingParams
from engine.generation.slots import Pick, SlotRequest, SlotSnapshot, decode_tokens
from engine.gguf.loader import LoadedModel
from engine.sparse.profile import SparseProfile

DEFAULT_CHUNK = 256


class CudaBackend:
    """One model on one card with `slots` sequence slots (each a KV cache + GDN state of `context` tokens)."""

    name = "cuda"
    can_snapshot = True

    def __init__(self, loaded: LoadedModel, context: int | None = None, chunk: int = DEFAULT_CHUNK, card_index: int = 0,
                 card_bytes: int | None = None, slots: int = 1, progress: ProgressCallback | None = None,
                 kv: str = "f16", sparse: SparseProfile | None = None):
        """`card_bytes` caps the card (a "logical card", e.g. 16 GiB to act as a CMP 100-210 on a bigger GPU).
        `progress` gets load reports and may raise `LoadCancelled`; the card is freed before it propagates.
        `kv`: the KV cache format (f16, or a quantised pair such as k8v3; engine.generation.kv_formats).
        `sparse`: a calibrated sparse prefill profile (engine.sparse.profile.require_profile) or None (dense)."""
        self.config = cfg = loaded.config
        self.context = min(context or cfg.context_length, cfg.context_length)
        self.chunk = self.prefill_chunk = chunk
        self.slot_count = slots
        self.kv = kv_format(kv)
        self.card = CudaCard(card_index, capacity_bytes=card_bytes)
        try:  # a failed or cancelled load must not leave the context pushed (pycuda aborts the process at exit)
            self.plan = self._plan(loaded)
            counter = ProgressCounter(progress, card_index, trunk_bytes(loaded.file, cfg), "uploading weights")
            counter.report()
            self.weights = upload_weights(self.card, loaded.file, cfg, counter)
            counter.enter("allocating slots and warming up kernels")
            self.slots = SlotDecoder(self.card, cfg, self.weights, self.context, slots, chunk, self.kv, sparse)
            self.fwd = self.slots.fwd
            counter.enter("ready")
        except BaseException:
            self.card.close()
            raise

    def _plan(self, loaded: LoadedModel) -> MemoryPlan:
        """The memory plan for this card, made before any allocation; refuses what will not fit."""
        total = self.card.capacity_bytes or self.card.total_bytes
        other = 0 if self.card.capacity_bytes else max(0, total - self.card.free_bytes())
        profile = CardProfile(self.card.name, total, other_used_bytes=other)
        return plan(footprint_of(loaded), [profile], self.context * self.slot_count, self.kv,
                    n_seqs=self.slot_count, prefill_chunk=self.chunk)

    # ---- the Backend protocol (slot 0) -----------------------------------------------------------
    def new_sequence(self) -> DeviceSequence:
        """Slot 0, reset (for single-sequence callers: CLI generation, backend comparisons)."""
        self.slots.reset_slot(0)
        return self.slots.seqs[0]

    def forward_last(self, token_ids: Sequence[int], sequence: DeviceSequence) -> np.ndarray:
        self.slots.prefill(token_ids, sequence)
        return self.fwd.logits_row(0).download(np.float32, self.config.vocab_size)

    def decode_on_device(self, seq: DeviceSequence, params: SamplingParams, history: Sequence[int], max_tokens: int,
                         stop_ids: Collection[int] = ()) -> Iterator[int]:
        """Tokens after a prefill of `seq`, chosen on the card (only ids cross PCIe); stops before a stop id,
        at `max_tokens` or at the context's end."""
        return decode_tokens(self, self.slots.slot_of(seq), params, history, max_tokens, stop_ids,
                             lambda: seq.next_position >= seq.capacity)

    # ---- the SlotBackend protocol ----------------------------------------------------------------
    def reset_slot(self, slot: int) -> None:
        self.slots.reset_slot(slot)

    def prefill_slot(self, slot: int, token_ids: Sequence[int]) -> None:
        self.slots.prefill_slot(slot, token_ids)

    def begin(self, slot: int, request: SlotRequest) -> Pick:
        return self.slots.begin(slot, request)

    def step(self, feeds: Mapping[int, int]) -> dict[int, Pick]:
        return self.slots.step(feeds)

    def snapshot_slot(self, slot: int) -> SlotSnapshot:
        return self.slots.snapshot_slot(slot)

    def restore_slot(self, slot: int, snapshot: SlotSnapshot) -> None:
        self.slots.restore_slot(slot, snapshot)

    def close(self) -> None:
        self.card.close()
