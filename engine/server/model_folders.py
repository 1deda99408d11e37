"""The folders whose GGUF files the admin API may plan, inspect and load; nothing else on disk is reachable.

An admin request names a model by path. Without this, that path could be any file the server can
read: the loader's "bad magic" error would echo its first bytes, "no such file" and "is a folder"
would map the disk, `..` would resolve from the working directory, and a FIFO would block a worker
thread for good. So a path is resolved (symlinks followed) against the configured folders only
(a relative one inside each folder in turn), must end in `.gguf`, and is checked with `stat` (which
never opens it) to be a regular file before anything reads it. Every refusal is the same sentence,
so refusals reveal nothing about what exists outside the folders.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from engine.generation.serving.request_error import APIError


class ModelFolders:
    def __init__(self, folders: Iterable[str | Path]):
        self.folders = tuple(dict.fromkeys(Path(os.path.realpath(f)) for f in folders))

    def resolve(self, requested: str) -> Path:
        """The regular `.gguf` file `requested` names inside a model folder, or a 400 that says only that."""
        for candidate in self._candidates(requested):
            real = Path(os.path.realpath(candidate))
            if real.suffix.lower() != ".gguf" or not any(real.is_relative_to(f) for f in self.folders):
                continue
            try:
                if stat.S_ISREG(os.stat(real).st_mode):
                    return real
            except (OSError, ValueError):
                continue
        raise APIError(400, f"'{requested[:200]}' is not a .gguf file in the server's model folders "
                       "(rigllm serve --model-dir adds folders)", param="model", code="model_not_allowed")

    def _candidates(self, requested: str) -> list[Path]:
        if "\x00" in requested:
            return []
        path = Path(requested)
        return [path] if path.is_absolute() else [folder / path for folder in self.folders]
