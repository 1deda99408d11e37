"""Where rigllm finds its bundled resources and keeps its per-user data (demo model, caches)."""

import os
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _data_root() -> Path:
    """The folder that holds `resources/` and `cuda_src/`.

    A source checkout, an editable install and the PyInstaller bundle keep them beside `engine/`. A wheel
    install puts them under `<prefix>/share/rigllm/` (pyproject `[tool.setuptools.data-files]`), the prefix
    being the interpreter's (venv or system) or, for `pip install --user`, the user's.
    """
    if (REPO_ROOT / "resources").is_dir():
        return REPO_ROOT
    for scheme in (sysconfig.get_default_scheme(), sysconfig.get_preferred_scheme("user")):
        candidate = Path(sysconfig.get_path("data", scheme)) / "share" / "rigllm"
        if (candidate / "resources").is_dir():
            return candidate
    return REPO_ROOT  # neither: messages then name the checkout layout the files are missing from


DATA_ROOT = _data_root()
RESOURCES_DIR = DATA_ROOT / "resources"
CUDA_SRC_DIR = DATA_ROOT / "cuda_src"


def user_data_dir() -> Path:
    """Per-user data folder (XDG on Linux); `RIGLLM_DATA_DIR` overrides it, which tests use."""
    override = os.environ.get("RIGLLM_DATA_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "rigllm"
