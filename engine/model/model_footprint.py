"""What each part of a model costs in card memory, before any allocation (input to the memory planner).

Weights are counted in the form the GPU backend keeps them (contracts.md "Model files"): large 2-D
F16/BF16/F32 weights are requantised to Q8_0 at load, so they cost Q8_0 bytes; small tensors (1-D
norms, `ssm_a`, `ssm_dt.bias`, `ssm_conv1d`, and `ssm_alpha`/`ssm_beta` when stored as F32) run in
fp32 kernels, so they cost 4 bytes a value; Q8_0 and K-quant (Q4_K, Q5_K, Q6_K) tensors stay as they are
(the K-quant device layouts hold the file's bytes, engine/cuda/kq_layout.py). The matmul weights that
run in fp32 are `FP32_KERNEL_SUFFIXES`, which the reference's kernel rounding also reads, so both count the same tensors.
A footprint comes from a validated file (`footprint_of`) or from a config and the file type it
would be written in (`footprint_for`, for planning sizes without a file). Context-dependent parts
(KV, GDN state) are functions of the config here, so the planner and `rigllm info` agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gguf import GGMLQuantizationType

from engine.gguf.config import ModelConfig
from engine.gguf.header import TensorInfo
from engine.gguf.loader import LoadedModel
from engine.gguf.tensor_layout import model_tensors
from engine.gguf.tensor_plan import planned_types
from engine.gguf.tensor_types import tensor_nbytes
from engine.gguf.validate import block_of
from engine.model.kv_formats import KVFormat

Q8_0 = GGMLQuantizationType.Q8_0
# Weights whose matmul stays fp32 on the GPU when the file stores them as F32 (contracts.md "Model files").
FP32_KERNEL_SUFFIXES = (".ssm_alpha.weight", ".ssm_beta.weight")
FP32_BYTES = 4
_FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
_CONV_SUFFIX = ".ssm_conv1d.weight"
_Q8_0_BLOCK = 32


def device_bytes(name: str, shape: tuple[int, ...], stored: GGMLQuantizationType) -> tuple[int, bool]:
    """(bytes on the card, whether it is requantised to Q8_0) for a tensor of numpy-order `shape`."""
    fp32_kernel = (
        len(shape) == 1
        or name.endswith(_CONV_SUFFIX)
        or (name.endswith(FP32_KERNEL_SUFFIXES) and stored == GGMLQuantizationType.F32)
    )
    if stored in _FLOAT_TYPES:
        if fp32_kernel:
            return tensor_nbytes(shape, GGMLQuantizationType.F32), False
        if shape[-1] % _Q8_0_BLOCK == 0:
            return tensor_nbytes(shape, Q8_0), True
    return tensor_nbytes(shape, stored), False


@dataclass(frozen=True)
class Footprint:
    """Device weight bytes by part; `block_bytes[i]` is block i (trunk layers, then MTP blocks)."""

    config: ModelConfig
    block_bytes: tuple[int, ...]
    embedding_bytes: int  # token_embd (lives on the first card; only rows are gathered)
    head_bytes: int  # output_norm + output.weight (0 for the LM head itself when tied: it is token_embd)
    file_bytes: int  # the same tensors as stored in the file
    requantised: int  # how many tensors are counted as requantised to Q8_0
    source: str  # where the types came from, for the plan's notes
    vision_bytes: tuple[int, int] = (0, 0)  # (weights, scratch) of a vision tower on the first card, if loaded

    @property
    def weight_bytes(self) -> int:
        return sum(self.block_bytes) + self.embedding_bytes + self.head_bytes

    def kv_bytes_per_token(self, block: int, kv: KVFormat) -> int:
        """KV bytes one token adds in `block` (0 for GDN layers)."""
        cfg = self.config
        if cfg.is_gdn(block):
            return 0
        return cfg.n_head_kv * (kv.k.vector_bytes(cfg.head_dim) + kv.v.vector_bytes(cfg.head_dim))

    def state_bytes_per_sequence(self, block: int) -> int:
        """GDN state of one sequence in `block`: conv taps and recurrent matrices, fp32 (spec §6.9)."""
        if not self.config.is_gdn(block):
            return 0
        return gdn_conv_state_bytes(self.config) + gdn_recurrent_state_bytes(self.config)


def gdn_conv_state_bytes(cfg: ModelConfig) -> int:
    """The last `Kc - 1` raw conv inputs of one GDN layer, fp32."""
    return (cfg.ssm_conv_kernel - 1) * cfg.ssm_conv_dim * FP32_BYTES


def gdn_recurrent_state_bytes(cfg: ModelConfig) -> int:
    """`Hv` matrices of `dk x dv` fp32 for one GDN layer."""
    return cfg.ssm_n_v_heads * cfg.ssm_d_state * cfg.ssm_d_head_v * FP32_BYTES


def footprint_of(model: LoadedModel) -> Footprint:
    """Footprint of a validated file, from its tensors' stored types."""
    return footprint_of_tensors(model.config, model.file.tensors, f"the types stored in {model.path.name}")


def footprint_of_tensors(cfg: ModelConfig, tensors: Mapping[str, TensorInfo], source: str) -> Footprint:
    """Footprint from a header's tensor table alone (a remote file's header read over HTTP: no weights needed)."""
    typed = [(name, shape, tensors[name].ggml_type) for name, shape in model_tensors(cfg)]
    return _footprint(cfg, typed, source)


def footprint_for(cfg: ModelConfig, weight_type: str = "q8_0") -> Footprint:
    """Footprint of `cfg` written as a `weight_type` file by llama.cpp's converter rules, or its quantizer's
    for the K-quant file types (no file needed)."""
    return _footprint(cfg, planned_types(cfg, weight_type), f"a {weight_type.upper()} file")


def _footprint(
    cfg: ModelConfig, typed: list[tuple[str, tuple[int, ...], GGMLQuantizationType]], source: str
) -> Footprint:
    blocks = [0] * cfg.n_blocks
    embedding = head = stored = requantised = 0
    for name, shape, qtype in typed:
        size, requant = device_bytes(name, shape, qtype)
        stored += tensor_nbytes(shape, qtype)
        requantised += requant
        block = block_of(name)
        if block is not None:
            blocks[block] += size
        elif name == "token_embd.weight":
            embedding += size
        else:
            head += size
    return Footprint(cfg, tuple(blocks), embedding, head, stored, requantised, source)
