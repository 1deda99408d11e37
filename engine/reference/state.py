"""Per-sequence decode state (spec §6.9, §8): KV caches, GDN conv/recurrent states, next position.

A GDN state is a summary of everything seen so far and cannot be cut back to an earlier position, so
rollback (prefix reuse, rejected speculative drafts) works only through `snapshot()` / `restore()`.
A snapshot is an immutable deep copy: restoring it never lets later decoding write into it, so one
snapshot can be restored any number of times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.gguf.config import ModelConfig

_INITIAL_KV_CAPACITY = 64


class KVCache:
    """Post-RoPE K and V of one attention layer, [tokens, Hkv, Dh] each, grown by doubling."""

    def __init__(self, n_kv_heads: int, head_dim: int):
        self._k = np.zeros((_INITIAL_KV_CAPACITY, n_kv_heads, head_dim), np.float32)
        self._v = np.zeros_like(self._k)
        self.length = 0

    @property
    def keys(self) -> np.ndarray:
        return self._k[: self.length]

    @property
    def values(self) -> np.ndarray:
        return self._v[: self.length]

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """Add rows k, v [T, Hkv, Dh] after the cached ones."""
        end = self.length + k.shape[0]
        if end > self._k.shape[0]:
            capacity = max(end, 2 * self._k.shape[0])
            self._k = _grown(self._k, capacity)
            self._v = _grown(self._v, capacity)
        self._k[self.length:end] = k
        self._v[self.length:end] = v
        self.length = end

    def replace(self, k: np.ndarray, v: np.ndarray) -> None:
        """Make the cache hold exactly rows k, v (used by restore)."""
        self.length = 0
        self.append(k, v)


def _grown(a: np.ndarray, capacity: int) -> np.ndarray:
    out = np.zeros((capacity,) + a.shape[1:], a.dtype)
    out[: a.shape[0]] = a
    return out


@dataclass
class GdnLayerState:
    """One GDN layer: the last Kc−1 raw `attn_qkv` rows [Kc−1, Cc] and the delta-rule state [Hv, dk, dv]."""

    conv: np.ndarray
    recurrent: np.ndarray


@dataclass
class MtpBlockState:
    """One MTP block: its own KV cache and its own next position."""

    kv: KVCache
    next_position: int = 0


@dataclass(frozen=True)
class StateSnapshot:
    """Read-only copy of a `SequenceState` at one point of a sequence."""

    cfg: ModelConfig
    n_tokens: int
    next_position: int
    kv: tuple[tuple[np.ndarray, np.ndarray], ...]  # per attention layer, in layer order
    gdn: tuple[tuple[np.ndarray, np.ndarray], ...]  # (conv, recurrent) per GDN layer, in layer order
    mtp: tuple[tuple[np.ndarray, np.ndarray, int], ...]  # (k, v, next_position) per MTP block


def _frozen(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out.setflags(write=False)
    return out


class SequenceState:
    """Everything one sequence carries between forward calls; a fresh state is all zeros at position 0."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.n_tokens = 0
        self.next_position = 0
        self.kv: dict[int, KVCache] = {i: KVCache(cfg.n_head_kv, cfg.head_dim) for i in cfg.attention_layers}
        self.gdn: dict[int, GdnLayerState] = {
            i: GdnLayerState(
                conv=np.zeros((cfg.ssm_conv_kernel - 1, cfg.ssm_conv_dim), np.float32),
                recurrent=np.zeros((cfg.ssm_n_v_heads, cfg.ssm_d_state, cfg.ssm_d_head_v), np.float32),
            )
            for i in cfg.gdn_layers
        }
        self.mtp: list[MtpBlockState] = [MtpBlockState(KVCache(cfg.n_head_kv, cfg.head_dim)) for _ in range(cfg.n_mtp)]

    def snapshot(self) -> StateSnapshot:
        """An immutable deep copy of the current state."""
        return StateSnapshot(
            cfg=self.cfg,
            n_tokens=self.n_tokens,
            next_position=self.next_position,
            kv=tuple((_frozen(c.keys), _frozen(c.values)) for _, c in sorted(self.kv.items())),
            gdn=tuple((_frozen(s.conv), _frozen(s.recurrent)) for _, s in sorted(self.gdn.items())),
            mtp=tuple((_frozen(m.kv.keys), _frozen(m.kv.values), m.next_position) for m in self.mtp),
        )

    def restore(self, snap: StateSnapshot) -> None:
        """Return to exactly the state `snap` was taken from (copies; `snap` stays reusable)."""
        if snap.cfg != self.cfg:
            raise ValueError("snapshot was taken from a state of a different model configuration")
        self.n_tokens = snap.n_tokens
        self.next_position = snap.next_position
        for (_, cache), (k, v) in zip(sorted(self.kv.items()), snap.kv):
            cache.replace(k, v)
        for (_, layer), (conv, recurrent) in zip(sorted(self.gdn.items()), snap.gdn):
            layer.conv = conv.copy()
            layer.recurrent = recurrent.copy()
        for block, (k, v, next_position) in zip(self.mtp, snap.mtp):
            block.kv.replace(k, v)
            block.next_position = next_position
