"""The synthetic full-size GGUFs both engines read, Q8_0 or a K-quant mix (written once per machine, reused when present)."""

from __future__ import annotations

import os
from pathlib import Path

from engine.gguf.shapes import shape_config
from engine.fixtures.synthetic import write_random_model


def model_path(folder: Path, shape: str, weights: str = "q8_0") -> Path:
    return folder / f"rigllm-synthetic-{shape}-{weights}.gguf"


def ensure_model(folder: Path, shape: str, weights: str = "q8_0", seed: int = 0) -> Path:
    """The shape's GGUF in `folder`, written (to a temporary name, renamed when complete, so an
    interrupted write is never reused) if it is not there yet."""
    path = model_path(folder, shape, weights)
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    write_random_model(partial, shape_config(shape), weights, seed=seed,
                       name=f"rigllm synthetic Qwen3.5-{shape.upper()} shape (random weights)")
    os.replace(partial, path)
    return path
