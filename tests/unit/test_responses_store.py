"""The store behind `previous_response_id` (engine/server/responses_input.py): bounded in count and in bytes."""

from __future__ import annotations

import json

import pytest

from engine.generation.serving.request_error import APIError
from engine.server.responses_input import ConversationStore


def turn(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def size(messages) -> int:
    return len(json.dumps(messages))


def test_the_oldest_conversations_go_once_their_bytes_pass_the_budget():
    one = turn("x" * 1000)
    store = ConversationStore(limit=100, max_bytes=3 * size(one))
    for i in range(5):
        store.put(f"resp_{i}", one)
    for gone in ("resp_0", "resp_1"):
        with pytest.raises(APIError, match="not kept"):
            store.get(gone)
    assert [store.get(f"resp_{i}") for i in (2, 3, 4)] == [one, one, one]


def test_the_count_limit_still_holds_and_a_conversation_over_the_budget_is_not_kept():
    store = ConversationStore(limit=2, max_bytes=10_000)
    for i in range(3):
        store.put(f"resp_{i}", turn(str(i)))
    with pytest.raises(APIError):
        store.get("resp_0")
    store.put("huge", turn("y" * 20_000))
    with pytest.raises(APIError):
        store.get("huge")
    assert store.get("resp_2") == turn("2")  # nothing was evicted for the conversation that was refused


def test_putting_the_same_id_again_counts_its_bytes_once():
    one = turn("z" * 100)
    store = ConversationStore(limit=100, max_bytes=2 * size(one))
    for _ in range(5):
        store.put("same", one)
    store.put("other", one)
    assert store.get("same") == one and store.get("other") == one
