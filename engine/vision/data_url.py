"""OpenAI `image_url` values → images. Only `data:` URLs: the server never fetches from the network.

Fetching arbitrary URLs would let any API client make the server connect anywhere (SSRF) and would
need network access the rigs usually lack, so http(s) URLs are refused with a message saying what to
send instead.
"""

from __future__ import annotations

import base64
import binascii
from urllib.parse import unquote_to_bytes

from PIL import Image

from engine.vision.image_io import ImageError, decode_image

LABEL = "image_url"


def data_url_bytes(url: str) -> bytes:
    """The payload of a `data:[<mime>][;base64],<data>` URL; refuses any other scheme."""
    if not isinstance(url, str) or not url:
        raise ImageError(f"{LABEL}: empty; send the image as a data URL (data:image/png;base64,...)")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https", "file", "ftp"):
        raise ImageError(
            f"{LABEL}: {scheme} URLs are not fetched (the server does not download images); "
            "send the image inline as a data URL (data:image/png;base64,...)"
        )
    if scheme != "data":
        raise ImageError(f"{LABEL}: not a data URL; send the image as data:image/png;base64,...")
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise ImageError(f"{LABEL}: malformed data URL (no ',' before the data)")
    params = [p.strip().lower() for p in header.split(";")]
    if params[0] and not params[0].startswith("image/"):
        raise ImageError(f"{LABEL}: the data URL holds '{params[0][:40]}', not an image")
    if "base64" in params[1:]:
        try:
            return base64.b64decode("".join(payload.split()), validate=True)
        except (binascii.Error, ValueError):
            raise ImageError(f"{LABEL}: the data URL's base64 data is invalid") from None
    return unquote_to_bytes(payload)


def image_from_data_url(url: str, max_pixels: int | None = None) -> Image.Image:
    """Decode an OpenAI `image_url.url` data URL to an upright RGB image (raises ImageError, a RigllmError);
    `max_pixels`: decode_image's budget, checked from the image's header."""
    return decode_image(data_url_bytes(url), LABEL, max_pixels)
