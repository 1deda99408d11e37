"""Whole-process tests: a crash mid-answer keeps the partial text (marked interrupted); the smoke test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from app.chat_records import INTERRUPTED
from app.chat_store import ChatStore

HERE = Path(__file__).parent
REPO = HERE.parent.parent


def _env() -> dict[str, str]:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def test_a_crash_mid_answer_keeps_the_partial_answer_marked_interrupted(tmp_path):
    db = tmp_path / "chats.sqlite3"
    child = subprocess.Popen([sys.executable, str(HERE / "crash_child.py"), str(db), str(tmp_path / "s.ini")],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env())
    try:
        assert child.stdout.readline().strip() == "STREAMING"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    store = ChatStore(db)
    try:
        [conv] = store.conversations()
        user, answer = store.messages(conv.id)
        assert user.content == "Tell me everything"
        assert answer.role == "assistant" and answer.status == INTERRUPTED and answer.content
    finally:
        store.close()


def test_smoke_test_flag_answers_one_message_and_exits_0(tmp_path):
    env = _env()
    env["RIGLLM_DATA_DIR"] = os.environ["RIGLLM_DATA_DIR"]  # reuse the session's demo model
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    done = subprocess.run([sys.executable, "-m", "app", "--smoke-test"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "smoke test: complete" in done.stdout
