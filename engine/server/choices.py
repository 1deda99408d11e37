"""Several choices in one response: `n` > 1, or a batch of completion prompts.

Each choice is its own job on its own slot, decoded in the same batched steps as the others. Jobs of one
prompt share its prefill only through the prefix cache: the first job to finish prefilling keeps the
turn-start state, and a job that starts after that restores it; jobs admitted together each prefill.
Streams interleave the jobs' chunks, each with its choice's `index`; usage sums the completions and
counts a prompt shared by `n` choices once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from engine.generation.serving.generation_job import AsyncSink, Failed, Finished, Job
from engine.server.responses import CompletionShape, collect, sse, stream_chunks, usage


def summed_usage(usages: Sequence[dict[str, Any]], per_prompt: int) -> dict[str, Any]:
    """Usage of all choices, in choice order; `per_prompt`: choices per prompt (counted once)."""
    prompts = usages[::per_prompt]
    merged: dict[str, Any] = {}
    for key, value in usages[0].items():
        rows = usages if key.startswith("completion") else prompts
        merged[key] = ({k: sum(u[key][k] for u in rows) for k in value} if isinstance(value, dict)
                       else sum(u[key] for u in rows))
    merged["total_tokens"] = merged["prompt_tokens"] + merged["completion_tokens"]
    return merged


async def collect_choices(jobs: Sequence[tuple[Job, AsyncSink]], shape: CompletionShape,
                          per_prompt: int) -> dict[str, Any] | Failed:
    """The whole response with one choice per job, or the first failure."""
    results = await asyncio.gather(*(collect(job, sink, shape, index=i) for i, (job, sink) in enumerate(jobs)))
    bodies: list[dict[str, Any]] = []
    for result in results:
        if isinstance(result, Failed):
            return result
        bodies.append(result)
    return {**bodies[0], "choices": [b["choices"][0] for b in bodies],
            "usage": summed_usage([b["usage"] for b in bodies], per_prompt)}


async def stream_choices(jobs: Sequence[tuple[Job, AsyncSink]], shape: CompletionShape, include_usage: bool,
                         per_prompt: int) -> AsyncIterator[str]:
    """The jobs' chunks as they come, then one usage chunk (when asked) and `[DONE]`."""
    finals: dict[int, Finished] = {}
    streams = [stream_chunks(job, sink, shape, False, index=i, finals=finals) for i, (job, sink) in enumerate(jobs)]
    pending = {asyncio.ensure_future(anext(s)): s for s in streams}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                stream = pending.pop(future)
                try:
                    chunk = future.result()
                except StopAsyncIteration:
                    continue
                yield chunk
                pending[asyncio.ensure_future(anext(stream))] = stream
    finally:
        for future in pending:
            future.cancel()
        for job, _ in jobs:
            job.cancelled.set()
    if include_usage and len(finals) == len(jobs):
        yield sse({**shape.envelope([], chunk=True),
                   "usage": summed_usage([usage(finals[i]) for i in range(len(jobs))], per_prompt)})
    yield sse("[DONE]")
