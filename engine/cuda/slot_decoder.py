"""Sequence slots on one card: prefill in chunks, and decode steps over any set of slots replayed from
CUDA graphs with sampling on the card (the engine side of engine.generation.slots.SlotBackend).

A decode step moves only token ids across PCIe: the host writes each slot's token and position and the
rows' slots, replays the graph captured for that batch width (embedding → all layers on B rows, the
mixers slot-indexed (engine.cuda.slot_batch) → LM head → every row's sampler and logprobs with its slot's
state (engine.cuda.slot_sampling)) and reads back B ids. Nothing in a graph depends on which slots it
steps, so a card keeps at most one graph per width. Separate from loading (engine.cuda.backend) so benchmarks can
drive it over synthetic weights.

The CUDA backend gives each of its cards (its stages: engine.cuda.backend) a decoder over that card's
trunk layers: `feed_chunk` and `step_part` take the previous card's hidden rows (host memory, fp32)
instead of token ids on a later card and, on a card without the LM head, leave their own hidden rows in
host memory for the next card, after waiting for the copy on the host (the fence anchor-qengine.md
lesson 9 asks for). Only the last card has samplers; a single card is first and last at once.

Image prompts (`prefill_embedded`, spec §9.5-9.6): the image rows' embeddings go up into the first
card's hidden rows after the token embedding, and every card's attention reads the chunk's (t, h, w)
positions from a device buffer. After an image a sequence's rope positions run behind its cache rows
(`DeviceSequence.rope_shift`): later prefill chunks upload their shifted text positions, and decode
steps always read each slot's rope position from the per-step buffer (the same bits as text
positions when there is no shift), so the captured graphs serve both.

With MTP weights a `CudaSpeculator` (engine.cuda.speculative) drafts and verifies: on a single card a step
whose slots all speculate now (requests that allow it, unmasked) and whose verify rows fit one GEMV is one
speculative round for all of them, and may return several tokens per slot (`Pick.extra`). Other steps stay
plain (the speculator keeps their heads fed), and so does every prefill chunk (`feed_chunk` runs the head
over a text chunk's rows). Over several cards the head is on the last card, every card of the backend holds
its share of the verifies (`StageVerifier`: `verify_part`, `commit_verify`), and
engine.cuda.pipeline_speculation runs the rounds across them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from engine.cuda.driver import CudaCard
from engine.cuda.forward import ForwardPass, SequenceRows
from engine.cuda.gemv import MAX_GEMV_TOKENS
from engine.cuda.host_staging import HostStaging
from engine.cuda.prefill_clock import PrefillClock
from engine.cuda.logprobs import LOGPROB_DTYPE, GpuLogprobs, token_logprob_of, token_logprobs_of
from engine.cuda.prefill_chunks import PrefillChunk, segment_chunks, text_chunks
from engine.cuda.sampling import GpuSampler
from engine.cuda.sequence import F16_FORMAT, DeviceSequence
from engine.cuda.slot_batch import ROPE_INTS, STEP_INTS, SlotBatch, upload_slot_tables
from engine.cuda.slot_sampling import SlotSampling
from engine.cuda.sparse_prefill import SparsePrefill
from engine.cuda.speculative import CudaSpeculator
from engine.cuda.stage_verify import StageVerifier
from engine.cuda.step_gaps import StepGaps
from engine.cuda.token_masks import NO_MASK
from engine.cuda.weights import ModelWeights, MtpWeights
from engine.errors import RigllmError
from engine.generation.logprobs import TokenLogprob
from engine.generation.slots import Pick, SlotRequest, SlotSnapshot, SnapshotCosts
from engine.model.kv_formats import KVFormat
from engine.generation.speculative import SpeculationStats
from engine.generation.token_mask import StepMasks, TokenMask, masks_now
from engine.gguf.config import ModelConfig
from engine.reference.rope import text_positions
from engine.sparse.profile import SparseProfile
from engine.vision.multimodal_prompt import PromptSegment

MAX_SLOTS = MAX_GEMV_TOKENS  # a batched step is one GEMV over the slots' rows
DEFAULT_CHUNK = 256  # prefill tokens per forward (the CUDA backends' default `chunk`)


class DecodeGraph:
    """A decode step of `width` rows, captured as a CUDA graph ending in every row's sampler and logprobs.
    Which slot a row continues is data (the batch's row → slot array), and so is each slot's sampling mode:
    the sampler is the full one for every row, and a greedy request's parameters make it take the arg-max
    and skip the rest (sampling.cu's greedy exit). So one graph serves any set of slots in any mix of modes
    (issue 28: keyed by slot sets and modes, 4 slots had 80 possible graphs, 8 slots 6,560). Logprobs return
    at once for rows whose slot did not ask for them. Without `sampling` the graph is the forward pass alone
    (a card without the head, or a masked step's first part: `SlotDecoder._queue_forward`)."""

    def __init__(self, fwd: ForwardPass, batch: SlotBatch, sampling: SlotSampling | None, width: int):
        self.fwd, self.card = fwd, fwd.card
        with self.card.capture(f"{'decode' if sampling else 'forward'} x{width}") as graph:
            step_launches(fwd, batch, sampling, width)
        self.graph = graph


def step_launches(fwd: ForwardPass, batch: SlotBatch, sampling: SlotSampling | None, width: int) -> None:
    """The launches of a decode step of `width` rows (what a DecodeGraph holds): the slot-indexed pass, then,
    on the card with the head, every row's sampler and logprobs."""
    fwd.run_slots(width, batch)
    if sampling is not None:
        pick_launches(fwd, batch, sampling, width)


def pick_launches(fwd: ForwardPass, batch: SlotBatch, sampling: SlotSampling, width: int) -> None:
    """Every row's sampler and logprobs over the forward pass's logits rows."""
    sampling.sample_rows(fwd.logits, width, batch.row_slot)
    sampling.logprob_rows(fwd.logits, width, batch.row_slot)


class SlotDecoder:
    """`slots` sequences of `context` tokens on one card, with their samplers and step graphs; the card runs
    the trunk layers `weights.span` (all of them on a single card)."""

    can_snapshot = True

    def __init__(self, card: CudaCard, cfg: ModelConfig, weights: ModelWeights, context: int, slots: int, chunk: int,
                 kv: KVFormat = F16_FORMAT, mtp: MtpWeights | None = None, draft_tokens: int = 1,
                 sparse: SparseProfile | None = None, verifies: bool = False):
        """`mtp`: the MTP head's weights on this card (which must hold the LM head) to speculate with, drafting
        `draft_tokens` per verify (greedy and sampled requests: engine.cuda.speculative). `verifies`: this card
        of a speculating backend has no head but runs its layers' share of the verifies.
        `sparse`: a calibrated profile for long prefill chunks of this card's attention layers
        (engine.cuda.sparse_prefill); None keeps every chunk dense."""
        if not 1 <= slots <= MAX_SLOTS:
            raise RigllmError(f"the CUDA backend holds 1 to {MAX_SLOTS} slots, not {slots}")
        self.card, self.config, self.context = card, cfg, context
        self.slot_count, self.prefill_chunk = slots, chunk
        self.fwd = ForwardPass(card, cfg, weights, chunk, kv)
        if sparse is not None and cfg.attention_layers:
            layers = [i for i in cfg.attention_layers if i in weights.span]
            self.fwd.sparse = SparsePrefill(card, sparse, self.fwd.dims, layers, chunk, context, kv)
        # [slot][pos, n_tokens], then [slot][t, h, w], then [row] slot, then [slot] mask entry: each slot's step and
        # decode rope position, the stepped rows' slots and each slot's mask for the step, one upload per step
        self._rope_at, self._rows_at = STEP_INTS * slots, (STEP_INTS + ROPE_INTS) * slots
        self._masks_at = self._rows_at + MAX_SLOTS
        self.steps = card.alloc(4 * (self._masks_at + slots), "slot steps")
        self._host_steps = card.pinned(self._masks_at + slots, np.int32)
        self._host_ids = card.pinned(MAX_SLOTS, np.int32)
        self.seqs = [DeviceSequence(card, cfg, context, f"slot{i}", self.steps.view(4 * STEP_INTS * i, 4 * STEP_INTS),
                                    weights.span, kv) for i in range(slots)]
        self.staging = HostStaging(card)  # the slots' snapshots and restores (the prefix cache) go through it
        self.prefill_clock = PrefillClock(card)  # with the staging's copy times: what a restore would save
        self.batch = SlotBatch(self.steps.view(4 * self._rows_at, 4 * MAX_SLOTS), self.steps.view(0, 4 * self._rope_at),
                               self.steps.view(4 * self._rope_at, 4 * ROPE_INTS * slots),
                               upload_slot_tables(card, self.seqs), like=self.seqs[0])
        self.sampling: SlotSampling | None = None
        self.samplers: list[GpuSampler] = []
        self.logprobs: list[GpuLogprobs] = []
        if self.fwd.heads:
            self.sampling = SlotSampling(card, cfg.vocab_size, slots, self.steps.view(4 * self._masks_at, 4 * slots))
            self.samplers, self.logprobs = self.sampling.samplers, self.sampling.logprobs
            self._host_tokens = card.pinned(slots, np.int32)  # row b's pick, then row b's logprob record
            self._host_logprobs = card.pinned(LOGPROB_DTYPE.itemsize * slots, np.uint8)
        else:  # this card's hidden rows, for the next card: portable, so the next context copies at full speed
            self.hidden_out = card.pinned((MAX_SLOTS, cfg.d_model), np.float32, portable=True)
        self._host_logits = [False] * slots
        self._top_logprobs: list[int | None] = [None] * slots  # each slot's request.logprobs
        self._graphs: dict[int, DecodeGraph] = {}  # by batch width
        self._first_pick_rows: dict[int, int] = {}  # slot → the logits row of its last prefill chunk (`begin`'s)
        self._forward_graphs: dict[int, DecodeGraph] = {}  # by batch width, for masked steps (`_queue_forward`)
        if self.sampling is not None:  # a masked step's mask uploads overlap its forward pass on their own stream
            self._mask_stream = card.new_stream()
            self._forward_queued, self._masks_uploaded = card.event(), card.event()
            self._host_entries = card.pinned(slots, np.int32)
        self._queued: tuple[list[int], set[int]] = ([], set())  # the last queued step's slots, and those with logprobs
        # a masked step's slots and feeds between `launch_forward` and `launch_picks` (None: no such step)
        self._forward_only: tuple[list[int], Mapping[int, int]] | None = None
        self.gaps = StepGaps(card)
        self._warm_up()
        self.verifier = (StageVerifier(self.fwd, self.seqs, draft_tokens)
                         if mtp is not None or verifies else None)
        self.speculator = (CudaSpeculator(self.fwd, self.seqs, self.samplers, mtp, self.verifier)
                           if mtp is not None and self.verifier is not None else None)

    @property
    def speculation_stats(self) -> SpeculationStats | None:
        """Acceptance counts over this decoder's life; None when it does not speculate."""
        return self.speculator.stats if self.speculator else None

    def _warm_up(self) -> None:
        """Run every batch width and both pickers once: capturing executes nothing, so each kernel (and GEMV
        variant) must have been loaded by an eager launch before any capture. Leaves every slot empty."""
        self.fwd.h.fill_zero()
        self._write_steps(range(self.slot_count))
        self.steps.upload(self._host_steps)
        for n in range(1, self.slot_count + 1):
            self.fwd.ids.view(0, 4 * n).upload(np.zeros(n, np.int32))
            self.fwd.run_slots(n, self.batch)
        for row, (sampler, lp) in enumerate(zip(self.samplers, self.logprobs)):
            sampler.argmax(self.fwd.logits_row(row))
            sampler.sample(self.fwd.logits_row(row))
            lp.compute(self.fwd.logits_row(row), sampler.token)  # loads the kernels (no slot wants them yet)
        self.card.synchronize()
        for seq in self.seqs:
            seq.reset()

    def reset_slot(self, slot: int) -> None:
        self.gaps.interrupt()
        self.seqs[slot].reset()
        if self.speculator:
            self.speculator.reset(slot)

    def prefill_slot(self, slot: int, token_ids: Sequence[int]) -> None:
        """Run the tokens through the model in chunks (a card with every layer); the last token's logits end in
        row 0."""
        self.check_room(self.seqs[slot], len(token_ids))
        for part in text_chunks(token_ids, self.prefill_chunk):
            self.feed_chunk(slot, part)

    def prefill_embedded(self, slot: int, segment: PromptSegment) -> None:
        """`prefill_slot` of a multimodal prompt's segment: its image rows take their embeddings instead of the
        pad token's, attention uses its (t, h, w) positions; later tokens continue at the largest + 1."""
        self.check_room(self.seqs[slot], len(segment.token_ids))
        for part in segment_chunks(segment, self.prefill_chunk):
            self.feed_chunk(slot, part)

    def feed_chunk(self, slot: int, part: PrefillChunk, hidden: np.ndarray | None = None,
                   out: np.ndarray | None = None) -> None:
        """One prefill chunk of the slot on this card (`prefill_part`), keeping the slot's MTP head in step:
        the head runs over a text chunk's rows; an image chunk leaves the slot behind, since the head runs on
        text positions only (as on the reference). Image rows are spliced in on the first card only."""
        self.gaps.interrupt()
        if self.speculator and part.positions is not None:
            self.speculator.leave_behind(slot)
        self.prefill_part(self.seqs[slot], part.ids, hidden, out, part.positions,
                          part.embedded if self.fwd.embeds else None)
        self._first_pick_rows = {slot: 0}
        if self.speculator and part.positions is None:
            self.speculator.prefilled([(slot, part.ids)])

    def feed_chunks(self, chunks: Sequence[tuple[int, PrefillChunk]], hidden: np.ndarray | None = None,
                    out: np.ndarray | None = None) -> None:
        """Several slots' prefill chunks on this card in one pass (`ForwardPass.run_sequences`: the weights are read
        once for all), chunk j continuing slot `chunks[j][0]` from row sum(earlier chunks' tokens) of `hidden`/`out`
        (as `feed_chunk`); slot j's first pick then reads logits row j. Text chunks only, each slot once; one chunk
        is `feed_chunk`. Every slot's room is checked before anything runs. Each chunk comes out bit for bit as in a
        pass of its own where `forward.shares_pass` allows the chunks' sizes (the backend lets only those
        share)."""
        if len(chunks) == 1:
            self.feed_chunk(*chunks[0], hidden, out)
            return
        self._no_forward_only("a prefill chunk")
        self.gaps.interrupt()
        slots = [slot for slot, _ in chunks]
        if len(set(slots)) != len(slots):
            raise ValueError(f"a slot takes one chunk of a pass, not several: {slots}")
        for slot, part in chunks:
            seq = self.seqs[slot]
            if part.positions is not None or part.embedded or seq.rope_shift:
                raise RigllmError(f"slot {slot}: only text chunks at text positions share a prefill pass")
            self.check_room(seq, len(part.ids))
        ids = np.concatenate([part.ids for _, part in chunks])
        self._take_rows(ids, hidden)
        runs, first = [], 0
        for slot, part in chunks:
            seq = self.seqs[slot]
            seq.set_step(len(part.ids))
            runs.append(SequenceRows(seq, first, len(part.ids)))
            first += len(part.ids)
        with self.prefill_clock.chunk(len(ids)):
            self.fwd.run_sequences(runs)
        for run in runs:
            run.seq.next_position += run.count
        self._first_pick_rows = {slot: j for j, slot in enumerate(slots)}
        if self.speculator:
            self.speculator.prefilled([(slot, part.ids) for slot, part in chunks])
        self._hand_on(out, len(ids))

    def check_room(self, seq: DeviceSequence, n: int) -> None:
        if seq.next_position + n > seq.capacity:
            raise RigllmError(f"{seq.next_position + n} tokens exceed the context of {seq.capacity}")

    def _take_rows(self, ids: np.ndarray, hidden: np.ndarray | None) -> None:
        """A pass's input: the token ids on the first card, the previous card's hidden rows on a later one."""
        if self.fwd.embeds:
            self.fwd.ids.view(0, 4 * len(ids)).upload(np.asarray(ids, dtype=np.int32))
        else:
            self.fwd.h.view(0, hidden.nbytes).upload(hidden)

    def _hand_on(self, out: np.ndarray | None, n: int) -> None:
        """On a card without the head: the pass's n hidden rows into `out`, waited for (the fence before the next
        card reads them)."""
        if not self.fwd.heads:
            self.fwd.h.download_async(out[:n])
            self.card.stream.synchronize()

    def prefill_part(self, seq: DeviceSequence, ids: np.ndarray, hidden: np.ndarray | None = None,
                     out: np.ndarray | None = None, positions: np.ndarray | None = None,
                     embedded: list[tuple[int, np.ndarray]] | None = None) -> None:
        """One chunk of n = len(ids) tokens continuing `seq`. The first card reads `ids`; a later card reads
        `hidden` ([n][D] fp32 host rows from the previous card). A card without the head copies its hidden
        rows into `out` and waits until they are there (the host fence before the next card reads them).
        `positions` ([n][3]) and `embedded` ((first row, [k][D] rows), first card only): an image chunk."""
        self._no_forward_only("a prefill chunk")
        n = len(ids)
        self._take_rows(ids, hidden)
        seq.set_step(n)
        if positions is None and seq.rope_shift:
            positions = text_positions(seq.next_rope_position, n)  # text after an image
        rope = None
        if positions is not None:
            rope = self.fwd.positions.view(0, 12 * n)
            rope.upload(np.asarray(positions, dtype=np.int32).reshape(n, 3))
        with self.prefill_clock.chunk(n):
            self.fwd.run(n, seq, rope, embedded or ())
        seq.next_position += n
        if positions is not None:
            seq.rope_shift = int(np.max(positions)) + 1 - seq.next_position
        self._hand_on(out, n)

    def begin(self, slot: int, request: SlotRequest, mask: TokenMask | None = None) -> Pick:
        """Set up the slot's sampler (parameters, logit_bias and the penalty history on the device) and pick from
        the prefill's logits (row 0, or the slot's row of a pass over several: `feed_chunks`), among the tokens
        `mask` allows."""
        self._no_forward_only("a request's first pick")
        self.gaps.interrupt()
        sampler, params = self.samplers[slot], request.params
        self._host_logits[slot] = request.host_logits
        self._top_logprobs[slot] = request.logprobs
        self.logprobs[slot].want(request.logprobs is not None)
        sampler.configure(params)  # the step graph's sampler reads the mode from here
        sampler.reset_counts()
        self.sampling.set_bias(slot, request.logit_bias)
        entry = NO_MASK if mask is None else self.sampling.masks.entry(mask)
        self.steps.view(4 * (self._masks_at + slot), 4).upload(np.array([entry], np.int32))
        if not params.plain_greedy:  # the penalties see the prompt
            ids = np.asarray(request.history, dtype=np.int32)
            for start in range(0, len(ids), self.prefill_chunk):
                part = ids[start : start + self.prefill_chunk]
                self.fwd.ids.view(0, 4 * len(part)).upload(part)
                sampler.count_tokens(self.fwd.ids, len(part))
        row = self.fwd.logits_row(self._first_pick_rows.get(slot, 0))
        if params.plain_greedy and not request.constrained:
            sampler.argmax(row)
        else:
            sampler.sample(row)
        logits = row.download(np.float32, self.config.vocab_size) if request.host_logits else None
        logprobs = None
        if request.logprobs is not None:
            self.logprobs[slot].compute(row, sampler.token)
            logprobs = self._logprob_record(slot, self.logprobs[slot].out.download(np.uint8, LOGPROB_DTYPE.itemsize))
        if self.speculator:
            self.speculator.begin(slot, request)
        return Pick(sampler.read_token(), logits, logprobs=logprobs)

    def _logprob_record(self, slot: int, raw: np.ndarray) -> TokenLogprob:
        """The slot's downloaded LOGPROB_DTYPE bytes as its pick's logprobs."""
        return token_logprob_of(raw.view(LOGPROB_DTYPE)[0], self._top_logprobs[slot])

    def step(self, feeds: Mapping[int, int], masks: StepMasks | None = None, *,
             hidden: np.ndarray | None = None) -> dict[int, Pick] | np.ndarray:
        """Feed each slot its token (on a later card: the previous card's `hidden` rows) and pick its next one,
        a slot in `masks` among the tokens its mask allows, all in one graph replay (on the card with the LM
        head; a masked step in two parts, `_queue_forward` then `_queue_masked_picks`); on a card with the whole
        model whose slots all speculate, the step may be a speculative round for all of them instead (never a
        masked one: `speculates_together`)."""
        if self.speculates_together(feeds, masks) and self.fwd.embeds:  # the whole model on this card
            rounds = self.speculator.rounds(feeds)
            if rounds is not None:
                return {slot: Pick.of_round(tokens, self.speculator.k) for slot, tokens in rounds.items()}
        return self.step_part(feeds, hidden, masks)

    def speculates_together(self, feeds: Mapping[int, int], masks: StepMasks | None) -> bool:
        """May a step over `feeds` be a speculative round of all its slots: unmasked (a callable counts as masks), on
        a speculating card, slots that may take one together (`CudaSpeculator.together`)? (The round itself may still
        find a slot that cannot take one now: then the step is plain.)"""
        return bool(self.speculator) and not masks and self.speculator.together(feeds)

    def step_part(self, feeds: Mapping[int, int], hidden: np.ndarray | None = None,
                  masks: StepMasks | None = None) -> dict[int, Pick] | np.ndarray:
        """One decode step of the slots in `feeds` on this card. The first card embeds the fed tokens, a later
        card starts from `hidden` (rows in slot order). The last card returns each slot's pick (a slot in
        `masks` among the tokens its mask allows); another card returns its hidden rows (in host memory,
        copied and fenced)."""
        slots = self._queue_step(feeds, hidden, masks)
        if self.fwd.heads:
            self._queue_picks(slots, feeds)
            return self.collect()
        out = self.hidden_out[: len(slots)]
        self.fwd.h.download_async(out)
        self.card.stream.synchronize()
        return out

    def verify_part(self, tokens: Mapping[int, Sequence[int]], hidden: np.ndarray | None) -> np.ndarray:
        """This card's layers of speculative verifies of `tokens` (slot → x_n then its drafts; a card without the LM
        head of a speculating backend; `StageVerifier.verify_part`): its hidden rows, in host memory, for the next
        card."""
        return self._verifier().verify_part(tokens, hidden, self.hidden_out)

    def commit_verify(self, accepted: Mapping[int, int]) -> None:
        """Each slot keeps its state after its verify's first `accepted[slot]` + 1 tokens (`StageVerifier.commit`)."""
        verifier = self._verifier()
        for slot, count in accepted.items():
            verifier.commit(slot, count)

    def _verifier(self) -> StageVerifier:
        if self.verifier is None:
            raise RigllmError("this card takes no part in speculative verifies")
        return self.verifier

    def launch(self, feeds: Mapping[int, int], masks: StepMasks | None = None) -> bool:
        """Queue a plain step over `feeds` on the card and return at once, so the host can work on the previous
        step's text meanwhile (issue 28 item 4); `collect` returns its picks. A callable `masks` is called
        before this returns, once the step's forward pass is queued (`_queue_masked_picks`). Until then the host
        may queue other work (prefill chunks, a request's first pick: they run after the step on the card's
        stream) but no other step. False, with nothing queued, when the step must be taken whole with `step`: a
        speculative round (`speculates_together`), or `_taken_whole`."""
        if self._taken_whole(feeds) or self.speculates_together(feeds, masks):
            return False
        self._queue_picks(self._queue_step(feeds, None, masks), feeds)
        return True

    def launch_forward(self, feeds: Mapping[int, int]) -> bool:
        """Queue a masked step's forward pass over `feeds` and return at once, before its masks can be known (the
        grammars take the previous step's picks in the host's text work, which then runs while the card computes);
        `launch_picks` queues its picks and `collect` returns them. Nothing else may be queued in between but
        `reset_slot` (the picks read the pass's logits rows). False, with nothing queued, where `launch` would be."""
        if self._taken_whole(feeds):
            return False
        slots = self._step_slots(feeds)
        self._queue_forward(slots, feeds, None)
        self._forward_only = (slots, feeds)
        return True

    def _taken_whole(self, feeds: Mapping[int, int]) -> bool:
        """Must a step over `feeds` be taken whole (a card without the LM head, or a slot that wants its logits
        rows, read after the step)?"""
        return not self.fwd.heads or any(self._host_logits[slot] for slot in feeds)

    def launch_picks(self, masks: StepMasks) -> None:
        """The picks of the step `launch_forward` queued, under `masks` (`_queue_masked_picks`)."""
        if self._forward_only is None:
            raise RigllmError("launch_picks without a forward pass queued by launch_forward")
        (slots, feeds), self._forward_only = self._forward_only, None
        self._queue_masked_picks(slots, masks)
        self._queue_picks(slots, feeds)

    def _queue_step(self, feeds: Mapping[int, int], hidden: np.ndarray | None, masks: StepMasks | None) -> list[int]:
        """Upload a step's record and replay its graph (a masked step on the card with the head: `_queue_forward`,
        then `_queue_masked_picks`); the slots in row order."""
        slots = self._step_slots(feeds)
        if masks and self.sampling is not None:
            self._queue_forward(slots, feeds, hidden)
            self._queue_masked_picks(slots, masks)
        else:
            self._queue_rows(slots, feeds, hidden, self._graph(len(slots)), self._host_steps)
        return slots

    def _queue_rows(self, slots: list[int], feeds: Mapping[int, int], hidden: np.ndarray | None,
                    graph: DecodeGraph, record: np.ndarray) -> None:
        """The step's record (`record`: the host's step buffer, every slot's mask entry NO_MASK, or the part
        before the entries) and its rows' inputs, then `graph`."""
        self._write_steps(slots)
        if self.fwd.heads:
            self.gaps.started()
        if self.fwd.embeds:
            for row, slot in enumerate(slots):
                self._host_ids[row] = feeds[slot]
            self.fwd.ids.view(0, 4 * len(slots)).upload_async(self._host_ids[: len(slots)])
        else:
            self.fwd.h.view(0, hidden.nbytes).upload_async(hidden)
        self.steps.view(0, record.nbytes).upload_async(record)
        self.card.replay(graph.graph)
        for slot in slots:
            self.seqs[slot].next_position += 1

    def _step_slots(self, feeds: Mapping[int, int]) -> list[int]:
        """The slots of a step over `feeds`, in row order, once none is full and no masked step awaits its picks."""
        self._no_forward_only("another step")
        slots = sorted(feeds)
        for slot in slots:
            if self.seqs[slot].next_position >= self.context:
                raise RigllmError(f"slot {slot} is full ({self.context} tokens)")
        return slots

    def _no_forward_only(self, what: str) -> None:
        if self._forward_only is not None:
            raise RigllmError(f"{what} cannot be queued between a masked step's forward pass and its picks "
                              "(launch_picks comes first)")

    def _queue_forward(self, slots: list[int], feeds: Mapping[int, int], hidden: np.ndarray | None) -> None:
        """A masked step's first part (issue 28: with a fresh mask in each of 4 rows the card sat idle 214-220 µs a
        step while the host looked the masks up and uploaded them before the step): the step's record without
        the slots' mask entries, and the graph of the forward pass alone, so that the host computes and looks
        up the masks while the card runs it (`_queue_masked_picks`)."""
        width = len(slots)
        forward = self._forward_graphs.get(width)
        if forward is None:  # captured before the event below is recorded: a capture would take the record in
            forward = self._forward_graphs[width] = DecodeGraph(self.fwd, self.batch, None, width)
        self._forward_queued.record()
        self._queue_rows(slots, feeds, hidden, forward, self._host_steps[: self._masks_at])

    def _queue_masked_picks(self, slots: list[int], masks: StepMasks) -> None:
        """A masked step's second part: the masks (computed now when `masks` is a callable: the grammars' work) are
        looked up in the pool, their uploads queued on the mask stream, which waits only for the work queued
        before the step's forward pass (so no earlier step's sampler reads an entry while it is rewritten) and
        followed there by the slots' pool entries (the record the card's stream uploaded stopped short of
        them); then, after those uploads, every row's picks, launched directly rather than from a second graph
        per width (they are queued long before the forward pass ends). Should the masks fail, the step still ends
        (under the masks looked up so far) before the error goes on, so nothing queued reads host memory the next
        step rewrites."""
        width = len(slots)
        entries = self._host_entries
        entries[:] = NO_MASK
        failed = True
        try:
            self._mask_stream.wait_for(self._forward_queued)
            for slot, mask in masks_now(masks).items():
                entries[slot] = self.sampling.masks.entry(mask, self._mask_stream)
            failed = False
        finally:
            self.steps.view(4 * self._masks_at, entries.nbytes).upload_async(entries, self._mask_stream)
            self._masks_uploaded.record(self._mask_stream)
            self.card.stream.wait_for(self._masks_uploaded)
            pick_launches(self.fwd, self.batch, self.sampling, width)
            if failed:
                self.gaps.discard()
                self.card.stream.synchronize()

    def _queue_picks(self, slots: list[int], feeds: Mapping[int, int]) -> None:
        """After a step on the card with the LM head: queue the picks' (and logprob records') read-back and the
        MTP heads' upkeep (`CudaSpeculator.stepped`), then the step's end event."""
        n, size = len(slots), LOGPROB_DTYPE.itemsize
        self.sampling.tokens.view(0, 4 * n).download_async(self._host_tokens[:n])
        asked = {slot for slot in slots if self._top_logprobs[slot] is not None}
        if asked:
            self.sampling.records.view(0, size * n).download_async(self._host_logprobs[: size * n])
        if self.speculator:
            self.speculator.stepped(feeds)
        self.gaps.ended()
        self._queued = (slots, asked)

    def collect(self) -> dict[int, Pick]:
        """The picks of the step queued last (`launch`, or `step`'s own), waiting for it to end."""
        (slots, asked), self._queued = self._queued, ([], set())
        self.gaps.wait()
        rows = [row for row, slot in enumerate(slots) if slot in asked]
        logprobs = {}
        if rows:  # a plain step reads none (the numpy passes would cost it several µs)
            records = self._host_logprobs[: LOGPROB_DTYPE.itemsize * len(slots)].view(LOGPROB_DTYPE)
            asked_rows = records if len(rows) == len(slots) else records[rows]  # a slice, not a copy, when all asked
            logprobs = dict(zip(rows, token_logprobs_of(asked_rows, [self._top_logprobs[slots[r]] for r in rows])))
        picks = {}
        for row, slot in enumerate(slots):
            logits = (self.fwd.logits_row(row).download(np.float32, self.config.vocab_size)
                      if self._host_logits[slot] else None)
            picks[slot] = Pick(int(self._host_tokens[row]), logits, logprobs=logprobs.get(row))
        return picks

    def prepare_step(self, slots: Sequence[int], token: int = 1) -> None:
        """Write a step over `slots` (each fed `token`, at its position) to the card, synchronously, so that
        `step_launches(self.fwd, self.batch, self.sampling, len(slots))` can be timed per kernel (benchmarks)."""
        self._write_steps(slots)
        self.steps.upload(self._host_steps)
        self.fwd.ids.view(0, 4 * len(slots)).upload(np.full(len(slots), token, np.int32))

    def _write_steps(self, slots: Sequence[int]) -> None:
        """The host copy of the step buffer for a step over `slots` (row b continues slots[b]): every slot's
        next position with one token, its rope position, the rows' slots, and every slot's mask pool entry
        (NO_MASK: a masked step uploads its entries after its forward pass, `_queue_masked_picks`)."""
        # whole columns at once: the host writes this before every step while the card waits (a slice assignment
        # per slot and field cost an 8-slot decoder 34 µs a step on the dev machine)
        n, host = len(self.seqs), self._host_steps
        positions = [seq.next_position for seq in self.seqs]
        steps = host[: STEP_INTS * n].reshape(n, STEP_INTS)
        steps[:, 0], steps[:, 1] = positions, 1
        rope = host[self._rope_at : self._rope_at + ROPE_INTS * n].reshape(n, ROPE_INTS)
        rope[:] = np.array([seq.next_rope_position for seq in self.seqs])[:, None]  # (t, h, w) alike for text
        host[self._masks_at : self._masks_at + n] = NO_MASK
        host[self._rows_at : self._rows_at + len(slots)] = slots

    def _graph(self, width: int) -> DecodeGraph:
        """The step graph for `width` rows, captured on first use and kept (at most one per width)."""
        graph = self._graphs.get(width)
        if graph is None:
            graph = self._graphs[width] = DecodeGraph(self.fwd, self.batch, self.sampling, width)
        return graph

    def snapshot_slot(self, slot: int) -> SlotSnapshot:
        self.gaps.interrupt()
        pos, parts = self.seqs[slot].snapshot(self.staging)
        return SlotSnapshot((pos, parts), sum(p.nbytes for p in parts))

    def snapshot_costs(self, tokens: int) -> SnapshotCosts:
        """A snapshot of `tokens` tokens of this card's layers: its copies out and in at this card's last timed staged
        copies, its tokens' prefill at this card's last timed chunk (None where not timed yet)."""
        per_byte, per_token = self.staging.seconds_per_byte, self.prefill_clock.seconds_per_token()
        nbytes = self.seqs[0].snapshot_bytes(tokens)
        out, into = per_byte.get("out"), per_byte.get("in")
        return SnapshotCosts(None if out is None else nbytes * out, None if into is None else nbytes * into,
                             None if per_token is None else tokens * per_token)

    def restore_slot(self, slot: int, snapshot: SlotSnapshot) -> None:
        self.gaps.interrupt()
        self.seqs[slot].restore(snapshot.state, self.staging)
        if self.speculator:
            self.speculator.leave_behind(slot)  # the snapshot holds no head cache
