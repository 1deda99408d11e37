"""The on-disk form of one saved sequence state: a versioned header, the token ids, then raw arrays.

A snapshot is only valid for the exact model, KV format and chat template it was taken with, so the
header names all three (`SnapshotIdentity`); a reader compares them before touching the arrays. The
state itself is a small tree (the reference's `StateSnapshot`, or the CUDA backend's `(position,
planes)` tuples, one per card: a single card's too, since format 3) whose arrays are written raw after the header; the tree is
kept as JSON with each array replaced by its index. The model configuration is not stored: a reader
gets it from the backend that restores the state (the model identity guarantees it is the same).

Layout: MAGIC, u32 format version, u64 header length, header JSON, int32 token ids, arrays in order.
The header holds the CRC-32 of everything after it (`payload_crc32`), checked when the state is read:
a file whose header is intact but whose payload is not (a bad sector, a partial copy) would
otherwise restore a wrong state silently and every answer built on it would differ.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from engine.model.kv_formats import kv_format
from engine.generation.slots import SlotSnapshot
from engine.gguf.config import ModelConfig
from engine.reference.state import StateSnapshot

MAGIC = b"RIGSNAP\0"
FORMAT_VERSION = 3  # 2: the payload checksum; 3: one CUDA card's state is a one-card tuple (a 2 would not restore)
_PREAMBLE = struct.Struct("<8sIQ")


class SnapshotFormatError(Exception):
    """A file that is not a complete snapshot of this format version (truncated, foreign or older)."""


@dataclass(frozen=True)
class SnapshotIdentity:
    """What a snapshot is valid for: restoring it anywhere else would give wrong logits."""

    model_id: str  # hash of the GGUF header and tensor table (`model_identity`)
    kv_format: str  # e.g. "f16", "k8v3"
    template_hash: str  # hash of the chat template source the prompt tokens were rendered with


@dataclass(frozen=True)
class SnapshotHeader:
    identity: SnapshotIdentity
    n_tokens: int
    nbytes: int  # the state's host bytes (what keeping it in RAM costs)
    tree: Any
    arrays: tuple[tuple[str, tuple[int, ...]], ...]  # (dtype, shape) per array, in file order
    data_offset: int  # where the token ids start
    payload_crc32: int  # of the token ids and arrays, as written

    def file_size(self) -> int:
        size = self.data_offset + 4 * self.n_tokens
        return size + sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for dt, shape in self.arrays)


# ---- the state tree ---------------------------------------------------------------------------------
def encode_tree(obj: Any, arrays: list[np.ndarray]) -> Any:
    """A JSON-able description of `obj`, appending its arrays to `arrays`."""
    if isinstance(obj, np.ndarray):
        arrays.append(obj)
        return {"a": len(arrays) - 1}
    if isinstance(obj, SlotSnapshot):
        return {"slot": encode_tree(obj.state, arrays), "nbytes": obj.nbytes}
    if isinstance(obj, StateSnapshot):
        fields = {name: encode_tree(getattr(obj, name), arrays) for name in ("n_tokens", "next_position", "kv", "gdn", "mtp")}
        return {"ref": fields, "kv_format": obj.kv_format.name}
    if isinstance(obj, tuple):
        return {"t": [encode_tree(x, arrays) for x in obj]}
    if isinstance(obj, list):
        return {"l": [encode_tree(x, arrays) for x in obj]}
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return {"v": obj}
    raise TypeError(f"cannot save a {type(obj).__name__} in a snapshot")


def decode_tree(node: Any, arrays: Sequence[np.ndarray], config: ModelConfig) -> Any:
    """The object `encode_tree` described; `config` is the model the state belongs to."""
    if "a" in node:
        return arrays[node["a"]]
    if "slot" in node:
        return SlotSnapshot(decode_tree(node["slot"], arrays, config), node["nbytes"])
    if "ref" in node:
        f = {name: decode_tree(value, arrays, config) for name, value in node["ref"].items()}
        return StateSnapshot(cfg=config, kv_format=kv_format(node["kv_format"]), **f)
    if "t" in node:
        return tuple(decode_tree(x, arrays, config) for x in node["t"])
    if "l" in node:
        return [decode_tree(x, arrays, config) for x in node["l"]]
    return node["v"]


# ---- files ------------------------------------------------------------------------------------------
def write_snapshot(f: BinaryIO, identity: SnapshotIdentity, tokens: Sequence[int], snapshot: SlotSnapshot) -> None:
    """Write one snapshot to an open binary file (the caller makes the write atomic)."""
    arrays: list[np.ndarray] = []
    tree = encode_tree(snapshot, arrays)
    token_bytes = np.asarray(tokens, dtype="<i4").tobytes()
    crc = zlib.crc32(token_bytes)
    for a in arrays:
        crc = _crc(np.ascontiguousarray(a), crc)
    header = json.dumps({
        "model_id": identity.model_id, "kv_format": identity.kv_format, "template_hash": identity.template_hash,
        "n_tokens": len(tokens), "nbytes": snapshot.nbytes, "tree": tree,
        "arrays": [[a.dtype.str, list(a.shape)] for a in arrays], "payload_crc32": crc,
    }).encode()
    f.write(_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header)))
    f.write(header)
    f.write(token_bytes)
    for a in arrays:
        write_array(f, a)


def _crc(a: np.ndarray, crc: int) -> int:
    """`crc` extended by a contiguous array's bytes (without copying them; empty arrays included)."""
    return zlib.crc32(a.reshape(-1).view(np.uint8), crc)


def write_array(f: BinaryIO, a: np.ndarray) -> None:
    """One array's raw bytes (a function of its own so a test can interrupt a save between arrays)."""
    f.write(memoryview(np.ascontiguousarray(a)).cast("B"))


def read_header(path: Path) -> SnapshotHeader:
    """The header of a snapshot file; SnapshotFormatError when it is not a complete one of this version."""
    with open(path, "rb") as f:
        pre = f.read(_PREAMBLE.size)
        if len(pre) < _PREAMBLE.size:
            raise SnapshotFormatError(f"{path.name}: truncated")
        magic, version, length = _PREAMBLE.unpack(pre)
        if magic != MAGIC or version != FORMAT_VERSION:
            raise SnapshotFormatError(f"{path.name}: not a version {FORMAT_VERSION} snapshot")
        try:
            h = json.loads(f.read(length))
            header = SnapshotHeader(SnapshotIdentity(h["model_id"], h["kv_format"], h["template_hash"]), h["n_tokens"],
                                    h["nbytes"], h["tree"], tuple((dt, tuple(shape)) for dt, shape in h["arrays"]),
                                    _PREAMBLE.size + length, int(h["payload_crc32"]))
        except (ValueError, KeyError, TypeError) as err:
            raise SnapshotFormatError(f"{path.name}: bad header ({err})") from None
    if path.stat().st_size != header.file_size():
        raise SnapshotFormatError(f"{path.name}: truncated")
    return header


def read_snapshot(path: Path, config: ModelConfig) -> tuple[SnapshotHeader, tuple[int, ...], SlotSnapshot]:
    """The header, token ids and state of a snapshot file (arrays read-only, as live snapshots are)."""
    header = read_header(path)
    with open(path, "rb") as f:
        f.seek(header.data_offset)
        ids = np.fromfile(f, dtype="<i4", count=header.n_tokens)
        crc = _crc(ids, 0)
        tokens = tuple(int(t) for t in ids)
        arrays = []
        for dt, shape in header.arrays:
            a = np.fromfile(f, dtype=np.dtype(dt), count=int(np.prod(shape, dtype=np.int64))).reshape(shape)
            crc = _crc(a, crc)
            a.setflags(write=False)
            arrays.append(a)
    if crc != header.payload_crc32:
        raise SnapshotFormatError(f"{path.name}: its payload does not match its checksum (the file is corrupt)")
    snapshot = decode_tree(header.tree, arrays, config)
    if not isinstance(snapshot, SlotSnapshot):
        raise SnapshotFormatError(f"{path.name}: does not hold a slot snapshot")
    return header, tokens, snapshot
