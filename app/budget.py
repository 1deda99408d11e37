"""The loading sheet's live memory budget: per-card bars, a verdict and one-click fixes (no Qt).

The engine's planner (`engine.model.memory_plan.plan`) is the single source of the numbers.
It refuses a plan that does not fit, but the sheet must still draw the over-full bars, so a refused
plan is re-made on profiles scaled up by a common factor: every card's usable bytes scale alike, so
the planner chooses the same layer split, and each card's parts are then drawn against its real
capacity. Fixes are found by asking the planner again (smaller KV formats, the longest context that
fits, one more card), so a fix shown is a fix that fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.errors import RigllmError
from engine.model.kv_formats import CODECS_BY_BITS, kv_format, kv_format_for_bits
from engine.model.memory_plan import CardPlan, CardProfile, MemoryPlan, format_bytes, layer_cuts, plan
from engine.model.model_footprint import Footprint
from engine.telemetry import CardSample

TIGHT_BYTES = 512 << 20  # under this much spare a card is "tight" (allocator slack, fragmentation)
_INFLATE = 64
CONTEXT_STEP = 1024


@dataclass(frozen=True)
class CardBudget:
    """One card's bar: the parts the plan puts there plus what the card keeps back, against its total."""

    name: str
    total: int
    weights: int
    kv: int
    state: int
    scratch: int
    reserve: int  # CUDA context/driver reserve plus the safety margin
    other: int  # other processes
    layers: range

    @property
    def free(self) -> int:
        return self.total - self.weights - self.kv - self.state - self.scratch - self.reserve - self.other

    @property
    def verdict(self) -> str:
        if self.free < 0:
            return f"won't fit: {format_bytes(-self.free)} short"
        if self.free < TIGHT_BYTES:
            return f"tight: {format_bytes(self.free)} spare"
        return f"fits: {format_bytes(self.free)} spare"


@dataclass(frozen=True)
class Fix:
    label: str
    kv: str | None = None
    context: int | None = None
    add_card: int | None = None  # index into all cards


@dataclass(frozen=True)
class Budget:
    cards: tuple[CardBudget, ...]
    fits: bool
    summary: str
    fixes: tuple[Fix, ...]
    plan: MemoryPlan | None  # the real plan when it fits


def profile_of(card: CardSample) -> CardProfile:
    return CardProfile(f"card {card.index}", card.memory_total, other_used_bytes=card.memory_used)


def _try_plan(fp: Footprint, profiles: list[CardProfile], context: int, kv: str,
              split: tuple[int, ...] | None = None) -> MemoryPlan | None:
    try:
        return plan(fp, profiles, context, kv_format(kv), split=split)
    except RigllmError:
        return None


def _bar(p: CardPlan, real: CardProfile) -> CardBudget:
    reserve = real.reserve_bytes + int(real.margin * real.total_bytes)
    return CardBudget(real.name, real.total_bytes, p.weight_bytes, p.kv_bytes, p.state_bytes, p.scratch_bytes,
                      reserve, real.other_used_bytes, p.layers)


def max_context(fp: Footprint, profiles: list[CardProfile], kv: str, limit: int,
                split: tuple[int, ...] | None = None) -> int:
    """The longest context (a multiple of CONTEXT_STEP, up to `limit`) that fits; 0 if none does."""
    lo, hi = 0, limit // CONTEXT_STEP
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _try_plan(fp, profiles, mid * CONTEXT_STEP, kv, split):
            lo = mid
        else:
            hi = mid - 1
    return lo * CONTEXT_STEP


def smaller_kv_formats(fp: Footprint, kv: str) -> list[str]:
    """Every K/V bit pair that takes less KV memory than `kv`, largest (most precise) first."""
    cfg = fp.config
    current = kv_format(kv).bytes_per_token(cfg)
    pairs = [kv_format_for_bits(k, v) for k in CODECS_BY_BITS for v in CODECS_BY_BITS]
    smaller = [f for f in pairs if f.bytes_per_token(cfg) < current]
    smaller.sort(key=lambda f: (-f.bytes_per_token(cfg), -f.k.bits))  # at equal size keep more key bits
    return [f.name for f in smaller]


def budget(fp: Footprint, all_cards: list[CardSample], chosen: list[int], context: int, kv: str,
           split: tuple[int, ...] | None = None) -> Budget:
    """The budget of `fp` on the chosen cards (indices into `all_cards`, PCI bus order); `split`: layers per
    chosen card set by the user (None: the planner balances them)."""
    cards = [all_cards[i] for i in sorted(chosen)]
    if not cards:
        return Budget((), True, "no card chosen: the CPU reference backend runs the model from system RAM",
                      (), None)
    profiles = [profile_of(c) for c in cards]
    if split is not None:  # a split that names no layout has no bars to draw
        try:
            cuts = layer_cuts(fp.config.n_layers, split)
        except RigllmError as err:
            return Budget((), False, str(err), (), None)
        if len(cuts) - 1 != len(profiles):
            return Budget((), False, f"the split names {len(cuts) - 1} cards and {len(profiles)} are chosen", (), None)
    try:
        made = plan(fp, profiles, context, kv_format(kv), split=split)
    except RigllmError as err:
        if "cannot split" in str(err):
            return Budget((), False, str(err), (), None)
        inflated = [replace(p, total_bytes=p.total_bytes * _INFLATE, reserve_bytes=p.reserve_bytes * _INFLATE,
                            other_used_bytes=p.other_used_bytes * _INFLATE) for p in profiles]
        shown = _try_plan(fp, inflated, context, kv, split)
        if shown is None:  # even a card's fixed parts exceed any scaling: report the planner's words
            return Budget((), False, str(err), _fixes(fp, all_cards, chosen, context, kv, split), None)
        bars = tuple(_bar(p, real) for p, real in zip(shown.cards, profiles))
        worst = min(bars, key=lambda b: b.free)
        fixes = _fixes(fp, all_cards, chosen, context, kv, split)
        hint = " or ".join(f.label for f in fixes[:2])
        summary = f"{worst.name} is {format_bytes(-worst.free)} short" + (f": {hint}" if hint else "")
        return Budget(bars, False, summary, fixes, None)
    bars = tuple(_bar(p, real) for p, real in zip(made.cards, profiles))
    spare = min(b.free for b in bars)
    kv_total = sum(b.kv for b in bars)
    summary = (f"fits on {len(bars)} card(s), least spare {format_bytes(spare)}; "
               f"{context} tokens x {kv} KV = {format_bytes(kv_total)}")
    return Budget(bars, True, summary, (), made)


def _fixes(fp: Footprint, all_cards: list[CardSample], chosen: list[int], context: int, kv: str,
           split: tuple[int, ...] | None = None) -> tuple[Fix, ...]:
    """Fixes that fit as offered: another KV format or a shorter context (with the user's split, if any),
    or one more card (only with the planner's split: a user's split names its cards)."""
    profiles = [profile_of(all_cards[i]) for i in sorted(chosen)]
    fixes: list[Fix] = []
    for smaller in smaller_kv_formats(fp, kv):
        if _try_plan(fp, profiles, context, smaller, split):
            fixes.append(Fix(f"use {smaller} KV", kv=smaller))
            break
    longest = max_context(fp, profiles, kv, context, split)
    if longest:
        fixes.append(Fix(f"use {longest // 1024}K context", context=longest))
    if split is not None:
        return tuple(fixes)
    for index, card in enumerate(all_cards):
        if index not in chosen and _try_plan(fp, profiles + [profile_of(card)], context, kv):
            fixes.append(Fix(f"add card {card.index}", add_card=index))
            break
    return tuple(fixes)
