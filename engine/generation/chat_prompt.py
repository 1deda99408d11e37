"""A conversation → prompt token ids, with the thinking switch resolved the one way every front end shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from engine.errors import RigllmError
from engine.generation.chat_template import ChatTemplate
from engine.generation.output_parser import THINK_CLOSE, thinking_from_prompt
from engine.generation.thinking_switch import choose_thinking
from engine.generation.tokenizer import Tokenizer


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    token_ids: list[int]
    thinking: bool  # the prompt opened a `<think>` block, so the reply starts with reasoning
    reply_prefix: str = ""  # forced start of the reply, already in the prompt; output parsers must see it first


def build_chat_prompt(
    template: ChatTemplate,
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    enable_thinking: bool | None = None,
    context_length: int | None = None,
    reply_prefix: str = "",
) -> ChatPrompt:
    """Render and tokenize; refuses (never truncates) a prompt longer than the context.

    Whether thinking is on is read off the rendered prompt (does it end inside an open `<think>`?),
    because the template's own default differs between model sizes (spec §11.4). `reply_prefix` is
    appended as the start of the reply (e.g. a forced tool call); with thinking on it first closes the
    reasoning block, left empty.
    """
    choice = choose_thinking(messages, enable_thinking)
    text = template.render(choice.messages, tools=tools, add_generation_prompt=True, enable_thinking=choice.enable_thinking)
    thinking = thinking_from_prompt(text)
    if reply_prefix:
        reply_prefix = (THINK_CLOSE + "\n\n" if thinking else "") + reply_prefix
        text += reply_prefix
    ids = tokenizer.encode(text, parse_special=True)
    if context_length is not None and len(ids) >= context_length:
        raise RigllmError(
            f"the conversation is {len(ids)} tokens, the context holds {context_length}; "
            "drop older turns or start a new chat"
        )
    return ChatPrompt(text, ids, thinking=thinking, reply_prefix=reply_prefix)
