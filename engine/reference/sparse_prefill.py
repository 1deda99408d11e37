"""Apply a sparse profile to the reference forward pass: prefill chunks only, decode stays dense.

The reference attention asks a mask hook (engine.reference.attention.attention_masks) for per-head
masks; this hook answers with the profile's patterns for chunks of more than one token once the
sequence reaches the profile's minimum length, and with None (dense) otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from engine.reference.attention import AttentionWeights, attention_masks
from engine.reference.model import ReferenceModel
from engine.reference.sparse_attention import Pattern, head_indices, head_masks
from engine.reference.state import KVCache

if TYPE_CHECKING:  # the profile file's reader (engine.sparse) sits above the reference it calibrates
    from engine.sparse.profile import SparseProfile


def layer_of_weights(model: ReferenceModel) -> dict[int, int]:
    """id(attention weights) → layer index: how a hook tells which layer is asking."""
    return {id(b.mixer): b.index for b in model.blocks if not b.is_gdn}


def indices_for(patterns: list[Pattern], q: np.ndarray, cache: KVCache, n_past: int, block: int) -> list[np.ndarray]:
    """Block indices per head of `patterns` for queries q [T, H, Dh], scored in the cache's attention domain."""
    return head_indices(patterns, cache.k_codec.to_domain(q), cache.key_domain(), n_past, block)


@contextmanager
def sparse_prefill(model: ReferenceModel, profile: SparseProfile) -> Iterator[None]:
    """Within the block, `model`'s prefill chunks use the profile's patterns (decode is unaffected)."""
    layers = layer_of_weights(model)

    def hook(w: AttentionWeights, q: np.ndarray, cache: KVCache, n_past: int) -> np.ndarray | None:
        layer = layers.get(id(w))  # None for an MTP head's attention: it stays dense
        patterns = None if layer is None else profile.patterns(layer)
        if patterns is None or q.shape[0] < 2 or cache.length < profile.min_length:
            return None
        indices = indices_for(patterns, q, cache, n_past, profile.block)
        return head_masks(indices, n_past, q.shape[0], cache.length, profile.block)

    with attention_masks(hook):
        yield
