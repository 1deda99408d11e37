"""Qwen3.5's special tokens and how llama.cpp classifies them (spec §3.2, §3.3, §11.5)."""

from __future__ import annotations

from gguf import TokenType

# Spec §3.3, in id order; in real files the first is id 248044 and the rest follow consecutively.
QWEN35_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
QWEN35_FIRST_SPECIAL_ID = 248044

# llama.cpp's end-of-generation strings for these vocabularies (§3.2/§11.5); the GGUF eos id is added too.
EOG_TOKEN_STRINGS: tuple[str, ...] = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)


def special_token_type(text: str) -> TokenType:
    """The GGUF type llama.cpp's converter gives an added token of Qwen's tokenizer.

    Qwen marks only the `<|…|>` tokens special; the converter makes those (and anything that looks
    like them) CONTROL and the rest (`<think>`, `<tool_call>`, …) USER_DEFINED.
    """
    return TokenType.CONTROL if text.startswith("<|") and text.endswith("|>") else TokenType.USER_DEFINED
