"""How full the KV cache is: tokens the slots hold, and per card the bytes reserved and in use.

A slot's state covers the tokens it has seen (a running request's, or a finished turn's kept for its
follow-up), so held tokens = the slots' token counts, capacity = slots x context. The CUDA backend
reserves each card's KV cache up front (its memory plan's `kv_bytes`: the card's attention layers x
all cells); a card's use is that reservation times the share of cells held, since every cell costs
the same bytes on a card. Backends without a plan (the reference) report tokens only.

Read from the metrics scrape's thread while the scheduler runs: the counts are a moment's snapshot
(list lengths), which is all a gauge needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.generation.serving.scheduler import Scheduler


@dataclass(frozen=True)
class CardKv:
    device: str  # the memory plan's name for the card ("cuda:0"; a pipeline's "card 1 (cuda:3)")
    reserved_bytes: int
    used_bytes: int


@dataclass(frozen=True)
class KvUsage:
    held_tokens: int
    capacity_tokens: int
    cards: tuple[CardKv, ...]


def kv_usage(scheduler: Scheduler, context: int) -> KvUsage:
    """The scheduler's KV use now; `context`: the tokens one slot holds at most."""
    held = sum(min(len(slot.tokens), context) for slot in scheduler.slots)
    capacity = context * len(scheduler.slots)
    plan = getattr(scheduler.backend, "plan", None)  # the CudaBackend's MemoryPlan
    cards = tuple(CardKv(card.profile.name, card.kv_bytes, card.kv_bytes * held // capacity if capacity else 0)
                  for card in plan.cards) if plan is not None else ()
    return KvUsage(held, capacity, cards)
