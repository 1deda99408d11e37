"""Offline calibration of sparse patterns: per head, the cheapest pattern within a relative-error tolerance.

One dense reference forward over the calibration prompt; at every attention layer a mask hook sees
the exact dense inputs (queries and cache), computes the dense output and each candidate's output for
all heads at once, and records per head the relative L2 error ‖o_pattern − o_dense‖ / ‖o_dense‖ over
all prompt rows and the density (fraction of causal blocks read, the cost). The forward itself stays
dense, so every layer is judged on the inputs it really sees (the MInference procedure).
A head keeps the lowest-density candidate whose error is within the tolerance; dense (error 0,
density 1) always qualifies and wins ties, so tolerance 0 gives an all-dense profile.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from engine.reference.attention import AttentionWeights, attend_stored, attention_masks
from engine.reference.model import ReferenceModel
from engine.reference.sparse_attention import DENSE, KINDS, Pattern, density, head_masks
from engine.reference.state import KVCache
from engine.sparse.profile import HeadChoice
from engine.reference.sparse_prefill import indices_for, layer_of_weights

# layer, number of heads → the pattern sets to measure there (one pattern per head in each set)
PatternSets = Callable[[int, int], list[list[Pattern]]]


def candidate_patterns(n_blocks: int, kinds: Collection[str] = KINDS) -> list[Pattern]:
    """Dense plus A-shape, vertical-slash and block top-k at power-of-two budgets below n_blocks, of the
    given kinds only (dense always: it is every head's fallback)."""
    sizes = [1 << i for i in range(n_blocks.bit_length()) if (1 << i) < n_blocks]
    out = [DENSE]
    out += [Pattern("a_shape", sink=1, window=w) for w in sizes]
    out += [Pattern("vertical_slash", vertical=n, slash=n) for n in sizes if n >= 2]
    out += [Pattern("block_topk", topk=k) for k in sizes]
    return [p for p in out if p == DENSE or p.kind in kinds]


@dataclass(frozen=True)
class LayerMeasurement:
    """The pattern sets measured at one layer, with errors and densities as [n_sets, n_heads] arrays."""

    sets: list[list[Pattern]]
    errors: np.ndarray
    densities: np.ndarray


def head_errors(o: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """Relative L2 error per head of outputs [T, H, Dh] against dense [T, H, Dh]."""
    num = np.sqrt(((o - dense) ** 2).sum(axis=(0, 2)))
    den = np.sqrt((dense**2).sum(axis=(0, 2)))
    return num / np.maximum(den, np.finfo(np.float32).tiny)


def measure(model: ReferenceModel, tokens: Sequence[int], block: int, pattern_sets: PatternSets) -> dict[int, LayerMeasurement]:
    """Errors and densities of `pattern_sets` at every attention layer on one dense prefill of `tokens`."""
    layers = layer_of_weights(model)
    found: dict[int, LayerMeasurement] = {}

    def hook(w: AttentionWeights, q: np.ndarray, cache: KVCache, n_past: int) -> None:
        layer = layers.get(id(w))
        if layer is None:
            return
        dense = attend_stored(q, cache, n_past, q.shape[-1])
        sets = pattern_sets(layer, q.shape[1])
        errors, densities = [], []
        for patterns in sets:
            indices = indices_for(patterns, q, cache, n_past, block)
            o = attend_stored(q, cache, n_past, q.shape[-1], head_masks(indices, n_past, q.shape[0], cache.length, block))
            errors.append(head_errors(o, dense))
            densities.append([density(idx) for idx in indices])
        found[layer] = LayerMeasurement(sets, np.array(errors), np.array(densities))
        return

    with attention_masks(hook):
        model.forward_hidden(tokens, model.new_state())
    return found


def choose(m: LayerMeasurement, tolerance: float) -> list[HeadChoice]:
    """Per head the lowest-density set entry with error ≤ tolerance (dense first among equals)."""
    out = []
    for h in range(m.errors.shape[1]):
        ok = [i for i in range(len(m.sets)) if m.errors[i, h] <= tolerance or m.sets[i][h] == DENSE]
        best = min(ok, key=lambda i: (m.densities[i, h], m.sets[i][h] != DENSE))
        out.append(HeadChoice(m.sets[best][h], float(m.errors[best, h]), float(m.densities[best, h])))
    return out


def calibrate(model: ReferenceModel, tokens: Sequence[int], block: int, tolerance: float,
              kinds: Collection[str] = KINDS) -> dict[int, list[HeadChoice]]:
    """The chosen pattern of every head of every attention layer for one calibration prompt, among `kinds`
    (e.g. only A-shape for a GPU with a quantised KV cache, whose sparse kernel serves no other kind)."""
    candidates = candidate_patterns((len(tokens) - 1) // block + 1, kinds)
    found = measure(model, tokens, block, lambda _layer, heads: [[c] * heads for c in candidates])
    return {layer: choose(m, tolerance) for layer, m in found.items()}
