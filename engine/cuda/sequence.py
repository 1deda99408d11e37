"""One sequence's state on a card: the KV cache of every attention layer (fp16 or a quantised format,
engine.cuda.kv_cache), the fp32 GDN state, and
the sequence's per-step values (`step`: cache row of the next token, tokens in the batch).

Cache rows and RoPE positions differ once a sequence has seen an image: an image's tokens share
M-RoPE positions (spec §9.6), so after one the next token's rope position is its cache row plus
`rope_shift` (≤ 0; 0 for text-only sequences, whose passes need no position buffer).

Sizes are fixed at creation (capacity = the planned context), so nothing is allocated while a request
runs and captured graphs keep valid pointers. `copy_from` is a device-to-device copy (anchor-qengine.md
§7.8); `snapshot`/`restore` copy only the used KV rows and the GDN state out to host memory and back (through the
card's pinned staging, engine.cuda.host_staging), for the prefix cache, which must not hold a full-context copy per
kept turn on a 16 GB card.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.host_staging import HostStaging
from engine.cuda.kv_cache import KVLayerCache, alloc_kv_layer, code_row_bytes, side_blocks
from engine.model.kv_formats import KVFormat, kv_format
from engine.gguf.config import ModelConfig

F16_FORMAT = kv_format("f16")

F32, F16 = 4, 2


@dataclass
class GdnState:
    conv: DeviceBuffer  # fp32 [Kc-1][Cc], oldest row first
    recurrent: DeviceBuffer  # fp32 [Hv][dk][dv]


class DeviceSequence:
    """KV caches and GDN states for one sequence, plus the next position (spec §6.9, §8)."""

    def __init__(self, card: CudaCard, cfg: ModelConfig, capacity: int, label: str = "seq",
                 step: DeviceBuffer | None = None, span: range | None = None, kv: KVFormat = F16_FORMAT):
        """`step`: 8 bytes for [pos, n_tokens] (e.g. a view into a buffer shared by all slots, so one
        copy updates every slot's position before a batched step); allocated here when None.
        `span`: the trunk layers this card runs (default all): only their caches and states live here.
        `kv`: the cache format (fp16 keeps today's [Hkv][capacity][Dh] fp16 planes)."""
        span = range(cfg.n_layers) if span is None else span
        self.card, self.cfg, self.capacity = card, cfg, capacity
        self.step = step if step is not None else card.alloc(8, f"{label}.step")
        self.next_position = 0  # cache rows used (= tokens seen)
        self.rope_shift = 0  # rope position of the next token minus its cache row
        self.kv_format = kv
        self.kv: dict[int, KVLayerCache] = {}
        for i in (i for i in cfg.attention_layers if i in span):
            self.kv[i] = alloc_kv_layer(card, kv, cfg.n_head_kv, cfg.head_dim, capacity, f"{label}.kv{i}")
        self.gdn: dict[int, GdnState] = {}
        conv_bytes = (cfg.ssm_conv_kernel - 1) * cfg.ssm_conv_dim * F32
        rec_bytes = cfg.ssm_n_v_heads * cfg.ssm_d_state * cfg.ssm_d_head_v * F32
        for i in (i for i in cfg.gdn_layers if i in span):
            self.gdn[i] = GdnState(card.alloc(conv_bytes, f"{label}.gdn{i}.conv"), card.alloc(rec_bytes, f"{label}.gdn{i}.rec"))
        self.reset()

    def buffers(self) -> list[DeviceBuffer]:
        out: list[DeviceBuffer] = []
        for c in self.kv.values():
            out += c.buffers()
        for s in self.gdn.values():
            out += [s.conv, s.recurrent]
        return out

    def reset(self) -> None:
        """A fresh sequence: zero GDN states and caches, position 0."""
        for buf in self.buffers():
            buf.fill_zero()
        self.next_position = 0
        self.rope_shift = 0

    def copy_from(self, other: "DeviceSequence") -> None:
        """Become `other` (same card and shapes): the snapshot/restore primitive."""
        if other.card is not self.card or other.capacity != self.capacity or other.cfg != self.cfg:
            raise ValueError("sequence copies need the same card, model and capacity")
        for dst, src in zip(self.buffers(), other.buffers()):
            dst.copy_from(src)
        self.next_position = other.next_position
        self.rope_shift = other.rope_shift

    @property
    def next_rope_position(self) -> int:
        """The rope position of the next token (M-RoPE "largest position used + 1" after images)."""
        return self.next_position + self.rope_shift

    def set_step(self, n_tokens: int) -> None:
        """Write [next_position, n_tokens] for a pass over this sequence alone (synchronous)."""
        self.step.upload(np.array([self.next_position, n_tokens], dtype=np.int32))

    def snapshot(self, staging: HostStaging) -> tuple[int, list[np.ndarray]]:
        """(position, host copies): the used rows [Hkv][pos][row bytes] of every KV plane (codes and scales, in
        the stored format), then the GDN states, copied through the card's pinned `staging`. A sequence that saw
        images has no snapshot: its state depends on which images they were, which token ids do not say (the
        scheduler never keeps such states)."""
        if self.rope_shift:
            raise ValueError("a sequence that saw images cannot be snapshotted (its token ids do not identify them)")
        pos, parts = self.next_position, []
        pieces: list[tuple[DeviceBuffer, np.ndarray]] = []
        for plane, row_bytes in self._kv_planes():
            rows = np.empty((self.cfg.n_head_kv, pos * row_bytes), np.uint8)
            parts.append(rows)
            pieces += [(self._rows(plane, h, pos, row_bytes), rows[h]) for h in range(self.cfg.n_head_kv)]
        for st in self.gdn.values():
            conv, recurrent = np.empty(st.conv.nbytes // F32, np.float32), np.empty(st.recurrent.nbytes // F32, np.float32)
            parts += [conv, recurrent]
            pieces += [(st.conv, conv), (st.recurrent, recurrent)]
        staging.download(pieces)
        return pos, parts

    def snapshot_bytes(self, position: int) -> int:
        """What a snapshot at `position` copies: the KV rows below it and every GDN state."""
        kv = sum(self.cfg.n_head_kv * position * row_bytes for _, row_bytes in self._kv_planes())
        return kv + sum(st.conv.nbytes + st.recurrent.nbytes for st in self.gdn.values())

    def restore(self, snapshot: tuple[int, list[np.ndarray]], staging: HostStaging) -> None:
        """Return to a `snapshot` of a sequence of the same model and KV format (its KV rows beyond the position
        stay stale but unread: attention reads rows below the position only), copied through `staging`."""
        pos, parts = snapshot
        if pos > self.capacity:
            raise ValueError(f"a snapshot at position {pos} does not fit a sequence of capacity {self.capacity}")
        if len(parts) != len(self._kv_planes()) + 2 * len(self.gdn):
            raise ValueError("the snapshot was taken with another model or KV format")
        it = iter(parts)
        pieces: list[tuple[np.ndarray, DeviceBuffer]] = []
        for plane, row_bytes in self._kv_planes():
            rows = next(it)
            if rows.shape != (self.cfg.n_head_kv, pos * row_bytes):
                raise ValueError("the snapshot was taken with another KV format")
            pieces += [(np.ascontiguousarray(rows[h]), self._rows(plane, h, pos, row_bytes))
                       for h in range(self.cfg.n_head_kv)]
        for st in self.gdn.values():
            for buf in (st.conv, st.recurrent):
                state = np.ascontiguousarray(next(it))
                if state.nbytes != buf.nbytes:
                    raise ValueError("the snapshot was taken with another model")
                pieces.append((state, buf))
        staging.upload(pieces)
        self.next_position = pos
        self.rope_shift = 0

    def _kv_planes(self) -> list[tuple[DeviceBuffer, int]]:
        """Every KV plane with its bytes per (head, position) row."""
        planes = []
        for cache in self.kv.values():
            for side in (cache.k, cache.v):
                planes.append((side.codes, code_row_bytes(side.codec, self.cfg.head_dim)))
                if side.side is not None:
                    planes.append((side.side, F16 * side_blocks(side.codec, self.cfg.head_dim)))
        return planes

    def _rows(self, buf: DeviceBuffer, head: int, rows: int, row_bytes: int) -> DeviceBuffer:
        return buf.view(head * self.capacity * row_bytes, rows * row_bytes)

    def download_gdn_state(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(conv [Kc-1, Cc], recurrent [Hv, dk, dv]) of one GDN layer, for tests and debugging."""
        cfg, s = self.cfg, self.gdn[layer]
        conv = s.conv.download(np.float32, (cfg.ssm_conv_kernel - 1, cfg.ssm_conv_dim))
        rec = s.recurrent.download(np.float32, (cfg.ssm_n_v_heads, cfg.ssm_d_state, cfg.ssm_d_head_v))
        return conv, rec
