"""The CUDA backend: one model over one or more cards, each card one stage of a pipeline (anchor-qengine.md §2.8).

Each stage (engine.cuda.stage) holds a contiguous range of layers with their weights, and their KV caches
and GDN states for every slot; the first card embeds tokens, the last holds the final norm, the LM head
and the samplers. Hidden rows cross between cards through pinned host memory (engine.cuda.pipeline): a
decode step makes one hop per boundary, a prefill's chunks flow through the cards. Only token ids (and,
per hop, the hidden rows) cross PCIe.

Each card is driven by one executor (engine.cuda.card_thread). Several cards get a thread each, from
`thread_factory` (the desktop app passes QThreads). A single card is a pipeline of one stage run inline:
the thread that opens the backend (the serving worker's, a command's) owns the card and drives it, with
no hand-off per call; so every call must come from that thread (one card, one thread: architecture.md).

The backend implements the generation layer's `Backend` (`forward_last`, for backend comparisons and
the host sampler; `decode_on_device`, the single-sequence fast path; `forward_embedded`) and `SlotBackend`
(engine.generation.slots, the scheduler's batched interface). It speculates with the model's MTP head
when the file has one (on by default, as on the reference; `speculative=False` leaves the head off the
cards): the head goes on the card with the LM head (with its own copy of the embedding when that is not
the first card), and over several cards a round's verify runs through every card
(engine.cuda.pipeline_speculation). Given an mmproj the
first card also holds the fp16 vision tower and prefills image prompts (`ImagePrefill`): `encode_image`
runs the tower, `prefill_embedded` carries a chunk's (t, h, w) positions to every card and its image rows
to the first.

The same code runs N logical cards on one GPU (several contexts on one device, each capped at a capacity
so it plans like a 16 GB CMP card); contexts on one GPU are time-sliced, so its speed-ups belong to real
multi-GPU hosts (contracts.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from engine.cuda.card_thread import ThreadFactory, card_executors
from engine.cuda.driver import CudaCard
from engine.cuda.forward import ForwardPass, shares_pass
from engine.cuda.kv_cache import download_side_rows
from engine.cuda.pipeline import BridgeModel, PipelinedPrefill
from engine.cuda.pipeline_speculation import PipelineRounds
from engine.cuda.prefill_chunks import PrefillChunk, segment_chunks, text_chunks
from engine.cuda.slot_decoder import DEFAULT_CHUNK, SlotDecoder
from engine.cuda.stage import Stage, layer_spans
from engine.cuda.step_gaps import StepGaps
from engine.cuda.vision import gpu_image_encoder
from engine.cuda.weights import ModelWeights, MtpWeights, has_mtp, trunk_bytes, upload_mtp_weights, upload_weights
from engine.errors import RigllmError
from engine.generation.backend import CardSpec
from engine.generation.sampler import SamplingParams
from engine.generation.slots import Pick, SlotRequest, SlotSnapshot, SnapshotCosts, decode_tokens
from engine.generation.speculative import SpeculationStats
from engine.generation.token_mask import StepMasks, TokenMask
from engine.gguf.config import ModelConfig
from engine.gguf.loader import LoadedModel
from engine.model.kv_formats import kv_format
from engine.model.load_progress import ProgressCallback, ProgressCounter
from engine.model.memory_plan import MemoryPlan, load_plan
from engine.model.model_footprint import footprint_of
from engine.reference.kv_quant import Encoded
from engine.sparse.profile import SparseProfile
from engine.vision.device_footprint import with_tower
from engine.vision.encoder import ImageEncoder, loaded_tower
from engine.vision.mmproj import LoadedMmproj
from engine.vision.multimodal_prompt import PromptSegment
from engine.vision.preprocess import PreparedImage

T = TypeVar("T")
WeightsFor = Callable[[CudaCard, range, ProgressCounter], ModelWeights]
MtpFor = Callable[[CudaCard, ModelWeights], MtpWeights]


@dataclass
class SlotSequence:
    """The Backend protocol's sequence handle: a slot index (each card holds its part of the slot)."""

    slot: int


class CudaBackend:
    """One model over `cards` (default: GPU 0 alone) with `slots` sequence slots, each a KV cache + GDN state
    of `context` tokens, its layers' share on every card."""

    name = "cuda"
    can_snapshot = True

    def __init__(self, loaded: LoadedModel | None, cards: Sequence[CardSpec] | None = None, context: int | None = None,
                 slots: int = 1, chunk: int = DEFAULT_CHUNK, split: Sequence[int] | None = None,
                 progress: ProgressCallback | None = None, kv: str = "f16", mmproj: LoadedMmproj | None = None,
                 speculative: bool = True, draft_tokens: int = 1, sparse: SparseProfile | None = None,
                 bridge: BridgeModel | None = None, config: ModelConfig | None = None,
                 weights_for: WeightsFor | None = None, mtp_for: MtpFor | None = None,
                 card_factory: Callable[..., CudaCard] = CudaCard, thread_factory: ThreadFactory | None = None):
        """`cards`: the cards to place layers on, in order (a `CardSpec`'s `capacity_bytes` caps a "logical
        card", e.g. 16 GiB to act as a CMP 100-210 on a bigger GPU); `split`: layers per card (default: the
        memory plan's split by free memory and per-layer cost; a user's split is checked by the plan too).
        `progress` gets load reports per card and may raise `LoadCancelled`; the cards are freed before it
        propagates. `kv`: the KV cache format (f16, or a quantised pair such as k8v3; engine.model.kv_formats).
        `mmproj`: a validated vision tower paired with this model (engine.vision.encoder checks the pairing),
        loaded onto the first card and counted in its memory plan.
        `speculative`: load the MTP head (when the file has one, and it fits) and draft `draft_tokens` per verify,
        for greedy and sampled requests alike (the exact acceptance rule runs on the card: engine.cuda.speculative).
        `sparse`: a calibrated sparse prefill profile (engine.sparse.profile.require_profile), each card applying
        it to its own attention layers; None: dense.
        `bridge`: slow every hop down to a modelled link. `config` + `weights_for` replace `loaded` for
        synthetic benchmarks (weights made on each card; no file, so no plan), and `mtp_for(card, trunk)` makes
        their MTP head on the last card (speculating like a file's head); `card_factory` makes each card's
        context (tests on machines without a GPU pass a stand-in); `thread_factory(target, name)` makes each
        card's thread when there are several (engine.cuda.card_thread)."""
        cards = (CardSpec(),) if cards is None else tuple(cards)
        if not cards:
            raise RigllmError("the CUDA backend needs at least one card")
        cfg = loaded.config if loaded is not None else config
        if cfg is None or (loaded is None and weights_for is None):
            raise ValueError("give a loaded model, or a config and weights_for")
        self.config = cfg
        self.context = min(context or cfg.context_length, cfg.context_length)
        self.slot_count, self.prefill_chunk, self.draft_tokens = slots, chunk, draft_tokens
        self.kv, self.sparse, self.bridge = kv_format(kv), sparse, bridge
        self.mtp_for = mtp_for
        self.with_mtp = speculative and (mtp_for is not None if loaded is None else has_mtp(loaded.file, cfg))
        self.executors = card_executors(len(cards), thread_factory)
        self.stages: list[Stage] = []
        self.rounds: PipelineRounds | None = None  # speculative rounds over several cards
        try:  # a failed or cancelled load must not leave a context pushed (pycuda aborts the process at exit)
            for i, (ex, spec) in enumerate(zip(self.executors, cards)):
                name = f"card {i} (cuda:{spec.device})" if len(cards) > 1 else None
                self.stages.append(ex.call(Stage, i, spec, card_factory, name))
            self.plan = self._plan(loaded, mmproj, split)
            self.spans = layer_spans(cfg.n_layers, len(cards), split, self.plan)
            loads = [ex.submit(self._load_stage, st, span, loaded, weights_for, progress, mmproj)
                     for ex, st, span in zip(self.executors, self.stages, self.spans)]
            for f in loads:  # several cards load in parallel, each on its own thread
                f.result()
            self.rounds = (PipelineRounds(self.stages, self.executors, self._hop)
                           if self.with_mtp and len(self.stages) > 1 else None)
        except BaseException:
            self.close()
            raise

    def _plan(self, loaded: LoadedModel | None, mmproj: LoadedMmproj | None,
              split: Sequence[int] | None) -> MemoryPlan | None:
        """The memory plan over the cards, made before any allocation; refuses what will not fit. None for
        synthetic weights (no file to plan). The MTP head is left off (and noted) when only it does not fit."""
        if loaded is None:
            return None
        profiles = [ex.call(st.profile) for ex, st in zip(self.executors, self.stages)]
        fp = with_tower(footprint_of(loaded), mmproj.config if mmproj is not None else None)
        made = load_plan(fp, profiles, self.context * self.slot_count, self.kv, with_mtp=self.with_mtp,
                         draft_tokens=self.draft_tokens, n_seqs=self.slot_count, prefill_chunk=self.prefill_chunk,
                         split=split)
        self.with_mtp = made.with_mtp
        return made

    def _load_stage(self, st: Stage, span: range, loaded: LoadedModel | None, weights_for: WeightsFor | None,
                    progress: ProgressCallback | None, mmproj: LoadedMmproj | None) -> None:
        """Stage `st`'s layers `span`, then the vision tower (first card), the MTP head (a speculating single
        card) and the slots, on the stage's own executor."""
        cfg = self.config
        total = trunk_bytes(loaded.file, cfg, span) if loaded is not None else 0
        counter = ProgressCounter(progress, st.index, total, f"uploading layers {span.start}-{span.stop - 1}")
        counter.report()
        weights = (upload_weights(st.card, loaded.file, cfg, counter, span) if loaded is not None
                   else weights_for(st.card, span, counter))  # type: ignore[misc]
        if mmproj is not None and st.index == 0:
            counter.enter("uploading the vision tower")
            st.images = gpu_image_encoder(st.card, mmproj)
        mtp = None
        if self.with_mtp and st.index == len(self.executors) - 1:
            mtp = (upload_mtp_weights(st.card, loaded.file, cfg, weights) if loaded is not None
                   else self.mtp_for(st.card, weights))  # type: ignore[misc]
        counter.enter("allocating slots and warming up kernels")
        st.load(SlotDecoder(st.card, cfg, weights, self.context, self.slot_count, self.prefill_chunk, self.kv,
                            mtp=mtp, draft_tokens=self.draft_tokens, sparse=self.sparse, verifies=self.with_mtp))
        counter.enter("ready")

    # ---- running work on the cards -----------------------------------------------------------------
    def _on_all(self, fn: Callable[[Stage], T]) -> list[T]:
        """`fn(stage)` on every card at once, each on its own executor; the results in card order."""
        futures = [ex.submit(fn, st) for ex, st in zip(self.executors, self.stages)]
        return [f.result() for f in futures]

    def _on_last(self, fn: Callable[[SlotDecoder], T]) -> T:
        """`fn(decoder)` on the last card, which has the LM head and the samplers, on its executor."""
        return self.executors[-1].call(fn, self.stages[-1].decoder)

    def _hop(self, rows: np.ndarray) -> np.ndarray:
        if self.bridge is not None:
            self.bridge.delay(rows.nbytes)
        return rows

    def hop_seconds(self, rows: int, repeats: int = 50) -> float:
        """Measured time of one hop of `rows` hidden rows from card 0 to card 1: D2H into the bridge buffer,
        the host fence, and the H2D, with the two thread hand-offs a real hop has."""
        if len(self.stages) < 2:
            raise RigllmError("a hop needs two cards")
        first, second = self.stages[0], self.stages[1]

        def out() -> np.ndarray:
            buf = first.out[0][:rows]
            first.decoder.fwd.h.download_async(buf)
            first.card.stream.synchronize()
            return buf

        def into(buf: np.ndarray) -> None:
            second.decoder.fwd.h.view(0, buf.nbytes).upload(buf)

        start = time.perf_counter()
        for _ in range(repeats):
            self.executors[1].call(into, self.executors[0].call(out))
        return (time.perf_counter() - start) / repeats

    # ---- one card's internals (benchmarks and tests reach below the backend) -----------------------
    def _only(self) -> Stage:
        if len(self.stages) != 1:
            raise RigllmError(f"the backend runs on {len(self.stages)} cards, not one")
        return self.stages[0]

    @property
    def card(self) -> CudaCard:
        """The card of a one-card backend."""
        return self._only().card

    @property
    def slots(self) -> SlotDecoder:
        """The slot decoder of a one-card backend."""
        return self._only().decoder

    @property
    def fwd(self) -> ForwardPass:
        """The forward pass of a one-card backend."""
        return self._only().decoder.fwd

    @property
    def speculation_stats(self) -> SpeculationStats | None:
        """MTP acceptance counts (None without the head)."""
        return self.stages[-1].decoder.speculation_stats

    # ---- prefill -----------------------------------------------------------------------------------
    def prefill_slot(self, slot: int, token_ids: Sequence[int]) -> None:
        self._prefill(slot, text_chunks(token_ids, self.prefill_chunk))

    def prefill_embedded(self, slot: int, segment: PromptSegment) -> None:
        self._prefill(slot, segment_chunks(segment, self.prefill_chunk))

    def shares_prefill(self, counts: Sequence[int]) -> bool:
        """`PrefillBatcher`: can parts of these token counts share one pass, each coming out bit for bit as in a pass
        of its own? At most `prefill_chunk` tokens in all, every part more than 8 tokens (`forward.shares_pass`)."""
        return len(counts) <= self.slot_count and shares_pass(counts, self.prefill_chunk)

    def prefill_slots(self, parts: Mapping[int, Sequence[int]]) -> None:
        """`PrefillBatcher`: several slots' text tokens in one forward pass on every card (`shares_prefill` must allow
        their counts), so the weights are read once for all of them; each slot's first pick then comes from its own
        logits row."""
        counts = [len(ids) for ids in parts.values()]
        if not self.shares_prefill(counts):
            raise ValueError(f"parts of {counts} tokens cannot share a prefill pass: at most {self.prefill_chunk} "
                             "tokens in all, each part more than 8 tokens")
        first = self.stages[0].decoder
        for slot, ids in parts.items():
            first.check_room(first.seqs[slot], len(ids))
        chunks = [(slot, PrefillChunk(np.asarray(ids, dtype=np.int32))) for slot, ids in parts.items()]
        PipelinedPrefill(self.stages, self.executors, self._hop, [chunks]).run()

    def _prefill(self, slot: int, chunks: list[PrefillChunk]) -> None:
        first = self.stages[0].decoder
        first.check_room(first.seqs[slot], sum(len(c.ids) for c in chunks))
        PipelinedPrefill(self.stages, self.executors, self._hop, [[(slot, c)] for c in chunks]).run()

    # ---- images (ImagePrefill) ---------------------------------------------------------------------
    @property
    def images(self) -> ImageEncoder | None:
        """The vision tower on the first card (None without an mmproj)."""
        return self.stages[0].images

    @property
    def supports_images(self) -> bool:
        """True when the backend was loaded with a vision tower."""
        return self.images is not None

    def encode_image(self, image: PreparedImage) -> np.ndarray:
        """The tower's embeddings [tokens, D] of one prepared image, run on the first card's executor."""
        return self.executors[0].call(loaded_tower(self.images).encode, image)

    # ---- the SlotBackend protocol ------------------------------------------------------------------
    def begin(self, slot: int, request: SlotRequest, mask: TokenMask | None = None) -> Pick:
        """The request's sampling goes to the last card alone (it samples)."""
        return self._on_last(lambda dec: dec.begin(slot, request, mask))

    def launch(self, feeds: Mapping[int, int], masks: StepMasks | None = None) -> bool:
        """`StepLauncher`: queue a plain step without waiting (one card; on several the step hops card to card
        and is taken whole: False)."""
        return len(self.stages) == 1 and self._on_last(lambda dec: dec.launch(feeds, masks))

    def launch_forward(self, feeds: Mapping[int, int]) -> bool:
        """`MaskedStepLauncher`: queue a masked step's forward pass without waiting (one card, as `launch`)."""
        return len(self.stages) == 1 and self._on_last(lambda dec: dec.launch_forward(feeds))

    def launch_picks(self, masks: StepMasks) -> None:
        """The picks of the step `launch_forward` queued, under `masks`."""
        self._on_last(lambda dec: dec.launch_picks(masks))

    def collect(self) -> dict[int, Pick]:
        """The picks of the step `launch` (or `launch_forward`) queued."""
        return self._on_last(lambda dec: dec.collect())

    @property
    def step_gaps(self) -> StepGaps:
        """The card with the LM head's idle time between decode steps."""
        return self.stages[-1].decoder.gaps

    def step(self, feeds: Mapping[int, int], masks: StepMasks | None = None) -> dict[int, Pick]:
        """The trunk cards pass their hidden rows on, one hop per boundary; the last card picks, under `masks`.
        Over several cards slots that all speculate take their rounds through every card instead (one slot, or
        several in one verify pass a card)."""
        if self.rounds is not None:
            picks = self.rounds.step(feeds, masks)
            if picks is not None:
                return picks
        hidden = None
        for ex, st in zip(self.executors[:-1], self.stages[:-1]):
            hidden = self._hop(ex.call(st.decoder.step_part, feeds, hidden))
        return self._on_last(lambda dec: dec.step(feeds, masks, hidden=hidden))

    def snapshot_costs(self, tokens: int) -> SnapshotCosts:
        """`SnapshotPricing`: a snapshot's copies (the slowest card's: the cards copy at once) and its tokens' prefill
        (every card's share, one after another), from each card's last timed staged copies and prefill chunk; a part
        not yet timed on every card is None (a card times its copies at its first snapshot and restore, its prefill
        at its first chunk of 32 tokens or more)."""
        costs = self._on_all(lambda st: st.decoder.snapshot_costs(tokens))

        def combined(parts: list[float | None], join: Callable[[list[float]], float]) -> float | None:
            return None if any(p is None for p in parts) else join(parts)  # type: ignore[arg-type]

        return SnapshotCosts(combined([c.copy_out for c in costs], max), combined([c.copy_in for c in costs], max),
                             combined([c.prefill for c in costs], sum))

    def reset_slot(self, slot: int) -> None:
        self._on_all(lambda st: st.decoder.reset_slot(slot))

    def snapshot_slot(self, slot: int) -> SlotSnapshot:
        """One part per card, each the card's own `SlotSnapshot`."""
        parts = self._on_all(lambda st: st.decoder.snapshot_slot(slot))
        return SlotSnapshot(tuple(parts), sum(p.nbytes for p in parts))

    def restore_slot(self, slot: int, snapshot: SlotSnapshot) -> None:
        if len(snapshot.state) != len(self.stages):
            raise RigllmError(f"a snapshot taken on {len(snapshot.state)} card(s) cannot be restored on "
                              f"{len(self.stages)}")
        self._on_all(lambda st: st.decoder.restore_slot(slot, snapshot.state[st.index]))

    def position(self, slot: int) -> int:
        """The slot's next cache row (how many tokens it holds)."""
        return self.stages[0].decoder.seqs[slot].next_position

    def stored_kv(self, slot: int) -> dict[int, tuple[Encoded, Encoded]]:
        """The slot's attention caches, layer by layer, as the reference stores them (K and V of every position so
        far): what a layer-local replay attends over instead of its own (engine.reference.staged_kv.CardRowsKV)."""
        rows, cfg = self.position(slot), self.config

        def download(st: Stage) -> dict[int, tuple[Encoded, Encoded]]:
            seq = st.decoder.seqs[slot]
            return {i: tuple(download_side_rows(side, cfg.n_head_kv, cfg.head_dim, seq.capacity, rows)
                             for side in (cache.k, cache.v)) for i, cache in seq.kv.items()}

        return {i: kv for part in self._on_all(download) for i, kv in part.items()}

    # ---- the Backend protocol (slot 0) -------------------------------------------------------------
    def new_sequence(self) -> SlotSequence:
        """Slot 0, reset (for single-sequence callers: CLI generation, backend comparisons)."""
        self.reset_slot(0)
        return SlotSequence(0)

    def forward_last(self, token_ids: Sequence[int], sequence: SlotSequence) -> np.ndarray:
        self.prefill_slot(sequence.slot, token_ids)
        return self._last_logits()

    def forward_embedded(self, segment: PromptSegment, sequence: SlotSequence) -> np.ndarray:
        """`forward_last` of a multimodal prompt segment (for Backend-protocol callers: `rigllm generate --image`)."""
        self.prefill_embedded(sequence.slot, segment)
        return self._last_logits()

    def _last_logits(self) -> np.ndarray:
        return self._on_last(lambda dec: dec.fwd.logits_row(0).download(np.float32, self.config.vocab_size))

    def decode_on_device(self, seq: SlotSequence, params: SamplingParams, history: Sequence[int], max_tokens: int,
                         stop_ids: Collection[int] = ()) -> Iterator[int]:
        """Tokens after a prefill of `seq`, chosen on the card (only ids cross PCIe); stops before a stop id,
        at `max_tokens` or at the context's end."""
        return decode_tokens(self, seq.slot, params, history, max_tokens, stop_ids,
                             lambda: self.position(seq.slot) >= self.context)

    def close(self) -> None:
        for ex, st in zip(self.executors, self.stages):
            ex.call(st.close)
        for ex in self.executors:
            ex.close()
