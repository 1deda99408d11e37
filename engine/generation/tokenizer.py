"""Text ↔ token ids for GGUF byte-level BPE vocabularies, matching llama.cpp's tokenizer.

Encoding mirrors llama.cpp (`llama-vocab.cpp`): special tokens (control, user-defined, unknown) are
first cut out of the text as whole strings, longest first, when `parse_special` is on; each remaining
fragment then goes through the pre-tokenizer regex and rank-based BPE, done by the `tokenizers`
library on a plain BPE model with no added tokens (so it can never produce a special id by itself).
Unlike llama.cpp, user-defined tokens such as `<think>` are *not* matched when `parse_special` is off:
plain user text must never turn into control structure.

Decoding works on bytes: each id maps to its bytes (normal tokens through the GPT-2 byte↔unicode
table, special tokens as their literal text, unused placeholders as nothing), which is also what the
incremental detokenizer needs to hold back partial UTF-8 sequences.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gguf import TokenType
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from engine.errors import ModelFileError
from engine.generation.pretokenizer import configure_byte_level
from engine.model.special_tokens import EOG_TOKEN_STRINGS

if TYPE_CHECKING:
    from engine.gguf.model_file import ModelFile

# Token types whose text is matched whole in the input (llama.cpp's special-token cache).
_MATCHED_WHOLE = {int(TokenType.CONTROL), int(TokenType.USER_DEFINED), int(TokenType.UNKNOWN)}
# Token types `decode(skip_special=True)` drops (llama.cpp's `special=false` in token_to_piece).
_SKIPPABLE = {int(TokenType.CONTROL), int(TokenType.UNKNOWN)}
_KNOWN_TYPES = {int(t) for t in TokenType if t != TokenType.BYTE}


def _byte_level_table() -> dict[str, bytes]:
    """GPT-2's byte-level alphabet: the printable character that stands for each of the 256 bytes."""
    printable = [b for b in range(256) if (33 <= b <= 126) or (161 <= b <= 172) or (174 <= b <= 255)]
    shifted = [b for b in range(256) if b not in set(printable)]
    table = {chr(b): bytes([b]) for b in printable} | {chr(256 + i): bytes([b]) for i, b in enumerate(shifted)}
    if set(table) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise AssertionError("GPT-2 byte table disagrees with tokenizers' ByteLevel alphabet")
    return table


_BYTE_TABLE = _byte_level_table()


class Tokenizer:
    """A GGUF `gpt2` (byte-level BPE) vocabulary: encode, decode, special and end-of-generation ids."""

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[str],
        pre: str,
        eos_id: int | None = None,
    ):
        if len(token_types) != len(tokens):
            raise ModelFileError(f"tokenizer has {len(tokens)} tokens but {len(token_types)} token types")
        unknown = {int(t) for t in token_types} - _KNOWN_TYPES
        if unknown:
            raise ModelFileError(f"tokenizer has token types {sorted(unknown)}, which a gpt2 vocabulary cannot use")
        self._tokens = list(tokens)
        self._types = [int(t) for t in token_types]
        self._to_id = {t: i for i, t in enumerate(self._tokens)}  # later ids win, as in llama.cpp
        self._bpe = _plain_bpe(self._to_id, merges, pre)
        self.special_ids: frozenset[int] = frozenset(
            i for i, t in enumerate(self._types) if t in _MATCHED_WHOLE
        )
        # Longest first, as llama.cpp partitions (ties by id, so the order is deterministic).
        self._specials_longest_first = sorted(
            (i for i in self.special_ids if self._tokens[i]), key=lambda i: (-len(self._tokens[i].encode()), i)
        )
        eog = {self._to_id[s] for s in EOG_TOKEN_STRINGS if s in self._to_id}
        if eos_id is not None:
            if not 0 <= eos_id < len(self._tokens):
                raise ModelFileError(f"tokenizer eos id {eos_id} is outside the vocabulary of {len(self._tokens)}")
            eog.add(eos_id)
        self.eos_ids: frozenset[int] = frozenset(eog)
        self._bytes: list[bytes | None] = [None] * len(self._tokens)

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> Tokenizer:
        """Build from decoded GGUF key/values (`ModelFile.fields`); any architecture, tensors or not."""
        model = fields.get("tokenizer.ggml.model")
        if model is None:
            raise ModelFileError("the GGUF has no tokenizer (tokenizer.ggml.model is missing)")
        if model != "gpt2":
            raise ModelFileError(
                f"tokenizer model '{model}' is not supported; rigllm reads byte-level BPE ('gpt2') vocabularies"
            )
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.pre"):
            if key not in fields:
                raise ModelFileError(f"the GGUF tokenizer lacks '{key}'")
        tokens = fields["tokenizer.ggml.tokens"]
        types = fields.get("tokenizer.ggml.token_type", [int(TokenType.NORMAL)] * len(tokens))
        eos = fields.get("tokenizer.ggml.eos_token_id")
        return cls(tokens, types, fields["tokenizer.ggml.merges"], fields["tokenizer.ggml.pre"], eos)

    @classmethod
    def from_model_file(cls, mf: ModelFile) -> Tokenizer:
        """Build from an open GGUF; errors name the file."""
        try:
            return cls.from_fields(mf.fields)
        except ModelFileError as err:
            raise ModelFileError(f"{mf.path.name}: {err}") from None

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def token_to_id(self, text: str) -> int | None:
        """The id whose token string is `text` (byte-level spelling for normal tokens), or None."""
        return self._to_id.get(text)

    def id_to_token(self, token_id: int) -> str:
        return self._tokens[token_id]

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        """Token ids for `text`; no BOS is ever added. `parse_special` matches special tokens whole."""
        fragments = self._partition_specials(text) if parse_special else [text]
        ids: list[int] = []
        for frag in fragments:
            if isinstance(frag, int):
                ids.append(frag)
            elif frag:
                # One fragment at a time: `encode_batch` would start tokenizers' thread pool, which then
                # warns and disables itself in every process the server forks afterwards.
                ids.extend(self._bpe.encode(frag, add_special_tokens=False).ids)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of `ids`; invalid UTF-8 (e.g. a cut multi-byte character) becomes U+FFFD."""
        return b"".join(self.token_bytes(i, skip_special) for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        """The bytes one token stands for; empty for skipped control tokens and unused placeholders."""
        if skip_special and self._types[token_id] in _SKIPPABLE:
            return b""
        cached = self._bytes[token_id]
        if cached is None:
            cached = self._bytes[token_id] = self._piece(token_id)
        return cached

    def _piece(self, token_id: int) -> bytes:
        kind = self._types[token_id]
        text = self._tokens[token_id]
        if kind == TokenType.NORMAL:
            # A character outside the byte alphabet stands for itself (llama.cpp prints an error marker).
            return b"".join(_BYTE_TABLE.get(c) or c.encode("utf-8") for c in text)
        if kind == TokenType.UNUSED:
            return b""
        return text.encode("utf-8")

    def _partition_specials(self, text: str) -> list[str | int]:
        """Split `text` into raw strings and special ids, each special cut out everywhere, longest first."""
        fragments: list[str | int] = [text]
        for sid in self._specials_longest_first:
            needle = self._tokens[sid]
            if needle not in text:
                continue
            split: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int) or needle not in frag:
                    split.append(frag)
                    continue
                parts = frag.split(needle)
                for k, part in enumerate(parts):
                    if k:
                        split.append(sid)
                    if part:
                        split.append(part)
            fragments = split
        return fragments


def _plain_bpe(vocab: dict[str, int], merges: Sequence[str], pre: str) -> HFTokenizer:
    """A `tokenizers` BPE over the whole vocabulary with no added tokens: regex → byte level → merges."""
    pairs = []
    for rank, merge in enumerate(merges):
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right:
            raise ModelFileError(f"tokenizer merge {rank} ({merge!r}) is not two tokens separated by a space")
        pairs.append((left, right))
    try:
        model = models.BPE(vocab=vocab, merges=pairs)
    except Exception as err:  # tokenizers raises on merges whose parts or result are not tokens
        raise ModelFileError(f"tokenizer merges do not fit the vocabulary ({err})") from None
    tokenizer = HFTokenizer(model)
    configure_byte_level(tokenizer, pre)
    return tokenizer
