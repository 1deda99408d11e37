"""The byte-level BPE pipeline shared by the runtime tokenizer and the tokenizer trainer.

Both must split text exactly as llama.cpp does for a GGUF's `tokenizer.ggml.pre`, so the regexes and
the `tokenizers` pipeline (regex Split, then ByteLevel without its own regex, ByteLevel decoder, no
normaliser) live here once.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers

from engine.errors import ModelFileError

# Spec §10. `qwen35` adds `\p{M}` (combining marks) to the letter classes of Qwen2's regex; without
# it, text with combining marks splits differently from llama.cpp.
QWEN35_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# `tokenizer.ggml.pre` ids llama.cpp maps to each regex (llama-vocab.cpp); others are refused.
PRE_TOKENIZER_REGEXES = {
    "qwen35": QWEN35_REGEX,
    "qwen2": QWEN2_REGEX,
    "deepseek-r1-qwen": QWEN2_REGEX,
}


def regex_for(pre: str) -> str:
    """The split regex for a GGUF pre-tokenizer id, or a ModelFileError naming the supported ones."""
    try:
        return PRE_TOKENIZER_REGEXES[pre]
    except KeyError:
        supported = ", ".join(sorted(PRE_TOKENIZER_REGEXES))
        raise ModelFileError(
            f"tokenizer pre-tokenizer '{pre}' is not supported (supported: {supported})"
        ) from None


def configure_byte_level(tokenizer: Tokenizer, pre: str) -> None:
    """Give `tokenizer` llama.cpp's gpt2-style pipeline: regex split → byte-level mapping; no normaliser."""
    tokenizer.normalizer = None
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex_for(pre)), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
