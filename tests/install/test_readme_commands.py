"""README's marked setup blocks exist and have the shape .ci/run runs (it appends --smoke-test to the app)."""

from __future__ import annotations

import pytest
from readme_commands import INSTALL_AND_RUN, TEST, readme_command


def test_the_install_and_run_command_installs_the_app_extra_and_starts_the_gui():
    command = readme_command(INSTALL_AND_RUN)
    assert command == 'python3 -m pip install -e ".[app]" && rigllm gui'


def test_the_test_command_installs_dev_and_runs_pytest():
    assert readme_command(TEST) == 'python3 -m pip install -e ".[dev,kernels]" && python3 -m pytest'


def test_a_missing_or_multi_line_block_is_refused():
    with pytest.raises(ValueError, match="0 code blocks"):
        readme_command("absent", "no blocks here\n")
    text = "<!-- ci: two -->\n```bash\nfirst\nsecond\n```\n"
    with pytest.raises(ValueError, match="2 lines"):
        readme_command("two", text)
