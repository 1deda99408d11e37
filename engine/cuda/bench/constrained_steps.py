"""What logprobs, logit_bias and grammar masks cost a decode step, and what they move over PCIe (issue 28:
≤ 1.05× a plain step and ≤ 8 KB per token).

Every kind steps the same slots at the same depth through `SlotDecoder.step` (the host's work included: the
mask's lookup, the step buffer, the read-back), greedy, timed over `steps` steps in all. The kinds take turns in
`rounds` rounds (each WARM_STEPS untimed steps, then its share of the timed ones), so that a drift in the machine's
state spreads over every kind instead of landing on the last ones (on 2026-12-04, in s19a's second run of
0c3f290, with the kinds one after another, the plain step at 4 rows read 58 µs of card idle time a step and
logit_bias, which adds no host work, 129). The card's idle time between steps (engine.cuda.step_gaps) is the
host's share of a step. The bytes are the card's own counters of what went up and came down
(engine.cuda.driver) over the timed steps.
Masked steps are taken in two parts (`SlotDecoder._queue_forward`, then `_queue_masked_picks`: the picks after
the masks' uploads); "split_no_mask" takes them so with no mask, which prices the split alone. Masks are random
bitsets made before timing (a grammar's own cost is the host's, not the step's): "repeating" cycles each row
through 8 masks, as a grammar's states repeat (the pool uploads each once); "fresh" gives every row a new mask
every step, the worst case (every step uploads them all).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from engine.cuda.bench.slot_depth import slots_at_depth
from engine.cuda.slot_decoder import SlotDecoder
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.generation.token_mask import MAX_LOGIT_BIAS, StepMasks, mask_of, masks_now

GREEDY = SamplingParams(temperature=0.0)
REPEATING_MASKS = 8
# untimed steps at the start of each kind's round: as many as the repeating masks, so that every one of them is
# in the pool again before timing (the fresh kind's round before evicts them all: in s19b, with one untimed
# step, the repeating kind re-uploaded them during its timed steps, 1,515 bytes a token against 545)
WARM_STEPS = REPEATING_MASKS


def constrained_step_costs(dec: SlotDecoder, widths: tuple[int, ...], depth: int, steps: int,
                           rounds: int = 4) -> dict[str, Any]:
    """Per width: each kind's µs per step, its ratio to the plain step, and bytes per token each way."""
    vocab = dec.config.vocab_size
    rng = np.random.default_rng(28)
    bias = {int(t): 1.0 for t in rng.choice(vocab, MAX_LOGIT_BIAS, replace=False)}
    cycle = [mask_of(rng.random(vocab) < 0.5) for _ in range(REPEATING_MASKS)]
    per_round = -(-steps // rounds)
    out: dict[str, Any] = {}
    for width in widths:
        # every step of every round gets new masks: a round must not find the last round's in the pool
        fresh = [[mask_of(rng.random(vocab) < 0.5) for _ in range(width)]
                 for _ in range(rounds * (WARM_STEPS + per_round))]
        rows = range(width)
        masked = SlotRequest(GREEDY, (), masked=True)
        kinds: dict[str, tuple[SlotRequest, MasksOf | None]] = {
            "plain": (SlotRequest(GREEDY, ()), None),
            "logprobs_top20": (SlotRequest(GREEDY, (), logprobs=20), None),
            "logit_bias_300": (SlotRequest(GREEDY, (), logit_bias=bias), None),
            # a masked step whose masks come to nothing: what taking the step in two parts costs by itself
            "split_no_mask": (masked, lambda step: lambda: {}),
            "mask_repeating": (masked, lambda step: {row: cycle[(step + row) % len(cycle)] for row in rows}),
            "mask_fresh": (masked, lambda step: {row: fresh[step][row] for row in rows}),
        }
        totals = {name: _StepTotals() for name in kinds}
        for r in range(rounds):
            for name, (request, mask) in kinds.items():
                first = r * (WARM_STEPS + per_round)
                totals[name].add(_timed_steps(dec, width, depth, per_round, first, request, mask))
        runs = {name: t.result(width) for name, t in totals.items()}
        plain = runs["plain"]["us_per_step"]
        out[str(width)] = {name: {**r, "vs_plain": r["us_per_step"] / plain} for name, r in runs.items()}
    return {"depth": depth, "steps": per_round * rounds, "rounds": rounds, "vocab": vocab, "widths": out}


MasksOf = Callable[[int], StepMasks]  # step → that step's masks


@dataclass
class _StepTotals:
    """One kind's timed steps summed over the rounds."""

    seconds: float = 0.0
    steps: int = 0
    idle_ms: float = 0.0
    gaps: int = 0
    up: int = 0
    down: int = 0
    uploads: int = 0

    def add(self, other: _StepTotals) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def result(self, width: int) -> dict[str, float]:
        tokens = self.steps * width
        return {"us_per_step": 1e6 * self.seconds / self.steps,
                # the card's own clock between one step's read-back and the next step's first upload: the host's share
                "card_idle_us_per_step": 1e3 * self.idle_ms / max(self.gaps, 1),
                "h2d_bytes_per_token": self.up / tokens, "d2h_bytes_per_token": self.down / tokens,
                "mask_uploads": self.uploads}


def _timed_steps(dec: SlotDecoder, width: int, depth: int, steps: int, first: int, request: SlotRequest,
                 masks_of: MasksOf | None) -> _StepTotals:
    """`steps` timed steps of `width` slots after WARM_STEPS untimed ones; masks from step index `first` on."""
    card = dec.card
    rows = list(range(width))

    def masks(step: int) -> StepMasks | None:
        return masks_of(first + step) if masks_of is not None else None

    with slots_at_depth(dec, width, depth):
        firsts = masks_now(masks(0))
        for row in rows:
            dec.begin(row, request, firsts.get(row))
        feeds = {row: 1 for row in rows}
        for step in range(WARM_STEPS):  # the first captures the width's graph
            feeds = {row: max(p.token, 0) for row, p in dec.step(feeds, masks(step)).items()}
        up, down, uploads = card.h2d_bytes, card.d2h_bytes, dec.sampling.masks.uploads
        idle_ms, gaps = dec.gaps.idle_ms, dec.gaps.steps
        t0 = time.perf_counter()
        for step in range(WARM_STEPS, WARM_STEPS + steps):
            feeds = {row: max(p.token, 0) for row, p in dec.step(feeds, masks(step)).items()}
        seconds = time.perf_counter() - t0
    return _StepTotals(seconds, steps, dec.gaps.idle_ms - idle_ms, dec.gaps.steps - gaps, card.h2d_bytes - up,
                       card.d2h_bytes - down, dec.sampling.masks.uploads - uploads)


def render_constrained(r: dict[str, Any]) -> list[str]:
    """Lines for the bench's table."""
    lines = [f"constrained steps at depth {r['depth']} (vocab {r['vocab']}): us/step, x plain, card idle us/step, "
             "bytes/token up/down"]
    for width, kinds in r["widths"].items():
        for name, k in kinds.items():
            lines.append(f"  {width} rows {name:<16} {k['us_per_step']:>7.0f} us  x{k['vs_plain']:.3f}  "
                         f"idle {k['card_idle_us_per_step']:>5.0f}  "
                         f"{k['h2d_bytes_per_token']:>7.0f} / {k['d2h_bytes_per_token']:>5.0f} B")
    return lines
