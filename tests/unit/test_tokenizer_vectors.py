"""llama.cpp's own tokenizer test vectors for the qwen35 vocabulary must all match."""

from __future__ import annotations

import llama_sdist
from tokenizer_fixtures import qwen35_tokenizer, vocab_test_vectors


@llama_sdist.needs_sdist
def test_qwen35_vocab_test_vectors_match() -> None:
    vectors = vocab_test_vectors(llama_sdist.QWEN35_VOCAB)
    assert len(vectors) >= 40
    tok = qwen35_tokenizer()
    # test-tokenizer-0.cpp tokenizes with add_special=false, parse_special=false.
    mismatches = [(text, want, got) for text, want in vectors if (got := tok.encode(text, parse_special=False)) != want]
    assert not mismatches
    for text, want in vectors:
        assert tok.encode(text) == want  # the inputs hold no special tokens
        assert tok.decode(want) == text
