"""Reference KV caches that store what the card stores: K/V rounded to fp16 before storing or encoding.

The reference's "f16" cache keeps fp32 rows (kv_quant's exact codec); the CUDA backend keeps fp16 rows,
and for a quantised format encodes from fp16 staging rows. Backend comparisons (tests/teeth.py,
`rigllm debug compare`) give the reference these caches so that the fp16 rounding of the stored rows is
not counted as a backend difference.
"""

from __future__ import annotations

import numpy as np

from engine.reference.model import ReferenceModel
from engine.reference.state import KVCache, SequenceState


class Fp16StagedKV(KVCache):
    """A KVCache fed K/V rounded to fp16 first."""

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        super().append(_fp16(k), _fp16(v))


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
