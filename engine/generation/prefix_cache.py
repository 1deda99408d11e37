"""Kept sequence states, keyed by the exact tokens they cover, so a prompt that extends one skips them.

A Gated DeltaNet state cannot be cut back to an earlier position, so a state is reusable only for a
prompt that starts with *all* of its tokens; the scheduler stores one at each chat turn boundary (the
state before the generation header), which the next turn's prompt extends. Entries are evicted least
recently used first within a byte budget (host memory: snapshots of GPU states are copied out).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from engine.generation.slots import SlotSnapshot


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
