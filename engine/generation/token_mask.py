"""Token masks and logit_bias: the constraints a slot backend applies where it samples.

A mask is the set of tokens a step may pick as a bitset over the model's vocabulary: uint32 words, bit
`v % 32` of word `v // 32` set when token v is allowed (llguidance's layout, so a grammar's bitset is a mask
as it stands). Grammars (JSON mode, forced tool calls) and forced tokens (the thinking budget's `</think>`)
become masks in the scheduler (engine.generation.serving.token_picks); backends apply them, with the request's
logit_bias, before their own sampler: the CUDA backend on the card (engine.cuda.token_masks), `HostSlots` on
the host with `constrain_row`. Order: bias added to the raw logits, then the mask, then the sampler's
penalties and filters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

TokenMask = np.ndarray  # uint32 (or int32) words, bit v % 32 of word v // 32: token v allowed
# a step's masks by slot, or what computes them: a backend that can calls it once the step's forward pass is on
# the device, so the grammars' work (and the masks' upload) overlaps it instead of leaving the device idle
StepMasks = Mapping[int, TokenMask] | Callable[[], Mapping[int, TokenMask]]
MAX_LOGIT_BIAS = 300  # ids in one request's logit_bias: OpenAI's limit, and what a backend holds per slot


def masks_now(masks: StepMasks | None) -> Mapping[int, TokenMask]:
    """A step's masks by slot, computed now when they came as a callable (for backends with nothing to overlap)."""
    if masks is None:
        return {}
    return masks() if callable(masks) else masks


def mask_words(vocab: int) -> int:
    """Words of a mask over `vocab` tokens."""
    return -(-vocab // 32)


def allowed_tokens(mask: TokenMask, vocab: int) -> np.ndarray:
    """The mask as one bool per token of a `vocab`-sized row (tokens past the mask's words are not allowed)."""
    bits = np.unpackbits(np.ascontiguousarray(mask).view(np.uint8), bitorder="little")[:vocab].astype(bool)
    return np.pad(bits, (0, vocab - bits.size))


def mask_of(allowed: np.ndarray) -> TokenMask:
    """The mask of one bool per token (the inverse of `allowed_tokens`)."""
    words = np.zeros(mask_words(allowed.size), np.uint32)
    packed = np.packbits(np.asarray(allowed, bool), bitorder="little")
    words.view(np.uint8)[: packed.size] = packed
    return words


def only_token(token: int, vocab: int) -> TokenMask:
    """The mask that allows `token` alone (a forced token)."""
    words = np.zeros(mask_words(vocab), np.uint32)
    words[token // 32] = np.uint32(1) << np.uint32(token % 32)
    return words


def constrain_row(logits: np.ndarray, bias: Mapping[int, float] | None, mask: TokenMask | None) -> np.ndarray:
    """The row a constrained request samples from: `bias` added (fp32, as the card adds it), tokens outside
    `mask` at -inf. Returns `logits` itself when there is nothing to apply."""
    if not bias and mask is None:
        return logits
    row = np.array(logits, dtype=np.float32, copy=True)
    if bias:
        ids = np.fromiter(bias.keys(), np.int64, len(bias))
        row[ids] += np.fromiter(bias.values(), np.float32, len(bias))
    if mask is not None:
        row[~allowed_tokens(mask, row.size)] = -np.inf
    return row
