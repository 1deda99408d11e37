"""The card's idle time between decode steps (engine.cuda.step_gaps) as the server's /metrics shows it."""

from __future__ import annotations

from engine.cuda.step_gaps import StepGaps
from engine.server.metrics_collector import _idle_between_steps
from fake_card import FakeCard


def test_gaps_count_only_steps_that_follow_a_step_and_reach_the_metrics():
    gaps = StepGaps(FakeCard())  # a stand-in event says every interval is 1 ms
    for interrupted in (False, False, True, False):
        if interrupted:
            gaps.interrupt()
        gaps.started()
        gaps.ended()
        gaps.wait()
    assert gaps.steps == 2 and gaps.idle_ms == 2.0 and gaps.max_ms == 1.0 and gaps.mean_ms == 1.0
    families = {f.name: f.samples[0].value for f in _idle_between_steps(gaps)}
    assert families == {"rigllm_decode_steps_followed": 2, "rigllm_decode_idle_seconds": 0.002}


def test_work_queued_behind_a_step_in_flight_keeps_that_step_from_opening_a_gap():
    """A request begins (a prefill, its first pick: `interrupt`) while a launched step is still to be waited for,
    as when a grammar closes its document on the pick before it: the step's end precedes that work on the card,
    so the step after it counts no gap (s19e's 1-stream JSON rounds: the time between rounds was counted)."""
    gaps = StepGaps(FakeCard())
    gaps.started()
    gaps.ended()
    gaps.wait()  # a step
    gaps.started()
    gaps.ended()  # the next one, launched
    gaps.interrupt()  # a new request's prefill, queued behind it
    gaps.wait()  # its gap from the step before is still idle time
    assert gaps.steps == 1
    gaps.started()
    gaps.ended()
    gaps.wait()  # the new request's first step: after the prefill, not after the launched step
    assert gaps.steps == 1
    gaps.started()
    gaps.ended()
    gaps.wait()
    assert gaps.steps == 2


def test_a_step_that_failed_midway_opens_no_gap():
    gaps = StepGaps(FakeCard())
    gaps.started()
    gaps.ended()
    gaps.wait()
    gaps.started()
    gaps.discard()  # never waited for
    gaps.started()
    gaps.ended()
    gaps.wait()
    assert gaps.steps == 0
