"""Logprob entries through a job's text pipeline: in order, never ahead of their text, cut with a stop string."""

from __future__ import annotations

import pytest

from engine.generation.logprobs import TokenLogprob
from engine.generation.sampler import SamplingParams
from engine.generation.serving.generation_job import Finished, Job, JobOutput, Piece
from tokenizer_fixtures import trained_tokenizer


def run_job(text: str, stop: list[str]) -> tuple[list, list[int], str]:
    """Feed `text`'s tokens (each with a fake logprob -index) until a stop; (posted events, ids, visible text)."""
    tokenizer = trained_tokenizer()
    posted: list = []
    job = Job([1], SamplingParams(), 100, False, None, stop, posted.append, top_logprobs=1)
    out = JobOutput(job, tokenizer)
    ids = tokenizer.encode(text, parse_special=False)
    for i, token in enumerate(ids):
        if out.add(token, TokenLogprob(token, -float(i), ((token, -float(i)),))):
            break
    out.finish("length", 1, 0, 0.0, 0.0)
    visible = "".join(e.text for p in posted if isinstance(p, Piece) for e in p.events)
    return posted, ids, visible


def entries(posted: list) -> list:
    return [e for p in posted if isinstance(p, Piece) for e in p.logprobs]


@pytest.mark.parametrize("text", ["Hello world, stop here now.", "日本語 😀 emoji and more"])
def test_every_token_gets_its_entry_in_order(text: str) -> None:
    posted, ids, visible = run_job(text, [])
    got = entries(posted)
    assert [e.logprob for e in got] == [-float(i) for i in range(len(ids))]
    tokenizer = trained_tokenizer()
    assert [e.token for e in got] == [tokenizer.token_bytes(t) for t in ids]
    assert b"".join(e.token for e in got).decode() == text == visible
    offsets = [e.text_offset for e in got]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert isinstance(posted[-1], Finished)


def test_entries_never_run_ahead_of_their_text() -> None:
    """With a stop string that keeps text held back, each posted entry's text start is already visible."""
    posted, _, _ = run_job("Hello world, stop here now.", ["here now!"])
    shown = 0
    for item in posted:
        if isinstance(item, Piece):
            shown += sum(len(e.text) for e in item.events)
            assert all(e.text_offset < max(shown, 1) for e in item.logprobs)


def test_tokens_after_a_stop_string_get_no_entry() -> None:
    text = "Hello world, stop here now."
    posted, ids, visible = run_job(text, ["p h"])
    got = entries(posted)
    assert visible == "Hello world, sto"
    assert b"".join(e.token for e in got).decode() == "Hello world, stop"  # "op" starts before the cut, " h" in it
    assert len(got) < len(ids)
