"""The ggml type of every tensor of a model written as a given file type, converter or quantizer rules.

F32/F16/BF16/Q8_0 files follow llama.cpp's converter (`engine.gguf.tensor_types`). The K-quant file
types follow llama.cpp's quantizer (vendored `src/llama-quant.cpp` of llama-cpp-python 0.3.36,
`llama_tensor_get_type_impl`), so synthetic files and size plans look like the files people download:

* quantized at all: 2-D tensors whose name ends in `weight`, not `*_norm.weight`, not `ssm_conv1d`
  (`tensor_allows_quantization`); everything else keeps the type the converter gave it (F32 here);
* `output.weight`, or `token_embd.weight` when the embeddings are tied: Q6_K;
* Q4_K_M / Q5_K_M: the "attn_v-like" tensors (`attn_v`, and the GDN layers' `attn_qkv`, which
  `category_is_attn_v` counts with them) and `ffn_down` of block i take Q6_K when
  `use_more_bits(i, n_blocks)`, the file's base type otherwise. The quantizer's counters run over
  tensors sorted by block index (`weight_name_comparer`) and every block has one attn_v-like tensor
  and one ffn_down, so block i's counter is i; the count is `block_count` (MTP blocks included);
* every other quantized tensor takes the base type (Q4_K, Q5_K, Q6_K);
* a row length that is not a multiple of 256 falls back: Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0
  (`tensor_type_fallback`); rigllm runs Q8_0 but refuses Q5_0/Q5_1, so such shapes fail validation.
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from engine.gguf.config import ModelConfig
from engine.gguf.metadata import FILE_TYPES
from engine.gguf.tensor_layout import Shape, model_tensors
from engine.gguf.tensor_types import tensor_type

Q = GGMLQuantizationType

# rigllm weight-type name -> (llama.cpp file type, base tensor type)
KQUANT_FILE_TYPES: dict[str, tuple[LlamaFileType, GGMLQuantizationType]] = {
    "q4_k_m": (LlamaFileType.MOSTLY_Q4_K_M, Q.Q4_K),
    "q5_k_m": (LlamaFileType.MOSTLY_Q5_K_M, Q.Q5_K),
    "q6_k": (LlamaFileType.MOSTLY_Q6_K, Q.Q6_K),
}
WEIGHT_TYPES = (*FILE_TYPES, *KQUANT_FILE_TYPES)
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}
QK_K = 256


def file_type_of(weight_type: str) -> LlamaFileType:
    """`general.file_type` of a `weight_type` file ("f32", ..., "q8_0", "q4_k_m", "q5_k_m", "q6_k")."""
    if weight_type in KQUANT_FILE_TYPES:
        return KQUANT_FILE_TYPES[weight_type][0]
    if weight_type in FILE_TYPES:
        return FILE_TYPES[weight_type]
    raise ValueError(f"weight_type must be one of {', '.join(WEIGHT_TYPES)}, not '{weight_type}'")


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers that get more bits: the first and last eighth, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _quantizable(name: str, shape: Shape) -> bool:
    return len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name and "ssm_conv1d" not in name


def kquant_tensor_type(name: str, shape: Shape, weight_type: str, cfg: ModelConfig) -> GGMLQuantizationType:
    """The type llama.cpp's quantizer gives tensor `name` (numpy-order `shape`) of `cfg` in a `weight_type` file,
    starting from an F32 conversion (unquantized tensors stay F32)."""
    file_type, base = KQUANT_FILE_TYPES[weight_type]
    if not _quantizable(name, shape):
        return Q.F32
    block = int(name.split(".")[1]) if name.startswith("blk.") else None
    qtype = base
    if name == "output.weight" or (cfg.tied_embeddings and name == "token_embd.weight"):
        return Q.Q6_K if shape[-1] % QK_K == 0 else Q.Q8_0
    if block is not None and file_type in (LlamaFileType.MOSTLY_Q4_K_M, LlamaFileType.MOSTLY_Q5_K_M):
        more_bits = name.endswith((".attn_v.weight", ".attn_qkv.weight", ".ffn_down.weight"))
        if more_bits and use_more_bits(block, cfg.n_blocks):
            qtype = Q.Q6_K
    if shape[-1] % GGML_QUANT_SIZES[qtype][0]:
        qtype = _FALLBACK[qtype]
        if shape[-1] % GGML_QUANT_SIZES[qtype][0]:
            qtype = Q.F16
    return qtype


def planned_types(cfg: ModelConfig, weight_type: str) -> list[tuple[str, Shape, GGMLQuantizationType]]:
    """(name, numpy-order shape, ggml type) of every tensor of `cfg` written as a `weight_type` file."""
    if weight_type in KQUANT_FILE_TYPES:
        return [(n, s, kquant_tensor_type(n, s, weight_type, cfg)) for n, s in model_tensors(cfg)]
    file_type = file_type_of(weight_type)
    return [(n, s, tensor_type(n, s, file_type)) for n, s in model_tensors(cfg)]
