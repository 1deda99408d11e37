"""Which ggml type each tensor gets for a requested file type, by llama.cpp's converter rules.

The rules (vendored `convert_hf_to_gguf.py`, `ModelBase.prepare_tensors`): 1-D tensors, every
`*_norm.weight`, `ssm_conv1d.weight` and any name not ending in `.weight` stay F32; everything
else takes the file type, and a Q8_0 tensor whose rows are not a whole number of 32-value blocks
falls back to F16. Synthetic models use the same rules so that they look like converted ones.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

_FILE_TYPE_TENSOR_TYPE = {
    LlamaFileType.ALL_F32: GGMLQuantizationType.F32,
    LlamaFileType.MOSTLY_F16: GGMLQuantizationType.F16,
    LlamaFileType.MOSTLY_BF16: GGMLQuantizationType.BF16,
    LlamaFileType.MOSTLY_Q8_0: GGMLQuantizationType.Q8_0,
}


def tensor_type(name: str, shape: tuple[int, ...], file_type: LlamaFileType) -> GGMLQuantizationType:
    """ggml type of GGUF tensor `name` with numpy-order `shape` in a file of `file_type`."""
    if len(shape) <= 1 or name.endswith("_norm.weight") or name.endswith(".ssm_conv1d.weight"):
        return GGMLQuantizationType.F32
    if not name.endswith(".weight"):
        return GGMLQuantizationType.F32
    qtype = _FILE_TYPE_TENSOR_TYPE[file_type]
    block = GGML_QUANT_SIZES[qtype][0]
    if shape[-1] % block != 0:
        return GGMLQuantizationType.F16
    return qtype


def tensor_nbytes(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    """Bytes of a tensor of numpy-order `shape` stored as `qtype`."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape, dtype=np.int64))
    return n // block * type_size
