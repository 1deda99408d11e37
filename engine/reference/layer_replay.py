"""Layer-local teacher forcing: each decoder block of the reference re-run on another run's own inputs.

A whole-model comparison accumulates every layer's rounding: a Q8_1 rounding that flips in layer 0
changes everything after it, so on small models the floor of "numerically the same computation" is
within a factor of a few of a one-layer bug. Replaying block L on the rows the other run fed into block L
(its captured output of block L-1; the token embeddings for block 0), with block L's own fresh cache or
GDN state built from those same rows, leaves only block L's own rounding differences between the two
outputs, so a wrong block stands out by orders of magnitude (README "Correctness").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from engine.reference.hidden_trace import HiddenTrace, tracing
from engine.reference.model import ReferenceModel
from engine.reference.rope import text_positions
from engine.reference.staged_kv import card_like_state
from engine.reference.state import KVCache


def replay_layers(model: ReferenceModel, trace: HiddenTrace, feeds: Sequence[Sequence[int]],
                  kv: str = "f16", kv_caches: Mapping[int, KVCache] | None = None) -> HiddenTrace:
    """A trace of every block of `model` re-run, feed by feed from position 0, on `trace`'s inputs to it;
    `kv_caches`: attention layers' caches to replay with instead of fresh ones (a `CardRowsKV` attends over the
    other run's own stored rows)."""
    tokens = np.concatenate([np.asarray(f, np.int64) for f in feeds])
    sizes = [len(f) for f in feeds]
    state = card_like_state(model, kv)
    state.kv.update(kv_caches or {})
    out = HiddenTrace()
    for block in model.blocks:
        rows = model.embedding[tokens] if block.index == 0 else trace.rows(block.index - 1, "ffn")
        if rows.shape[0] != tokens.shape[0]:
            raise ValueError(f"the trace holds {rows.shape[0]} rows before block {block.index}, the feeds {len(tokens)}")
        cache = state.gdn[block.index] if block.is_gdn else state.kv[block.index]
        at = 0
        with tracing(out):
            for n in sizes:
                block(rows[at : at + n], text_positions(at, n), cache)
                at += n
    return out
