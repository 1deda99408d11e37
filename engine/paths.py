"""Where rigllm finds its bundled resources and keeps its per-user data (demo model, caches)."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESOURCES_DIR = REPO_ROOT / "resources"


def user_data_dir() -> Path:
    """Per-user data folder (XDG on Linux); `RIGLLM_DATA_DIR` overrides it, which tests use."""
    override = os.environ.get("RIGLLM_DATA_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "rigllm"
