"""Shared helpers for the converter and synthetic-writer tests: tiny HF checkpoints, GGUF comparisons.

Tiny HF folders are built once per test session (per variant and seed) in a pytest temp folder;
transformers and torch are needed only for those, so tests that use them skip without the dev extra.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from gguf import GGUFReader

_CACHE: dict[tuple[str, int], Path] = {}


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], Path]:
    """`tiny_hf(variant, seed=0)` → path of a tiny HF folder (no GGUF inside); treat it as read-only."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from engine.fixtures.tiny_models import make_tiny_model

    def build(variant: str, seed: int = 0) -> Path:
        key = (variant, seed)
        if key not in _CACHE:
            _CACHE[key] = make_tiny_model(tmp_path_factory.mktemp(f"tiny-{variant}"), variant, seed, gguf_type=None)
        return _CACHE[key]

    return build


def copy_hf(src: Path, dst: Path) -> Path:
    """A writable copy of an HF folder."""
    shutil.copytree(src, dst)
    return dst


def gguf_fields(path: Path) -> dict[str, tuple[Any, list[int]]]:
    """Every key (GGUF.* header entries excluded) → (decoded value, value-type ids), in file order."""
    reader = GGUFReader(path)
    return {
        k: (f.contents(), [int(t) for t in f.types]) for k, f in reader.fields.items() if not k.startswith("GGUF.")
    }


def gguf_tensors(path: Path) -> list[tuple[str, str, list[int], np.ndarray]]:
    """(name, ggml type name, ne, raw stored bytes) of every tensor, in file order."""
    reader = GGUFReader(path)
    return [
        (t.name, t.tensor_type.name, [int(x) for x in t.shape], np.asarray(t.data).view(np.uint8).ravel().copy())
        for t in reader.tensors
    ]
