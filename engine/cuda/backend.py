"""The CUDA backend on one card: the memory plan, the weights uploaded once, and the sequence slots.

It implements the generation layer's `Backend` (`forward_last` returns the last token's logits, for
backend comparisons and the host sampler; `decode_on_device`, the single-sequence fast path) and
`SlotBackend` (engine.generation.slots, the scheduler's batched interface) through its
`SlotDecoder`, which speculates with the model's MTP head when the file has one (on by default, as on
the reference; `speculative=False` leaves the head off the card). Given an mmproj it also holds the fp16
vision tower on its card and prefills image prompts (`ImagePrefill`): `encode_image` runs the tower,
`prefill_embedded` splices the rows in. All calls must come from the thread that created the backend
(one card, one thread: architecture.md).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence

import numpy as np

from engine.cuda.driver import CudaCard
from engine.cuda.sequence import DeviceSequence
from engine.cuda.slot_decoder import DEFAULT_CHUNK, SlotDecoder
from engine.cuda.weights import has_mtp, trunk_bytes, upload_mtp_weights, upload_weights
from engine.model.kv_formats import kv_format
from engine.model.load_progress import ProgressCallback, ProgressCounter
from engine.model.memory_plan import CardProfile, MemoryPlan, plan
from engine.model.model_footprint import footprint_of
from engine.generation.sampler import SamplingParams
from engine.generation.slots import Pick, SlotRequest, SlotSnapshot, decode_tokens
from engine.generation.speculative import SpeculationStats
from engine.generation.token_mask import TokenMask
from engine.gguf.loader import LoadedModel
from engine.vision.mmproj import LoadedMmproj
from engine.sparse.profile import SparseProfile
from engine.vision.device_footprint import with_tower
from engine.cuda.vision import gpu_image_encoder
from engine.vision.encoder import ImageEncoder, loaded_tower
from engine.vision.multimodal_prompt import PromptSegment
from engine.vision.preprocess import PreparedImage



class CudaBackend:
    """One model on one card with `slots` sequence slots (each a KV cache + GDN state of `context` tokens)."""

    name = "cuda"
    can_snapshot = True

    def __init__(self, loaded: LoadedModel, context: int | None = None, chunk: int = DEFAULT_CHUNK, card_index: int = 0,
                 card_bytes: int | None = None, slots: int = 1, progress: ProgressCallback | None = None,
                 kv: str = "f16", mmproj: LoadedMmproj | None = None, speculative: bool = True,
                 draft_tokens: int = 1, sparse: SparseProfile | None = None):
        """`card_bytes` caps the card (a "logical card", e.g. 16 GiB to act as a CMP 100-210 on a bigger GPU).
        `progress` gets load reports and may raise `LoadCancelled`; the card is freed before it propagates.
        `kv`: the KV cache format (f16, or a quantised pair such as k8v3; engine.model.kv_formats).
        `mmproj`: a validated vision tower paired with this model (engine.vision.encoder checks the pairing),
        loaded onto this card and counted in its memory plan.
        `speculative`: load the MTP head (when the file has one) and draft `draft_tokens` per verify, for greedy
        and sampled requests alike (the exact acceptance rule runs on the card: engine.cuda.speculative).
        `sparse`: a calibrated sparse prefill profile (engine.sparse.profile.require_profile) or None (dense)."""
        self.config = cfg = loaded.config
        self.context = min(context or cfg.context_length, cfg.context_length)
        self.chunk = self.prefill_chunk = chunk
        self.slot_count = slots
        self.kv = kv_format(kv)
        self.with_mtp = speculative and has_mtp(loaded.file, cfg)
        self.draft_tokens = draft_tokens
        self.card = CudaCard(card_index, capacity_bytes=card_bytes)
        self.images: ImageEncoder | None = None
        try:  # a failed or cancelled load must not leave the context pushed (pycuda aborts the process at exit)
            self.plan = self._plan(loaded, mmproj)
            counter = ProgressCounter(progress, card_index, trunk_bytes(loaded.file, cfg), "uploading weights")
            counter.report()
            self.weights = upload_weights(self.card, loaded.file, cfg, counter)
            if mmproj is not None:
                counter.enter("uploading the vision tower")
                self.images = gpu_image_encoder(self.card, mmproj)
            mtp = upload_mtp_weights(self.card, loaded.file, cfg, self.weights) if self.with_mtp else None
            counter.enter("allocating slots and warming up kernels")
            self.slots = SlotDecoder(self.card, cfg, self.weights, self.context, slots, chunk, self.kv, mtp=mtp,
                                     draft_tokens=draft_tokens, sparse=sparse)
            self.fwd = self.slots.fwd
            counter.enter("ready")
        except BaseException:
            self.card.close()
            raise

    def _plan(self, loaded: LoadedModel, mmproj: LoadedMmproj | None) -> MemoryPlan:
        """The memory plan for this card, made before any allocation; refuses what will not fit."""
        total = self.card.capacity_bytes or self.card.total_bytes
        other = 0 if self.card.capacity_bytes else max(0, total - self.card.free_bytes())
        profile = CardProfile(self.card.name, total, other_used_bytes=other)
        fp = with_tower(footprint_of(loaded), mmproj.config if mmproj is not None else None)
        return plan(fp, [profile], self.context * self.slot_count, self.kv, n_seqs=self.slot_count,
                    prefill_chunk=self.chunk, with_mtp=self.with_mtp,
                    verify_states=self.draft_tokens if self.with_mtp else 0)

    @property
    def speculation_stats(self) -> SpeculationStats | None:
        """MTP acceptance counts (None without the head)."""
        return self.slots.speculation_stats

    # ---- images (ImagePrefill) -------------------------------------------------------------------
    @property
    def supports_images(self) -> bool:
        """True when the backend was loaded with a vision tower."""
        return self.images is not None

    def encode_image(self, image: PreparedImage) -> np.ndarray:
        """The tower's embeddings [tokens, D] of one prepared image (on this backend's thread)."""
        return loaded_tower(self.images).encode(image)

    def prefill_embedded(self, slot: int, segment: PromptSegment) -> None:
        self.slots.prefill_embedded(slot, segment)

    def forward_embedded(self, segment: PromptSegment, sequence: DeviceSequence) -> np.ndarray:
        """`forward_last` of a multimodal prompt segment (for Backend-protocol callers: `rigllm generate --image`)."""
        self.slots.prefill_embedded(self.slots.slot_of(sequence), segment)
        return self.fwd.logits_row(0).download(np.float32, self.config.vocab_size)

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

    def begin(self, slot: int, request: SlotRequest, mask: TokenMask | None = None) -> Pick:
        return self.slots.begin(slot, request, mask)

    def step(self, feeds: Mapping[int, int], masks: Mapping[int, TokenMask] | None = None) -> dict[int, Pick]:
        return self.slots.step(feeds, masks)

    def snapshot_slot(self, slot: int) -> SlotSnapshot:
        return self.slots.snapshot_slot(slot)

    def restore_slot(self, slot: int, snapshot: SlotSnapshot) -> None:
        self.slots.restore_slot(slot, snapshot)

    def close(self) -> None:
        self.card.close()
