"""mmproj GGUFs: what `rigllm convert` writes, the loader's one-line refusals, and pairing with a text model."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from test_vision_fixtures import tiny_vlm  # noqa: F401 (fixture)

from engine.commands import convert as convert_cmd
from engine.errors import ModelFileError, RigllmError
from engine.vision.convert_mmproj import convert_mmproj
from engine.vision.mmproj import load_mmproj, mmproj_tensors
from engine.vision.mmproj_pairing import find_mmproj
from engine.gguf.model_file import ModelFile
from engine.vision.encoder import ImageEncoder


def rewrite(src: Path, dst: Path, set_keys: dict | None = None, drop_keys: tuple = (),
            drop_tensors: tuple = (), reshape: dict | None = None) -> Path:
    """A copy of GGUF `src` with keys replaced/removed and tensors removed or given another (numpy) shape."""
    reader = GGUFReader(src)
    writer = GGUFWriter(dst, reader.fields["general.architecture"].contents())
    set_keys = dict(set_keys or {})
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_keys:
            continue
        if name in set_keys:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for name, value in set_keys.items():
        if isinstance(value, bool):
            writer.add_bool(name, value)
        elif isinstance(value, str):
            writer.add_string(name, value)
        elif isinstance(value, list):
            writer.add_array(name, value)
        else:
            writer.add_uint32(name, value)
    for t in reader.tensors:
        if t.name in drop_tensors:
            continue
        data = np.asarray(t.data)
        if t.tensor_type == GGMLQuantizationType.F32 and reshape and t.name in reshape:
            data = np.zeros(reshape[t.name], np.float32)
        writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_converted_mmproj_loads_with_the_tiny_config(tiny_vlm):
    mm = load_mmproj(tiny_vlm.mmproj)
    cfg = mm.config
    assert (cfg.n_embd, cfg.n_ff, cfg.n_layers, cfg.n_head, cfg.patch_size, cfg.merge_size) == (32, 48, 2, 2, 16, 2)
    assert (cfg.image_size, cfg.pos_side, cfg.projection_dim) == (64, 4, 64)
    assert cfg.image_mean == pytest.approx((0.48, 0.5, 0.52)) and cfg.image_std == pytest.approx((0.5, 0.45, 0.55))
    assert set(mm.file.tensors) == {n for n, _ in mmproj_tensors(cfg)}
    assert mm.file.fields["general.type"] == "mmproj" and mm.file.fields["clip.projector_type"] == "qwen3vl_merger"


@pytest.mark.parametrize("out_type, matrix, patch", [("q8_0", "Q8_0", "F32"), ("f16", "F16", "F16"), ("bf16", "BF16", "F32")])
def test_types_follow_llama_cpp_rules(tiny_vlm, tmp_path, out_type, matrix, patch):
    mm = load_mmproj(convert_mmproj(tiny_vlm.hf_dir, tmp_path / "m.gguf", out_type))
    types = {n: t.ggml_type.name for n, t in mm.file.tensors.items()}
    assert types["v.blk.0.attn_qkv.weight"] == matrix and types["mm.2.weight"] == matrix
    assert types["v.patch_embd.weight"] == types["v.patch_embd.weight.1"] == patch
    assert types["v.position_embd.weight"] == types["v.blk.0.ln1.weight"] == types["mm.0.bias"] == "F32"
    if out_type == "q8_0":
        assert types["v.blk.0.ffn_down.weight"] == "F16"  # 48 inputs: not whole Q8_0 blocks


def test_patch_kernel_is_split_in_time(tiny_vlm):
    from safetensors.numpy import load_file

    hf = load_file(str(tiny_vlm.hf_dir / "model.safetensors"))["model.visual.patch_embed.proj.weight"]
    mf = ModelFile(tiny_vlm.mmproj)
    np.testing.assert_array_equal(mf.tensor("v.patch_embd.weight"), hf[:, :, 0])
    np.testing.assert_array_equal(mf.tensor("v.patch_embd.weight.1"), hf[:, :, 1])


@pytest.mark.parametrize("change, message", [
    (dict(set_keys={"clip.projector_type": "mlp"}), "projector type 'mlp' is not supported"),
    (dict(drop_keys=("clip.vision.block_count",)), "missing key clip.vision.block_count"),
    (dict(set_keys={"clip.vision.attention.head_count": 3}), "head size divisible by 4"),
    (dict(set_keys={"clip.has_vision_encoder": False}), "no vision encoder"),
    (dict(set_keys={"clip.vision.is_deepstack_layers": [True, False]}), "deepstack"),
    (dict(drop_tensors=("v.blk.1.ffn_up.bias",)), "missing tensor v.blk.1.ffn_up.bias"),
    (dict(reshape={"v.position_embd.weight": (9, 32)}), r"v.position_embd.weight has shape \[32, 9\]"),
])
def test_loader_refuses_broken_files(tiny_vlm, tmp_path, change, message):
    path = rewrite(tiny_vlm.mmproj, tmp_path / "bad.gguf", **change)
    with pytest.raises(ModelFileError, match=message) as err:
        load_mmproj(path)
    assert str(err.value).startswith("bad.gguf:") and "\n" not in str(err.value)


def test_text_model_given_as_mmproj(tiny_vlm):
    with pytest.raises(ModelFileError, match="text model file"):
        load_mmproj(tiny_vlm.text_gguf)


def test_pairing(tiny_vlm, tmp_path):
    with pytest.raises(ModelFileError, match="width 64, but big.gguf has width 128"):
        ImageEncoder.open(tiny_vlm.mmproj, 128, "big.gguf")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    assert find_mmproj(model, 64) is None
    rewrite(tiny_vlm.mmproj, tmp_path / "mmproj-other.gguf")
    rewrite(tiny_vlm.mmproj, tmp_path / "mmproj-wide.gguf", set_keys={"clip.vision.projection_dim": 128})
    assert find_mmproj(model, 64) == tmp_path / "mmproj-other.gguf"  # the 128-wide one does not fit
    rewrite(tiny_vlm.mmproj, tmp_path / "mmproj-second.gguf")
    with pytest.raises(RigllmError, match="several mmproj files"):
        find_mmproj(model, 64)
    rewrite(tiny_vlm.mmproj, tmp_path / "mmproj-m.gguf")
    assert find_mmproj(model, 64) == tmp_path / "mmproj-m.gguf"  # the exact name wins


def run_convert(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="rigllm")
    convert_cmd.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["convert", *argv])
    return args.func(args)


def test_convert_command_writes_the_mmproj_beside_the_model(tiny_vlm, tmp_path):
    assert run_convert(str(tiny_vlm.hf_dir), str(tmp_path / "a" / "q.gguf"), "--type", "q8_0") == 0
    assert load_mmproj(tmp_path / "a" / "mmproj-q.gguf").file.fields["general.file_type"] == 1  # f16 default
    assert run_convert(str(tiny_vlm.hf_dir), str(tmp_path / "b.gguf"), "--mmproj", str(tmp_path / "v" / "vis.gguf"),
                       "--mmproj-type", "q8_0") == 0
    assert load_mmproj(tmp_path / "v" / "vis.gguf").file.fields["general.file_type"] == 7
    assert run_convert(str(tiny_vlm.hf_dir), str(tmp_path / "c.gguf"), "--no-mmproj") == 0
    assert not (tmp_path / "mmproj-c.gguf").exists()


def test_convert_refuses_mmproj_without_a_vision_tower(tmp_path):
    pytest.importorskip("transformers")
    from engine.fixtures.tiny_models import make_tiny_model

    text_only = make_tiny_model(tmp_path / "t", "gqa2-hv2", gguf_type=None)
    with pytest.raises(RigllmError, match="no vision tower"):
        run_convert(str(text_only), str(tmp_path / "t.gguf"), "--mmproj", str(tmp_path / "v.gguf"))
    with pytest.raises(ModelFileError, match="has no vision tower"):
        convert_mmproj(text_only, tmp_path / "v.gguf")
    assert run_convert(str(text_only), str(tmp_path / "t2.gguf")) == 0
    assert not (tmp_path / "mmproj-t2.gguf").exists()


def test_pixel_bounds_from_the_file(tiny_vlm, tmp_path):
    assert load_mmproj(tiny_vlm.mmproj).config.pixel_bounds() == (8 * 1024, 4096 * 1024)  # llama.cpp's defaults
    hf_bounds = rewrite(tiny_vlm.mmproj, tmp_path / "b.gguf",
                        set_keys={"clip.vision.image_min_pixels": 65536, "clip.vision.image_max_pixels": 16777216})
    assert load_mmproj(hf_bounds).config.pixel_bounds() == (65536, 16777216)
    inverted = rewrite(tiny_vlm.mmproj, tmp_path / "c.gguf",
                       set_keys={"clip.vision.image_min_pixels": 9000, "clip.vision.image_max_pixels": 8000})
    with pytest.raises(ModelFileError, match="not a valid range"):
        load_mmproj(inverted)
