"""Image decoding and preprocessing: parity with transformers, every input mode, and one-line errors for bad files."""

from __future__ import annotations

import base64
import io
import math
import struct
import zlib

import numpy as np
import pytest
from PIL import Image
from test_vision_fixtures import hf_pixel_values, random_image

from engine.errors import RigllmError
from engine.vision.config import VisionConfig
from engine.vision.data_url import image_from_data_url
from engine.vision.image_io import decode_image, load_image_file
from engine.vision.preprocess import image_token_count, prepare_image, smart_resize

CFG = VisionConfig(n_embd=32, n_ff=48, n_layers=1, n_head=2, patch_size=16, merge_size=2, image_size=64, eps=1e-6,
                   projection_dim=64, image_mean=(0.48, 0.5, 0.52), image_std=(0.5, 0.45, 0.55))


def encode(img: Image.Image, fmt: str, **save) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **save)
    return buf.getvalue()


@pytest.mark.parametrize("h, w", [(1, 1), (31, 33), (48, 80), (1000, 7), (4000, 3000), (333, 777), (96, 96)])
def test_smart_resize_equals_transformers(h, w):
    hf = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    low, high = CFG.pixel_bounds()
    if max(h, w) / min(h, w) > 200:
        return
    got = smart_resize(h, w, 32, low, high)
    assert got == hf.smart_resize(h, w, factor=32, min_pixels=low, max_pixels=high)
    assert got[0] % 32 == 0 and got[1] % 32 == 0 and got[0] * got[1] <= high


@pytest.mark.parametrize("h, w, seed", [(70, 130, 0), (200, 90, 1), (20, 20, 2)])
def test_pixels_equal_transformers_processor(h, w, seed):
    hf = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    low, high = CFG.pixel_bounds()
    processor = hf.Qwen2VLImageProcessorPil(
        patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=list(CFG.image_mean),
        image_std=list(CFG.image_std), size={"shortest_edge": low, "longest_edge": high})
    img = random_image(h, w, seed)
    want = processor(images=[img], return_tensors="np")
    prepared = prepare_image(img, CFG)
    assert want["image_grid_thw"].tolist() == [[1, *prepared.grid]]
    np.testing.assert_allclose(hf_pixel_values(prepared.patches()), want["pixel_values"], rtol=0, atol=1e-6)


def test_huge_image_is_downscaled_into_the_token_budget():
    img = decode_image(encode(Image.new("RGB", (6000, 4000), (10, 200, 30)), "JPEG"))
    prepared = prepare_image(img, CFG)
    assert prepared.n_tokens <= 4096 and prepared.n_tokens == image_token_count(6000, 4000, CFG)
    gh, gw = prepared.grid
    assert math.isclose(gw / gh, 1.5, rel_tol=0.05)


def test_exif_orientation_is_applied():
    img = Image.new("RGB", (64, 32), (255, 0, 0))
    img.paste((0, 0, 255), (0, 0, 8, 32))  # blue stripe on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to view"
    out = decode_image(encode(img, "JPEG", exif=exif, quality=95))
    assert out.size == (32, 64)
    r, g, b = out.getpixel((16, 2))  # the left stripe is now at the top
    assert b > 200 and r < 60


def test_transparency_is_composited_on_white():
    rgba = Image.new("RGBA", (8, 8), (255, 0, 0, 0))
    assert decode_image(encode(rgba, "PNG")).getpixel((0, 0)) == (255, 255, 255)
    half = Image.new("LA", (8, 8), (0, 128))
    assert decode_image(encode(half, "PNG")).getpixel((0, 0)) == (127, 127, 127)
    palette = Image.new("P", (8, 8), 1)
    palette.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
    assert decode_image(encode(palette, "PNG")).getpixel((0, 0)) == (10, 20, 30)
    assert decode_image(encode(palette, "PNG", transparency=1)).getpixel((0, 0)) == (255, 255, 255)


def test_grayscale_and_16_bit_become_rgb():
    assert decode_image(encode(Image.new("L", (4, 4), 77), "PNG")).getpixel((1, 1)) == (77, 77, 77)
    deep = Image.fromarray(np.full((4, 4), 65535, dtype=np.uint16))
    assert decode_image(encode(deep, "PNG")).getpixel((0, 0)) == (255, 255, 255)
    cmyk = Image.new("CMYK", (4, 4), (0, 0, 0, 0))
    assert decode_image(encode(cmyk, "JPEG")).getpixel((0, 0))[0] > 240


@pytest.mark.parametrize("data, message", [
    (b"", "empty"),
    (b"definitely not an image", "not a recognised image"),
    (encode(Image.new("RGB", (64, 64)), "PNG")[:60], "corrupt or truncated"),
    (encode(Image.new("RGB", (8, 8)), "PPM"), "PPM images are not supported"),
])
def test_bad_images_give_one_line_errors(data, message):
    with pytest.raises(RigllmError, match=message) as err:
        decode_image(data, "upload.png")
    assert "\n" not in str(err.value) and str(err.value).startswith("upload.png")


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width×height but carries almost no data (what a decompression bomb looks like)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(b"")) + png_chunk(b"IEND", b"")


def test_decompression_bomb_is_refused():
    with pytest.raises(RigllmError, match="too many pixels"):
        decode_image(png_header_only(30000, 30000))


def test_extreme_aspect_ratio_is_refused():
    with pytest.raises(RigllmError, match="too elongated"):
        prepare_image(Image.new("RGB", (4000, 10)), CFG)


def test_image_files(tmp_path):
    path = tmp_path / "a.webp"
    random_image(20, 30, 0).save(path, "WEBP", lossless=True)
    assert load_image_file(path).size == (30, 20)
    with pytest.raises(RigllmError, match="no such file"):
        load_image_file(tmp_path / "missing.png")
    with pytest.raises(RigllmError, match="folder"):
        load_image_file(tmp_path)


def test_data_urls():
    png = encode(random_image(10, 12, 1), "PNG")
    img = image_from_data_url("data:image/png;base64," + base64.b64encode(png).decode())
    assert img.size == (12, 10) and img.mode == "RGB"
    wrapped = base64.encodebytes(png).decode()  # line breaks inside the base64 are tolerated
    assert image_from_data_url("data:image/png;base64," + wrapped).size == (12, 10)


@pytest.mark.parametrize("url, message", [
    ("https://example.com/cat.png", "https URLs are not fetched"),
    ("http://10.0.0.1/x.png", "http URLs are not fetched"),
    ("file:///etc/passwd", "file URLs are not fetched"),
    ("cat.png", "not a data URL"),
    ("", "empty"),
    ("data:image/png;base64", "no ','"),
    ("data:text/plain;base64,aGVsbG8=", "not an image"),
    ("data:image/png;base64,@@@", "base64 data is invalid"),
    ("data:image/png;base64,aGVsbG8=", "not a recognised image"),
])
def test_bad_data_urls(url, message):
    with pytest.raises(RigllmError, match=message):
        image_from_data_url(url)
