"""`rigllm doctor`, `generate` and every other command's parser must not need the HTTP stack.

Why: `doctor` is what a user runs when an install is broken, and on the H200 check of 2026-12-02 a machine
without fastapi could run no command at all (engine.commands.serve imported the server's HTTP policy for
one default at parse time). Only `serve` itself may need fastapi and uvicorn, when it runs.
"""

from __future__ import annotations

import subprocess
import sys

BLOCK_HTTP = """
import importlib.abc, sys
class NoHttp(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fastapi", "uvicorn", "starlette"):
            raise ModuleNotFoundError(f"No module named '{name}' (blocked by the test)")
        return None
sys.meta_path.insert(0, NoHttp())
from engine.cli import build_parser
parser = build_parser()
parser.parse_args(["doctor"])
parser.parse_args(["generate", "--backend", "reference", "--prompt", "Hi"])
parser.parse_args(["serve", "--max-body-mb", "2"])
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("fastapi", "uvicorn", "starlette"))
assert not leaked, leaked
print("ok")
"""


def test_every_command_parses_without_fastapi_uvicorn_or_starlette() -> None:
    done = subprocess.run([sys.executable, "-c", BLOCK_HTTP], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
