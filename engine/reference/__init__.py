"""The numpy reference backend: fp32 forward pass of the Qwen3.5/3.6 text model, the truth for the CUDA backend."""

from engine.reference.activation_rounding import ActivationRounding
from engine.reference.model import ReferenceModel
from engine.reference.mtp import MtpHead
from engine.reference.state import SequenceState, StateSnapshot

__all__ = ["ActivationRounding", "MtpHead", "ReferenceModel", "SequenceState", "StateSnapshot"]
