"""A save killed mid-write leaves the previous snapshot of the same prefix and the chat database intact."""

from __future__ import annotations

import signal
import os
import subprocess
import sys
import textwrap
import time

import numpy as np

from app.chat_records import Message
from app.chat_store import ChatStore
from engine.generation.slots import SlotSnapshot
from engine.generation.snapshot_store import STALE_PARTIAL_SECONDS, SUFFIX, SnapshotStore
from engine.generation.snapshot_store_format import SnapshotIdentity

IDENTITY = SnapshotIdentity("model-a", "f16", "template-a")
TOKENS = list(range(10, 74))

# The child saves a new state for the same tokens and stops after its first array is written: the
# parent kills it there, with the temporary file half written.
CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    from pathlib import Path
    import engine.generation.snapshot_store_format as fmt
    from engine.generation.slots import SlotSnapshot
    from engine.generation.snapshot_store import SnapshotStore
    from engine.generation.snapshot_store_format import SnapshotIdentity

    plain = fmt.write_array
    def slow(f, a):
        plain(f, a)
        f.flush()
        print("writing", flush=True)
        time.sleep(60)
    fmt.write_array = slow
    planes = [np.full((2, 1 << 20), 9, np.uint8), np.full(64, 9, np.float32)]
    store = SnapshotStore(Path(sys.argv[1]), SnapshotIdentity("model-a", "f16", "template-a"), None, 1 << 30)
    store.save(list(range(10, 74)), SlotSnapshot((64, planes), sum(p.nbytes for p in planes)))
""")


def _state(value: int) -> SlotSnapshot:
    planes = [np.full((2, 4096), value, np.uint8), np.full(64, value, np.float32)]
    return SlotSnapshot((64, planes), sum(p.nbytes for p in planes))


def test_a_killed_save_keeps_the_previous_snapshot_and_the_chat_database(tmp_path):
    root = tmp_path / "snapshots"
    chats = ChatStore(tmp_path / "chats.sqlite3")
    conversation = chats.create_conversation("kept")
    chats.add_message(conversation, Message("user", "hello"))
    SnapshotStore(root, IDENTITY, None, 1 << 30).save(TOKENS, _state(3))
    (saved,) = (root / "model-a").glob(f"*{SUFFIX}")
    before = saved.read_bytes()

    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "writing"
        partial = [p for p in (root / "model-a").iterdir() if p.suffix != SUFFIX]
        assert partial and partial[0].stat().st_size > 0  # the kill lands in the middle of a write
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

    assert saved.read_bytes() == before
    SnapshotStore(root, IDENTITY, None, 1 << 30)
    assert partial[0].exists()  # a recent partial file may be another process's save in progress: kept
    old = time.time() - STALE_PARTIAL_SECONDS - 1
    os.utime(partial[0], (old, old))
    reopened = SnapshotStore(root, IDENTITY, None, 1 << 30)
    n, snap = reopened.longest_prefix(TOKENS + [1])
    assert n == len(TOKENS) and int(snap.state[1][0][0, 0]) == 3
    assert list((root / "model-a").iterdir()) == [saved]  # the killed save's leftover is cleaned up
    chats.close()
    again = ChatStore(tmp_path / "chats.sqlite3")
    assert [m.content for m in again.messages(conversation)] == ["hello"]
    assert again._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
