"""Per-sequence decode state (spec §6.9, §8): KV caches, GDN conv/recurrent states, next position.

A GDN state is a summary of everything seen so far and cannot be cut back to an earlier position, so
rollback (prefix reuse, rejected speculative drafts) works only through `snapshot()` / `restore()`.
A snapshot is an immutable deep copy: restoring it never lets later decoding write into it, so one
snapshot can be restored any number of times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.model.kv_formats import KVFormat, kv_format_of
from engine.gguf.config import ModelConfig
from engine.reference.kv_quant import Encoded, codec_for

_INITIAL_KV_CAPACITY = 64


class _StoredRows:
    """One cache side's stored rows (codes and side data of `Encoded`), grown by doubling."""

    def __init__(self, empty: Encoded):
        self.codes = np.zeros((_INITIAL_KV_CAPACITY,) + empty.codes.shape[1:], empty.codes.dtype)
        self.side = np.zeros((_INITIAL_KV_CAPACITY,) + empty.side.shape[1:], empty.side.dtype)

    def write(self, start: int, rows: Encoded) -> None:
        end = start + rows.codes.shape[0]
        if end > self.codes.shape[0]:
            capacity = max(end, 2 * self.codes.shape[0])
            self.codes, self.side = _grown(self.codes, capacity), _grown(self.side, capacity)
        self.codes[start:end] = rows.codes
        self.side[start:end] = rows.side

    def head(self, length: int) -> Encoded:
        return Encoded(self.codes[:length], self.side[:length])


class KVCache:
    """K and V of one attention layer ([tokens, Hkv, Dh] post-RoPE keys and values) in a KV format.

    `kv_format` None or "f16" keeps fp32 rows exactly (the reference's long-standing behaviour);
    other formats store what the CUDA kernels store (engine.reference.kv_quant) and attention reads
    that stored form through `k_codec` / `v_codec` (rotated-domain scores and value sums).
    """

    def __init__(self, n_kv_heads: int, head_dim: int, kv_format: str | KVFormat | None = None):
        fmt = kv_format_of(kv_format)
        self.format = fmt
        self.k_codec = codec_for(fmt.k, head_dim)
        self.v_codec = codec_for(fmt.v, head_dim)
        empty = np.zeros((1, n_kv_heads, head_dim), np.float32)
        self._k = _StoredRows(self.k_codec.encode(empty))
        self._v = _StoredRows(self.v_codec.encode(empty))
        self.length = 0

    @property
    def keys(self) -> np.ndarray:
        """Keys [tokens, Hkv, Dh] as stored (decoded from the codes for quantised formats)."""
        return self.k_codec.decode(self._k.head(self.length))

    @property
    def values(self) -> np.ndarray:
        return self.v_codec.decode(self._v.head(self.length))

    def key_domain(self) -> np.ndarray:
        """Keys in the K codec's attention domain [tokens, Hkv, domain width] (rotated for wht formats)."""
        return self.k_codec.domain_values(self._k.head(self.length))

    def value_domain(self) -> np.ndarray:
        return self.v_codec.domain_values(self._v.head(self.length))

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """Add rows k, v [T, Hkv, Dh] after the cached ones (encoded into the cache's format)."""
        self._k.write(self.length, self.k_codec.encode(k))
        self._v.write(self.length, self.v_codec.encode(v))
        self.length += k.shape[0]

    def truncate(self, length: int) -> None:
        """Forget the rows from `length` on (rolling back rejected speculative tokens); rows are kept in
        order, so the first `length` are exactly the state before those tokens."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} rows to {length}")
        self.length = length

    def stored(self) -> tuple[np.ndarray, ...]:
        """The stored rows as arrays: (k, v) fp32 for f16, else (k codes, k side, v codes, v side)."""
        k, v = self._k.head(self.length), self._v.head(self.length)
        if self.k_codec.exact and self.v_codec.exact:
            return (k.codes, v.codes)
        return (k.codes, k.side, v.codes, v.side)

    def encoded(self) -> tuple[Encoded, Encoded]:
        """The stored K and V rows as `Encoded` (what `CardRowsKV` replays)."""
        return self._k.head(self.length), self._v.head(self.length)

    def replace_stored(self, stored: tuple[np.ndarray, ...]) -> None:
        """Make the cache hold exactly the rows of a `stored()` tuple (used by restore); no re-encoding."""
        if len(stored) == 2:
            k, v = (Encoded(a, np.zeros((*a.shape[:-1], 0), np.float16)) for a in stored)
        else:
            k, v = Encoded(stored[0], stored[1]), Encoded(stored[2], stored[3])
        self._k.write(0, k)
        self._v.write(0, v)
        self.length = k.codes.shape[0]


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
    kv_format: KVFormat
    n_tokens: int
    next_position: int
    kv: tuple[tuple[np.ndarray, ...], ...]  # KVCache.stored() per attention layer, in layer order
    gdn: tuple[tuple[np.ndarray, np.ndarray], ...]  # (conv, recurrent) per GDN layer, in layer order
    mtp: tuple[tuple[tuple[np.ndarray, ...], int], ...]  # (KVCache.stored(), next_position) per MTP block


def _frozen(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out.setflags(write=False)
    return out


class SequenceState:
    """Everything one sequence carries between forward calls; a fresh state is all zeros at position 0.

    `kv_format` (a name such as "k8v3", or a KVFormat) is the storage of every attention layer's cache
    and the MTP blocks' caches; None keeps the exact fp32 cache.
    """

    def __init__(self, cfg: ModelConfig, kv_format: str | KVFormat | None = None):
        self.cfg = cfg
        self.kv_format = kv_format_of(kv_format)
        self.n_tokens = 0
        self.next_position = 0
        self.kv: dict[int, KVCache] = {
            i: KVCache(cfg.n_head_kv, cfg.head_dim, self.kv_format) for i in cfg.attention_layers
        }
        self.gdn: dict[int, GdnLayerState] = {
            i: GdnLayerState(
                conv=np.zeros((cfg.ssm_conv_kernel - 1, cfg.ssm_conv_dim), np.float32),
                recurrent=np.zeros((cfg.ssm_n_v_heads, cfg.ssm_d_state, cfg.ssm_d_head_v), np.float32),
            )
            for i in cfg.gdn_layers
        }
        self.mtp: list[MtpBlockState] = [
            MtpBlockState(KVCache(cfg.n_head_kv, cfg.head_dim, self.kv_format)) for _ in range(cfg.n_mtp)
        ]

    def snapshot(self) -> StateSnapshot:
        """An immutable deep copy of the current state."""
        return StateSnapshot(
            cfg=self.cfg,
            kv_format=self.kv_format,
            n_tokens=self.n_tokens,
            next_position=self.next_position,
            kv=tuple(tuple(_frozen(a) for a in c.stored()) for _, c in sorted(self.kv.items())),
            gdn=tuple((_frozen(s.conv), _frozen(s.recurrent)) for _, s in sorted(self.gdn.items())),
            mtp=tuple((tuple(_frozen(a) for a in m.kv.stored()), m.next_position) for m in self.mtp),
        )

    def restore(self, snap: StateSnapshot) -> None:
        """Return to exactly the state `snap` was taken from (copies; `snap` stays reusable)."""
        if snap.cfg != self.cfg:
            raise ValueError("snapshot was taken from a state of a different model configuration")
        if snap.kv_format != self.kv_format:
            raise ValueError(f"snapshot holds a {snap.kv_format.name} KV cache, this state {self.kv_format.name}")
        self.n_tokens = snap.n_tokens
        self.next_position = snap.next_position
        for (_, cache), stored in zip(sorted(self.kv.items()), snap.kv):
            cache.replace_stored(stored)
        for (_, layer), (conv, recurrent) in zip(sorted(self.gdn.items()), snap.gdn):
            layer.conv = conv.copy()
            layer.recurrent = recurrent.copy()
        for block, (stored, next_position) in zip(self.mtp, snap.mtp):
            block.kv.replace_stored(stored)
            block.next_position = next_position
