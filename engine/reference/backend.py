"""`ReferenceBackend`: the numpy fp32 forward pass as a backend (engine.generation.backend's `Backend`).

Slow, exact, the truth the other backends match. Beyond the plain protocol it has the two optional
capabilities the host-side slots (engine.generation.slots.HostSlots) look for: `forward_embedded`
prefills a multimodal prompt segment (image rows take their embeddings, M-RoPE positions), and
`speculative_model` is the model (trunk and MTP head) that `MtpSpeculator` drafts with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from engine.gguf.loader import LoadedModel
from engine.gguf.model_file import ModelFile
from engine.model.kv_formats import kv_format
from engine.model.load_progress import ProgressCallback, ProgressCounter
from engine.reference.model import ReferenceModel
from engine.reference.sparse_prefill import sparse_prefill
from engine.reference.state import SequenceState

if TYPE_CHECKING:
    from engine.sparse.profile import SparseProfile
    from engine.vision.multimodal_prompt import PromptSegment


class _CountingFile:
    """A `ModelFile` whose `tensor()` reports each tensor's file bytes, for load progress."""

    def __init__(self, mf: ModelFile, progress: ProgressCounter):
        self._mf, self._progress = mf, progress

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mf, name)

    def tensor(self, name: str) -> np.ndarray:
        out = self._mf.tensor(name)
        self._progress.add(self._mf.tensors[name].n_bytes)
        return out


class ReferenceBackend:
    """The numpy fp32 forward pass (engine.reference): slow, exact, the truth other backends match."""

    name = "reference"

    def __init__(self, loaded: LoadedModel, progress: ProgressCallback | None = None, kv: str = "f16",
                 sparse_profile: SparseProfile | None = None):
        """`kv`: the KV cache format the reference stores (f16 keeps exact fp32 rows); `sparse_profile`: prefill
        with this calibrated block-sparse attention profile (`rigllm calibrate-sparse`; engine.sparse.profile)."""
        self.kv = kv_format(kv)
        self.sparse_profile = sparse_profile

        total = sum(t.n_bytes for t in loaded.file.tensors.values())
        counter = ProgressCounter(progress, 0, total, "reading weights")
        counter.report()
        self.model = ReferenceModel.from_model_file(_CountingFile(loaded.file, counter))  # type: ignore[arg-type]
        self.config = self.model.cfg
        counter.enter("ready")

    @classmethod
    def from_model(cls, model: ReferenceModel, kv: str = "f16") -> ReferenceBackend:
        """A backend around a `ReferenceModel` built in memory (tests, fixtures: no GGUF file, no profile)."""
        backend = cls.__new__(cls)
        backend.model, backend.config, backend.kv, backend.sparse_profile = model, model.cfg, kv_format(kv), None
        return backend

    @property
    def speculative_model(self) -> ReferenceModel | None:
        """The model `MtpSpeculator` drafts with: this one when it has an MTP head, else None."""
        return self.model if self.model.mtp else None

    def new_sequence(self) -> SequenceState:
        return SequenceState(self.config, kv_format=self.kv)

    def forward_last(self, token_ids: Sequence[int], sequence: SequenceState) -> np.ndarray:
        if self.sparse_profile is None:
            hidden = self.model.forward_hidden(token_ids, sequence)
        else:  # the profile applies to prefill chunks past its minimum length; decode stays dense
            with sparse_prefill(self.model, self.sparse_profile):
                hidden = self.model.forward_hidden(token_ids, sequence)
        return self.model.logits(hidden[-1:])[0]

    def forward_embedded(self, segment: PromptSegment, sequence: SequenceState) -> np.ndarray:
        """`forward_last` of a multimodal prompt segment: its image rows take their embeddings instead of the
        pad token's, at the segment's (t, h, w) positions; the sequence then continues at the largest position + 1."""
        hidden = self.model.forward_hidden(segment.token_ids, sequence, segment.positions, segment.embeddings,
                                           segment.embedding_rows)
        return self.model.logits(hidden[-1:])[0]

    def close(self) -> None:
        """Nothing to release: the weights are ordinary numpy arrays."""
