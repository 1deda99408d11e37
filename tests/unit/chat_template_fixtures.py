"""Shared inputs for the chat-template tests: the official Qwen3.5 template and conversations covering §11.

The conversations contain no `/think` directives (contracts.md: parity tests use inputs without them).
"""

from __future__ import annotations

from typing import Any

from llama_sdist import sdist_file

OFFICIAL_TEMPLATE = "vendor/llama.cpp/models/templates/Qwen3.5-4B.jinja"


def official_qwen35_template() -> str:
    """The official Qwen3.5 template text from the llama-cpp-python sdist (skips the test when offline)."""
    return sdist_file(OFFICIAL_TEMPLATE).read_text(encoding="utf-8")


WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city — “quoted”, ünïcode & <markup>",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "days": {"type": "integer"},
                "units": {"type": "string", "enum": ["metric", "imperial"]},
            },
            "required": ["city"],
        },
    },
}
CLOCK_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "description": "Local time", "parameters": {"type": "object", "properties": {}}},
}
TOOLS = [WEATHER_TOOL, CLOCK_TOOL]


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# name -> (messages, tools, extra template variables)
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]] = {
    "plain": ([{"role": "user", "content": "Hello, who are you?"}], None, {}),
    "system": (
        [{"role": "system", "content": "  You are terse.\n"}, {"role": "user", "content": "Hi"}],
        None,
        {},
    ),
    "empty_system": ([{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}], None, {}),
    "multi_turn_history_reasoning": (
        [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": "6", "reasoning_content": "Add again."},
            {"role": "user", "content": [{"type": "text", "text": "Thanks! "}, {"type": "text", "text": "Bye."}]},
        ],
        None,
        {},
    ),
    "tools_only": ([{"role": "user", "content": "Weather in Oslo?"}], TOOLS, {}),
    "tools_with_system": (
        [
            {"role": "system",
             "content": [{"type": "text", "text": " Use metric "}, {"type": "text", "text": "units.\n"}]},
            {"role": "user", "content": "Weather in Oslo?"},
        ],
        TOOLS,
        {},
    ),
    "tools_with_blank_system": (
        [{"role": "system", "content": "  \n"}, {"role": "user", "content": "Weather in Oslo?"}],
        [WEATHER_TOOL],
        {},
    ),
    "tool_results_sent_as_user_message": (
        [
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": "", "reasoning_content": "Clock.",
             "tool_calls": [_call("c1", "get_time", {})]},
            {"role": "user", "content": "<tool_response>\n09:30\n</tool_response>"},
            {"role": "assistant", "content": "It is 09:30.", "reasoning_content": " Done. "},
        ],
        TOOLS,
        {},
    ),
    "assistant_tool_call_single_response": (
        [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "\n  I should call the tool.\n\n",
                "tool_calls": [_call("call_1", "get_weather", {"city": "Oslo", "days": 2, "units": "metric"})],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 18 °C"},
        ],
        TOOLS,
        {},
    ),
    "grouped_tool_responses_and_answer": (
        [
            {"role": "system", "content": "Be precise."},
            {"role": "user", "content": "Weather in Oslo and Rome, and the time?"},
            {
                "role": "assistant",
                "content": "Let me check both.",
                "reasoning_content": "\nTwo cities and a clock.\n",
                "tool_calls": [
                    _call("call_1", "get_weather", {"city": "Oslo", "extra": {"a": [1, 2]}, "flags": ["x", "y"]}),
                    _call("call_2", "get_weather", {"city": "Rome", "days": 1, "exact": True, "note": None}),
                    {"id": "call_3", "type": "function", "function": {"name": "get_time", "arguments": {}}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "Rain"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "Sun"}]},
            {"role": "tool", "tool_call_id": "call_3", "content": "12:00"},
            {"role": "assistant", "content": "Oslo: rain. Rome: sun. It is noon."},
            {"role": "user", "content": "Thanks. And tomorrow?"},
        ],
        TOOLS,
        {},
    ),
    "tool_loop_in_progress": (
        [
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": "<think>\nNeed the clock.\n</think>\n\n",
             "tool_calls": [_call("c1", "get_time", {})]},
            {"role": "tool", "content": "09:30"},
            {"role": "assistant", "content": "Checking again.", "tool_calls": [_call("c2", "get_time", {})]},
            {"role": "tool", "content": "09:31"},
        ],
        TOOLS,
        {},
    ),
    "odd_but_accepted_shapes": (
        [
            {"role": "user", "content": "Go"},
            {"role": "assistant", "content": "<think>a</think>b", "reasoning_content": "r",
             "tool_calls": [{"name": "get_time", "arguments": {"x": 1.5}}, {"function": {"name": "get_time"}}]},
            {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": [{"type": "text", "text": "See "}, {"type": "image"}]},
            {"role": "tool", "content": "late"},
        ],
        TOOLS,
        {"add_vision_id": True},
    ),
    "images": (
        [
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "What is in this picture and "},
                {"type": "image"},
                {"type": "text", "text": "this one?"},
            ]},
            {"role": "assistant", "content": "A cat and a dog."},
            {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "And this clip?"}]},
        ],
        None,
        {},
    ),
    "images_with_vision_ids": (
        [
            {"role": "user", "content": [{"type": "image"}, {"type": "image_url", "image_url": {"url": "x"}}]},
            {"role": "assistant", "content": "Two."},
            {"role": "user", "content": [{"type": "text", "text": "More: "}, {"type": "image"}, {"type": "video"}]},
        ],
        None,
        {"add_vision_id": True},
    ),
}

# name -> (messages, the error message the official template raises)
REFUSED: dict[str, tuple[list[dict[str, Any]], str]] = {
    "no_messages": ([], "No messages provided."),
    "no_user_query": ([{"role": "system", "content": "Hi"}], "No user query found in messages."),
    "only_tool_responses": (
        [{"role": "user", "content": "<tool_response>\nx\n</tool_response>"}],
        "No user query found in messages.",
    ),
    "late_system": (
        [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Late"}],
        "System message must be at the beginning.",
    ),
    "unknown_role": ([{"role": "user", "content": "Hi"}, {"role": "critic", "content": "Meh"}],
                     "Unexpected message role."),
    "system_image": (
        [{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "Hi"}],
        "System message cannot contain images.",
    ),
    "system_video": (
        [{"role": "system", "content": [{"type": "video"}]}, {"role": "user", "content": "Hi"}],
        "System message cannot contain videos.",
    ),
    "unknown_part": ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
                     "Unexpected item type in content."),
    "content_number": ([{"role": "user", "content": 42}], "Unexpected content type."),
}
