"""Sequence slots: the interface a scheduler drives to decode several requests together.

A slot is one sequence's state (KV cache, GDN state, position) that lives as long as the backend, so
a finished request's state stays there for a follow-up that extends it. Each step feeds one token to
every decoding slot at once (on CUDA one batched pass: the weights are read once for all of them) and
picks the next token of each with that slot's own sampling parameters. `HostSlots` gives any plain
`Backend` this interface (a forward per slot, sampling on the host); the CUDA backend implements it
natively with on-device sampling.

Images are an optional capability (`ImagePrefill`): a slot backend with `supports_images` true also
prefills prompt segments that carry image embedding rows and M-RoPE positions. `HostSlots` has it
over a backend with `forward_embedded` (the reference's); the CUDA backends have it natively when
loaded with an mmproj (vision tower).

Constraints are applied where a backend samples: a request's `logit_bias`, and for a `masked` request the
token mask that comes with each pick (`begin`'s `mask`, `step`'s `masks`: engine.generation.token_mask) —
on the card for CUDA, on the host for `HostSlots`. Only ids (and logprob records) come back.

Speculative decoding is another (engine.generation.speculative): a step may then return several
tokens for a slot (`Pick.extra`); all but the last are already consumed by the slot's state, and the
last is the one fed at the next step. `HostSlots` speculates over a backend's `speculative_model` (the
reference's, when it has an MTP head; on by default, off per backend or per request with
`SlotRequest.speculative`); the CUDA backend does it natively, on one card or over several
(engine.cuda.speculative, engine.cuda.pipeline_speculation).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from engine.errors import RigllmError
from engine.generation.backend import Backend, takes_embeddings
from engine.generation.logprobs import TokenLogprob, token_logprobs
from engine.generation.sampler import Sampler, SamplingParams
from engine.generation.speculative import MtpSpeculator, SpeculationStats, speculation_rng
from engine.generation.token_mask import StepMasks, TokenMask, constrain_row, masks_now
from engine.reference.speculative_state import MtpTrail
from engine.gguf.config import ModelConfig

if TYPE_CHECKING:
    from engine.vision.multimodal_prompt import PromptSegment


@dataclass(frozen=True)
class SlotRequest:
    """How a slot picks tokens for one request."""

    params: SamplingParams
    history: Sequence[int]  # the tokens the penalties see before the first pick (the prompt)
    host_logits: bool = False  # return each step's logits row (backend comparisons and tests)
    # draft with the MTP head when the backend speculates (never with host_logits, logprobs or constraints)
    speculative: bool = True
    # the picked token's logprob and this many alternatives (0..MAX_TOP_LOGPROBS) in every Pick, computed where
    # the logits are (on the card for the CUDA backend: 176 bytes read back instead of the row)
    logprobs: int | None = None
    # token id → bias added to the raw logits before every pick (OpenAI's logit_bias: at most 300 ids)
    logit_bias: Mapping[int, float] | None = None
    # the request's picks may come with a token mask (`begin`'s and `step`'s masks: a grammar, a forced
    # token), so the slot takes one token per step
    masked: bool = False

    @property
    def constrained(self) -> bool:
        """The picks are biased or masked: only the backend's plain sampler may take them, one per step."""
        return self.masked or bool(self.logit_bias)


@dataclass(frozen=True)
class Pick:
    token: int  # -1: the logits were NaN or infinite
    logits: np.ndarray | None = None  # the row the token was picked from, when the request asked for it
    extra: tuple[int, ...] = ()  # tokens after `token` from the same step (speculative decoding)
    drafted: int = 0  # drafts the step verified (speculative decoding); len(extra) of them were accepted
    logprobs: TokenLogprob | None = None  # of `token` under the row's raw logits, when the request asked (logprobs)

    @property
    def tokens(self) -> tuple[int, ...]:
        """Every token of the step in order; the slot's state has consumed all but the last."""
        return (self.token,) + self.extra

    @classmethod
    def of_round(cls, tokens: Sequence[int], drafted: int) -> Pick:
        """A speculative round's tokens (accepted drafts + one) as one step's pick, with the drafts it verified."""
        return cls(tokens[0], None, tuple(tokens[1:]), drafted)


@dataclass(frozen=True)
class SlotSnapshot:
    """A copy of one slot's state; `nbytes` is what keeping it costs (host memory)."""

    state: Any
    nbytes: int


class SlotBackend(Protocol):
    name: str
    config: ModelConfig
    slot_count: int
    prefill_chunk: int  # the scheduler prefills at most this many tokens between decode steps
    can_snapshot: bool  # whether snapshot_slot returns snapshots

    def reset_slot(self, slot: int) -> None:
        """Empty the slot (position 0)."""

    def prefill_slot(self, slot: int, token_ids: Sequence[int]) -> None:
        """Continue the slot's sequence with `token_ids`; keeps the last token's logits for `begin`."""

    def begin(self, slot: int, request: SlotRequest, mask: TokenMask | None = None) -> Pick:
        """Configure the slot's sampling for a request and pick its first token from the prefill's logits
        (among the tokens `mask` allows, for a `masked` request: engine.generation.token_mask)."""

    def step(self, feeds: Mapping[int, int], masks: StepMasks | None = None) -> dict[int, Pick]:
        """Feed one token to each slot in `feeds` (slot → token) and pick each slot's next token, a slot in
        `masks` among the tokens its mask allows. `masks` may be a callable that computes them: it is called
        once, by a backend that can after the step's forward pass is queued (so the grammars' work overlaps it),
        else first (`masks_now`). A callable counts as masks: the step is plain, never a speculative round."""

    def snapshot_slot(self, slot: int) -> SlotSnapshot | None:
        """A copy of the slot's state, or None when this backend cannot take one."""

    def restore_slot(self, slot: int, snapshot: SlotSnapshot) -> None:
        """Make the slot's state the snapshot's."""

    def close(self) -> None:
        """Release the backend."""


class StepLauncher(Protocol):
    """The optional overlap capability of a `SlotBackend` (`launches_steps`): a plain step queued on the device
    without waiting, so the host's text work for the previous step runs while the device computes."""

    def launch(self, feeds: Mapping[int, int], masks: StepMasks | None = None) -> bool:
        """Queue `step(feeds, masks)` and return at once; False (nothing queued) when this step must be taken
        whole with `step` (a speculative round, several cards). Until `collect`, the caller may prefill and
        begin other slots (they run after the step) but not step."""

    def collect(self) -> dict[int, Pick]:
        """The launched step's picks, once it has ended."""


def launches_steps(slots: SlotBackend) -> bool:
    """Does this slot backend have the `StepLauncher` capability?"""
    return callable(getattr(slots, "launch", None)) and callable(getattr(slots, "collect", None))


class PrefillBatcher(Protocol):
    """The optional capability of a `SlotBackend` (`batches_prefill`) to prefill several slots' prompt parts in one
    pass: the CUDA backend then reads the weights once for all of them, where requests that arrive together would
    otherwise take a pass each, one after another. Only parts that come out exactly as in passes of their own share
    one (`shares_prefill`), so a request's output never depends on what arrived beside it."""

    def shares_prefill(self, counts: Sequence[int]) -> bool:
        """Can parts of these token counts share one pass, each giving the bits a pass of its own gives?"""

    def prefill_slots(self, parts: Mapping[int, Sequence[int]]) -> None:
        """`prefill_slot` of each slot's part (slot → its tokens; `shares_prefill` allows their counts); each slot
        keeps its own last token's logits for its `begin`."""


def batches_prefill(slots: SlotBackend) -> bool:
    """Does this slot backend have the `PrefillBatcher` capability?"""
    return all(callable(getattr(slots, name, None)) for name in ("prefill_slots", "shares_prefill"))


def shared_pass(counts: Sequence[int], shares: Callable[[list[int]], bool]) -> list[int]:
    """Which waiting parts (their token counts, oldest first) one prefill pass takes: the oldest, then each later one
    that `shares` lets join those already taken (the scheduler's cut, which `rigllm bench` times too)."""
    taken: list[int] = []
    for i, n in enumerate(counts):
        if not taken or shares([counts[j] for j in taken] + [n]):
            taken.append(i)
    return taken


@dataclass(frozen=True)
class SnapshotCosts:
    """Seconds a snapshot of some tokens costs, as a backend measured them: copying it out of a slot now, copying it into
    one later, prefilling its tokens again instead (None: not measured yet). Copying a slot's state over a slow host
    link can take longer than that prefill (a 9B slot's 50 MB of GDN state is about 0.2 s each way over a CMP's PCIe
    Gen1 x1, where a hundred-odd tokens prefill), and then a snapshot does not pay."""

    copy_out: float | None = None
    copy_in: float | None = None
    prefill: float | None = None

    def restore_pays(self) -> bool:
        """Copy a kept snapshot in unless that was measured to take longer than the prefill (unmeasured: restore,
        which times the copy in)."""
        return self.copy_in is None or self.prefill is None or self.copy_in < self.prefill

    def keep_pays(self) -> bool:
        """Keep a snapshot only where one restore repays both copies against the prefill, the copy in estimated as the
        copy out (the same bytes over the same link) until one was timed; unmeasured, keep it (its copy times the
        link)."""
        if self.copy_out is None or self.prefill is None:
            return True
        copy_in = self.copy_out if self.copy_in is None else self.copy_in
        return self.copy_out + copy_in < self.prefill


class SnapshotPricing(Protocol):
    """The optional capability of a `SlotBackend` to price its snapshots (`snapshot_costs`)."""

    def snapshot_costs(self, tokens: int) -> SnapshotCosts:
        """What a snapshot of a slot holding `tokens` tokens costs, as far as the backend has measured it."""


def snapshot_costs(slots: SlotBackend, tokens: int) -> SnapshotCosts:
    """`slots.snapshot_costs(tokens)` where the backend has the `SnapshotPricing` capability, else nothing measured."""
    price = getattr(slots, "snapshot_costs", None)
    return price(tokens) if callable(price) else SnapshotCosts()


class MaskedStepLauncher(StepLauncher, Protocol):
    """The optional overlap capability for masked steps (`launches_masked_steps`): a step's forward pass queued
    before its masks are known (they come from the grammars once they have taken the previous step's picks, in
    the host's text work, which then runs while the device computes), its picks queued once they are."""

    def launch_forward(self, feeds: Mapping[int, int]) -> bool:
        """Queue the forward pass of a step over `feeds` and return at once; False (nothing queued) when the step
        must be taken whole with `step`. `launch_picks` must come next: until then the caller may only reset
        slots (no prefill, first pick or other step)."""

    def launch_picks(self, masks: StepMasks) -> None:
        """Queue the picks of the step `launch_forward` queued, a slot in `masks` among the tokens its mask
        allows; `collect` returns them."""


def launches_masked_steps(slots: SlotBackend) -> bool:
    """Does this slot backend have the `MaskedStepLauncher` capability?"""
    return launches_steps(slots) and all(callable(getattr(slots, name, None))
                                         for name in ("launch_forward", "launch_picks"))


class ImagePrefill(Protocol):
    """The optional image capability of a `SlotBackend` (see `supports_images` before calling)."""

    supports_images: bool

    def prefill_embedded(self, slot: int, segment: PromptSegment) -> None:
        """Like `prefill_slot`, with the segment's image rows taking their embeddings instead of the
        pad token's, at the segment's (t, h, w) positions; later steps continue at the largest position + 1."""


def supports_images(slots: SlotBackend) -> bool:
    """Does this slot backend have the `ImagePrefill` capability?"""
    return bool(getattr(slots, "supports_images", False))


class _HostSlot:
    def __init__(self, sequence: Any, trail: MtpTrail | None = None):
        self.sequence = sequence
        self.logits: np.ndarray | None = None
        self.sampler: Sampler | None = None
        self.history: list[int] = []
        self.host_logits = False
        self.top_logprobs: int | None = None
        self.bias: Mapping[int, float] | None = None
        self.trail = trail  # the MTP head's owed rows; None: no head upkeep (no speculator, or images seen)
        self.speculate = False
        self.rng: np.random.Generator | None = None


class HostSlots:
    """`SlotBackend` over a plain `Backend`: one forward per slot per step, sampling on the host.

    Snapshots work when the backend's sequence objects have `snapshot()`/`restore()` (the reference's
    `SequenceState` does); otherwise `snapshot_slot` returns None and prefix reuse is limited to a
    slot's live state. Images work over a backend with `forward_embedded` (the reference's: its model
    takes embedding rows and 3-component positions, its state keeps the next position for decoding).

    With `speculative` (default) and a backend whose `speculative_model` (a host model with an MTP head,
    the reference's) is not None, every slot keeps the head's
    cache in step with its trunk (one head row per token, batched) and decodes requests that allow it
    with `draft_tokens` drafts per verify; `speculation_stats` counts the rounds. A slot that saw images
    stops speculating until it is reset (the head's positions for image rows are unsettled, spec §6.10).
    """

    DEFAULT_PREFILL_CHUNK = 512

    def __init__(self, backend: Backend, slot_count: int, speculative: bool = True, draft_tokens: int = 1):
        if slot_count < 1:
            raise ValueError("a backend needs at least one slot")
        self.backend = backend
        self.name = backend.name
        self.config = backend.config
        self.slot_count = slot_count
        self.prefill_chunk = getattr(backend, "prefill_chunk", self.DEFAULT_PREFILL_CHUNK)
        model = getattr(backend, "speculative_model", None)
        self.speculator = MtpSpeculator(model, draft_tokens) if speculative and model is not None else None
        self._slots = [self._new_slot() for _ in range(slot_count)]
        self.can_snapshot = all(hasattr(self._slots[0].sequence, name) for name in ("snapshot", "restore"))
        self.supports_images = takes_embeddings(backend)

    @property
    def speculation_stats(self) -> SpeculationStats | None:
        """Acceptance counts over this backend's life; None when it does not speculate."""
        return self.speculator.stats if self.speculator else None

    def _new_slot(self) -> _HostSlot:
        return _HostSlot(self.backend.new_sequence(), self.speculator.new_trail() if self.speculator else None)

    def reset_slot(self, slot: int) -> None:
        self._slots[slot] = self._new_slot()

    def last_logits(self, slot: int) -> np.ndarray | None:
        """The logits row the slot's next pick comes from (after a prefill or a plain step)."""
        return self._slots[slot].logits

    def prefill_slot(self, slot: int, token_ids: Sequence[int]) -> None:
        s = self._slots[slot]
        s.logits = self._forward(s, token_ids)

    def _forward(self, s: _HostSlot, token_ids: Sequence[int]) -> np.ndarray:
        if self.speculator is not None and s.trail is not None:
            return self.speculator.feed(s.sequence, s.trail, token_ids)
        return self.backend.forward_last(token_ids, s.sequence)

    def prefill_embedded(self, slot: int, segment: PromptSegment) -> None:
        if not self.supports_images:
            raise RuntimeError(f"the {self.name} backend cannot take image embeddings")
        s = self._slots[slot]
        s.trail = None
        s.logits = self.backend.forward_embedded(segment, s.sequence)  # type: ignore[attr-defined]

    def begin(self, slot: int, request: SlotRequest, mask: TokenMask | None = None) -> Pick:
        s = self._slots[slot]
        if s.logits is None:
            raise RuntimeError("begin() needs a prefill first")
        s.sampler = Sampler(request.params)
        s.history = list(request.history)
        s.host_logits = request.host_logits
        s.top_logprobs = request.logprobs
        s.bias = request.logit_bias
        s.speculate = (s.trail is not None and request.speculative and not request.host_logits
                       and request.logprobs is None and not request.constrained)
        s.rng = speculation_rng(request.params.seed) if s.speculate else None
        return self._pick(s, mask)

    def step(self, feeds: Mapping[int, int], masks: StepMasks | None = None) -> dict[int, Pick]:
        masks = masks_now(masks)
        picks = {}
        for slot, token in feeds.items():
            s = self._slots[slot]
            s.history.append(token)
            run = self._speculate(s, token) if s.speculate else None
            if run is not None:
                s.logits = None  # the round picked from its own rows
                picks[slot] = Pick.of_round(run, self.speculator.k)  # type: ignore[union-attr]  # _speculate asserts it
                continue
            s.logits = self._forward(s, [token])
            picks[slot] = self._pick(s, masks.get(slot))
        return picks

    def _speculate(self, s: _HostSlot, token: int) -> list[int] | None:
        assert self.speculator is not None and s.trail is not None and s.sampler is not None and s.rng is not None
        return self.speculator.round(s.sequence, s.trail, token, s.sampler, s.history, s.rng)

    @staticmethod
    def _pick(s: _HostSlot, mask: TokenMask | None) -> Pick:
        """The slot's pick from its logits row, with the request's bias and the step's mask; logprobs are of
        the raw row."""
        assert s.sampler is not None and s.logits is not None
        logits = s.logits
        kept = logits if s.host_logits else None
        if np.isnan(logits).any() or np.isposinf(logits).any():
            return Pick(-1, kept)
        token = s.sampler.sample(constrain_row(logits, s.bias, mask), s.history)
        logprobs = token_logprobs(logits, token, s.top_logprobs) if s.top_logprobs is not None else None
        return Pick(token, kept, logprobs=logprobs)

    def snapshot_slot(self, slot: int) -> SlotSnapshot | None:
        if not self.can_snapshot:
            return None
        s = self._slots[slot]
        snap = s.sequence.snapshot()
        state = snap if self.speculator is None else (snap, s.trail.frozen() if s.trail is not None else None)
        return SlotSnapshot(state, _nbytes(state))

    def restore_slot(self, slot: int, snapshot: SlotSnapshot) -> None:
        """A speculating backend's snapshots also hold the head's owed rows (the trunk's last hidden row);
        restoring one without them (saved by a backend that did not speculate) leaves the slot plain until reset."""
        self.reset_slot(slot)
        s = self._slots[slot]
        state, trail = snapshot.state if isinstance(snapshot.state, tuple) else (snapshot.state, None)
        s.sequence.restore(state)
        if self.speculator is not None:
            s.trail = MtpTrail.thawed(trail) if trail is not None else None

    def close(self) -> None:
        self.backend.close()


def _nbytes(obj: Any) -> int:
    """Bytes of the numpy arrays inside a (nested) snapshot object."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, (tuple, list)):
        return sum(_nbytes(x) for x in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(_nbytes(getattr(obj, name)) for name in obj.__dataclass_fields__)
    return 0


def decode_tokens(backend: SlotBackend, slot: int, params: SamplingParams, history: Sequence[int], max_tokens: int,
                  stop_ids: Collection[int], full: Callable[[], bool], speculative: bool = True) -> Iterator[int]:
    """Tokens of one slot after its prefill, chosen by the backend (on the card for CUDA): the single-sequence
    fast path of `TokenStream`. Stops before a stop id, at `max_tokens`, or when `full()` says the slot's
    context is used up; a step's several tokens (speculative decoding, unless `speculative` is False) pass
    the same checks one by one."""
    run = backend.begin(slot, SlotRequest(params, history, speculative=speculative)).tokens
    produced = 0
    if max_tokens < 1:
        return
    while True:
        for token in run:
            if token < 0:
                raise RigllmError("the model produced NaN or infinite logits")
            if token in stop_ids:
                return
            yield token
            produced += 1
            if produced == max_tokens or full():
                return
        run = backend.step({slot: run[-1]})[slot].tokens


def slot_backend(backend: Backend, slot_count: int, speculative: bool = True) -> SlotBackend:
    """The backend itself when it has slots natively (CUDA), else `HostSlots` around it (speculating with
    the model's MTP head when it has one, unless `speculative` is False)."""
    if hasattr(backend, "slot_count") and hasattr(backend, "step"):
        return backend  # type: ignore[return-value]
    return HostSlots(backend, slot_count, speculative)
