"""`engine.gguf.safetensors_reader`: plain-numpy safetensors reading, checked against the safetensors package."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from engine.errors import ModelFileError
from engine.gguf.safetensors_reader import SafetensorsCheckpoint


def write_safetensors(path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> None:
    """A safetensors file by hand: name → (dtype, shape, raw bytes), data in the given order."""
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_dtypes_rows_and_order_match_the_safetensors_package(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    tensors = {
        "z.bf16": torch.randn(5, 3, generator=gen).to(torch.bfloat16),
        "a.f16": torch.randn(4, 8, generator=gen).to(torch.float16),
        "m.f32": torch.randn(2, 1, 4, generator=gen),
        "s.vec": torch.randn(6, generator=gen),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with SafetensorsCheckpoint(tmp_path) as ckpt:
        assert ckpt.names() == sorted(tensors)
        for name, t in tensors.items():
            got = ckpt.read(name)
            assert got.shape == tuple(t.shape)
            np.testing.assert_array_equal(got, t.float().numpy())
        assert ckpt.read("a.f16").dtype == np.float16 and ckpt.read("z.bf16").dtype == np.float32
        np.testing.assert_array_equal(ckpt.read("z.bf16", 1, 4), tensors["z.bf16"][1:4].float().numpy())
        assert [n for n, _ in ckpt.iter_tensors()] == sorted(tensors)


def test_index_json_decides_the_parts(tmp_path):
    write_safetensors(tmp_path / "model-b.safetensors", {"x": ("F32", (2,), np.float32([1, 2]).tobytes())})
    write_safetensors(tmp_path / "model-a.safetensors", {"y": ("F32", (1,), np.float32([3]).tobytes())})
    write_safetensors(tmp_path / "model-unused.safetensors", {"w": ("F32", (1,), np.float32([9]).tobytes())})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "model-b.safetensors", "y": "model-a.safetensors"}})
    )
    ckpt = SafetensorsCheckpoint(tmp_path)
    assert ckpt.names() == ["y", "x"]  # part files in name order, then names within each
    np.testing.assert_array_equal(ckpt.read("x"), [1, 2])
    ckpt.close()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda raw: raw[:4], "too short"),
        (lambda raw: struct.pack("<Q", 10**12) + raw[8:], "header length"),
        (lambda raw: raw[:8] + b"{" * (len(raw) - 8), "corrupt safetensors header"),
        (lambda raw: raw[:-4], "outside the file"),
    ],
)
def test_broken_files_raise_one_clear_error(tmp_path, mutate, message):
    write_safetensors(tmp_path / "model.safetensors", {"x": ("F32", (4,), np.zeros(4, np.float32).tobytes())})
    raw = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(mutate(raw))
    with pytest.raises(ModelFileError, match=message):
        SafetensorsCheckpoint(tmp_path)


def test_unsupported_dtype_and_missing_parts(tmp_path):
    write_safetensors(tmp_path / "model.safetensors", {"x": ("I64", (1,), b"\0" * 8)})
    with pytest.raises(ModelFileError, match="dtype I64"):
        SafetensorsCheckpoint(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-2.safetensors"}}))
    with pytest.raises(ModelFileError, match="missing checkpoint part"):
        SafetensorsCheckpoint(tmp_path)
    with pytest.raises(ModelFileError, match="not a folder"):
        SafetensorsCheckpoint(tmp_path / "nope")
