"""`collect_images`: a conversation's images in the order the chat template renders their markers."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from engine.errors import RigllmError
from engine.generation.chat_template import ChatTemplate
from engine.vision.chat_images import collect_images
from engine.vision.multimodal_prompt import IMAGE_MARKER


def data_url(color: tuple[int, int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), color).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_images_come_in_marker_order():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url((255, 0, 0))}},
                                     {"type": "text", "text": "and"},
                                     {"type": "image", "image": Image.new("LA", (2, 2), (0, 255))}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "then"},
                                     {"type": "image_url", "image_url": data_url((0, 0, 255))}]},
    ]
    images = collect_images(messages)
    assert [im.getpixel((0, 0)) for im in images] == [(255, 0, 0), (0, 0, 0), (0, 0, 255)]
    assert all(im.mode == "RGB" for im in images)
    text = ChatTemplate.fallback().render(messages, add_generation_prompt=True)
    assert text.count(IMAGE_MARKER) == len(images)


def test_text_only_conversation_has_no_images():
    assert collect_images([{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "text", "text": "x"}]}]) == []


@pytest.mark.parametrize("part, message", [
    ({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, "not fetched"),
    ({"type": "image_url", "image_url": {}}, "missing its url"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "not a recognised image"),
])
def test_bad_image_parts(part, message):
    with pytest.raises(RigllmError, match=message):
        collect_images([{"role": "user", "content": [part]}])
