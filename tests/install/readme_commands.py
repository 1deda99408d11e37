"""The README's setup commands, read from its marked code blocks, so CI runs exactly what a user types.

README.md marks each block with an HTML comment `<!-- ci: NAME ... -->` on the line before its opening
fence; the block must hold one command line. `.ci/run` prints a block with
`python3 tests/install/readme_commands.py NAME` and runs it; tests/install/test_readme_commands.py checks
that both blocks exist and have the shape .ci/run relies on.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
INSTALL_AND_RUN = "install-and-run"
TEST = "test"
_BLOCK = re.compile(r"^<!-- ci: (?P<name>[\w-]+)\b[^\n]*-->\n```\w*\n(?P<body>.*?)\n```$", re.MULTILINE | re.DOTALL)


def readme_command(name: str, text: str | None = None) -> str:
    """The one command line in README's block marked `ci: name`; ValueError when absent or not one line."""
    text = README.read_text(encoding="utf-8") if text is None else text
    bodies = [m.group("body") for m in _BLOCK.finditer(text) if m.group("name") == name]
    if len(bodies) != 1:
        raise ValueError(f"README.md has {len(bodies)} code blocks marked '<!-- ci: {name} -->' (want 1)")
    lines = [line for line in bodies[0].splitlines() if line.strip()]
    if len(lines) != 1:
        raise ValueError(f"README.md's '{name}' block holds {len(lines)} lines (want one command)")
    return lines[0].strip()


if __name__ == "__main__":
    try:
        print(readme_command(sys.argv[1]))
    except (IndexError, ValueError) as err:
        sys.exit(f"readme_commands.py: {err if isinstance(err, ValueError) else 'usage: readme_commands.py NAME'}")
