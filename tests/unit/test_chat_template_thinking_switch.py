"""`/think` and `/no_think`: honoured only standalone at the end of a user/system message, then stripped."""

from __future__ import annotations

import pytest

from engine.generation.chat_template import ChatTemplate
from engine.generation.thinking_switch import choose_thinking, strip_directive


@pytest.mark.parametrize(
    "text, stripped, wanted",
    [
        ("Explain monads /no_think", "Explain monads", False),
        ("Explain monads\n/think\n", "Explain monads", True),
        ("/no_think", "", False),
        ("Use /no_think at the end", "Use /no_think at the end", None),
        ("path/no_think", "path/no_think", None),
        ("Explain /no_thinking", "Explain /no_thinking", None),
        ("Explain /No_Think", "Explain /No_Think", None),
    ],
)
def test_strip_directive(text: str, stripped: str, wanted: bool | None) -> None:
    assert strip_directive(text) == (stripped, wanted)


def test_last_directive_wins_is_stripped_everywhere_and_the_flag_wins_over_it() -> None:
    messages = [
        {"role": "system", "content": "Be brief. /no_think"},
        {"role": "user", "content": "Hi /think"},
        {"role": "assistant", "content": "Hello /no_think"},  # not a user/system message: left alone
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this? /no_think"}]},
    ]
    choice = choose_thinking(messages)
    assert (choice.enable_thinking, choice.source) == (False, "directive")
    assert choice.messages[0]["content"] == "Be brief."
    assert choice.messages[1]["content"] == "Hi"
    assert choice.messages[2]["content"] == "Hello /no_think"
    assert choice.messages[3]["content"] == [{"type": "image"}, {"type": "text", "text": "What is this?"}]
    assert messages[0]["content"] == "Be brief. /no_think"  # the caller's messages are untouched

    prompt = ChatTemplate.fallback().render(choice.messages, enable_thinking=choice.enable_thinking)
    assert "/no_think" not in prompt.replace("Hello /no_think", "")
    assert prompt.endswith("<think>\n\n</think>\n\n")

    flagged = choose_thinking(messages, enable_thinking=True)
    assert (flagged.enable_thinking, flagged.source) == (True, "request")
    assert flagged.messages == choice.messages

    plain = choose_thinking([{"role": "user", "content": "Hi"}])
    assert (plain.enable_thinking, plain.source) == (None, "template default")
