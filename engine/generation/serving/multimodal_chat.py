"""Chat messages with images → the prompt a job runs: the one path the API and the desktop app share.

The chat template writes one `<|vision_start|><|image_pad|><|vision_end|>` per image part; here the
images are decoded, checked against the context, run through the model's vision tower and spliced in
(engine.vision.multimodal_prompt), so the job carries token ids with every image's pads expanded plus
the rows and M-RoPE positions a backend needs to prefill them. The numpy tower (reference backend)
runs on the caller's thread (the request's, or the app's), so a slow image delays only its own
request; a GPU backend's tower lives on its card, so `vision_for_backend` routes the encoding to the
thread that owns the card, between two scheduler turns. Everything that can go wrong is a one-line `RigllmError`: a bad or non-data-URL image, a
model without an mmproj, a conversation that no longer fits once its images are counted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from engine.errors import RigllmError
from engine.generation.chat_prompt import ChatPrompt
from engine.generation.tokenizer import Tokenizer
from engine.gguf.loader import LoadedModel
from engine.generation.serving.request_limits import RequestLimits
from engine.vision.chat_images import collect_images, count_images
from engine.vision.mmproj_pairing import find_mmproj
from engine.vision.encoder import ImageEncoder
from engine.vision.multimodal_prompt import IMAGE_PAD, MultimodalPrompt, expand_image_pads
from engine.vision.preprocess import PreparedImage

log = logging.getLogger("rigllm.server")

IMAGES_UNSUPPORTED = "this backend was opened without the model's vision tower (mmproj), so it takes no images"


@dataclass(frozen=True)
class Vision:
    """A model's image input: its encoder, or (when None) why images are refused."""

    encoder: ImageEncoder | None
    unavailable: str = "this model takes no images (no mmproj vision tower was loaded with it)"


def open_vision(loaded: LoadedModel, tokenizer: Tokenizer, mmproj: str | Path | None = None) -> Vision:
    """The vision tower for `loaded`: `mmproj` when given (its errors raise), else the one beside the model.

    A missing, ambiguous or unusable mmproj found beside the model does not stop the model from
    serving text: image requests are then refused with the reason, which is also logged.
    """
    label = loaded.path.name
    if tokenizer.token_to_id(IMAGE_PAD) is None:
        if mmproj is not None:
            raise RigllmError(f"{label} has no {IMAGE_PAD} token; it cannot take images")
        return Vision(None, f"this model takes no images ({label} has no {IMAGE_PAD} token)")
    if mmproj is not None:
        return Vision(ImageEncoder.open(mmproj, loaded.config.d_model, label))
    try:
        found = find_mmproj(loaded.path, loaded.config.d_model)
        if found is None:
            return Vision(None, f"this model takes no images: there is no mmproj (vision tower) beside {label} "
                                f"(rigllm convert writes mmproj-{loaded.path.stem}.gguf from a checkpoint with one)")
        return Vision(ImageEncoder.open(found, loaded.config.d_model, label))
    except RigllmError as err:
        log.warning("serving %s without images: %s", label, err)
        return Vision(None, f"images are unavailable for this model: {err}")


class OwnerEncoding(Protocol):
    """What `vision_for_backend` needs of the generation worker."""

    @property
    def encodes_images(self) -> bool:
        """Whether the backend holds its own vision tower."""

    def encode_image(self, image: PreparedImage) -> np.ndarray:
        """Run the backend's tower on `image`, on the backend's thread."""


@dataclass(frozen=True)
class _OwnerTower:
    worker: OwnerEncoding

    def encode(self, image: PreparedImage) -> np.ndarray:
        return self.worker.encode_image(image)


def vision_for_backend(vision: Vision, worker: OwnerEncoding) -> Vision:
    """The image input of a model whose backend is open: its own tower on the card (CUDA with an mmproj),
    run on the worker's thread; else `vision` unchanged (the numpy tower on the caller's thread)."""
    if vision.encoder is None or not worker.encodes_images:
        return vision
    return Vision(ImageEncoder(vision.encoder.mmproj, tower=_OwnerTower(worker)), vision.unavailable)


@dataclass(frozen=True)
class PreparedChat:
    """A rendered chat and, when it holds images, its multimodal form (whose ids are the ones to run)."""

    chat: ChatPrompt
    multimodal: MultimodalPrompt | None = None

    @property
    def token_ids(self) -> list[int]:
        """The prompt as the job runs it: every image's pads expanded (so its length counts image tokens)."""
        return self.multimodal.token_ids if self.multimodal is not None else self.chat.token_ids


def with_images(chat: ChatPrompt, messages: Sequence[Mapping[str, Any]], vision: Vision, tokenizer: Tokenizer,
                context_length: int, backend_takes_images: bool = True,
                limits: RequestLimits = RequestLimits()) -> PreparedChat:
    """Splice the images of `messages` (rendered as `chat`) into its prompt; a chat without images passes through.

    Images are refused from the messages' structure alone, before any is decoded, when the model or
    the backend takes none or there are more than `limits.max_images`; each is refused from its header
    when it has more than `limits.max_image_pixels`. The context check counts each image's tokens from
    its size before the tower runs, so an image that cannot fit costs no tower time.
    """
    count = count_images(messages)
    if not count:
        return PreparedChat(chat)
    if vision.encoder is None:
        raise RigllmError(vision.unavailable)
    if not backend_takes_images:
        raise RigllmError(IMAGES_UNSUPPORTED)
    if count > limits.max_images:
        raise RigllmError(f"the conversation holds {count} images; this server takes at most {limits.max_images} "
                          "per request")
    images = collect_images(messages, limits.max_image_pixels)
    encoder = vision.encoder
    total = len(chat.token_ids) - len(images) + sum(encoder.token_count(im) for im in images)
    if total >= context_length:
        raise RigllmError(f"the conversation with its {len(images)} image(s) is {total} tokens, the context holds "
                          f"{context_length}; send fewer or smaller images, or start a new chat")
    pad = tokenizer.token_to_id(IMAGE_PAD)
    assert pad is not None  # open_vision gives no encoder to a vocabulary without it
    return PreparedChat(chat, expand_image_pads(chat.token_ids, [encoder.encode(im) for im in images], pad))
