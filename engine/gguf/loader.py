"""Open a qwen35 GGUF for use: parse, validate, and describe it as a `LoadedModel`.

This is the one entry point backends, `rigllm info` and the planner use, so a file is checked against
the spec exactly once and in one order: structure (header parser), identity (architecture), keys,
vocabulary, tensors (presence, shapes, types), then cheap value checks. The first problem found is
raised as a one-line `ModelFileError`; non-fatal oddities are kept in `LoadedModel.warnings`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFileError
from engine.gguf.config import ModelConfig
from engine.gguf.model_file import ModelFile
from engine.gguf.tensor_layout import model_tensors
from engine.gguf.validate import check_architecture, check_keys, check_tensors, check_values, check_vocab


@dataclass(frozen=True)
class LoadedModel:
    """A validated model file: the mapped file, its config, its tensor-type summary and any warnings."""

    file: ModelFile
    config: ModelConfig
    type_counts: dict[str, int]  # ggml type name -> number of model tensors stored in it
    warnings: tuple[str, ...]

    @property
    def path(self) -> Path:
        return self.file.path


def load_model(path: str | Path) -> LoadedModel:
    """Validate `path` as a Qwen3.5/3.6 dense hybrid GGUF; raises ModelFileError on the first problem."""
    mf = ModelFile(path)
    cfg, warnings = check_header(mf)
    warnings += check_values(mf, cfg)
    types = Counter(mf.tensors[name].ggml_type.name for name, _ in model_tensors(cfg))
    return LoadedModel(mf, cfg, dict(types.most_common()), tuple(warnings))


def check_header(mf: ModelFile) -> tuple[ModelConfig, list[str]]:
    """The checks that need only the header (all but the value checks), in load_model's order: also run on a
    remote file's header read over HTTP, before anything is downloaded. `mf` needs `path`, `fields`,
    `tensors` and `has` only."""
    label = mf.path.name
    if not mf.tensors:
        raise ModelFileError(f"{label}: contains no tensors (a vocabulary-only GGUF?); it cannot be run as a model")
    check_architecture(mf.fields, label)
    warnings = check_keys(mf.fields, label)
    n_vocab = check_vocab(mf.fields, label)
    try:
        cfg = ModelConfig.from_gguf_fields(mf.fields, n_vocab, tied_embeddings=not mf.has("output.weight"))
    except ModelFileError as err:  # check_keys should have caught it; keep the file name in the message anyway
        raise ModelFileError(f"{label}: {err}") from None
    warnings += check_tensors(mf, cfg)
    return cfg, warnings


def load_vocab_only(path: str | Path) -> ModelFile:
    """Open any GGUF (tensors or not, any architecture) for its tokenizer; checks only the vocabulary.

    This is how vocabulary-only files such as llama.cpp's `ggml-vocab-qwen35.gguf` are used
    (contracts.md "Model files").
    """
    mf = ModelFile(path)
    check_vocab(mf.fields, mf.path.name)
    return mf
