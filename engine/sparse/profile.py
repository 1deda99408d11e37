"""Sparse-attention profiles: the per-head patterns `rigllm calibrate-sparse` chose, saved beside the model.

A profile is only valid for the exact model file it was measured on, so it records the file's
identity (a hash of the GGUF header and tensor table, the file size and the last MiB of tensor data:
cheap, and it changes with a retrain that keeps the shapes). `load_profile` refuses a profile of
another file or another format version instead of silently applying wrong patterns.

JSON layout (version 1): {"format", "version", "model": {"identity"}, "block", "min_length",
"tolerance", "calibration_tokens", "layers": {"<layer>": [{"pattern", "error", "density"}, ...]}}.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import RigllmError
from engine.gguf.model_file import ModelFile
from engine.reference.sparse_attention import Pattern

FORMAT = "rigllm-sparse-profile"
VERSION = 1
SUFFIX = ".sparse.json"
_TAIL = 1 << 20


class StaleProfile(RigllmError):
    """The profile beside the model was made for another file or format version: recalibrate."""


@dataclass(frozen=True)
class HeadChoice:
    """One head's chosen pattern with its calibration error (relative L2) and density (cost)."""

    pattern: Pattern
    error: float
    density: float


@dataclass
class SparseProfile:
    """Patterns per attention layer and head; prefill below `min_length` tokens stays dense."""

    identity: str
    block: int
    min_length: int
    tolerance: float
    calibration_tokens: int
    layers: dict[int, list[HeadChoice]] = field(default_factory=dict)

    def patterns(self, layer: int) -> list[Pattern] | None:
        """The heads' patterns of `layer`, or None when the layer is not in the profile (dense)."""
        heads = self.layers.get(layer)
        return None if heads is None else [c.pattern for c in heads]

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": {"identity": self.identity},
            "block": self.block,
            "min_length": self.min_length,
            "tolerance": self.tolerance,
            "calibration_tokens": self.calibration_tokens,
            "layers": {
                str(layer): [{"pattern": c.pattern.to_json(), "error": c.error, "density": c.density} for c in heads]
                for layer, heads in sorted(self.layers.items())
            },
        }

    @classmethod
    def from_json(cls, data: dict) -> SparseProfile:
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise StaleProfile(
                f"sparse profile format {data.get('format')!r} version {data.get('version')!r} is not "
                f"{FORMAT!r} version {VERSION}: run `rigllm calibrate-sparse` again"
            )
        layers = {
            int(layer): [HeadChoice(Pattern.from_json(c["pattern"]), float(c["error"]), float(c["density"])) for c in heads]
            for layer, heads in data["layers"].items()
        }
        return cls(data["model"]["identity"], int(data["block"]), int(data["min_length"]), float(data["tolerance"]),
                   int(data["calibration_tokens"]), layers)


def profile_path(model_path: Path) -> Path:
    """Where the profile of a model lives: beside it, `<model file name>.sparse.json`."""
    return model_path.with_name(model_path.name + SUFFIX)


def model_identity(mf: ModelFile) -> str:
    """The identity a profile is keyed to: see `file_identity`."""
    return file_identity(mf.path, min((t.offset for t in mf.tensors.values()), default=mf.path.stat().st_size))


def file_identity(model_path: Path, data_offset: int) -> str:
    """Hash of the bytes before the tensor data (header, tensor table), the size and the last MiB."""
    size = model_path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(model_path, "rb") as f:
        digest.update(f.read(data_offset))
        f.seek(max(data_offset, size - _TAIL))
        digest.update(f.read())
    return digest.hexdigest()[:32]


def save_profile(profile: SparseProfile, path: Path) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a profile."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(profile.to_json(), indent=1) + "\n")
    os.replace(tmp, path)


def load_profile(path: Path, identity: str) -> SparseProfile | None:
    """The profile at `path` (None when there is none); `StaleProfile` when it belongs to another file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        profile = SparseProfile.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError) as e:
        raise StaleProfile(f"sparse profile {path} is unreadable ({e}): run `rigllm calibrate-sparse` again") from None
    if profile.identity != identity:
        raise StaleProfile(f"sparse profile {path} was made for another model file: run `rigllm calibrate-sparse` again")
    return profile


def require_profile(mf: ModelFile) -> SparseProfile:
    """The valid profile beside a model file; a user error naming the command when there is none."""
    path = profile_path(mf.path)
    profile = load_profile(path, model_identity(mf))
    if profile is None:
        raise RigllmError(f"no sparse profile at {path}: run `rigllm calibrate-sparse {mf.path}` first")
    return profile
