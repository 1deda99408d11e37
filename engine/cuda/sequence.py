"""One sequence's state on a card: the fp16 KV cache of every attention layer and the fp32 GDN state.

Sizes are fixed at creation (capacity = the planned context), so nothing is allocated while a request
runs and captured graphs keep valid pointers. Snapshots are device-to-device copies: restoring a
conversation prefix never crosses PCIe (anchor-qengine.md §7.8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.gguf.config import ModelConfig

F32, F16 = 4, 2


@dataclass
class AttentionCache:
    k: DeviceBuffer  # fp16 [Hkv][capacity][Dh]
    v: DeviceBuffer


@dataclass
class GdnState:
    conv: DeviceBuffer  # fp32 [Kc-1][Cc], oldest row first
    recurrent: DeviceBuffer  # fp32 [Hv][dk][dv]


class DeviceSequence:
    """KV caches and GDN states for one sequence, plus the next position (spec §6.9, §8)."""

    def __init__(self, card: CudaCard, cfg: ModelConfig, capacity: int, label: str = "seq"):
        self.card, self.cfg, self.capacity = card, cfg, capacity
        self.next_position = 0
        self.kv: dict[int, AttentionCache] = {}
        self.gdn: dict[int, GdnState] = {}
        kv_bytes = cfg.n_head_kv * capacity * cfg.head_dim * F16
        for i in cfg.attention_layers:
            self.kv[i] = AttentionCache(card.alloc(kv_bytes, f"{label}.kv{i}.k"), card.alloc(kv_bytes, f"{label}.kv{i}.v"))
        conv_bytes = (cfg.ssm_conv_kernel - 1) * cfg.ssm_conv_dim * F32
        rec_bytes = cfg.ssm_n_v_heads * cfg.ssm_d_state * cfg.ssm_d_head_v * F32
        for i in cfg.gdn_layers:
            self.gdn[i] = GdnState(card.alloc(conv_bytes, f"{label}.gdn{i}.conv"), card.alloc(rec_bytes, f"{label}.gdn{i}.rec"))
        self.reset()

    def buffers(self) -> list[DeviceBuffer]:
        out: list[DeviceBuffer] = []
        for c in self.kv.values():
            out += [c.k, c.v]
        for s in self.gdn.values():
            out += [s.conv, s.recurrent]
        return out

    def reset(self) -> None:
        """A fresh sequence: zero GDN states and caches, position 0."""
        for buf in self.buffers():
            buf.fill_zero()
        self.next_position = 0

    def copy_from(self, other: "DeviceSequence") -> None:
        """Become `other` (same card and shapes): the snapshot/restore primitive."""
        if other.card is not self.card or other.capacity != self.capacity or other.cfg != self.cfg:
            raise ValueError("sequence copies need the same card, model and capacity")
        for dst, src in zip(self.buffers(), other.buffers()):
            dst.copy_from(src)
        self.next_position = other.next_position

    def download_gdn_state(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(conv [Kc-1, Cc], recurrent [Hv, dk, dv]) of one GDN layer, for tests and debugging."""
        cfg, s = self.cfg, self.gdn[layer]
        conv = s.conv.download(np.float32, (cfg.ssm_conv_kernel - 1, cfg.ssm_conv_dim))
        rec = s.recurrent.download(np.float32, (cfg.ssm_n_v_heads, cfg.ssm_d_state, cfg.ssm_d_head_v))
        return conv, rec
