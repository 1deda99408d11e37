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
