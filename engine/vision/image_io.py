"""Bytes from a user (a file, a dropped image, an API data URL) → an upright 8-bit RGB PIL image, or a clear error.

Images are untrusted input: every way decoding can fail becomes one `RigllmError` line that says what
was wrong (the API turns it into a 400, the app shows it). What is accepted and how it is normalised:
* formats: PNG, JPEG, WebP, GIF (first frame), BMP, TIFF; anything else is refused by name;
* EXIF orientation is applied (phone photos are stored sideways);
* transparency (RGBA, LA, palette with a transparent colour) is composited onto white, as
  transformers' `convert_to_rgb` does; palette, grayscale and CMYK become RGB; 16-bit and float
  grayscale are scaled to 8 bits;
* size: Pillow refuses images above twice its `MAX_IMAGE_PIXELS` (a decompression bomb guard,
  ~179 megapixels); everything below decodes and is later downscaled into the pixel budget.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from engine.errors import RigllmError

SUPPORTED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF", "MPO")  # MPO: multi-picture JPEG from cameras
MAX_BYTES = 64 * 1024 * 1024


class ImageError(RigllmError):
    """An image that cannot be used: unreadable, unsupported, empty or too large."""


def decode_image(data: bytes, label: str = "image", max_pixels: int | None = None) -> Image.Image:
    """Decode `data` to an upright RGB image; `label` names it in error messages.

    `max_pixels`: refuse an image whose header states more pixels, before any pixel is decoded (a
    small PNG can claim 13000 x 13000 and cost gigabytes once decoded)."""
    if not data:
        raise ImageError(f"{label}: empty file, not an image")
    if len(data) > MAX_BYTES:
        raise ImageError(f"{label}: {len(data) / 2**20:.0f} MiB is larger than the {MAX_BYTES // 2**20} MiB rigllm accepts")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            if img.format not in SUPPORTED_FORMATS:
                raise ImageError(
                    f"{label}: {img.format or 'unknown'} images are not supported (use PNG, JPEG, WebP, GIF, BMP or TIFF)"
                )
            if max_pixels is not None and img.width * img.height > max_pixels:
                raise ImageError(f"{label}: {img.width} x {img.height} is {img.width * img.height / 1e6:.1f} "
                                 f"megapixels, more than the {max_pixels / 1e6:.1f} this server decodes")
            img.load()
            img = ImageOps.exif_transpose(img)
    except Image.DecompressionBombError:
        raise ImageError(f"{label}: the image has too many pixels to decode safely (limit about 179 megapixels)") from None
    except UnidentifiedImageError:
        raise ImageError(f"{label}: not a recognised image file (PNG, JPEG, WebP, GIF, BMP or TIFF)") from None
    except (OSError, SyntaxError, ValueError, EOFError) as err:
        raise ImageError(f"{label}: the image data is corrupt or truncated ({err})") from None
    if img.width < 1 or img.height < 1:
        raise ImageError(f"{label}: the image has no pixels")
    return to_rgb(img)


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB: transparency onto white, high-bit-depth grayscale scaled down, every other mode converted."""
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        values = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") else max(float(values.max()), 1.0)
        img = Image.fromarray(np.clip(values / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")


def load_image_file(path: str | Path) -> Image.Image:
    """Read and decode an image file (for `rigllm generate --image` and the app's drag-and-drop)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ImageError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ImageError(f"{p}: is a folder, not an image") from None
    except OSError as err:
        raise ImageError(f"{p}: cannot be read ({err.strerror or err})") from None
    return decode_image(data, str(p))
