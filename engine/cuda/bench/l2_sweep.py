"""Decode speed per L2 prefetch policy (engine.cuda.l2_prefetch), the greedy tokens checked equal to no prefetch.

Each policy gets its own decoder (its graphs are captured with or without the prefetch branches); the runs
alternate between policies `repeats` times so that a drift of the card's clocks spreads over all of them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.cuda.bench.slot_depth import slots_at_depth
from engine.cuda.bench.speed import GREEDY, slot_decode_speed
from engine.cuda.driver import CudaCard
from engine.cuda.l2_prefetch import PREFETCH_ENV
from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.weights import ModelWeights
from engine.gguf.config import ModelConfig
from engine.generation.slots import SlotRequest

PROMPT_TOKENS, CHECK_TOKENS = 48, 24


def greedy_tokens(dec: SlotDecoder, prompt: np.ndarray, count: int) -> list[int]:
    """`count` greedy tokens after `prompt` in slot 0 (which is empty again afterwards)."""
    dec.reset_slot(0)
    dec.prefill_slot(0, prompt)
    token = dec.begin(0, SlotRequest(GREEDY, ())).token
    out = [token]
    for _ in range(count - 1):
        token = dec.step({0: token})[0].token
        out.append(token)
    dec.reset_slot(0)
    return out


def l2_sweep(card: CudaCard, cfg: ModelConfig, weights: ModelWeights, policies: Sequence[str], depth: int = 512,
             steps: int = 64, repeats: int = 3, streams: Sequence[int] = (1, 8), chunk: int = 256) -> dict[str, Any]:
    """Tokens/s of each policy (PREFETCH_ENV syntax, "0" = none) at `streams`, and whether its tokens match."""
    prompt = np.random.default_rng(3).integers(0, cfg.vocab_size, PROMPT_TOKENS).astype(np.int32)
    decoders: dict[str, SlotDecoder] = {}
    before = os.environ.get(PREFETCH_ENV)
    try:
        for p in policies:
            os.environ[PREFETCH_ENV] = p
            decoders[p] = SlotDecoder(card, cfg, weights, depth + steps + PROMPT_TOKENS + 16, max(streams), chunk)
    finally:
        if before is None:
            os.environ.pop(PREFETCH_ENV, None)
        else:
            os.environ[PREFETCH_ENV] = before
    tokens = {p: greedy_tokens(dec, prompt, CHECK_TOKENS) for p, dec in decoders.items()}
    runs: dict[str, dict[int, list[float]]] = {p: {n: [] for n in streams} for p in policies}
    for _ in range(repeats):
        for p, dec in decoders.items():
            for n in streams:
                with slots_at_depth(dec, n, depth):
                    runs[p][n].append(slot_decode_speed(dec, n, steps))
    base = policies[0]
    return {
        "depth": depth, "steps": steps, "repeats": repeats, "l2_bytes": card.l2_bytes,
        "policies": {p: {
            "tokens_match_first_policy": tokens[p] == tokens[base],
            "tokens_per_s": {n: sorted(v) for n, v in runs[p].items()},
            "median_vs_first_policy": {n: float(np.median(v) / np.median(runs[base][n])) for n, v in runs[p].items()},
        } for p in policies},
    }


def render_l2_sweep(r: dict[str, Any]) -> str:
    lines = [f"L2 prefetch sweep at depth {r['depth']} (median tokens/s of {r['repeats']} runs, ratio to the first):"]
    for p, v in r["policies"].items():
        cells = "  ".join(f"{n}x {np.median(t):7.1f} ({v['median_vs_first_policy'][n]:.3f})"
                          for n, t in v["tokens_per_s"].items())
        lines.append(f"  {p:>12}  {cells}  tokens {'same' if v['tokens_match_first_policy'] else 'DIFFER'}")
    return "\n".join(lines)
