"""Kept sequence states, keyed by the exact tokens they cover, so a prompt that extends one skips them.

A Gated DeltaNet state cannot be cut back to an earlier position, so a state is reusable only for a
prompt that starts with *all* of its tokens; the scheduler stores one at each chat turn boundary (the
state before the generation header), which the next turn's prompt extends. Entries are evicted least
recently used first within a byte budget (host memory: snapshots of GPU states are copied out).
`TieredPrefixCache` adds the disk tier (engine.generation.snapshot_store) behind the same calls.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Sequence

from engine.generation.slots import SlotSnapshot
from engine.generation.snapshot_store import SnapshotStore

log = logging.getLogger(__name__)


class PrefixCache:
    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[tuple[int, ...], SlotSnapshot] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, tokens: Sequence[int]) -> bool:
        return tuple(tokens) in self._entries

    def put(self, tokens: Sequence[int], snapshot: SlotSnapshot) -> bool:
        """Keep `snapshot` as the state after `tokens`; False when it alone exceeds the budget."""
        key = tuple(tokens)
        if snapshot.nbytes > self.budget_bytes:
            return False
        if key in self._entries:
            self.nbytes -= self._entries.pop(key).nbytes
        while self._entries and self.nbytes + snapshot.nbytes > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= evicted.nbytes
        self._entries[key] = snapshot
        self.nbytes += snapshot.nbytes
        return True

    def longest_prefix(self, prompt: Sequence[int]) -> tuple[int, SlotSnapshot | None]:
        """The entry covering the most tokens that is a proper prefix of `prompt` (length, snapshot).

        Proper: at least one prompt token must remain to be run, for the logits of the first pick.
        """
        prompt = tuple(prompt)
        best_key: tuple[int, ...] | None = None
        for key in self._entries:
            if len(key) < len(prompt) and (best_key is None or len(key) > len(best_key)) and prompt[: len(key)] == key:
                best_key = key
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        return len(best_key), self._entries[best_key]


class TieredPrefixCache(PrefixCache):
    """A `PrefixCache` in host RAM backed by a `SnapshotStore` on disk, with the same calls.

    `put` keeps the state in RAM and queues it for saving on a writer thread (the generation thread
    never waits for the disk); `longest_prefix` prefers a longer saved state over the best RAM one,
    loading it then and keeping it in RAM. `close` finishes the queued saves.
    """

    def __init__(self, budget_bytes: int, store: SnapshotStore):
        super().__init__(budget_bytes)
        self.store = store
        self._pending: set[tuple[int, ...]] = set()
        self._saves: queue.Queue[tuple[tuple[int, ...], SlotSnapshot] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="rigllm-snapshot-writer", daemon=True)
        self._writer.start()

    def __contains__(self, tokens: Sequence[int]) -> bool:
        key = tuple(tokens)
        return super().__contains__(key) or key in self._pending or key in self.store

    def put(self, tokens: Sequence[int], snapshot: SlotSnapshot) -> bool:
        key = tuple(tokens)
        kept = super().put(key, snapshot)
        if key not in self._pending and key not in self.store:
            self._pending.add(key)
            self._saves.put((key, snapshot))
        return kept

    def longest_prefix(self, prompt: Sequence[int]) -> tuple[int, SlotSnapshot | None]:
        n, snapshot = super().longest_prefix(prompt)
        n_disk, from_disk = self.store.longest_prefix(prompt, longer_than=n)
        if from_disk is None:
            return n, snapshot
        super().put(prompt[:n_disk], from_disk)
        return n_disk, from_disk

    def flush(self) -> None:
        """Wait until every queued save is on disk."""
        self._saves.join()

    def close(self) -> None:
        """Finish the queued saves and end the writer thread."""
        self._saves.put(None)
        self._writer.join()

    def _write_loop(self) -> None:
        while (item := self._saves.get()) is not None:
            key, snapshot = item
            try:
                self.store.save(key, snapshot)
            except Exception:  # a full or read-only disk costs the saved copy, never the generation
                log.exception("could not save a snapshot")
            finally:
                self._pending.discard(key)
                self._saves.task_done()
        self._saves.task_done()
