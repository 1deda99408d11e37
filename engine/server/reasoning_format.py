"""`rigllm serve --reasoning-format`: where a reply's reasoning goes.

`deepseek` (the default, as llama-server's): in `reasoning_content`, beside `content`. `none`: inline in
`content` as `<think>…</think>` before the answer, for clients that drop `reasoning_content` (LangChain's
ChatOpenAI, the `llm` CLI), so a reply whose budget ended in its reasoning is not empty to their users.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.generation.output_parser import THINK_CLOSE, ContentDelta, ReasoningDelta
from engine.generation.serving.generation_job import Event, Piece

REASONING_FORMATS = ("deepseek", "none")
THINK_OPEN = "<think>"


def inline_reasoning(sink: Callable[[Event], None]) -> Callable[[Event], None]:
    """`sink` with reasoning deltas turned into content wrapped in `<think>`/`</think>`."""
    state = {"open": False}

    def passed(item: Event) -> None:
        if isinstance(item, Piece):
            events = []
            for event in item.events:
                if isinstance(event, ReasoningDelta):
                    text = event.text if state["open"] else THINK_OPEN + event.text
                    state["open"] = True
                    events.append(ContentDelta(text))
                    continue
                if state["open"]:
                    state["open"] = False
                    events.append(ContentDelta(THINK_CLOSE))
                events.append(event)
            item = Piece(events, item.logprobs)
        elif state["open"]:
            state["open"] = False
            sink(Piece([ContentDelta(THINK_CLOSE)]))
        sink(item)

    return passed
