"""What a file in a GGUF repository is, from its name alone: its quant type, and whether it is a model, a
vision projector (mmproj) or one part of a split model.

Repositories name files `<model>-<QUANT>.gguf` (Q4_K_M, Q8_0, BF16, UD-Q4_K_XL, IQ4_XS, ...) and the vision
tower `mmproj-<QUANT>.gguf` or `<model>-mmproj-<QUANT>.gguf`; llama.cpp's splitter adds `-00001-of-00003`.
rigllm runs single-file GGUFs whose weights are Q8_0, F16, BF16 or F32 (contracts.md "Model files").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

FileKind = Literal["model", "mmproj", "split", "other"]
RUNNABLE_QUANTS = ("Q8_0", "BF16", "F16", "F32")
# The vision tower runs with fp16 weights whatever the file stores, so the smallest lossless file wins.
MMPROJ_PREFERENCE = ("F16", "BF16", "F32", "Q8_0")

_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})$", re.IGNORECASE)
_QUANT = re.compile(r"(?:^|[-_.])(I?Q\d+(?:_[A-Z0-9]+)*|BF16|FP16|F16|F32|MXFP4(?:_MOE)?|TQ\d_\d)$")


@dataclass(frozen=True)
class FileName:
    name: str  # the path in the repository
    kind: FileKind
    quant: str | None  # upper case, e.g. Q4_K_M; None when the name carries none

    @property
    def runnable_quant(self) -> bool:
        return self.quant in RUNNABLE_QUANTS


def quant_of(name: str) -> str | None:
    """The quant type a GGUF's file name ends with (`Qwen3.5-27B-UD-Q4_K_XL.gguf` -> Q4_K_XL)."""
    stem = _SPLIT.sub("", name.rsplit("/", 1)[-1].removesuffix(".gguf").removesuffix(".GGUF")).upper()
    match = _QUANT.search(stem)
    if match is None:
        return None
    quant = match.group(1)
    return "F16" if quant == "FP16" else quant


def classify(name: str) -> FileName:
    base = name.rsplit("/", 1)[-1]
    if not base.lower().endswith(".gguf"):
        return FileName(name, "other", None)
    quant = quant_of(name)
    if "mmproj" in base.lower():
        return FileName(name, "mmproj", quant)
    if _SPLIT.search(base[: -len(".gguf")]):
        return FileName(name, "split", quant)
    return FileName(name, "model", quant)


def pick_mmproj(names: list[str]) -> str | None:
    """The vision projector to pair with a repository's models: by MMPROJ_PREFERENCE, then the first by name."""
    projectors = sorted(n for n in names if classify(n).kind == "mmproj")
    if not projectors:
        return None
    rank = {q: i for i, q in enumerate(MMPROJ_PREFERENCE)}
    return min(projectors, key=lambda n: rank.get(classify(n).quant or "", len(rank)))


def context_label(tokens: int) -> str:
    """32768 -> '32K', 262144 -> '256K', 1000 -> '1000'."""
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def params_label(n: int | None) -> str:
    """27_000_000_000 -> '27.0B params', 1_100_000 -> '1.1M params', None -> 'params ?'."""
    if not n:
        return "params ?"
    return f"{n / 1e9:.1f}B params" if n >= 1e9 else f"{n / 1e6:.1f}M params"
