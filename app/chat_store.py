"""Chats in SQLite: WAL, a schema version table and forward-only migrations, images as BLOBs.

Why this shape: users lose chats to storage-format upgrades and to unsaved state at exit
(anchor-desktop-apps.md §2 "Losing chats"). Every change is committed at once; an answer is stored
as soon as it starts (status `streaming`) and updated as it grows, so a crash leaves the partial text,
which the next open marks `interrupted`. Deleting a conversation only hides it until `purge_deleted`,
so Undo is a flag flip. Migrations are numbered SQL scripts run in order inside one transaction each;
tests build databases of every older version and open them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from app.chat_records import INTERRUPTED, STREAMING, Attachment, Conversation, Message
from app.file_lock import FileLock, LockHeld

MIGRATIONS: tuple[str, ...] = (
    # 1: the first release: conversations and plain text messages
    """
    CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, created REAL NOT NULL,
                                updated REAL NOT NULL);
    CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL
                           REFERENCES conversations(id) ON DELETE CASCADE, position INTEGER NOT NULL,
                           role TEXT NOT NULL, content TEXT NOT NULL);
    CREATE INDEX messages_by_conversation ON messages(conversation_id, position);
    """,
    # 2: reasoning, tool calls, answer status and stats, image attachments, soft delete for Undo
    """
    ALTER TABLE conversations ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT '';
    ALTER TABLE messages ADD COLUMN reasoning_seconds REAL;
    ALTER TABLE messages ADD COLUMN tool_calls TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE messages ADD COLUMN status TEXT NOT NULL DEFAULT 'complete';
    ALTER TABLE messages ADD COLUMN stats TEXT NOT NULL DEFAULT '{}';
    CREATE TABLE attachments (id INTEGER PRIMARY KEY, message_id INTEGER NOT NULL
                              REFERENCES messages(id) ON DELETE CASCADE, position INTEGER NOT NULL,
                              name TEXT NOT NULL, mime TEXT NOT NULL, data BLOB NOT NULL);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


class ChatStoreError(Exception):
    """The database was written by a newer rigllm, or another rigllm has it open: refuse rather than risk
    damaging it."""


class ChatStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock = FileLock(self.path.with_name(self.path.name + ".lock"))
        except LockHeld:
            raise ChatStoreError(f"{self.path} is open in another rigllm (one app at a time may use a chat "
                                 "database)") from None
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
            with self._db:
                self._db.execute("UPDATE messages SET status=? WHERE status=?", (INTERRUPTED, STREAMING))
        except BaseException:
            self._lock.release()
            raise

    @property
    def schema_version(self) -> int:
        return self._db.execute("SELECT version FROM schema_version").fetchone()[0]

    def _migrate(self) -> None:
        self._db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        if self._db.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 0:
            self._db.execute("INSERT INTO schema_version VALUES (0)")
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise ChatStoreError(f"{self.path} has chat schema {version}; this rigllm reads up to {SCHEMA_VERSION}. "
                                 "Update rigllm (the file was left untouched).")
        for number in range(version + 1, SCHEMA_VERSION + 1):
            script = MIGRATIONS[number - 1]
            self._db.execute("BEGIN")
            try:
                for statement in filter(str.strip, script.split(";")):
                    self._db.execute(statement)
                self._db.execute("UPDATE schema_version SET version=?", (number,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        self._db.close()
        self._lock.release()

    # conversations

    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; `search` matches titles and message text (case-insensitive)."""
        like = f"%{search}%"
        rows = self._db.execute(
            "SELECT id, title, created, updated FROM conversations c WHERE deleted=0 AND (?='' OR title LIKE ? "
            "OR EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id=c.id AND m.content LIKE ?)) "
            "ORDER BY updated DESC, id DESC", (search, like, like))
        return [Conversation(*row) for row in rows]

    def create_conversation(self, title: str) -> int:
        now = time.time()
        with self._db:
            return self._db.execute("INSERT INTO conversations (title, created, updated) VALUES (?, ?, ?)",
                                    (title, now, now)).lastrowid

    def conversation(self, conversation_id: int) -> Conversation:
        row = self._db.execute("SELECT id, title, created, updated FROM conversations WHERE id=?",
                               (conversation_id,)).fetchone()
        return Conversation(*row)

    def rename(self, conversation_id: int, title: str) -> None:
        with self._db:
            self._db.execute("UPDATE conversations SET title=? WHERE id=?", (title, conversation_id))

    def delete(self, conversation_id: int) -> None:
        """Hide the conversation; `restore` undoes it until `purge_deleted` runs (at exit)."""
        with self._db:
            self._db.execute("UPDATE conversations SET deleted=1 WHERE id=?", (conversation_id,))

    def restore(self, conversation_id: int) -> None:
        with self._db:
            self._db.execute("UPDATE conversations SET deleted=0 WHERE id=?", (conversation_id,))

    def purge_deleted(self) -> None:
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE deleted=1")

    # messages

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute(
            "SELECT id, role, content, reasoning, reasoning_seconds, tool_calls, status, stats FROM messages "
            "WHERE conversation_id=? ORDER BY position", (conversation_id,)).fetchall()
        out = []
        for mid, role, content, reasoning, seconds, calls, status, stats in rows:
            files = self._db.execute("SELECT name, mime, data FROM attachments WHERE message_id=? ORDER BY position",
                                     (mid,)).fetchall()
            out.append(Message(role, content, reasoning, seconds, json.loads(calls), status, json.loads(stats),
                               [Attachment(n, m, bytes(d)) for n, m, d in files], mid))
        return out

    def add_message(self, conversation_id: int, message: Message) -> int:
        with self._db:
            position = self._db.execute("SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE conversation_id=?",
                                        (conversation_id,)).fetchone()[0]
            mid = self._db.execute(
                "INSERT INTO messages (conversation_id, position, role, content, reasoning, reasoning_seconds, "
                "tool_calls, status, stats) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, position, message.role, message.content, message.reasoning,
                 message.reasoning_seconds, json.dumps(message.tool_calls), message.status,
                 json.dumps(message.stats))).lastrowid
            for i, att in enumerate(message.attachments):
                self._db.execute("INSERT INTO attachments (message_id, position, name, mime, data) VALUES (?, ?, ?, ?, ?)",
                                 (mid, i, att.name, att.mime, att.data))
            self._touch(conversation_id)
        message.id = mid
        return mid

    def update_message(self, message: Message) -> None:
        """Write a message's text, reasoning, calls, status and stats (attachments never change)."""
        with self._db:
            self._db.execute(
                "UPDATE messages SET content=?, reasoning=?, reasoning_seconds=?, tool_calls=?, status=?, stats=? "
                "WHERE id=?", (message.content, message.reasoning, message.reasoning_seconds,
                               json.dumps(message.tool_calls), message.status, json.dumps(message.stats), message.id))

    def truncate(self, conversation_id: int, keep: int) -> None:
        """Drop every message after the first `keep` (Regenerate and Edit-and-resend rewrite the tail)."""
        with self._db:
            self._db.execute("DELETE FROM messages WHERE conversation_id=? AND position >= ?", (conversation_id, keep))
            self._touch(conversation_id)

    def _touch(self, conversation_id: int) -> None:
        self._db.execute("UPDATE conversations SET updated=? WHERE id=?", (time.time(), conversation_id))
