"""Check a parsed GGUF against the qwen35 spec before anything trusts it (spec §3, §4, §16).

Every problem that would make the model unusable, or silently wrong, is a `ModelFileError` with one
line naming the file and the problem. Oddities that may be legitimate are returned as warnings:

errors   wrong architecture (MoE named as such); a missing, mistyped or out-of-range key (§3.1);
         inconsistent widths (`Cv % Hv`, `Hv % Hk`, `H % Hkv`, rotary dims); a tokenizer that is not
         byte-level BPE, token/type/embedding-row counts that disagree, no merges, special ids out of
         range; a missing tensor, a wrong shape (§4, §16), a type other than Q8_0/Q4_K/Q5_K/Q6_K/F16/BF16/
         F32 (the message names type and tensor and the types to look for, e.g. Q4_0, Q5_0, IQ4_XS); `ssm_a` not strictly negative (the
         converter's `-exp(A_log)` is missing: the recurrence would blow up), NaN/inf in a small tensor.
warnings norm weights averaging near 0 instead of near 1 (the `+1` offset looks missing, but trained
         norms vary, so this is a hint, not proof); IMROPE sections covering fewer pairs than the
         rotary width (tiny test models); tensors the engine does not use (they are ignored).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable, Mapping

import numpy as np

from engine.errors import ModelFileError
from engine.gguf.config import ARCH, ModelConfig
from engine.gguf.header import show
from engine.gguf.model_file import SUPPORTED_ADVICE, SUPPORTED_TEXT, SUPPORTED_TYPES, ModelFile
from engine.gguf.tensor_layout import model_tensors

MOE_ARCH = "qwen35moe"
VISION_ARCH = "clip"  # llama.cpp's mmproj files
MAX_BLOCKS = 1024  # far above any real model; bounds the work a corrupt block_count can cause
MAX_WIDTH = 1 << 32

_INT_KEYS = (
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "rope.dimension_count",
    "ssm.conv_kernel",
    "ssm.state_size",
    "ssm.group_count",
    "ssm.time_step_rank",
    "ssm.inner_size",
)
_FLOAT_KEYS = ("attention.layer_norm_rms_epsilon", "rope.freq_base")
_OPTIONAL_INT_KEYS = {"nextn_predict_layers": 0, "full_attention_interval": 1}  # name -> lowest valid value
_SPECIAL_ID_KEYS = ("bos", "eos", "padding", "unknown", "seperator", "eot", "eom")
NORM_MEAN_WARN_BELOW = 0.25


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_architecture(fields: Mapping[str, Any], label: str) -> None:
    arch = fields.get("general.architecture")
    if arch is None:
        raise ModelFileError(f"{label}: no general.architecture key; not a Qwen3.5/3.6 model file")
    if arch == MOE_ARCH:
        raise ModelFileError(f"{label}: MoE models are not supported (architecture '{MOE_ARCH}')")
    if arch == VISION_ARCH:
        raise ModelFileError(
            f"{label}: this is a vision projector (mmproj) file, not a language model; open the text model GGUF"
        )
    if arch != ARCH:
        raise ModelFileError(f"{label}: not a Qwen3.5/3.6 dense hybrid (architecture {show(arch)})")


def check_keys(fields: Mapping[str, Any], label: str) -> list[str]:
    """Required `qwen35.*` keys present, typed and consistent; returns warnings."""

    def fail(problem: str) -> ModelFileError:
        return ModelFileError(f"{label}: {problem}")

    values: dict[str, int] = {}
    for name in _INT_KEYS:
        key = f"{ARCH}.{name}"
        if key not in fields:
            raise fail(f"missing GGUF key '{key}'")
        value = fields[key]
        if not _is_int(value):
            raise fail(f"GGUF key '{key}' should be an integer, found {show(value)}")
        if not 1 <= value < MAX_WIDTH:
            raise fail(f"GGUF key '{key}' = {value} is out of range")
        values[name] = value
    for name, lowest in _OPTIONAL_INT_KEYS.items():
        key = f"{ARCH}.{name}"
        if key in fields and not (_is_int(fields[key]) and lowest <= fields[key] < MAX_WIDTH):
            raise fail(f"GGUF key '{key}' = {show(fields[key])} is not a valid count")
    for name in _FLOAT_KEYS:
        key = f"{ARCH}.{name}"
        if key not in fields:
            raise fail(f"missing GGUF key '{key}'")
        value = fields[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise fail(f"GGUF key '{key}' should be a positive number, found {show(value)}")

    n_blocks, n_mtp = values["block_count"], fields.get(f"{ARCH}.nextn_predict_layers", 0)
    if n_blocks > MAX_BLOCKS:
        raise fail(f"block_count {n_blocks} is implausible (more than {MAX_BLOCKS})")
    if n_mtp >= n_blocks:
        raise fail(f"nextn_predict_layers {n_mtp} leaves no trunk layers (block_count {n_blocks})")
    value_length = fields.get(f"{ARCH}.attention.value_length", values["attention.key_length"])
    if value_length != values["attention.key_length"]:
        raise fail(f"attention.value_length {show(value_length)} != key_length {values['attention.key_length']}")
    if values["attention.head_count"] % values["attention.head_count_kv"]:
        raise fail(
            f"attention.head_count {values['attention.head_count']} is not a multiple of head_count_kv {values['attention.head_count_kv']}"
        )
    if values["ssm.inner_size"] % values["ssm.time_step_rank"]:
        raise fail(
            f"ssm.inner_size {values['ssm.inner_size']} is not a multiple of ssm.time_step_rank {values['ssm.time_step_rank']}"
        )
    if values["ssm.time_step_rank"] % values["ssm.group_count"]:
        raise fail(
            f"ssm.time_step_rank {values['ssm.time_step_rank']} is not a multiple of ssm.group_count {values['ssm.group_count']}"
        )
    rope_dims = values["rope.dimension_count"]
    if rope_dims % 2 or rope_dims > values["attention.key_length"]:
        raise fail(
            f"rope.dimension_count {rope_dims} must be even and at most key_length {values['attention.key_length']}"
        )
    _check_recurrent_layers(fields, n_blocks, n_mtp, fail)
    return _check_rope_sections(fields, rope_dims, fail)


def _check_recurrent_layers(
    fields: Mapping[str, Any], n_blocks: int, n_mtp: int, fail: Callable[[str], ModelFileError]
) -> None:
    key = f"{ARCH}.attention.recurrent_layers"
    if key not in fields:
        return
    flags = fields[key]
    if not isinstance(flags, list) or not all(_is_int(f) or isinstance(f, bool) for f in flags):
        raise fail(f"GGUF key '{key}' should be an array of flags")
    if len(flags) != n_blocks:
        raise fail(f"'{key}' has {len(flags)} entries, block_count is {n_blocks}")
    if any(flags[n_blocks - n_mtp :]):
        raise fail(f"'{key}' marks an MTP block as recurrent; MTP blocks are attention blocks")


def _check_rope_sections(fields: Mapping[str, Any], rope_dims: int, fail: Callable[[str], ModelFileError]) -> list[str]:
    key = f"{ARCH}.rope.dimension_sections"
    if key not in fields:
        return []
    sections = fields[key]
    if (
        not isinstance(sections, list)
        or not 3 <= len(sections) <= 4
        or not all(_is_int(s) and s >= 0 for s in sections)
    ):
        raise fail(f"GGUF key '{key}' should be 3 or 4 non-negative integers, found {show(sections)}")
    if 2 * sum(sections[:3]) < rope_dims:
        return [f"IMROPE sections {sections} cover fewer than the {rope_dims // 2} rotary pairs"]
    return []


def check_vocab(fields: Mapping[str, Any], label: str) -> int:
    """A usable byte-level BPE vocabulary; returns its size `V`."""
    model = fields.get("tokenizer.ggml.model")
    if model is None:
        raise ModelFileError(f"{label}: no tokenizer (missing 'tokenizer.ggml.model')")
    if model != "gpt2":
        raise ModelFileError(
            f"{label}: tokenizer model {show(model)} is not supported (rigllm reads byte-level BPE 'gpt2' vocabularies)"
        )
    tokens = fields.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ModelFileError(f"{label}: 'tokenizer.ggml.tokens' is missing or not a list of strings")
    n_vocab = len(tokens)
    types = fields.get("tokenizer.ggml.token_type")
    if types is not None:
        if not isinstance(types, list) or not all(_is_int(t) for t in types):
            raise ModelFileError(f"{label}: 'tokenizer.ggml.token_type' is not a list of integers")
        if len(types) != n_vocab:
            raise ModelFileError(f"{label}: vocabulary mismatch: {n_vocab} tokens but {len(types)} token types")
    merges = fields.get("tokenizer.ggml.merges")
    if not isinstance(merges, list) or not merges or not all(isinstance(m, str) for m in merges):
        raise ModelFileError(f"{label}: the gpt2 (BPE) vocabulary has no 'tokenizer.ggml.merges'")
    for name in _SPECIAL_ID_KEYS:
        key = f"tokenizer.ggml.{name}_token_id"
        if key in fields and (not _is_int(fields[key]) or not 0 <= fields[key] < n_vocab):
            raise ModelFileError(
                f"{label}: {key} = {show(fields[key])} is not a token id (vocabulary has {n_vocab} tokens)"
            )
    return n_vocab


def block_of(name: str) -> int | None:
    """Layer index of a `blk.N.*` tensor name, None for global tensors."""
    if not name.startswith("blk."):
        return None
    index = name.split(".", 2)[1]
    return int(index) if index.isdecimal() else None


def check_tensors(mf: ModelFile, cfg: ModelConfig) -> list[str]:
    """Every tensor of spec §4 present with its shape and a supported type; returns warnings.

    `cfg.tied_embeddings` must reflect whether the file has `output.weight` (it is then optional).
    """
    label = mf.path.name
    expected = {name: tuple(reversed(shape)) for name, shape in model_tensors(cfg)}  # GGUF ne order
    if not mf.has("blk.0.attn_norm.weight") and mf.has(f"blk.{cfg.n_layers}.nextn.eh_proj.weight"):
        raise ModelFileError(f"{label}: this is an MTP-only GGUF (no trunk layers); open the main model file")
    embd = mf.tensors.get("token_embd.weight")
    if embd is not None and len(embd.ne) == 2 and embd.ne[0] == cfg.d_model and embd.ne[1] != cfg.vocab_size:
        raise ModelFileError(
            f"{label}: vocabulary mismatch: token_embd.weight has {embd.ne[1]} rows but the vocabulary has {cfg.vocab_size} tokens"
        )

    missing = [name for name in expected if not mf.has(name)]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelFileError(f"{label}: missing tensor '{missing[0]}'{_kind(cfg, missing[0])}{more}")
    wrong = [name for name, ne in expected.items() if mf.tensors[name].ne != ne]
    if wrong:
        more = f" (and {len(wrong) - 1} more wrong shapes)" if len(wrong) > 1 else ""
        raise ModelFileError(
            f"{label}: tensor '{wrong[0]}' has shape {list(mf.tensors[wrong[0]].ne)}, expected {list(expected[wrong[0]])}"
            f" (GGUF ne order){more}"
        )
    unsupported = [name for name in expected if mf.tensors[name].ggml_type not in SUPPORTED_TYPES]
    if unsupported:
        kinds = Counter(mf.tensors[n].ggml_type.name for n in unsupported)
        first = mf.tensors[unsupported[0]]
        raise ModelFileError(
            f"{label}: tensor '{first.name}' has type {first.ggml_type.name}"
            f" ({', '.join(f'{n} {k} tensors' for k, n in kinds.items())} in all), which rigllm does not support"
            f" (supported: {SUPPORTED_TEXT}); {SUPPORTED_ADVICE}"
        )
    unused = [name for name in mf.tensors if name not in expected]
    if unused:
        return [f"{len(unused)} tensor(s) not used by rigllm are ignored (first: {show(unused[0])})"]
    return []


def _kind(cfg: ModelConfig, name: str) -> str:
    block = block_of(name)
    if block is None:
        return ""
    if block >= cfg.n_layers:
        return " (MTP block)"
    return " (GDN layer)" if cfg.is_gdn(block) else " (attention layer)"


def check_values(mf: ModelFile, cfg: ModelConfig) -> list[str]:
    """Cheap numeric checks on the small 1-D tensors (spec §16); returns warnings."""
    label = mf.path.name
    for name, shape in model_tensors(cfg):
        if len(shape) != 1:
            continue
        values = mf.tensor(name)
        if not np.isfinite(values).all():
            raise ModelFileError(f"{label}: tensor '{name}' contains NaN or infinite values")
        if name.endswith(".ssm_a") and values.max() >= 0:
            raise ModelFileError(
                f"{label}: tensor '{name}' has values >= 0 (max {values.max():.3g}); ssm_a must be -exp(A_log) < 0,"
                " so the file was not converted like llama.cpp's converter does"
            )
    norms = ["output_norm.weight"] + [
        f"blk.{i}.{n}" for i in range(cfg.n_layers) for n in ("attn_norm.weight", "post_attention_norm.weight")
    ]
    mean = float(np.mean([mf.tensor(n).mean() for n in norms]))
    if mean < NORM_MEAN_WARN_BELOW:
        return [f"RMSNorm weights average {mean:.3f} (expected about 1): the converter's +1 norm offset may be missing"]
    return []
