"""A captured graph's tail (engine/cuda/graphs.py CapturedGraph.mark_tail / set_tail) over a stand-in driver: the
nodes after the mark, walked along the captured chain, are switched off and on only when the state changes, and a
tail that is not a chain is refused without leaving the graph allocated."""

from __future__ import annotations

import pytest

from engine.cuda.graphs import CapturedGraph
from engine.errors import RigllmError


class ChainApi:
    """The GraphApi calls CapturedGraph makes, over a graph given as node -> dependents."""

    def __init__(self, dependents: dict[int, list[int]], tip: int):
        self.edges, self.tip = dependents, tip
        self.enabled: list[tuple[int, bool]] = []
        self.destroyed: list[tuple[int, int]] = []

    def begin_capture(self, stream: int) -> None:
        pass

    def capture_tip(self, stream: int) -> int:
        return self.tip

    def end_capture(self, stream: int) -> int:
        return 100

    def instantiate(self, graph: int) -> int:
        return 200

    def dependents(self, node: int) -> list[int]:
        return self.edges.get(node, [])

    def set_enabled(self, exec_: int, node: int, enabled: bool) -> None:
        self.enabled.append((node, enabled))

    def destroy(self, exec_: int, graph: int) -> None:
        self.destroyed.append((exec_, graph))


def captured(api: ChainApi) -> CapturedGraph:
    graph = CapturedGraph(api, "decode x2")  # type: ignore[arg-type]
    graph.start_capture(7)
    graph.mark_tail()
    graph.finish_capture(7)
    return graph


def test_the_tail_is_the_chain_after_the_mark_and_switches_only_on_change():
    api = ChainApi({1: [2], 2: [3], 3: [4], 4: [5]}, tip=3)  # nodes 1-3 the forward pass, 4-5 the picks
    graph = captured(api)
    graph.set_tail(True)  # as captured: nothing to do
    assert api.enabled == []
    graph.set_tail(False)
    graph.set_tail(False)
    assert api.enabled == [(4, False), (5, False)]
    graph.set_tail(True)
    assert api.enabled[2:] == [(4, True), (5, True)]


def test_a_graph_without_a_mark_has_no_tail():
    api = ChainApi({1: [2]}, tip=1)
    graph = CapturedGraph(api, "forward x1")  # type: ignore[arg-type]
    graph.start_capture(7)
    graph.finish_capture(7)
    graph.set_tail(False)
    assert api.enabled == []


def test_a_tail_that_branches_is_refused_and_freed():
    api = ChainApi({3: [4, 5]}, tip=3)
    with pytest.raises(RigllmError, match="2 dependents in its tail"):
        captured(api)
    assert api.destroyed == [(200, 100)]
