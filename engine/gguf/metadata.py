"""The non-tokenizer GGUF keys of a qwen35 model file, written exactly as llama.cpp's converter writes them.

llama.cpp's loader and our own read these keys, so every writer in rigllm (converter, synthetic and
demo models) goes through this module: one key set, one order, one value type per key. The set and
order were taken from a GGUF written by the converter in llama-cpp-python 0.3.36
(`Qwen3_5TextModel`): `general.architecture`, `general.type`, the `general.*` model-card keys,
the architecture keys, `general.file_type` among them, then `general.quantization_version`; the
tokenizer keys follow (engine.gguf.vocab). `qwen35.attention.recurrent_layers` is missing from PyPI
gguf 0.19.0's helpers and is written with the raw array call (it comes out as an array of BOOL,
as the converter's).
"""

from __future__ import annotations

import json
from pathlib import Path

from gguf import GGML_QUANT_VERSION, GGUFWriter, LlamaFileType, Metadata, size_label

from engine.gguf.config import ARCH, ModelConfig

RECURRENT_LAYERS_KEY = f"{ARCH}.attention.recurrent_layers"

FILE_TYPES: dict[str, LlamaFileType] = {
    "f32": LlamaFileType.ALL_F32,
    "f16": LlamaFileType.MOSTLY_F16,
    "bf16": LlamaFileType.MOSTLY_BF16,
    "q8_0": LlamaFileType.MOSTLY_Q8_0,
}


def new_writer(path: str | Path) -> GGUFWriter:
    """A GGUFWriter for a qwen35 file (it writes `general.architecture` itself, first)."""
    return GGUFWriter(path, ARCH)


def hf_card_metadata(hf_dir: Path, total_params: int) -> Metadata:
    """The `general.*` model-card values the converter derives from an HF folder (name, size label, sampling).

    Uses gguf's own heuristics (README model card, config, folder name) so the values match the
    converter's; the converter in llama.cpp also reads `repetition_penalty` from
    generation_config.json, which PyPI gguf 0.19.0 does not, so that one is filled in here.
    """
    meta = Metadata.load(None, hf_dir, None, total_params)
    if meta.name is None:
        meta.name = hf_dir.name
    gen_config = hf_dir / "generation_config.json"
    if meta.sampling_penalty_repeat is None and gen_config.is_file():
        meta.sampling_penalty_repeat = json.loads(gen_config.read_text(encoding="utf-8")).get("repetition_penalty")
    if meta.size_label is None and total_params > 0:
        meta.size_label = size_label(total_params, total_params, 0, 0)
    return meta


def named_metadata(name: str, total_params: int) -> Metadata:
    """Model-card values for a model that has no HF folder (synthetic and demo models): a name and a size label."""
    meta = Metadata()
    meta.name = name
    meta.size_label = size_label(total_params, total_params, 0, 0)
    return meta


def write_general_keys(writer: GGUFWriter, meta: Metadata) -> None:
    """`general.type` and the model-card keys, in the converter's order (right after the architecture)."""
    writer.add_type("model")
    meta.set_gguf_meta_model(writer)


def write_model_keys(
    writer: GGUFWriter, cfg: ModelConfig, file_type: LlamaFileType, sections_from_config: bool = True
) -> None:
    """The `qwen35.*` hyperparameters and `general.file_type`, as `Qwen3_5TextModel.set_gguf_parameters` does.

    The converter writes `rope.dimension_sections` with the other RoPE keys when the HF config has
    `mrope_section`, and appends its default at the very end when it does not; `sections_from_config`
    picks the place, so converted files keep the converter's key order too.
    """
    writer.add_block_count(cfg.n_blocks)
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.d_model)
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    if sections_from_config:
        writer.add_rope_dimension_sections(list(cfg.rope_sections))
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_file_type(file_type)
    if cfg.n_mtp > 0:
        writer.add_nextn_predict_layers(cfg.n_mtp)
    writer.add_ssm_conv_kernel(cfg.ssm_conv_kernel)
    writer.add_ssm_state_size(cfg.ssm_d_state)
    writer.add_ssm_group_count(cfg.ssm_n_k_heads)
    writer.add_ssm_time_step_rank(cfg.ssm_n_v_heads)
    writer.add_ssm_inner_size(cfg.ssm_d_inner)
    writer.add_array(RECURRENT_LAYERS_KEY, [bool(x) for x in cfg.is_recurrent])
    writer.add_full_attention_interval(cfg.full_attention_interval)
    writer.add_rope_dimension_count(cfg.rope_dims)
    if not sections_from_config:
        writer.add_rope_dimension_sections(list(cfg.rope_sections))


def write_quantization_version(writer: GGUFWriter) -> None:
    """`general.quantization_version`, written after the model keys and before the tokenizer, like the converter."""
    writer.add_quantization_version(GGML_QUANT_VERSION)
