"""Tokenizer keys of a qwen35 GGUF: `Vocab`, its writer, and its reader for an HF tokenizer folder.

Mirrors llama.cpp's converter (`TextModel._set_vocab_gpt2` → `get_vocab_base`, then
`gguf.SpecialVocab`): ids without a vocabulary entry up to `vocab_size` become `[PAD{id}]` with
type UNUSED; added tokens are CONTROL when flagged special or shaped like `<|...|>`, otherwise
USER_DEFINED; everything else is NORMAL. Merges, special ids, `add_*_token` flags and the chat
template come from `gguf.SpecialVocab`, the same code the converter runs. Reading uses the
`tokenizers` library and plain JSON (no transformers at run time).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGUFWriter, SpecialVocab, TokenType

from engine.errors import ModelFileError

PRE_TOKENIZER = "qwen35"


@dataclass(frozen=True)
class Vocab:
    """Everything written under `tokenizer.*`; `special_ids`/`add_special` keep SpecialVocab's key order."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    special_ids: dict[str, int] = field(default_factory=dict)  # e.g. {"eos": 248046, "pad": 248044}
    add_special: dict[str, bool] = field(default_factory=dict)  # e.g. {"bos": False}
    chat_template: str | None = None
    pre: str = PRE_TOKENIZER

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.token_types):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.token_types)} token types")

    def token_id(self, text: str) -> int:
        """Id of the token spelled `text` (first match)."""
        return self.tokens.index(text)


def write_vocab(writer: GGUFWriter, vocab: Vocab) -> None:
    """All tokenizer keys, in the converter's order."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    for kind, token_id in vocab.special_ids.items():
        getattr(writer, f"add_{kind}_token_id")(token_id)
    for kind, value in vocab.add_special.items():
        getattr(writer, f"add_add_{kind}_token")(value)
    if vocab.chat_template is not None:
        writer.add_chat_template(vocab.chat_template)


def looks_special(token: str) -> bool:
    """llama.cpp's `does_token_look_special`: added tokens it marks CONTROL even if not flagged special."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<｜") and token.endswith("｜>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


def vocab_from_hf(hf_dir: Path, vocab_size: int | None = None, pre: str = PRE_TOKENIZER) -> Vocab:
    """Read `tokenizer.json` (+ `tokenizer_config.json`, `chat_template.jinja`, `config.json`) of an HF folder.

    `vocab_size` is the model's embedding rows (`config.json`); the token list is padded to it.
    The pre-tokenizer name is not derived from a hash of test encodings as in llama.cpp: every
    Qwen3.5/3.6 checkpoint uses `qwen35`, which is the default.
    """
    from tokenizers import Tokenizer

    tokenizer_file = hf_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ModelFileError(f"{hf_dir}: no tokenizer.json")
    tok = Tokenizer.from_file(str(tokenizer_file))
    spec = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    added = {int(a["id"]): a for a in spec.get("added_tokens", [])}
    reverse = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    size = vocab_size if vocab_size is not None else len(reverse)
    if reverse and max(reverse) >= size:
        raise ModelFileError(f"{hf_dir}: token id {max(reverse)} does not fit the model's vocab_size {size}")

    tokens: list[str] = []
    types: list[int] = []
    for i in range(size):
        text = reverse.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
            continue
        entry = added.get(i)
        if entry is None:
            types.append(TokenType.NORMAL)
        else:
            if not entry.get("normalized", True):
                text = tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False)
            if entry.get("special", False) or looks_special(text):
                types.append(TokenType.CONTROL)
            else:
                text = text.replace("\u2581", " ")
                types.append(TokenType.USER_DEFINED)
        tokens.append(text)

    special = SpecialVocab(hf_dir, load_merges=True)
    template = special.chat_template
    if template is not None and not isinstance(template, str):
        raise ModelFileError(f"{hf_dir}: several named chat templates are not supported")
    return Vocab(
        tokens=tokens,
        token_types=[int(t) for t in types],
        merges=list(special.merges),
        special_ids=dict(special.special_token_ids),
        add_special=dict(special.add_special_token),
        chat_template=template,
        pre=pre,
    )
