"""How long a card sits idle between consecutive decode steps (issue 28 item 4: the host's text work for step
t used to run while the card waited for step t+1).

Each step is bracketed by CUDA events on the card's stream: `start` before its uploads, `end` after its
read-backs. When step t+1 follows step t with no other work in between, the card was idle from `end` of t to
`start` of t+1, timed by the card's own clock. Other work between two steps (a prefill chunk, a request's
first pick, a snapshot) calls `interrupt`, so its busy time is never counted as idle. That work may come while a
launched step is still to be waited for (a request begins while the last step of a finished one is in flight):
then that step's `end` comes before the work on the card, and the next step's gap is not measured from it.
"""

from __future__ import annotations

from engine.cuda.driver import CudaCard, Event


class StepGaps:
    """Idle time between the steps of one card's decoder; two pairs of events, used in turn."""

    def __init__(self, card: CudaCard):
        self._pairs = [(card.event(), card.event()) for _ in range(2)]
        self._turn = 0
        self._last_end: Event | None = None
        self._in_flight = False  # a step started and not yet waited for
        self._followed = False  # other work was queued after the step in flight
        self.steps = 0  # steps that followed another step directly (each one's gap is counted)
        self.idle_ms = 0.0
        self.max_ms = 0.0

    def started(self) -> None:
        """A step's first work is about to be queued."""
        self._pairs[self._turn][0].record()
        self._in_flight = True

    def ended(self) -> None:
        """The step's last work (its read-backs) is queued."""
        self._pairs[self._turn][1].record()

    def wait(self) -> None:
        """Wait for the step to end, then count the gap before it if it followed a step directly."""
        start, end = self._pairs[self._turn]
        end.synchronize()
        if self._last_end is not None:
            gap = start.elapsed_ms(self._last_end)
            self.steps += 1
            self.idle_ms += gap
            self.max_ms = max(self.max_ms, gap)
        self._last_end = None if self._followed else end
        self._in_flight = self._followed = False
        self._turn ^= 1

    def interrupt(self) -> None:
        """Other work ran on the card since the last step, or is queued after the step in flight (whose own gap
        stays idle time): the next step's gap is not idle time."""
        if self._in_flight:
            self._followed = True
        else:
            self._last_end = None

    def discard(self) -> None:
        """The step in flight will not be waited for (it failed midway): no gap is measured across it."""
        self._last_end = None
        self._in_flight = self._followed = False

    @property
    def mean_ms(self) -> float:
        return self.idle_ms / self.steps if self.steps else 0.0
