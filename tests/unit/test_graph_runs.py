"""engine.cuda.graph_runs on the stand-in card: a key runs eagerly, is captured, then replayed; the card keeps at
most `capacity` graphs, releasing the least recently replayed (issue 28: graphs bounded, freed when evicted)."""

from __future__ import annotations

from engine.cuda.graph_runs import MAX_GRAPHS, GraphRuns
from fake_card import FakeCard


def test_a_key_runs_eagerly_then_is_captured_then_replayed():
    card, calls = FakeCard(), []
    runs = GraphRuns(card, "t")
    for _ in range(3):
        runs.run("k", lambda: calls.append(1))
    assert calls == [1, 1]  # eager, then inside the capture; the third is a replay
    assert len(card.graphs) == len(runs) == 1
    assert sum(1 for name, *_ in card.launches if name == "<replay>") == 2


def test_the_least_recently_replayed_graph_is_released_past_the_bound():
    card = FakeCard()
    runs = GraphRuns(card, "t", capacity=3)
    for key in "abc":
        runs.run(key, lambda: None)
        runs.run(key, lambda: None)  # captured
    first = card.graphs[0]
    runs.run("a", lambda: None)  # "a" is now the most recent, "b" the least
    b = card.graphs[1]
    runs.run("d", lambda: None)
    runs.run("d", lambda: None)  # captured: one over the bound
    assert len(runs) == len(card.graphs) == 3
    assert b.closed and b not in card.graphs and not first.closed
    replays = sum(1 for name, *_ in card.launches if name == "<replay>")
    runs.run("b", lambda: None)  # seen before: captured again at once, not run eagerly first
    assert len(runs) == 3 and sum(1 for name, *_ in card.launches if name == "<replay>") == replays + 1
    assert runs.capacity == 3 < MAX_GRAPHS
