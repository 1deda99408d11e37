"""The images of an OpenAI-style conversation, decoded, in the order the chat template renders their markers.

The template (resources/chat_template_qwen35.jinja) writes one `<|vision_start|><|image_pad|><|vision_end|>`
per content part that is an image (`type` "image" or "image_url", or a part carrying an `image` or
`image_url` key), message by message, part by part; `collect_images` walks the same order so image k
fills marker k. Accepted parts:
* `{"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}` (also `"image_url": "data:..."`):
  the API form; only data URLs (engine.vision.data_url explains why);
* `{"type": "image", "image": <PIL image>}`: what the desktop app builds from a dropped file.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from PIL import Image

from engine.vision.data_url import image_from_data_url
from engine.vision.image_io import ImageError, to_rgb


def _is_image_part(part: Any) -> bool:
    if not isinstance(part, Mapping):
        return False
    return "image" in part or "image_url" in part or part.get("type") in ("image", "image_url")


def _decode(part: Mapping[str, Any], max_pixels: int | None) -> Image.Image:
    if isinstance(part.get("image"), Image.Image):
        return to_rgb(part["image"])
    ref = part.get("image_url")
    url = ref.get("url") if isinstance(ref, Mapping) else ref
    if not isinstance(url, str):
        raise ImageError("image_url: missing its url (send {\"type\": \"image_url\", \"image_url\": {\"url\": \"data:...\"}})")
    return image_from_data_url(url, max_pixels)


def _image_parts(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    parts: list[Mapping[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, (list, tuple)):
            parts += [part for part in content if _is_image_part(part)]
    return parts


def count_images(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many image parts the conversation holds, from its structure alone (nothing is decoded)."""
    return len(_image_parts(messages))


def collect_images(messages: Sequence[Mapping[str, Any]], max_pixels: int | None = None) -> list[Image.Image]:
    """Every image of the conversation as upright RGB, in marker order; raises ImageError (a RigllmError).
    `max_pixels` bounds each data URL's image by its header (a PIL image given by the app is already decoded)."""
    return [_decode(part, max_pixels) for part in _image_parts(messages)]
