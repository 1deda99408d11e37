"""A model's `Footprint` as JSON and back, so the desktop app prices a file that lives on a remote rig.

The app's loading sheet plans with the same planner for a remote model as for a local one; only the
footprint (what each part costs on a card) has to cross the network, and it is a few hundred numbers,
where the file is many gigabytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.gguf.config import ModelConfig
from engine.model.model_footprint import Footprint


def footprint_to_json(fp: Footprint) -> dict[str, Any]:
    return dataclasses.asdict(fp)


def footprint_from_json(data: dict[str, Any]) -> Footprint:
    """Inverse of `footprint_to_json` (JSON arrays become the tuples the dataclasses hold)."""
    config = ModelConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in data["config"].items()})
    return Footprint(**{**data, "config": config, "block_bytes": tuple(data["block_bytes"]),
                        "vision_bytes": tuple(data.get("vision_bytes", (0, 0)))})
