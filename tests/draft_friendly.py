"""The tests' draft-friendly model: the demo model's shape and vocabulary (so its chat template and tokenizer work)
with an MTP head, untied embeddings and no recurrent-flag pattern, whose head drafts well but not always
(engine.fixtures.speculative_fixture), so that accepted and rejected drafts both occur."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from engine.fixtures.demo_model import DEMO_CONFIG, demo_vocab
from engine.fixtures.speculative_fixture import write_draft_friendly_model
from engine.generation.chat_template import FALLBACK_TEMPLATE_PATH


def write_demo_draft_friendly(path: Path) -> Path:
    """Write the model to `path` (a GGUF) and return the path."""
    cfg = dataclasses.replace(DEMO_CONFIG, n_mtp=1, tied_embeddings=False, is_recurrent=())
    vocab = demo_vocab(FALLBACK_TEMPLATE_PATH.read_text(encoding="utf-8"))
    return write_draft_friendly_model(path, cfg, vocab, seed=3, mix=0.15)
