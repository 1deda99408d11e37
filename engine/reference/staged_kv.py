"""Reference KV caches that store what the card stores: K/V rounded to fp16 before storing or encoding.

The reference's "f16" cache keeps fp32 rows (kv_quant's exact codec); the CUDA backend keeps fp16 rows,
and for a quantised format encodes from fp16 staging rows. Backend comparisons (tests/teeth.py,
`rigllm debug compare`) give the reference these caches so that the fp16 rounding of the stored rows is
not counted as a backend difference. A layer-local replay can go further and attend over the other run's
own stored rows (`CardRowsKV`), checking its encoding row by row instead.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from engine.gguf.config import ModelConfig
from engine.reference.kv_quant import Encoded
from engine.reference.model import ReferenceModel
from engine.reference.state import KVCache, SequenceState


class Fp16StagedKV(KVCache):
    """A KVCache fed K/V rounded to fp16 first."""

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        super().append(_fp16(k), _fp16(v))


# The share of a layer's stored K/V values that may differ from a replay's own encoding of them (CardRowsKV). Correct
# code rounds a value to the neighbouring fp16 number or code now and then: 0 to 6.3e-3 of the values in the
# head-grouping test's g3-hv1 model across its six formats (H200, 2026-12-04, s20d); keys rotated one position late in
# one layer changed 11.6% (tests/unit/test_card_rows_kv.py), a wrong K/V path most values.
STORED_KV_DIFFERING_BOUND = 3e-2


class CardRowsKV(Fp16StagedKV):
    """A cache that stores another run's rows in place of its own encoding: `card_k`, `card_v` hold that run's
    stored K and V of every position (engine.cuda.kv_cache.download_side_rows, or `KVCache.encoded`).

    Why: in a quantised format one code that the two runs round to neighbouring levels (their projections differ in
    the last bit) changes what every later row attends to, so a replay on its own cache drifts from the card after
    the first such flip, which says nothing about the layer. Attending over the card's rows leaves each row's own
    rounding only; the card's encoding is checked separately: `append` still encodes its own K/V and counts the
    stored values that differ from the card's (`differing` of `compared`), a rare flip in correct code and most
    values in a wrong K/V path."""

    def __init__(self, n_kv_heads: int, head_dim: int, kv_format: str, card_k: Encoded, card_v: Encoded):
        super().__init__(n_kv_heads, head_dim, kv_format)
        self.card_k, self.card_v = card_k, card_v
        self.differing = self.compared = 0

    @property
    def differing_share(self) -> float:
        return self.differing / self.compared if self.compared else 0.0

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        rows = slice(self.length, self.length + k.shape[0])
        if rows.stop > self.card_k.codes.shape[0]:
            raise ValueError(f"the card stored {self.card_k.codes.shape[0]} rows, the replay reached {rows.stop}")
        sides = ((self.k_codec, k, self.card_k, self._k), (self.v_codec, v, self.card_v, self._v))
        for codec, own, card, kept in sides:
            stored = Encoded(card.codes[rows], card.side[rows])
            mine, theirs = codec.decode(codec.encode(_fp16(own))), codec.decode(stored)
            self.differing += int(np.count_nonzero(mine != theirs))
            self.compared += mine.size
            kept.write(self.length, stored)
        self.length = rows.stop


def card_rows_caches(cfg: ModelConfig, kv: str, stored: Mapping[int, tuple[Encoded, Encoded]]) -> dict[int, CardRowsKV]:
    """A `CardRowsKV` per attention layer of `stored` (its K and V rows by layer), in KV format `kv`."""
    return {i: CardRowsKV(cfg.n_head_kv, cfg.head_dim, kv, k, v) for i, (k, v) in stored.items()}


def _fp16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def card_like_state(model: ReferenceModel, kv: str = "f16") -> SequenceState:
    """A fresh state of `model` in KV format `kv` whose caches (trunk and MTP) are `Fp16StagedKV`."""
    fmt = None if kv == "f16" else kv
    state = SequenceState(model.cfg, kv_format=fmt)
    cfg = model.cfg
    state.kv = {i: Fp16StagedKV(cfg.n_head_kv, cfg.head_dim, fmt) for i in state.kv}
    for block in state.mtp:
        block.kv = Fp16StagedKV(cfg.n_head_kv, cfg.head_dim, fmt)
    return state
