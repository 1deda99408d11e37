"""Device work that runs the same launches again and again (a speculative round's pieces), replayed from graphs.

Capturing executes nothing, so a piece's kernels must have been loaded by an eager launch first: a key's
work runs eagerly the first time, is captured the second and replayed from then on. The key names what
the work bakes into its launches (the slots, their modes, the accepted count...).

The graphs are bounded (issue 28: a card's graph count must not grow with the slots that ever speculated):
one GraphRuns per card, shared by its StageVerifier and CudaSpeculator, keeps MAX_GRAPHS, the least recently
replayed released first. A slot speculating alone at K <= 2 replays at most 6 graphs on a card: per mode
(greedy, sampled) a round graph, or over several cards a draft graph and a decision (the owed rows are data:
engine.cuda.mtp pads them), plus a commit per rejected-draft count. Slots speculating together
(engine.cuda.speculative) replay one draft graph and one verify graph per set of slots and modes, and each slot's
commits: 4 slots at K=1 replay 1 + 1 + 4 = 6 in steady rounds, 2 slots at K=2 1 + 1 + 4 = 6. So a bound of 16
holds a steady set of rounds and evicts what slots that stopped speculating left. With the card's 8 decode graphs
(one per batch width) that keeps a card at 24 graphs at most: 8 batch widths x 3 verify widths (1 to 3 rows).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

from engine.cuda.driver import CudaCard
from engine.cuda.graphs import CapturedGraph

MAX_GRAPHS = 16


class GraphRuns:
    """One card's graphs of repeated work, by key, at most `capacity` of them."""

    def __init__(self, card: CudaCard, label: str, capacity: int = MAX_GRAPHS):
        self.card, self.label, self.capacity = card, label, capacity
        self._graphs: OrderedDict[Hashable, CapturedGraph] = OrderedDict()  # least recently replayed first
        self._seen: set[Hashable] = set()

    def __len__(self) -> int:
        return len(self._graphs)

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
            while len(self._graphs) > self.capacity:
                # an evicted graph still queued on the stream is freed by the driver once it has run
                self.card.release_graph(self._graphs.popitem(last=False)[1])
        else:
            self._graphs.move_to_end(key)
        self.card.replay(graph)
