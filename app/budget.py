"""The loading sheet's live memory budget: per-card bars, a verdict and one-click fixes (no Qt).

The engine's planner (`engine.model.memory_plan.plan`) is the single source of the numbers.
It refuses a plan that does not fit, but the sheet must still draw the over-full bars, so a refused
plan is re-made on profiles scaled up by a common factor: every card's usable bytes scale alike, so
the planner chooses the same layer split, and each card's parts are then drawn against its real
capacity. Fixes are found by asking the planner again (smaller KV formats, the longest context that
fits, one more card), so a fix shown is a fix that fits, and only KV formats the chosen backend has
kernels for are offered or called a fit.

Cards default to the fewest that fit (`fewest_cards`): one card pays no PCIe hops between cards (each
decode step or speculative round crosses every boundary between cards once). With no card the CPU reference backend
runs the model, and its fp32 weights and KV cache are priced against system RAM (`cpu_budget`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.errors import RigllmError
from engine.model.kv_formats import CODECS_BY_BITS, CUDA_KERNEL_FORMATS, kv_format, kv_format_for_bits
from engine.model.memory_plan import CardPlan, CardProfile, MemoryPlan, format_bytes, layer_cuts, load_plan
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


@dataclass(frozen=True)
class HostMemory:
    total: int
    available: int


def read_host_memory() -> HostMemory:
    """System RAM from /proc/meminfo (MemAvailable counts reclaimable cache as free), else sysconf."""
    try:
        info = dict(line.split(":", 1) for line in open("/proc/meminfo", encoding="ascii"))
        kib = {k: int(v.split()[0]) * 1024 for k, v in info.items() if k in ("MemTotal", "MemAvailable")}
        return HostMemory(kib["MemTotal"], kib.get("MemAvailable", kib["MemTotal"]))
    except (OSError, KeyError, ValueError):
        import os

        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return HostMemory(total, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def runnable_kv_formats(backend: str) -> tuple[str, ...] | None:
    """The KV formats `backend` has kernels for; None: all (the reference codes every pair in numpy)."""
    return CUDA_KERNEL_FORMATS if backend == "cuda" else None


def reference_kv_bytes_per_token(fp: Footprint, kv: str) -> int:
    """What the reference's KV cache keeps per token: fp32 rows for f16, the format's own bytes otherwise."""
    cfg = fp.config
    if kv == "f16":
        return len(cfg.attention_layers) * cfg.n_head_kv * cfg.head_dim * 2 * 4
    return kv_format(kv).bytes_per_token(cfg)


def cpu_budget(fp: Footprint, host_weight_bytes: int, host: HostMemory, context: int, kv: str) -> Budget:
    """The model on the CPU reference backend: fp32 weights, its KV cache and GDN states in system RAM."""
    kv_bytes = context * reference_kv_bytes_per_token(fp, kv)
    state = sum(fp.state_bytes_per_sequence(b) for b in range(fp.config.n_layers))
    bar = CardBudget("system RAM", host.total, host_weight_bytes, kv_bytes, state, 0, 0, host.total - host.available,
                     range(fp.config.n_layers))
    fits = bar.free >= 0
    summary = (f"CPU reference backend (no card chosen): fp32 weights {format_bytes(host_weight_bytes)} + "
               f"{context} tokens x {kv} KV = {format_bytes(kv_bytes)} in system RAM, "
               f"{format_bytes(host.available)} available: " + ("fits" if fits else f"{format_bytes(-bar.free)} short"))
    fixes: list[Fix] = []
    if not fits:
        for smaller in smaller_kv_formats(fp, kv):
            if context * reference_kv_bytes_per_token(fp, smaller) + host_weight_bytes + state <= host.available:
                fixes.append(Fix(f"use {smaller} KV", kv=smaller))
                break
    return Budget((bar,), fits, summary, tuple(fixes), None)


def fewest_cards(fp: Footprint, all_cards: list[CardSample], context: int, kv: str) -> tuple[list[int], str]:
    """The fewest cards (most free memory first) that hold the model at `context` and `kv`, and why."""
    order = sorted(range(len(all_cards)), key=lambda i: (-all_cards[i].memory_free, i))
    setting = f"{context // 1024}K context with {kv} KV" if context >= 1024 else f"{context} tokens with {kv} KV"
    for n in range(1, len(order) + 1):
        chosen = sorted(order[:n])
        if _try_plan(fp, [profile_of(all_cards[i]) for i in chosen], context, kv):
            if n == 1:
                return chosen, (f"1 card: the model fits on card {all_cards[chosen[0]].index} at {setting}; one card "
                                "needs no PCIe hops between cards")
            return chosen, f"{n} cards: the fewest that hold the model at {setting}"
    return sorted(order), f"all {len(order)} cards: the model does not fit on fewer at {setting}"


def profile_of(card: CardSample) -> CardProfile:
    return CardProfile(f"card {card.index}", card.memory_total, other_used_bytes=card.memory_used)


def _card_plan(fp: Footprint, profiles: list[CardProfile], context: int, kv: str,
               split: tuple[int, ...] | None) -> MemoryPlan:
    """The plan the CUDA backend makes when it loads: a model with an MTP head speculates by default (one draft
    token, on one card or several) when the head fits, and loads without it when only the head does not (a
    file that declares a head but omits it is counted with one, the safe side)."""
    return load_plan(fp, profiles, context, kv_format(kv), with_mtp=fp.config.n_mtp > 0, split=split)


def _try_plan(fp: Footprint, profiles: list[CardProfile], context: int, kv: str,
              split: tuple[int, ...] | None = None) -> MemoryPlan | None:
    try:
        return _card_plan(fp, profiles, context, kv, split)
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
           split: tuple[int, ...] | None = None, backend: str = "cuda") -> Budget:
    """The budget of `fp` on the chosen cards (indices into `all_cards`, PCI bus order); `split`: layers per
    chosen card set by the user (None: the planner balances them); `backend`: the one that will run it
    (a KV format it has no kernels for is not a fit, whatever the bytes say)."""
    cards = [all_cards[i] for i in sorted(chosen)]
    if not cards:
        return Budget((), True, "no card chosen: the CPU reference backend runs the model from system RAM",
                      (), None)
    runnable = runnable_kv_formats(backend)
    if runnable is not None and kv not in runnable:
        priced = budget(fp, all_cards, chosen, context, "f16", split, backend)
        fixes = (Fix("use f16 KV", kv="f16"),) if priced.fits else tuple(
            f for f in _fixes(fp, all_cards, chosen, context, "f16", split, runnable) if f.kv)
        bars = budget(fp, all_cards, chosen, context, kv, split, backend="reference").cards
        return Budget(bars, False, f"the {backend.upper()} backend has no {kv} KV kernels (it runs "
                      f"{', '.join(runnable)})" + (f": {fixes[0].label}" if fixes else ""), fixes, None)
    profiles = [profile_of(c) for c in cards]
    if split is not None:  # a split that names no layout has no bars to draw
        try:
            cuts = layer_cuts(fp.config.n_layers, split)
        except RigllmError as err:
            return Budget((), False, str(err), (), None)
        if len(cuts) - 1 != len(profiles):
            return Budget((), False, f"the split names {len(cuts) - 1} cards and {len(profiles)} are chosen", (), None)
    try:
        made = _card_plan(fp, profiles, context, kv, split)
    except RigllmError as err:
        if "cannot split" in str(err):
            return Budget((), False, str(err), (), None)
        inflated = [replace(p, total_bytes=p.total_bytes * _INFLATE, reserve_bytes=p.reserve_bytes * _INFLATE,
                            other_used_bytes=p.other_used_bytes * _INFLATE) for p in profiles]
        shown = _try_plan(fp, inflated, context, kv, split)
        runnable = runnable_kv_formats(backend)
        if shown is None:  # even a card's fixed parts exceed any scaling: report the planner's words
            return Budget((), False, str(err), _fixes(fp, all_cards, chosen, context, kv, split, runnable), None)
        bars = tuple(_bar(p, real) for p, real in zip(shown.cards, profiles))
        worst = min(bars, key=lambda b: b.free)
        fixes = _fixes(fp, all_cards, chosen, context, kv, split, runnable)
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
           split: tuple[int, ...] | None = None, runnable: tuple[str, ...] | None = None) -> tuple[Fix, ...]:
    """Fixes that fit as offered: another KV format the backend runs (`runnable`; None: any) or a shorter
    context (with the user's split, if any), or one more card (only with the planner's split: a user's
    split names its cards)."""
    profiles = [profile_of(all_cards[i]) for i in sorted(chosen)]
    fixes: list[Fix] = []
    for smaller in smaller_kv_formats(fp, kv):
        if runnable is not None and smaller not in runnable:
            continue
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
