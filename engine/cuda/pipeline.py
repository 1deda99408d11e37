"""The CUDA backend over several cards: contiguous layer ranges per card, hidden states bridged through
pinned host memory, prefill pipelined chunk by chunk (anchor-qengine.md §2.8).

Each card has its own thread and context (`CardThread`), its share of the weights, its layers' KV
caches and GDN states for every slot, and a `SlotDecoder` over its layers; the first card embeds
tokens, the last holds the final norm, the LM head and the samplers. A hop is: D2H of the fp32 hidden
rows into portable pinned memory on card i, a host wait for that copy (the fence the CMP needs:
lesson 9), then H2D on card i+1. Decode makes one hop per boundary per step; prefill chunks flow
through the cards so card i works on chunk c+1 while card i+1 works on chunk c, with two bridge
buffers per boundary. Only token ids (and, per hop, the hidden rows) cross PCIe.

The same code runs N logical cards on one GPU (several contexts on one device, each capped at a
capacity so it plans like a 16 GB CMP card); contexts on one GPU are time-sliced, so its speed-ups
belong to real multi-GPU hosts (contracts.md).

With an mmproj the vision tower lives on the first card (where image rows enter the model): images are
encoded on that card's thread, and an image prompt's chunks carry their (t, h, w) positions to every
card and their image rows to the first (`prefill_embedded`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.cuda.card_thread import CardThread
from engine.cuda.driver import CudaCard
from engine.cuda.slot_decoder import DEFAULT_CHUNK, SlotDecoder, embedded_runs
from engine.cuda.weights import ModelWeights, trunk_bytes, upload_weights
from engine.errors import RigllmError
from engine.model.kv_formats import KVFormat, kv_format
from engine.model.load_progress import ProgressCallback, ProgressCounter
from engine.model.memory_plan import CardProfile, MemoryPlan, layer_cuts, plan
from engine.model.model_footprint import footprint_of
from engine.generation.sampler import SamplingParams
from engine.generation.backend import CardSpec
from engine.generation.slots import Pick, SlotRequest, SlotSnapshot, decode_tokens
from engine.generation.token_mask import TokenMask
from engine.gguf.config import ModelConfig
from engine.gguf.loader import LoadedModel
from engine.vision.mmproj import LoadedMmproj
from engine.sparse.profile import SparseProfile
from engine.vision.device_footprint import with_tower
from engine.cuda.vision import gpu_image_encoder
from engine.vision.encoder import ImageEncoder, loaded_tower
from engine.vision.multimodal_prompt import PromptSegment
from engine.vision.preprocess import PreparedImage

WeightsFor = Callable[[CudaCard, range, ProgressCounter], ModelWeights]


@dataclass(frozen=True)
class BridgeModel:
    """An optional slowdown of every hop, so a fast host link feels like the CMP's PCIe Gen1 x1."""

    bytes_per_second: float
    latency_seconds: float = 0.0

    def delay(self, nbytes: int) -> None:
        time.sleep(self.latency_seconds + nbytes / self.bytes_per_second)


def split_layers(n_layers: int, counts: Sequence[int]) -> list[range]:
    """Contiguous ranges from per-card layer counts (a user override like 22,22,20)."""
    cuts = layer_cuts(n_layers, counts)
    return [range(a, b) for a, b in zip(cuts[:-1], cuts[1:])]


class _Stage:
    """One card's share of the model; built and used only on its own thread."""

    def __init__(self, index: int, spec: CardSpec, card_factory: Callable[..., CudaCard] = CudaCard):
        self.index = index
        self.card = card_factory(spec.device, capacity_bytes=spec.capacity_bytes, name=f"card {index} (cuda:{spec.device})")

    def profile(self) -> CardProfile:
        total = self.card.capacity_bytes or self.card.total_bytes
        other = 0 if self.card.capacity_bytes else max(0, total - self.card.free_bytes())
        return CardProfile(self.card.name, total, other_used_bytes=other)

    def load(self, cfg: ModelConfig, weights: ModelWeights, context: int, slots: int, chunk: int, last: bool,
             kv: KVFormat, sparse: SparseProfile | None = None) -> None:
        self.decoder = SlotDecoder(self.card, cfg, weights, context, slots, chunk, kv, sparse=sparse)
        if not last:  # two bridge buffers: chunk c+1 is copied out while the next card still reads chunk c
            self.out = [self.card.pinned((chunk, cfg.d_model), np.float32, portable=True) for _ in range(2)]

    def close(self) -> None:
        self.card.close()


@dataclass(frozen=True)
class _Chunk:
    """One prefill chunk: its token ids, and for an image prompt its rope positions and image rows."""

    ids: np.ndarray
    positions: np.ndarray | None = None
    embedded: list[tuple[int, np.ndarray]] | None = None


class _Prefill:
    """One pipelined prefill: the bridge buffers' availability and the outcome, shared by the card threads."""

    def __init__(self, n_stages: int, n_chunks: int):
        self.free = [[threading.Event() for _ in range(2)] for _ in range(n_stages)]
        for events in self.free:
            for e in events:
                e.set()
        self.n_chunks = n_chunks
        self.done: Future = Future()
        self.failed = False

    def fail(self, err: BaseException) -> None:
        self.failed = True
        for events in self.free:  # no card may wait for a buffer that will never be released
            for e in events:
                e.set()
        if not self.done.done():
            self.done.set_exception(err)


@dataclass
class PipelineSequence:
    """The Backend protocol's sequence handle: a slot index (each card holds its part of the slot)."""

    slot: int


class PipelineBackend:
    """One model over several cards; implements `Backend` and `SlotBackend` like `CudaBackend`."""

    name = "cuda"
    can_snapshot = True

    def __init__(self, loaded: LoadedModel | None, cards: Sequence[CardSpec], context: int | None = None,
                 slots: int = 1, chunk: int = DEFAULT_CHUNK, split: Sequence[int] | None = None,
                 progress: ProgressCallback | None = None, bridge: BridgeModel | None = None,
                 config: ModelConfig | None = None, weights_for: WeightsFor | None = None, kv: str = "f16",
                 card_factory: Callable[..., CudaCard] = CudaCard, thread_factory: Callable[..., Any] | None = None,
                 mmproj: LoadedMmproj | None = None, sparse: SparseProfile | None = None):
        """`split`: layers per card (default: the memory plan's split by free memory and per-layer cost).
        `mmproj`: a vision tower paired with the model, loaded onto the first card.
        `config` + `weights_for` replace `loaded` for synthetic benchmarks (weights made on each card);
        `card_factory` makes each card's context (tests on machines without a GPU pass a stand-in);
        `thread_factory(target, name)` makes each card's thread (see `CardThread`); `sparse`: a sparse
        prefill profile, each card applying it to its own attention layers."""
        if not cards:
            raise RigllmError("a pipeline needs at least one card")
        cfg = loaded.config if loaded is not None else config
        assert cfg is not None
        self.config = cfg
        self.context = min(context or cfg.context_length, cfg.context_length)
        self.slot_count, self.prefill_chunk, self.bridge = slots, chunk, bridge
        self.kv, self.sparse = kv_format(kv), sparse
        self.images: ImageEncoder | None = None
        self.threads = [CardThread(f"rigllm-card{i}", thread_factory) for i in range(len(cards))]
        self.stages: list[_Stage] = []
        try:
            self.stages = [t.call(_Stage, i, spec, card_factory) for i, (t, spec) in enumerate(zip(self.threads, cards))]
            profiles = [t.call(st.profile) for t, st in zip(self.threads, self.stages)]
            if loaded is not None:
                fp = with_tower(footprint_of(loaded), mmproj.config if mmproj is not None else None)
                self.plan: MemoryPlan | None = plan(fp, profiles, self.context * slots, self.kv, n_seqs=slots,
                                                    prefill_chunk=chunk, split=split)  # a user's split is checked too
            else:
                self.plan = None
            spans = (split_layers(cfg.n_layers, split) if split is not None else
                     [c.layers for c in self.plan.cards] if self.plan is not None else
                     split_layers(cfg.n_layers, _even(cfg.n_layers, len(cards))))
            if len(spans) != len(cards):
                raise RigllmError(f"the split gives {len(spans)} cards, {len(cards)} were given")
            self.spans = spans
            loads = [t.submit(self._load_stage, st, loaded, weights_for, span, progress, i == len(cards) - 1)
                     for i, (t, st, span) in enumerate(zip(self.threads, self.stages, spans))]
            for f in loads:  # the cards load in parallel, each on its own thread
                f.result()
            if mmproj is not None:
                self.images = self.threads[0].call(gpu_image_encoder, self.stages[0].card, mmproj)
        except BaseException:
            self.close()
            raise

    def _load_stage(self, st: _Stage, loaded: LoadedModel | None, weights_for: WeightsFor | None, span: range,
                    progress: ProgressCallback | None, last: bool) -> None:
        cfg = self.config
        total = trunk_bytes(loaded.file, cfg, span) if loaded is not None else 0
        counter = ProgressCounter(progress, st.index, total, f"uploading layers {span.start}-{span.stop - 1}")
        counter.report()
        weights = (upload_weights(st.card, loaded.file, cfg, counter, span) if loaded is not None
                   else weights_for(st.card, span, counter))  # type: ignore[misc]
        counter.enter("allocating slots and warming up kernels")
        st.load(cfg, weights, self.context, self.slot_count, self.prefill_chunk, last, self.kv, self.sparse)
        counter.enter("ready")

    # ---- hops --------------------------------------------------------------------------------------
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
            self.threads[1].call(into, self.threads[0].call(out))
        return (time.perf_counter() - start) / repeats

    # ---- prefill -----------------------------------------------------------------------------------
    def prefill_slot(self, slot: int, token_ids: Sequence[int]) -> None:
        ids = np.asarray(token_ids, dtype=np.int32)
        self._prefill(slot, [_Chunk(ids[i : i + self.prefill_chunk]) for i in range(0, len(ids), self.prefill_chunk)])

    @property
    def supports_images(self) -> bool:
        """True when the pipeline was loaded with a vision tower."""
        return self.images is not None

    def encode_image(self, image: PreparedImage) -> np.ndarray:
        """The tower's embeddings [tokens, D] of one prepared image, run on the first card's thread."""
        return self.threads[0].call(loaded_tower(self.images).encode, image)

    def prefill_embedded(self, slot: int, segment: PromptSegment) -> None:
        self._prefill(slot, [_Chunk(np.asarray(p.token_ids, np.int32), p.positions, embedded_runs(p))
                             for p in segment.chunks(self.prefill_chunk)])

    def _prefill(self, slot: int, chunks: list[_Chunk]) -> None:
        first = self.stages[0].decoder
        first.check_room(first.seqs[slot], sum(len(c.ids) for c in chunks))
        run = _Prefill(len(self.stages), len(chunks))
        for c, part in enumerate(chunks):
            self.threads[0].submit(self._chunk, run, 0, slot, c, part, None)
        run.done.result()

    def _chunk(self, run: _Prefill, i: int, slot: int, c: int, part: _Chunk, hidden: np.ndarray | None) -> None:
        """Chunk c on card i (on card i's thread); hands its hidden rows to card i+1's thread."""
        if run.failed:
            return
        st, last = self.stages[i], i == len(self.stages) - 1
        image = {"positions": part.positions, "embedded": part.embedded if i == 0 else None}
        try:
            if last:
                st.decoder.prefill_part(st.decoder.seqs[slot], part.ids, hidden, **image)
            else:
                buf = st.out[c % 2]
                run.free[i][c % 2].wait()
                run.free[i][c % 2].clear()
                st.decoder.prefill_part(st.decoder.seqs[slot], part.ids, hidden, out=buf, **image)
            if i > 0:
                run.free[i - 1][c % 2].set()  # this card has copied the previous card's rows in
            if last:
                if c == run.n_chunks - 1:
                    run.done.set_result(None)
            else:
                rows = self._hop(buf[: len(part.ids)])
                self.threads[i + 1].submit(self._chunk, run, i + 1, slot, c, part, rows)
        except BaseException as err:
            run.fail(err)

    # ---- decode ------------------------------------------------------------------------------------
    def step(self, feeds: Mapping[int, int], masks: Mapping[int, TokenMask] | None = None) -> dict[int, Pick]:
        hidden = None
        for t, st in zip(self.threads[:-1], self.stages[:-1]):
            hidden = self._hop(t.call(st.decoder.step_part, feeds, hidden))
        return self.threads[-1].call(self.stages[-1].decoder.step_part, feeds, hidden, masks)

    def begin(self, slot: int, request: SlotRequest, mask: TokenMask | None = None) -> Pick:
        return self.threads[-1].call(self.stages[-1].decoder.begin, slot, request, mask)

    # ---- slots -------------------------------------------------------------------------------------
    def _on_all(self, method: str, *args) -> list:
        futures = [t.submit(getattr(st.decoder, method), *args) for t, st in zip(self.threads, self.stages)]
        return [f.result() for f in futures]

    def reset_slot(self, slot: int) -> None:
        self._on_all("reset_slot", slot)

    def snapshot_slot(self, slot: int) -> SlotSnapshot:
        parts = self._on_all("snapshot_slot", slot)
        return SlotSnapshot(tuple(parts), sum(p.nbytes for p in parts))

    def restore_slot(self, slot: int, snapshot: SlotSnapshot) -> None:
        futures = [t.submit(st.decoder.restore_slot, slot, part)
                   for t, st, part in zip(self.threads, self.stages, snapshot.state)]
        for f in futures:
            f.result()

    def position(self, slot: int) -> int:
        return self.stages[0].decoder.seqs[slot].next_position

    # ---- the Backend protocol (slot 0) -------------------------------------------------------------
    def new_sequence(self) -> PipelineSequence:
        self.reset_slot(0)
        return PipelineSequence(0)

    def forward_last(self, token_ids: Sequence[int], sequence: PipelineSequence) -> np.ndarray:
        self.prefill_slot(sequence.slot, token_ids)
        return self._last_logits()

    def forward_embedded(self, segment: PromptSegment, sequence: PipelineSequence) -> np.ndarray:
        """`forward_last` of a multimodal prompt segment (for Backend-protocol callers: `rigllm generate --image`)."""
        self.prefill_embedded(sequence.slot, segment)
        return self._last_logits()

    def _last_logits(self) -> np.ndarray:
        last = self.stages[-1].decoder
        return self.threads[-1].call(lambda: last.fwd.logits_row(0).download(np.float32, self.config.vocab_size))

    def decode_on_device(self, seq: PipelineSequence, params: SamplingParams, history: Sequence[int], max_tokens: int,
                         stop_ids: Collection[int] = ()) -> Iterator[int]:
        return decode_tokens(self, seq.slot, params, history, max_tokens, stop_ids,
                             lambda: self.position(seq.slot) >= self.context)

    def close(self) -> None:
        for t, st in zip(self.threads, self.stages):
            t.call(st.close)
        for t in self.threads:
            t.close()


def _even(n_layers: int, n_cards: int) -> list[int]:
    base, extra = divmod(n_layers, n_cards)
    return [base + (i < extra) for i in range(n_cards)]
