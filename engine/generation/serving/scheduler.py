"""Continuous batching over sequence slots, with prefix reuse: the loop the generation worker runs.

Each turn of the loop (1) admits waiting jobs into free slots, choosing the slot whose kept state
covers the longest prefix of the job's prompt (a finished request's live state, or a snapshot from
the prefix cache), (2) runs one prefill chunk of one admitted job, and (3) decodes one token for every
decoding slot in one batched step. So a long prompt delays the others' next token by one chunk, not
by its whole prefill, and a request that arrives mid-generation joins the running batch. On a backend
that prefills several slots in one pass (`PrefillBatcher`), the pass of (2) is shared, oldest job
first, by the waiting text prompts whose next parts fit in it and may share it (each part exactly the
one it would take alone, so every request gets the bits it would get alone): requests that arrive
together take one pass, not one each (on the H200 four 54-token 9B prompts took 52 ms in one pass
against 77 ms in four, s24a).

Sampling parameters live in the slot for the duration of its request (`SlotBackend.begin`), so
nothing leaks between requests; a cancelled job leaves its slot at the next turn. Constraints are the
backend's to apply where it samples: a job's logit_bias goes with its request, and every pick of a
constrained job (a grammar, a thinking budget's forced `</think>`) comes with the job's token mask for that
pick (`JobOutput.next_mask`), so no logits row ever comes back to the host.

A request can fail only itself: every per-request step (admission, prefill, a token through its text
pipeline, its sink) runs under a guard that ends that job with a `Failed` and frees its slot, and
every job that leaves, however it ends, is reported through `on_leave` (the worker's admission count).

Between turns it also runs the calls other threads need on the backend's own thread (`tasks`: the
CUDA backend's vision tower encoding a request's images).

A job with images (`Job.multimodal`) is prefilled through the backend's `prefill_embedded`, chunk by
chunk (`MultimodalPrompt.segment`). It starts from an empty slot and leaves no reusable state (no
turn snapshot; the slot forgets its tokens on release): kept states are keyed by token ids, and the
pads of two different images have the same ids.
"""

from __future__ import annotations

import itertools
import logging
import queue
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import cast

from engine.generation.prefix_cache import PrefixCache
from engine.generation.slots import (ImagePrefill, MaskedStepLauncher, Pick, PrefillBatcher, SlotBackend, SlotRequest,
                                     StepLauncher, batches_prefill, launches_masked_steps, launches_steps,
                                     shared_pass, snapshot_costs, supports_images)
from engine.generation.tokenizer import Tokenizer
from engine.generation.token_mask import TokenMask
from engine.generation.serving.early_launch import UNSURE, next_feed
from engine.generation.serving.generation_job import Failed, Job, JobOutput, Progress
from engine.generation.serving.multimodal_chat import IMAGES_UNSUPPORTED
from engine.generation.serving.owner_tasks import OwnerTasks, Wake

log = logging.getLogger("rigllm.server")


@dataclass
class _Slot:
    index: int
    tokens: list[int] = field(default_factory=list)  # what the slot's state has seen, in order
    last_used: int = 0
    job: Job | None = None
    output: JobOutput | None = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to prefill
    snapshot_at: int = 0  # take a snapshot when `tokens` reaches this length (0: none)
    next_token: int | None = None  # picked, to be fed at the next step
    cached: int = 0
    started: float = 0.0
    first_token: float = 0.0

    @property
    def decoding(self) -> bool:
        return self.job is not None and self.next_token is not None


class Scheduler:
    """Owns the slots of one backend; `run` is the worker thread's whole life after loading."""

    def __init__(self, slots: SlotBackend, tokenizer: Tokenizer, cache: PrefixCache | None = None,
                 on_leave: Callable[[Job], None] = lambda job: None):
        self.backend = slots
        self._on_leave = on_leave
        self.stop_ids: Collection[int] = tokenizer.eos_ids
        self._tokenizer = tokenizer
        self.cache = cache if slots.can_snapshot else None
        self.supports_images = supports_images(slots)
        self.tasks = OwnerTasks()
        self.slots = [_Slot(i) for i in range(slots.slot_count)]
        self._launches = launches_steps(slots)
        self._launches_masked = launches_masked_steps(slots)
        self._batches_prefill = batches_prefill(slots)
        # the step launched before its picks' text work: slot → (its job, the token fed), until collected
        self._launched: dict[int, tuple[Job, int]] | None = None
        self._picks_owed = False  # the launched step is a masked one's forward pass: its picks follow the text work
        self._clock = itertools.count(1)

    @property
    def active(self) -> int:
        return sum(s.job is not None for s in self.slots)

    # ---- the loop --------------------------------------------------------------------------------
    def run(self, jobs: "queue.Queue[Job | Wake | None]") -> None:
        """Serve jobs until a None arrives; jobs already running are finished first."""
        closing = False
        try:
            while True:
                closing = self._admit(jobs, closing)
                self.tasks.run_pending()
                if closing and not self.active:
                    self._settle()
                    self._refuse_waiting(jobs)
                    return
                self._drop_cancelled()
                self._prefill_one()
                self._decode()
        finally:
            self.tasks.close()

    def _settle(self) -> None:
        """Wait for a step launched for jobs that have all ended since (its picks are dropped)."""
        if self._launched is not None:
            self._launched = None
            cast(StepLauncher, self.backend).collect()

    def _admit(self, jobs: "queue.Queue[Job | Wake | None]", closing: bool) -> bool:
        while not closing and any(s.job is None for s in self.slots):
            try:
                job = jobs.get(block=not self.active)
            except queue.Empty:
                break
            if job is None:
                return True
            if isinstance(job, Wake):  # owner tasks are waiting: run them before blocking again
                break
            if job.cancelled.is_set():
                self._on_leave(job)
                continue
            try:
                self._start(job)
            except Exception as err:  # the job fails; the loop goes on
                log.exception("could not start a request")
                self._abandon(job, err)
        return closing

    def _abandon(self, job: Job, err: Exception) -> None:
        """End a job that holds no slot (or whose slot was already freed) with a failure."""
        for slot in self.slots:
            if slot.job is job:
                slot.job = slot.output = None
                slot.next_token, slot.pending, slot.snapshot_at, slot.tokens = None, [], 0, []
        _post(job, Failed(f"generation failed: {type(err).__name__}: {err}"))
        self._on_leave(job)

    # ---- admission -------------------------------------------------------------------------------
    def _start(self, job: Job) -> None:
        if job.multimodal is not None and not self.supports_images:  # the worker refuses these before queueing
            _post(job, Failed(IMAGES_UNSUPPORTED))
            self._on_leave(job)
            return
        prompt = job.prompt_ids
        cache = self.cache if job.multimodal is None else None
        free = [s for s in self.slots if s.job is None]
        live = max((s for s in free if job.multimodal is None and _extends(prompt, s.tokens)),
                   key=lambda s: len(s.tokens), default=None)
        live_len = len(live.tokens) if live else 0
        cached_len, snap = cache.longest_prefix(prompt) if cache is not None else (0, None)
        if snap is not None and cached_len > live_len and not snapshot_costs(self.backend, cached_len).restore_pays():
            cached_len, snap = 0, None  # prefilling those tokens again is quicker than copying their state in
        try:
            if live is not None and live_len >= cached_len:
                slot, reuse = live, live_len
            else:
                slot = min(free, key=lambda s: s.last_used)
                if snap is not None:
                    self.backend.restore_slot(slot.index, snap)
                    reuse = cached_len
                else:
                    self.backend.reset_slot(slot.index)
                    reuse = 0
                slot.tokens = list(prompt[:reuse])
        except Exception as err:  # a failed restore must not take the worker down
            log.exception("could not prepare a slot")
            _post(job, Failed(f"generation failed: {type(err).__name__}: {err}"))
            self._on_leave(job)
            return
        output = JobOutput(job, self._tokenizer)
        slot.job, slot.output = job, output
        slot.pending = list(prompt[reuse:])
        slot.cached = reuse
        slot.next_token = None
        keep = (cache is not None and job.turn_start > reuse and prompt[: job.turn_start] not in cache
                and snapshot_costs(self.backend, job.turn_start).keep_pays())
        slot.snapshot_at = job.turn_start if keep else 0
        slot.started = time.perf_counter()
        slot.last_used = next(self._clock)
        _report(slot)

    # ---- prefill ---------------------------------------------------------------------------------
    def _prefill_one(self) -> None:
        """One prefill pass: the oldest waiting job's next chunk, shared with other waiting text prompts where the
        backend can (`_shared_pass`)."""
        waiting = sorted((s for s in self.slots if s.job is not None and s.next_token is None),
                         key=lambda s: s.last_used)
        if not waiting:
            return
        shared = self._shared_pass(waiting)
        if len(shared) > 1:
            self._prefill_together(shared)
            return
        slot = waiting[0]
        assert slot.job is not None
        part = slot.pending[: self._part_limit(slot)]
        try:
            if slot.job.multimodal is not None:  # only admitted when the backend is an ImagePrefill
                start = len(slot.tokens)
                segment = slot.job.multimodal.segment(start, start + len(part))
                cast(ImagePrefill, self.backend).prefill_embedded(slot.index, segment)
            else:
                self.backend.prefill_slot(slot.index, part)
            self._prefilled(slot, part)
        except Exception as err:
            self._fail(slot, err)

    def _part_limit(self, slot: _Slot) -> int:
        """The most tokens of the slot's prompt one pass takes: a chunk, or up to where its snapshot is due."""
        limit = self.backend.prefill_chunk
        if slot.snapshot_at > len(slot.tokens):
            limit = min(limit, slot.snapshot_at - len(slot.tokens))
        return limit

    def _shared_pass(self, waiting: list[_Slot]) -> list[tuple[_Slot, list[int]]]:
        """The parts of a pass shared by waiting text prompts: the oldest one's next part, then, oldest first, every
        other one's next part (never cut shorter than alone) that the backend lets share the pass with them (nothing
        when the oldest has images or the backend cannot)."""
        if not self._batches_prefill or waiting[0].job.multimodal is not None:  # type: ignore[union-attr]
            return []
        text = [(slot, slot.pending[: self._part_limit(slot)]) for slot in waiting
                if slot.job.multimodal is None]  # type: ignore[union-attr]
        taken = shared_pass([len(part) for _, part in text], cast(PrefillBatcher, self.backend).shares_prefill)
        return [text[i] for i in taken]

    def _prefill_together(self, parts: list[tuple[_Slot, list[int]]]) -> None:
        """One pass over several slots' parts. Should the pass fail, every slot in it fails (their states may have
        moved on); each slot's own text work after it fails only that slot."""
        try:
            cast(PrefillBatcher, self.backend).prefill_slots({slot.index: part for slot, part in parts})
        except Exception as err:
            for slot, _ in parts:
                self._fail(slot, err)
            return
        for slot, part in parts:
            try:
                self._prefilled(slot, part)
            except Exception as err:
                self._fail(slot, err)

    def _prefilled(self, slot: _Slot, part: list[int]) -> None:
        """The slot's state has taken `part`: keep a snapshot where one is due, and once the whole prompt is in, begin
        the request with its first pick."""
        assert slot.job is not None
        slot.pending = slot.pending[len(part):]
        slot.tokens += part
        _report(slot)
        if slot.snapshot_at and len(slot.tokens) == slot.snapshot_at:
            self._keep_snapshot(slot)
        if not slot.pending:
            job, out = slot.job, slot.output
            assert out is not None
            request = SlotRequest(job.params, job.prompt_ids, speculative=job.speculative,
                                  logprobs=job.top_logprobs, logit_bias=job.logit_bias, masked=out.masked)
            pick = self.backend.begin(slot.index, request, out.next_mask())
            slot.first_token = time.perf_counter()
            self._take(slot, pick)

    def _keep_snapshot(self, slot: _Slot) -> None:
        assert self.cache is not None
        snapshot = self.backend.snapshot_slot(slot.index)
        if snapshot is not None:
            self.cache.put(slot.tokens, snapshot)
        slot.snapshot_at = 0

    # ---- decode ----------------------------------------------------------------------------------
    def _decode(self) -> None:
        if self._launched is not None:
            self._take_launched()
            return
        decoding = [s for s in self.slots if s.decoding]
        if not decoding:
            return
        failed: list[tuple[_Slot, Exception]] = []
        feeds = {s.index: s.next_token for s in decoding}
        masked = any(s.output.masked for s in decoding)  # type: ignore[union-attr]
        # the masks are computed when the backend calls for them (the CUDA backend: once the step's forward pass
        # is on the card, so the grammars' work overlaps it)
        step_masks = (lambda: self._masks_of(decoding, failed)) if masked else None
        try:
            picks = self.backend.step(feeds, step_masks)  # type: ignore[arg-type]
        except Exception as err:
            for s in decoding:
                self._fail(s, err)
            return
        for s, err in failed:  # fed, so their state moved on: reset by _fail
            decoding.remove(s)
            self._fail(s, err)
        self._take_step(decoding, feeds, picks)  # type: ignore[arg-type]

    @staticmethod
    def _masks_of(slots: list[_Slot], failed: list[tuple[_Slot, Exception]]) -> dict[int, TokenMask]:
        """Each slot's token mask for its next pick (none where its job sets none). A grammar that fails ends its
        own job only: it is noted in `failed`, for the caller to end once the step is queued."""
        masks = {}
        for s in slots:
            try:
                mask = s.output.next_mask()  # type: ignore[union-attr]
            except Exception as err:
                failed.append((s, err))
                continue
            if mask is not None:
                masks[s.index] = mask
        return masks

    def _still_running(self, launched: dict[int, tuple[Job, int]]) -> list[_Slot]:
        """The slots of a launched step whose job is still the one the step was launched for."""
        return [self.slots[i] for i, (job, _) in launched.items() if self.slots[i].job is job]

    def _take_launched(self) -> None:
        """Collect the step launched early (`_launch_next`) and take its picks. A slot whose job ended while the
        step ran counted its fed token at its release; its pick is dropped."""
        launched, self._launched = self._launched or {}, None
        try:
            picks = cast(StepLauncher, self.backend).collect()
        except Exception as err:
            for s in self._still_running(launched):
                self._fail(s, err)
            return
        stepped = self._still_running(launched)
        for s in stepped:
            s.next_token = None  # fed already
        self._take_step(stepped, {i: token for i, (_, token) in launched.items()}, picks)

    def _take_step(self, stepped: list[_Slot], feeds: dict[int, int], picks: dict[int, Pick]) -> None:
        """The fed tokens join each slot's tokens; the next step is launched if it can be (before the picks'
        text work, which then runs while the card computes); then every pick goes through its job's text, and a
        masked step launched so gets its picks, under the masks its grammars give now."""
        for s in stepped:
            s.tokens.append(feeds[s.index])
        self._launch_next(stepped, picks)
        for s in stepped:
            try:
                self._take_run(s, picks[s.index])
            except Exception as err:  # this request's text pipeline or sink failed: it alone ends
                self._fail(s, err)
        self._launch_owed_picks()

    def _launch_next(self, stepped: list[_Slot], picks: dict[int, Pick]) -> None:
        """Queue the next step on the card now when every slot in it is known before any text work: each stepped
        slot's pick either ends its job for sure or continues it for sure (`next_feed`). A step with a masked slot
        is launched only on a backend that takes its forward pass alone (`MaskedStepLauncher`): its grammars must
        take the picks first, so its picks follow the text work (`_launch_owed_picks`). Otherwise the next turn
        steps as usual."""
        if not self._launches:
            return
        feeds: dict[int, int] = {}
        for s in stepped:
            assert s.job is not None and s.output is not None
            token = next_feed(s.job, s.output, picks[s.index], self.stop_ids, self._launches_masked)
            if token is UNSURE:
                return
            if token is not None:
                feeds[s.index] = token
        for s in self.slots:  # slots that began since (their first pick waits): they join this step
            if s.decoding and s not in stepped:
                if s.output is None or (s.output.masked and not self._launches_masked):
                    return
                feeds[s.index] = s.next_token  # type: ignore[assignment]
        if not feeds:
            return
        masked = any(self.slots[i].output.masked for i in feeds)  # type: ignore[union-attr]
        try:
            if masked:  # its forward pass now, its picks once the grammars have taken these picks
                launched = cast(MaskedStepLauncher, self.backend).launch_forward(feeds)
            else:
                launched = cast(StepLauncher, self.backend).launch(feeds)
        except Exception:  # the step will be taken as usual, and fail there if it must
            log.exception("could not launch a step early")
            return
        if launched:
            self._launched = {i: (self.slots[i].job, token) for i, token in feeds.items()}  # type: ignore[misc]
            self._picks_owed = masked

    def _launch_owed_picks(self) -> None:
        """The picks of a masked step whose forward pass `_launch_next` launched, once the text work has run: each
        launched slot whose job goes on gets its grammar's mask now. A slot whose job ended meanwhile gets none
        (its pick is dropped), and one whose grammar fails ends its own job, after the picks are queued (its
        state took the fed token: `_fail` resets it). Should the picks not be queued, the step's jobs fail."""
        if not self._picks_owed:
            return
        self._picks_owed = False
        launched = self._launched or {}
        failed: list[tuple[_Slot, Exception]] = []
        masks = self._masks_of(self._still_running(launched), failed)
        try:
            cast(MaskedStepLauncher, self.backend).launch_picks(masks)
        except Exception as err:
            self._launched = None
            for s in self._still_running(launched):
                self._fail(s, err)
            return
        for s, err in failed:
            self._fail(s, err)

    def _take_run(self, slot: _Slot, pick: Pick) -> None:
        """A step's tokens in order (several with speculative decoding), each through every stop rule.

        The slot's state has consumed all of them but the last, whether or not the job uses them, so
        they join `slot.tokens` first (a follow-up's prompt is matched against what the state holds).
        """
        run = pick.tokens
        slot.tokens += run[:-1]
        if pick.drafted:
            assert slot.output is not None
            slot.output.count_drafts(pick.drafted, len(pick.extra))
        self._take(slot, pick)
        for token in run[1:]:
            if slot.next_token is None:  # the job ended (or failed) on an earlier token
                return
            self._take(slot, Pick(token))

    def _take(self, slot: _Slot, pick: Pick) -> None:
        """Handle a slot's newly picked token: end the job, or queue the token for the next step."""
        job, out = slot.job, slot.output
        assert job is not None and out is not None
        slot.next_token = None
        if pick.token < 0:
            self._release(slot)
            _post(job, Failed("the model produced NaN or infinite logits"))
            return
        token = pick.token
        if token in self.stop_ids:
            self._finish(slot, "stop")
            return
        stopped = out.add(token, pick.logprobs if job.top_logprobs is not None else None)
        _report(slot)
        if stopped or job.cancelled.is_set() or out.complete:
            self._finish(slot, "stop")
        elif out.generated >= job.max_tokens or (job.deadline is not None and time.monotonic() >= job.deadline):
            self._finish(slot, "length")
        else:
            slot.next_token = token
            slot.last_used = next(self._clock)

    # ---- endings ---------------------------------------------------------------------------------
    def _finish(self, slot: _Slot, reason: str) -> None:
        job, out = slot.job, slot.output
        assert job is not None and out is not None
        now = time.perf_counter()
        try:
            out.finish(reason, len(job.prompt_ids), slot.cached, slot.first_token - slot.started, now - slot.first_token)
        except Exception as err:  # its parser or sink failed: the job ends with that failure instead
            self._fail(slot, err)
            return
        self._release(slot)

    def _fail(self, slot: _Slot, err: Exception) -> None:
        log.exception("generation failed", exc_info=err)
        job = slot.job
        try:
            self._release(slot, keep_state=False)
        except Exception:  # the slot could not even be reset: forget its state and go on
            log.exception("could not reset slot %d", slot.index)
            slot.tokens = []
        if job is not None:
            _post(job, Failed(f"generation failed: {type(err).__name__}: {err}"))

    def _drop_cancelled(self) -> None:
        for slot in self.slots:
            if slot.job is not None and slot.job.cancelled.is_set():
                try:
                    self._release(slot)
                except Exception as err:
                    self._fail(slot, err)

    def _release(self, slot: _Slot, keep_state: bool = True) -> None:
        """Free the slot; its state stays for a follow-up unless it may be inconsistent or saw images
        (their pads' token ids do not say which image they were, so no follow-up may match them)."""
        job = slot.job
        saw_images = job is not None and job.multimodal is not None
        if self._launched is not None and slot.index in self._launched and keep_state:
            slot.tokens.append(self._launched[slot.index][1])  # the launched step feeds it to the state
        slot.job = slot.output = None
        slot.next_token = None
        slot.pending = []
        slot.snapshot_at = 0
        if saw_images or not keep_state:
            slot.tokens = []
        if job is not None:
            self._on_leave(job)
        if not keep_state:
            self.backend.reset_slot(slot.index)

    def _refuse_waiting(self, jobs: "queue.Queue[Job | Wake | None]") -> None:
        """Answer the jobs still queued when the worker stops, so no requester waits forever."""
        while True:
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                return
            if isinstance(job, Job):
                _post(job, Failed("the model was unloaded before this request started", status=503))
                self._on_leave(job)

    def fail_all(self, jobs: "queue.Queue[Job | Wake | None]", reason: str) -> None:
        """The loop itself died: answer every job it holds or that waits, so none waits forever."""
        for slot in self.slots:
            if slot.job is not None:
                job, slot.job, slot.output, slot.next_token = slot.job, None, None, None
                _post(job, Failed(reason, status=503))
                self._on_leave(job)
        self._refuse_waiting(jobs)


def _post(job: Job, event: Failed) -> None:
    """Tell a job it failed; a sink that raises is logged, never allowed to stop the loop."""
    try:
        job.post(event)
    except Exception:
        log.exception("could not deliver a request's failure")


def _report(slot: _Slot) -> None:
    """Tell the job's requester how far it has got, if it asked (`Job.on_progress`)."""
    job, out = slot.job, slot.output
    if job is not None and out is not None and job.on_progress is not None:
        job.on_progress(Progress(len(job.prompt_ids) - len(slot.pending), len(job.prompt_ids), slot.cached,
                                 out.generated, time.perf_counter() - slot.started))


def _extends(prompt: list[int], tokens: list[int]) -> bool:
    """Does `prompt` start with all of `tokens` and have at least one token more?"""
    return 0 < len(tokens) < len(prompt) and prompt[: len(tokens)] == tokens
