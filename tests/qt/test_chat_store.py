"""Chat storage: migrations from fixture databases, crash recovery flag, undoable delete, export/import."""

from __future__ import annotations

import sqlite3

import pytest

from app.chat_export import ChatImportError, from_json, from_markdown, to_json, to_markdown
from app.chat_records import INTERRUPTED, STREAMING, Attachment, Message
from app.chat_store import MIGRATIONS, SCHEMA_VERSION, ChatStore, ChatStoreError

PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154789c6360"
                    "0000000200010e0d0a2d0000000049454e44ae426082")


def build_fixture_db(path, version: int) -> None:
    """A database as release `version` wrote it, with one conversation of two messages."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    db.execute("INSERT INTO schema_version VALUES (?)", (version,))
    for script in MIGRATIONS[:version]:
        db.executescript(script)
    db.execute("INSERT INTO conversations (id, title, created, updated) VALUES (1, 'old chat', 1.0, 2.0)")
    db.execute("INSERT INTO messages (conversation_id, position, role, content) VALUES (1, 0, 'user', 'hi')")
    db.execute("INSERT INTO messages (conversation_id, position, role, content) VALUES (1, 1, 'assistant', 'hello')")
    db.commit()
    db.close()


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION + 1))
def test_every_older_schema_opens_and_keeps_its_chats(tmp_path, version):
    path = tmp_path / f"v{version}.sqlite3"
    build_fixture_db(path, version)
    store = ChatStore(path)
    assert store.schema_version == SCHEMA_VERSION
    [conv] = store.conversations()
    assert conv.title == "old chat"
    assert [(m.role, m.content, m.status) for m in store.messages(conv.id)] == [
        ("user", "hi", "complete"), ("assistant", "hello", "complete")]
    store.add_message(conv.id, Message("user", "new", attachments=[Attachment("a.png", "image/png", PNG)]))
    assert store.messages(conv.id)[-1].attachments[0].data == PNG
    store.close()


def test_newer_schema_is_refused_untouched(tmp_path):
    path = tmp_path / "future.sqlite3"
    build_fixture_db(path, SCHEMA_VERSION)
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version=?", (SCHEMA_VERSION + 1,))
    db.commit()
    db.close()
    with pytest.raises(ChatStoreError, match="newer"):
        ChatStore(path)
    db = sqlite3.connect(path)
    assert db.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION + 1


def test_wal_mode_and_streaming_answers_become_interrupted_on_open(tmp_path):
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    cid = store.create_conversation("c")
    store.add_message(cid, Message("user", "q"))
    answer = Message("assistant", "partial ans", status=STREAMING)
    store.add_message(cid, answer)
    store.close()
    reopened = ChatStore(path)
    last = reopened.messages(cid)[-1]
    assert (last.content, last.status) == ("partial ans", INTERRUPTED)
    reopened.close()


def test_delete_is_undoable_until_purged_and_search_finds_text(store):
    a = store.create_conversation("alpha")
    b = store.create_conversation("beta")
    store.add_message(b, Message("user", "the word zebra"))
    assert [c.id for c in store.conversations("zebra")] == [b]
    assert [c.id for c in store.conversations("ALPHA")] == [a]
    store.delete(a)
    assert [c.id for c in store.conversations()] == [b]
    store.restore(a)
    assert {c.id for c in store.conversations()} == {a, b}
    store.delete(a)
    store.purge_deleted()
    store.restore(a)
    assert [c.id for c in store.conversations()] == [b]


def test_truncate_drops_the_tail(store):
    cid = store.create_conversation("c")
    for text in ("1", "2", "3"):
        store.add_message(cid, Message("user", text))
    store.truncate(cid, 1)
    store.add_message(cid, Message("user", "4"))
    assert [m.content for m in store.messages(cid)] == ["1", "4"]


def _sample() -> list[Message]:
    return [Message("system", "be brief"),
            Message("user", "look", attachments=[Attachment("dot.png", "image/png", PNG)]),
            Message("assistant", "A dot.\n\n```python\nprint(1)\n```", reasoning="It is a pixel.",
                    reasoning_seconds=0.5, tool_calls=[{"id": "c1", "type": "function",
                                                        "function": {"name": "f", "arguments": "{}"}}],
                    status=INTERRUPTED, stats={"tokens": 9.0})]


def test_json_round_trip_is_lossless():
    title, messages = from_json(to_json("T", _sample()))
    assert title == "T" and messages == _sample()


def test_markdown_round_trip_keeps_roles_text_reasoning_and_images():
    text = to_markdown("My chat", _sample())
    assert "## Assistant" in text and "data:image/png;base64," in text
    title, messages = from_markdown(text)
    assert title == "My chat"
    assert [(m.role, m.content, m.reasoning) for m in messages] == [(m.role, m.content, m.reasoning) for m in _sample()]
    assert messages[1].attachments == _sample()[1].attachments


@pytest.mark.parametrize("bad", ["{}", "not json", '{"format": "rigllm-chat", "messages": [{"content": "x"}]}'])
def test_bad_json_imports_say_why(bad):
    with pytest.raises(ChatImportError):
        from_json(bad)


def test_markdown_without_sections_is_refused():
    with pytest.raises(ChatImportError, match="no '## User'"):
        from_markdown("# Title\n\njust text")
