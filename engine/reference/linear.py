"""Checked access to GGUF-named weights and the `Linear` matmul that applies the rounding policy.

Every layer reads its tensors through `WeightTable`, so a missing or mis-shaped tensor fails at
construction with a message naming it (not as a numpy broadcast error deep inside a forward pass),
and every weight matmul goes through `Linear`, the single place where `ActivationRounding` acts.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from engine.errors import ModelFileError
from engine.reference.activation_rounding import ActivationRounding, round_q8_1


class Linear:
    """`y = x · Wᵀ` with W in numpy order [out, in]; x is rounded to Q8_1 first when `round_input`."""

    def __init__(self, weight: np.ndarray, round_input: bool):
        self.weight = np.ascontiguousarray(weight, dtype=np.float32)
        self.round_input = round_input

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.round_input:
            x = round_q8_1(x)
        return x @ self.weight.T


class WeightTable:
    """GGUF-named fp32 tensors in numpy order, handed out with shape checks."""

    def __init__(
        self,
        weights: Mapping[str, np.ndarray],
        rounding: ActivationRounding = ActivationRounding.EXACT,
        fp32_weights: Collection[str] = (),
    ):
        self._weights = weights
        self.rounding = rounding
        self._fp32_weights = frozenset(fp32_weights)

    def has(self, name: str) -> bool:
        return name in self._weights

    def tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The tensor as contiguous float32, after checking it exists and has `shape` (numpy order)."""
        if name not in self._weights:
            raise ModelFileError(f"missing tensor '{name}'")
        data = np.asarray(self._weights[name])
        if data.shape != shape:
            raise ModelFileError(f"tensor '{name}' has shape {data.shape}, expected {shape} (numpy order)")
        return np.ascontiguousarray(data, dtype=np.float32)

    def linear(self, name: str, out_features: int, in_features: int) -> Linear:
        """A matmul against weight `name` ([out, in]) under this table's rounding policy."""
        weight = self.tensor(name, (out_features, in_features))
        return Linear(weight, self.rounding is ActivationRounding.KERNEL and name not in self._fp32_weights)
