"""Device work that runs the same launches again and again (a speculative round's pieces), replayed from graphs.

Capturing executes nothing, so a piece's kernels must have been loaded by an eager launch first: a key's
work runs eagerly the first time, is captured the second and replayed from then on. The key names what
the work bakes into its launches (the slot, the owed rows, the accepted count...).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from engine.cuda.driver import CudaCard
from engine.cuda.graphs import CapturedGraph


class GraphRuns:
    """One card's graphs of repeated work, by key."""

    def __init__(self, card: CudaCard, label: str):
        self.card, self.label = card, label
        self._graphs: dict[Hashable, CapturedGraph] = {}
        self._seen: set[Hashable] = set()

    def run(self, key: Hashable, work: Callable[[], None]) -> None:
        """Run `work` eagerly the first time (that loads its kernels), capture it the second, replay it after."""
        graph = self._graphs.get(key)
        if graph is None:
            if key not in self._seen:
                self._seen.add(key)
                work()
                return
            with self.card.capture(f"{self.label} {key}") as graph:
                work()
            self._graphs[key] = graph
        self.card.replay(graph)
