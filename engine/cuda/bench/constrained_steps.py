"""What logprobs, logit_bias and grammar masks cost a decode step, and what they move over PCIe (issue 28:
≤ 1.05× a plain step and ≤ 8 KB per token).

Every kind steps the same slots at the same depth through `SlotDecoder.step` (the host's work included: the
mask's digest, the step buffer, the read-back), greedy, timed over `steps` steps after an untimed one. The
card's idle time between steps (engine.cuda.step_gaps) is the host's share of a step. The bytes are the card's
own counters of what went up and came down (engine.cuda.driver) over the timed steps.
Masks are random bitsets made before timing (a grammar's own cost is the host's, not the step's):
"repeating" cycles each row through 8 masks, as a grammar's states repeat (the pool uploads each once);
"fresh" gives every row a new mask every step, the worst case (every step uploads them all).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.cuda.bench.slot_depth import slots_at_depth
from engine.cuda.slot_decoder import SlotDecoder
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.generation.token_mask import MAX_LOGIT_BIAS, TokenMask, mask_of

GREEDY = SamplingParams(temperature=0.0)
REPEATING_MASKS = 8


def constrained_step_costs(dec: SlotDecoder, widths: tuple[int, ...], depth: int, steps: int) -> dict[str, Any]:
    """Per width: each kind's µs per step, its ratio to the plain step, and bytes per token each way."""
    vocab = dec.config.vocab_size
    rng = np.random.default_rng(28)
    bias = {int(t): 1.0 for t in rng.choice(vocab, MAX_LOGIT_BIAS, replace=False)}
    cycle = [mask_of(rng.random(vocab) < 0.5) for _ in range(REPEATING_MASKS)]
    out: dict[str, Any] = {}
    for width in widths:
        fresh = [[mask_of(rng.random(vocab) < 0.5) for _ in range(width)] for _ in range(steps + 1)]
        kinds: dict[str, tuple[SlotRequest, Callable[[int, int], TokenMask] | None]] = {
            "plain": (SlotRequest(GREEDY, ()), None),
            "logprobs_top20": (SlotRequest(GREEDY, (), logprobs=20), None),
            "logit_bias_300": (SlotRequest(GREEDY, (), logit_bias=bias), None),
            "mask_repeating": (SlotRequest(GREEDY, (), masked=True), lambda step, row: cycle[(step + row) % len(cycle)]),
            "mask_fresh": (SlotRequest(GREEDY, (), masked=True), lambda step, row: fresh[step][row]),
        }
        runs = {name: _timed_steps(dec, width, depth, steps, request, mask) for name, (request, mask) in kinds.items()}
        plain = runs["plain"]["us_per_step"]
        out[str(width)] = {name: {**r, "vs_plain": r["us_per_step"] / plain} for name, r in runs.items()}
    return {"depth": depth, "steps": steps, "vocab": vocab, "widths": out}


def _timed_steps(dec: SlotDecoder, width: int, depth: int, steps: int, request: SlotRequest,
                 mask: Callable[[int, int], TokenMask] | None) -> dict[str, float]:
    card = dec.card
    rows = list(range(width))

    def masks(step: int) -> dict[int, TokenMask] | None:
        return {row: mask(step, row) for row in rows} if mask is not None else None

    with slots_at_depth(dec, width, depth):
        for row in rows:
            dec.begin(row, request, mask(0, row) if mask is not None else None)
        feeds = {row: 1 for row in rows}
        dec.step(feeds, masks(0))  # captures the width's graph
        up, down, uploads = card.h2d_bytes, card.d2h_bytes, dec.sampling.masks.uploads
        idle_ms, gaps = dec.gaps.idle_ms, dec.gaps.steps
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            feeds = {row: max(p.token, 0) for row, p in dec.step(feeds, masks(step)).items()}
        seconds = time.perf_counter() - t0
    tokens = steps * width
    # the card's own clock between one step's read-back and the next step's first upload: the host's share
    idle_us = 1e3 * (dec.gaps.idle_ms - idle_ms) / max(dec.gaps.steps - gaps, 1)
    return {"us_per_step": 1e6 * seconds / steps, "card_idle_us_per_step": idle_us,
            "h2d_bytes_per_token": (card.h2d_bytes - up) / tokens,
            "d2h_bytes_per_token": (card.d2h_bytes - down) / tokens,
            "mask_uploads": dec.sampling.masks.uploads - uploads}


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
