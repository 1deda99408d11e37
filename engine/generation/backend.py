"""The interface the generation layer drives, and the backends that implement it.

A backend owns the model's weights and runs forward passes on opaque per-sequence state objects;
the generation layer above it (prompting, sampling, streaming) never sees how. Today there is the
numpy reference backend; the CUDA backend plugs in here with the same two methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, Sequence

import numpy as np

from engine.errors import RigllmError
from engine.gguf.config import ModelConfig
from engine.model.kv_formats import kv_format
from engine.model.load_progress import ProgressCallback, ProgressCounter
from engine.gguf.loader import LoadedModel
from engine.vision.mmproj import LoadedMmproj
from engine.gguf.model_file import ModelFile

BACKEND_CHOICES = ("auto", "reference", "cuda")


class Backend(Protocol):
    """Runs the model: a sequence object carries the KV cache and GDN state between calls."""

    name: str
    config: ModelConfig

    def new_sequence(self) -> Any:
        """Fresh per-sequence state (empty caches, position 0)."""

    def forward_last(self, token_ids: Sequence[int], sequence: Any) -> np.ndarray:
        """Process `token_ids` continuing `sequence`; return the logits [V] of the last token only."""

    def close(self) -> None:
        """Release devices and memory; the backend is unusable afterwards."""


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
                 sparse: bool = False):
        """`kv`: the KV cache format the reference stores (f16 keeps exact fp32 rows); `sparse`: prefill with
        the calibrated block-sparse attention profile beside the model (`rigllm calibrate-sparse`)."""
        from engine.reference.model import ReferenceModel
        from engine.sparse.profile import require_profile

        self.kv = kv_format(kv)
        self.sparse_profile = require_profile(loaded.file) if sparse else None

        total = sum(t.n_bytes for t in loaded.file.tensors.values())
        counter = ProgressCounter(progress, 0, total, "reading weights")
        counter.report()
        self.model = ReferenceModel.from_model_file(_CountingFile(loaded.file, counter))  # type: ignore[arg-type]
        self.config = self.model.cfg
        counter.enter("ready")

    @classmethod
    def from_model(cls, model: Any, kv: str = "f16") -> "ReferenceBackend":
        """A backend around a `ReferenceModel` built in memory (tests, fixtures: no GGUF file, no profile)."""
        backend = cls.__new__(cls)
        backend.model, backend.config, backend.kv, backend.sparse_profile = model, model.cfg, kv_format(kv), None
        return backend

    def new_sequence(self) -> Any:
        from engine.reference.state import SequenceState

        return SequenceState(self.config, kv_format=self.kv)

    def forward_last(self, token_ids: Sequence[int], sequence: Any) -> np.ndarray:
        if self.sparse_profile is None:
            hidden = self.model.forward_hidden(token_ids, sequence)
        else:  # the profile applies to prefill chunks past its minimum length; decode stays dense
            from engine.sparse.reference_hook import sparse_prefill

            with sparse_prefill(self.model, self.sparse_profile):
                hidden = self.model.forward_hidden(token_ids, sequence)
        return self.model.logits(hidden[-1:])[0]

    def close(self) -> None:
        """Nothing to release: the weights are ordinary numpy arrays."""


def open_backend(name: str, loaded: LoadedModel, context: int | None = None,
                 progress: ProgressCallback | None = None, slots: int = 1, cards: Sequence[Any] | None = None,
                 split: Sequence[int] | None = None, kv: str = "f16", sparse: bool = False,
                 thread_factory: Callable[..., Any] | None = None, mmproj: LoadedMmproj | None = None,
                 speculative: bool = True, draft_tokens: int = 1) -> Backend:
    """Build the named backend; `auto` takes CUDA when pycuda and a GPU are usable, else the reference.

    `context`: the most tokens one sequence will hold (sizes the GPU's KV cache; default the model's).
    `progress` receives `LoadProgress` reports and may raise `LoadCancelled`; the backend frees what it
    had allocated before the exception propagates. `slots`: sequences decoded together (the CUDA
    backend allocates a KV cache and GDN state for each; the reference makes them on demand).
    `cards`: `engine.cuda.pipeline.CardSpec`s to spread the layers over (default: GPU 0 alone); `split`:
    layers per card (default: the memory plan's split). `kv`: the KV cache format (f16, k8v3, ...).
    `sparse`: prefill long chunks with the calibrated sparse profile beside the model (both backends).
    `thread_factory(target, name)` makes each card's thread on several cards (the app passes QThreads).
    `mmproj`: the model's vision tower, loaded onto the (first) card by the CUDA backend, which then
    encodes and prefills images itself; the reference runs its numpy tower elsewhere and ignores it.
    `speculative`, `draft_tokens`: the CUDA backend on one card loads the model's MTP head (when it has one)
    and drafts that many tokens per verify (the reference speculates through `HostSlots` instead).
    """
    if name == "auto":
        from engine.cuda.driver import gpu_unavailable_reason

        name = "reference" if gpu_unavailable_reason() else "cuda"
    if name == "reference":
        return ReferenceBackend(loaded, progress, kv, sparse)
    if name == "cuda":
        from engine.cuda.backend import CudaBackend
        from engine.cuda.driver import gpu_unavailable_reason

        reason = gpu_unavailable_reason()
        if reason:
            raise RigllmError(f"the CUDA backend cannot run here: {reason}")
        from engine.sparse.profile import require_profile

        profile = require_profile(loaded.file) if sparse else None
        if cards is not None and (len(cards) > 1 or split is not None):
            from engine.cuda.pipeline import PipelineBackend

            return PipelineBackend(loaded, cards, context=context, slots=slots, split=split, progress=progress, kv=kv,
                                   thread_factory=thread_factory, mmproj=mmproj, sparse=profile)
        spec = cards[0] if cards else None
        return CudaBackend(loaded, context=context, slots=slots, progress=progress, kv=kv,
                           card_index=spec.device if spec else 0, card_bytes=spec.capacity_bytes if spec else None,
                           mmproj=mmproj, speculative=speculative, draft_tokens=draft_tokens, sparse=profile)
    raise RigllmError(f"unknown backend '{name}' (choose from: {', '.join(BACKEND_CHOICES)})")
