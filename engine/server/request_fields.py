"""OpenAI request fields rigllm maps onto the ones it serves: roles, legacy function calling, seeds,
prompts as token ids.

Kept apart from validation (`request_jobs`) so each mapping is one small rule: `developer` is the
template's `system`; `functions` / `function_call` (the pre-tools API) become `tools` / `tool_choice`;
`seed` is any int64 (-1, as llama.cpp's clients send, means "random"); `n` is at most `MAX_CHOICES`;
`logit_bias` keys are token ids.
"""

from __future__ import annotations

from typing import Any

from engine.generation.serving.request_error import APIError
from engine.generation.token_mask import MAX_LOGIT_BIAS
from engine.generation.tokenizer import Tokenizer

MAX_CHOICES = 8


def template_role(role: str) -> str:
    """The chat template's role for an API role (`developer` is OpenAI's newer name for `system`)."""
    return "system" if role == "developer" else role


def legacy_tools(functions: list[dict[str, Any]] | None, function_call: str | dict[str, Any] | None,
                 tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None
                 ) -> tuple[list[dict[str, Any]] | None, str | dict[str, Any] | None]:
    """`tools` and `tool_choice`, from the legacy fields when the request uses those instead."""
    if functions is None and function_call is None:
        return tools, tool_choice
    if tools is not None or tool_choice is not None:
        raise APIError(400, "send either tools/tool_choice or the legacy functions/function_call, not both",
                       param="functions")
    mapped = [{"type": "function", "function": f} for f in functions or []]
    if isinstance(function_call, dict):
        return mapped, {"type": "function", "function": {"name": function_call.get("name")}}
    return mapped or None, function_call


def sampling_seed(seed: int | None) -> int | None:
    """A seed for the sampler: None (fresh randomness) for None or -1; other negatives wrap to uint64."""
    if seed is None or seed == -1:
        return None
    if not -(2**63) <= seed < 2**64:
        raise APIError(400, f"seed must be a 64-bit integer, got {seed}", param="seed")
    return seed % 2**64


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice `index`'s seed: distinct choices from one seeded request, each replayable."""
    return None if seed is None else (seed + index) % 2**64


def choice_count(n: int | None) -> int:
    if n is None:
        return 1
    if not 1 <= n <= MAX_CHOICES:
        raise APIError(400, f"n must be between 1 and {MAX_CHOICES}, got {n}", param="n")
    return n


def prompt_list(prompt: Any, tokenizer: Tokenizer) -> list[list[int]]:
    """The completion prompts as token ids: a string, a list of strings, a list of ids, or a list of lists."""
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt:
        prompts = prompt
    else:
        raise APIError(400, "prompt must be a string, a list of strings, or token ids", param="prompt")
    result = []
    for i, p in enumerate(prompts):
        ids = tokenizer.encode(p, parse_special=True) if isinstance(p, str) else list(p)
        if any(not 0 <= t < tokenizer.vocab_size for t in ids):
            raise APIError(400, f"prompt {i} holds a token id outside the vocabulary of {tokenizer.vocab_size}",
                           param="prompt")
        if not ids:
            raise APIError(400, f"prompt {i} is empty", param="prompt")
        result.append(ids)
    if len(result) > MAX_CHOICES:
        raise APIError(400, f"at most {MAX_CHOICES} prompts per request", param="prompt")
    return result


def token_bias(logit_bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    """OpenAI's `logit_bias` (token id strings to -100..100) as ids; -100 bans a token, 100 all but forces it."""
    if not logit_bias:
        return None
    if len(logit_bias) > MAX_LOGIT_BIAS:
        raise APIError(400, f"logit_bias may hold at most {MAX_LOGIT_BIAS} tokens, got {len(logit_bias)}",
                       param="logit_bias")
    bias: dict[int, float] = {}
    for key, value in logit_bias.items():
        try:
            token = int(key)
        except ValueError:
            raise APIError(400, f"logit_bias keys are token ids, got {key!r}", param="logit_bias") from None
        if not 0 <= token < vocab_size or not -100 <= value <= 100:
            raise APIError(400, f"logit_bias: token ids in [0, {vocab_size}) with values in [-100, 100] "
                           f"(got {key}: {value})", param="logit_bias")
        bias[token] = float(value)
    return bias
