"""Structurally broken GGUFs: each is refused fast with one ModelFileError line naming the file.

The files are made by editing the bytes of a valid tiny model, so every check of the defensive
header parser (engine.gguf.header) is exercised on the exact layout real writers produce.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from engine.errors import ModelFileError
from engine.gguf.loader import load_model
from engine.gguf.model_file import ModelFile
from tests.unit.loader_fixtures import write_tiny_model


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("header") / "tiny.gguf")


def edited(valid: Path, tmp_path: Path, offset: int, new: bytes) -> Path:
    data = bytearray(valid.read_bytes())
    data[offset : offset + len(new)] = new
    out = tmp_path / "broken.gguf"
    out.write_bytes(bytes(data))
    return out


def after_key(data: bytes, key: str) -> int:
    """Offset just past a key's name (where its u32 value type starts)."""
    encoded = key.encode()
    return data.index(struct.pack("<Q", len(encoded)) + encoded) + 8 + len(encoded)


def refused(path: Path, *fragments: str) -> str:
    start = time.perf_counter()
    with pytest.raises(ModelFileError) as err:
        load_model(path)
    assert time.perf_counter() - start < 2.0
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith((path.name + ":", str(path)))
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_missing_file_and_folder(tmp_path):
    refused(tmp_path / "nope.gguf", "no such file")
    refused(tmp_path, "is a folder")


def test_not_a_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 this is a zip file, not a model")
    refused(path, "not a GGUF file", "bad magic")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    refused(path, "not a GGUF file")


@pytest.mark.parametrize("keep", [4, 20, 300, 5000])
def test_truncated_header(valid, tmp_path, keep):
    path = tmp_path / "cut.gguf"
    path.write_bytes(valid.read_bytes()[:keep])
    refused(path, "truncated")


def test_truncated_tensor_data(valid, tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(valid.read_bytes()[:-100])
    refused(path, "truncated", "output.weight")


def test_unsupported_version_and_big_endian(valid, tmp_path):
    refused(edited(valid, tmp_path, 4, struct.pack("<I", 1)), "unsupported GGUF version 1")
    refused(edited(valid, tmp_path, 4, struct.pack(">I", 3)), "big-endian")


@pytest.mark.parametrize("offset, what", [(8, "tensors"), (16, "keys")])
def test_huge_declared_counts(valid, tmp_path, offset, what):
    refused(edited(valid, tmp_path, offset, struct.pack("<Q", 1 << 62)), f"declares {1 << 62} {what}")


def test_huge_string_length(valid, tmp_path):
    refused(edited(valid, tmp_path, 24, struct.pack("<Q", 1 << 60)), "key #0", "limit")


def test_huge_array_length_fails_fast(valid, tmp_path):
    """GGUFReader would loop ~2^40 times here; the parser checks the length against the bytes left."""
    data = valid.read_bytes()
    count_at = after_key(data, "tokenizer.ggml.tokens") + 4 + 4  # value type, item type
    refused(edited(valid, tmp_path, count_at, struct.pack("<Q", 1 << 40)), "tokenizer.ggml.tokens", "strings")


def test_unknown_value_type(valid, tmp_path):
    data = valid.read_bytes()
    refused(
        edited(valid, tmp_path, after_key(data, "qwen35.block_count"), struct.pack("<I", 99)), "unknown value type 99"
    )


def test_string_not_utf8(valid, tmp_path):
    data = valid.read_bytes()
    at = after_key(data, "general.name") + 4 + 8
    refused(edited(valid, tmp_path, at, b"\xff\xfe"), "not UTF-8")


def tensor_info_offset(data: bytes, name: str) -> int:
    """Offset just past a tensor info's name (where its u32 n_dims starts)."""
    return after_key(data, name)


def test_too_many_dimensions(valid, tmp_path):
    at = tensor_info_offset(valid.read_bytes(), "blk.0.ssm_a")
    refused(edited(valid, tmp_path, at, struct.pack("<I", 7)), "'blk.0.ssm_a' has 7 dimensions")


def test_unknown_tensor_type(valid, tmp_path):
    at = tensor_info_offset(valid.read_bytes(), "blk.0.ssm_a") + 4 + 8  # n_dims, ne[0]
    refused(edited(valid, tmp_path, at, struct.pack("<I", 250)), "unknown ggml type id 250")


def test_tensor_offset_past_end(valid, tmp_path):
    at = tensor_info_offset(valid.read_bytes(), "blk.0.ssm_a") + 4 + 8 + 4
    refused(edited(valid, tmp_path, at, struct.pack("<Q", 1 << 40)), "blk.0.ssm_a", "the file has")


def test_misaligned_tensor_offset(valid, tmp_path):
    data = valid.read_bytes()
    at = tensor_info_offset(data, "blk.0.ssm_a") + 4 + 8 + 4
    (offset,) = struct.unpack_from("<Q", data, at)
    refused(edited(valid, tmp_path, at, struct.pack("<Q", offset + 1)), "not a multiple of the alignment")


def test_zero_dimension(valid, tmp_path):
    at = tensor_info_offset(valid.read_bytes(), "blk.0.ssm_a") + 4
    refused(edited(valid, tmp_path, at, struct.pack("<Q", 0)), "empty dimension")


def test_row_not_whole_blocks(valid, tmp_path):
    at = tensor_info_offset(valid.read_bytes(), "blk.0.ffn_up.weight") + 4  # Q8_0, ne[0] = 64
    refused(edited(valid, tmp_path, at, struct.pack("<Q", 63)), "not a multiple of the Q8_0 block size 32")


def test_duplicate_key(valid, tmp_path):
    data = valid.read_bytes()
    # rename `general.name` to the key written just before it, `general.type` (same length: 12 bytes)
    at = data.index(b"general.name")
    refused(edited(valid, tmp_path, at, b"general.type"), "duplicate key 'general.type'")


def test_message_escapes_control_characters(valid, tmp_path):
    data = valid.read_bytes()
    at = data.index(b"qwen35", data.index(b"general.architecture") + 20)  # the value, not a key prefix
    message = refused(edited(valid, tmp_path, at, b"qw\nn35"), "architecture 'qw\\nn35'")
    assert "\n" not in message


def test_model_file_matches_gguf_reader(valid):
    """The defensive parser decodes exactly what gguf.GGUFReader decodes, and `raw()` is the same view."""
    ours = ModelFile(valid)
    reader = GGUFReader(valid)
    assert ours.fields == {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        info = ours.tensors[t.name]
        assert (info.offset, info.n_bytes, info.ne) == (t.data_offset, t.n_bytes, tuple(int(x) for x in t.shape))
        raw = ours.raw(t.name)
        assert raw.dtype == t.data.dtype and raw.shape == t.data.shape and np.array_equal(raw, t.data)
