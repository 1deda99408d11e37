"""Slot-indexed decode steps (issue 28): one launch per mixer for all the rows of a batched step.

A batched step gives row b one token of the sequence in slot `row_slot[b]`. The mixers' kernels (GDN conv
and recurrence, attention prep, KV append, flash decode) take that slot per row from a small device array
and find the slot's state through a per-layer pointer table written once, when the slots are allocated
(every sequence's buffers stay where they were allocated: nothing is copied or pooled). The kernels'
side is `cuda_src/common.cuh` ("slot-indexed"): a slot's step record follows the previous slot's
(RIGLLM_STEP_INTS ints), its rope positions are [slot][3], and its table entries are
RIGLLM_GDN_SLOT_PTRS (conv, recurrent state) or RIGLLM_KV_SLOT_PTRS (K codes, K side, V codes, V side;
the fp16 cache has no side planes) 64-bit addresses.

Because nothing in a launch depends on which slots are stepped, the forward pass of one captured graph
per batch width serves every set of slots (the samplers likewise: engine.cuda.slot_sampling); before a
replay the host writes only the row → slot array (beside the positions it writes anyway). The sequences'
own launches (prefill chunks, speculative verifies) keep passing their buffers directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.sequence import DeviceSequence

# Mirrors of common.cuh's #defines (a unit test checks them against the source).
STEP_INTS = 2  # RIGLLM_STEP_INTS: [pos, n_tokens] per slot
ROPE_INTS = 3  # (t, h, w) per slot
GDN_SLOT_PTRS = 2  # RIGLLM_GDN_SLOT_PTRS
KV_SLOT_PTRS = 4  # RIGLLM_KV_SLOT_PTRS


@dataclass(frozen=True)
class SlotRows:
    """The two arguments of one slot-indexed launch: the rows' slots and the layer's pointer table."""

    row_slot: DeviceBuffer
    table: DeviceBuffer

    def args(self) -> tuple[DeviceBuffer, DeviceBuffer]:
        return self.row_slot, self.table


def slot_args(rows: SlotRows | None) -> tuple[DeviceBuffer | None, DeviceBuffer | None]:
    """(row_slot, slot_ptrs) of a launch: null pointers when it runs on one sequence's buffers."""
    return rows.args() if rows is not None else (None, None)


@dataclass(frozen=True)
class SlotBatch:
    """What the slot-indexed launches of one batched step read besides their inputs."""

    row_slot: DeviceBuffer  # int32 [rows]: the slot of each row
    steps: DeviceBuffer  # int32 [slots][STEP_INTS]: every slot's step record
    rope: DeviceBuffer  # int32 [slots][ROPE_INTS]: every slot's rope position for its next token
    tables: dict[int, DeviceBuffer]  # layer -> uint64 [slots][GDN_SLOT_PTRS or KV_SLOT_PTRS]
    like: DeviceSequence  # any slot's sequence: the layers, cache format and capacity every slot shares

    def rows(self, layer: int) -> SlotRows:
        return SlotRows(self.row_slot, self.tables[layer])


def layer_addresses(seq: DeviceSequence, layer: int) -> list[int]:
    """The table entries of one sequence for one of its layers (common.cuh's order; 0 for absent side planes)."""
    if layer in seq.gdn:
        state = seq.gdn[layer]
        return [state.conv.ptr, state.recurrent.ptr]
    cache = seq.kv[layer]
    return [b.ptr if b is not None else 0 for side in (cache.k, cache.v) for b in (side.codes, side.side)]


def upload_slot_tables(card: CudaCard, seqs: Sequence[DeviceSequence], label: str = "slot tables"
                       ) -> dict[int, DeviceBuffer]:
    """Each layer's pointer table over `seqs` (slot i = seqs[i]): one device buffer, a view per layer."""
    layers = sorted({*seqs[0].gdn, *seqs[0].kv})
    for seq in seqs[1:]:
        if sorted({*seq.gdn, *seq.kv}) != layers:
            raise ValueError("slot tables need every slot to hold the same layers")
    rows = [[layer_addresses(seq, layer) for seq in seqs] for layer in layers]
    flat = np.asarray([a for table in rows for entry in table for a in entry], dtype=np.uint64)
    if flat.size == 0:
        return {}
    buf = card.upload(flat, label)
    tables, offset = {}, 0
    for layer, table in zip(layers, rows):
        nbytes = 8 * len(seqs) * len(table[0])
        tables[layer] = buf.view(offset, nbytes, f"{label}.{layer}")
        offset += nbytes
    return tables
