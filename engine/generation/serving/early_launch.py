"""Whether a decode step's pick decides its job's next feed before the pick's text work runs: the rule that
lets the scheduler launch step t+1 while it detokenizes step t (issue 28 item 4).

A pick ends its job for sure when it is an end token, NaN's -1, or the last token `max_tokens` allows; it
continues it for sure when none of the job's rules that only the text work can apply may end it: no stop
strings (the text decides them), no grammar or thinking budget (the next pick needs a mask made after the
grammar takes this one), not cancelled, before its deadline, and one token (a speculative run's tokens go
through the rules one by one). Anything else is unsure, and the step after it waits for the text work.

A backend that takes a masked step's forward pass before its masks (`MaskedStepLauncher`, `masks_later`) lifts
the grammar's rule: the masks are made after the text work, and a grammar that ends its job on this pick (its
document complete) ends it while the launched step runs, like a cancel, whose fed token the slot's state keeps.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Final

from engine.generation.serving.generation_job import Job, JobOutput
from engine.generation.slots import Pick

UNSURE: Final = -2  # the pick's text work decides


def next_feed(job: Job, out: JobOutput, pick: Pick, stop_ids: Collection[int],
              masks_later: bool = False) -> int | None:
    """The token the job's slot will be fed next (None: the pick ends the job), or UNSURE."""
    if pick.extra or (out.masked and not masks_later) or job.stop or job.cancelled.is_set():
        return UNSURE
    if pick.token < 0 or pick.token in stop_ids or out.generated + 1 >= job.max_tokens:
        return None
    if job.deadline is not None and time.monotonic() >= job.deadline:
        return UNSURE
    return pick.token
