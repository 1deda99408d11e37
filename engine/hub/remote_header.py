"""Read a GGUF's header straight from the Hub (ranged reads through `HfFileSystem`), before downloading it.

A Qwen3.5 header holds the 248k-entry vocabulary and merges, about 8-10 MB, so the first read is 4 MiB
and each retry doubles it until the header parses (bounded by MAX_HEADER_BYTES). The header is checked as
`load_model` checks a local file, all but the tensor values, so a verdict here is the one loading gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from huggingface_hub.hf_file_system import HfFileSystem  # by module: a bundler follows it (the package loads lazily)

from engine.errors import ModelFileError
from engine.gguf.config import ModelConfig
from engine.gguf.header import GGUFHeader, HeaderPrefixShort, TensorInfo, parse_header
from engine.gguf.loader import check_header
from engine.hub.session import HubAccess, hub_errors
from engine.model.model_footprint import Footprint, footprint_of_tensors
from engine.vision.config import VisionConfig
from engine.vision.mmproj import config_from_fields

FIRST_READ_BYTES = 4 << 20
MAX_HEADER_BYTES = 256 << 20


@dataclass(frozen=True)
class HeaderView:
    """What the header checks need of a model file (path, fields, tensors), for a file that is not here."""

    path: PurePosixPath
    fields: dict[str, Any]
    tensors: dict[str, TensorInfo]

    def has(self, name: str) -> bool:
        return name in self.tensors


def read_header(repo: str, filename: str, size: int, commit: str, access: HubAccess) -> GGUFHeader:
    """The header of `repo/filename` (`size` bytes at `commit`), from as few leading bytes as it needs."""
    fs = HfFileSystem(endpoint=access.url, token=access.bearer, skip_instance_cache=True)
    want = FIRST_READ_BYTES
    with hub_errors(access, repo, filename), fs.open(f"{repo}/{filename}", "rb", revision=commit,
                                                     block_size=FIRST_READ_BYTES) as fh:
        data = b""
        while True:
            data += fh.read(min(want, size) - len(data))
            try:
                return parse_header(data, filename, file_size=size)
            except HeaderPrefixShort:
                if len(data) >= min(size, MAX_HEADER_BYTES):
                    raise ModelFileError(f"{filename}: no complete GGUF header in its first {len(data)} bytes") from None
                want *= 2


@dataclass(frozen=True)
class RemoteModel:
    """A remote model file priced from its header: what the fit verdicts and the library show."""

    name: str
    config: ModelConfig
    footprint: Footprint
    warnings: tuple[str, ...]


def inspect_model(repo: str, filename: str, size: int, commit: str, access: HubAccess) -> RemoteModel:
    """Validate a remote model's header; raises ModelFileError (MoE, a K-quant, not qwen35, ...) as loading would."""
    header = read_header(repo, filename, size, commit, access)
    view = HeaderView(PurePosixPath(filename), header.fields, header.tensors)
    cfg, warnings = check_header(view)  # type: ignore[arg-type]  # HeaderView has what check_header reads
    fp = footprint_of_tensors(cfg, header.tensors, f"the header of {filename} on the Hub")
    return RemoteModel(str(header.fields.get("general.name", PurePosixPath(filename).stem)), cfg, fp,
                       tuple(warnings))


def inspect_mmproj(repo: str, filename: str, size: int, commit: str, access: HubAccess) -> VisionConfig:
    header = read_header(repo, filename, size, commit, access)
    return config_from_fields(header.fields, filename)
