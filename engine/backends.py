"""The composition root for backends: the one module that knows every backend and opens the named one.

Everything above it (the server, the commands, the app) opens a backend here and then drives it
through the generation layer's protocols (engine.generation.backend, engine.generation.slots);
everything below it (engine.reference, engine.cuda) implements those protocols without knowing
about the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Sequence

from engine.errors import RigllmError
from engine.generation.backend import Backend, CardSpec
from engine.gguf.loader import LoadedModel
from engine.model.load_progress import ProgressCallback
from engine.vision.mmproj import LoadedMmproj

BACKEND_CHOICES = ("auto", "reference", "cuda")


def open_backend(name: str, loaded: LoadedModel, context: int | None = None,
                 progress: ProgressCallback | None = None, slots: int = 1, cards: Sequence[CardSpec] | None = None,
                 split: Sequence[int] | None = None, kv: str = "f16", sparse: bool = False,
                 thread_factory: Callable[..., Any] | None = None, mmproj: LoadedMmproj | None = None,
                 speculative: bool = True, draft_tokens: int = 1) -> Backend:
    """Build the named backend; `auto` takes CUDA when pycuda and a GPU are usable, else the reference.

    `context`: the most tokens one sequence will hold (sizes the GPU's KV cache; default the model's).
    `progress` receives `LoadProgress` reports and may raise `LoadCancelled`; the backend frees what it
    had allocated before the exception propagates. `slots`: sequences decoded together (the CUDA
    backend allocates a KV cache and GDN state for each; the reference makes them on demand).
    `cards`: `CardSpec`s to spread the layers over (default: GPU 0 alone); `split`: layers per card
    (default: the memory plan's split). `kv`: the KV cache format (f16, k8v3, ...).
    `sparse`: prefill long chunks with the calibrated sparse profile beside the model (both backends).
    `thread_factory(target, name)` makes each card's thread on several cards (the app passes QThreads); a
    single card runs on the calling thread.
    `mmproj`: the model's vision tower, loaded onto the (first) card by the CUDA backend, which then
    encodes and prefills images itself; the reference runs its numpy tower elsewhere and ignores it.
    `speculative`, `draft_tokens`: the CUDA backend loads the model's MTP head (when it has one) on its last card
    and drafts that many tokens per verify (the reference speculates through `HostSlots` instead).
    """
    from engine.sparse.profile import require_profile

    if name == "auto":
        from engine.cuda.driver import gpu_unavailable_reason

        name = "reference" if gpu_unavailable_reason() else "cuda"
    if name == "reference":
        from engine.reference.backend import ReferenceBackend

        return ReferenceBackend(loaded, progress, kv, require_profile(loaded.file) if sparse else None)
    if name == "cuda":
        from engine.cuda.backend import CudaBackend
        from engine.cuda.driver import gpu_unavailable_reason

        reason = gpu_unavailable_reason()
        if reason:
            raise RigllmError(f"the CUDA backend cannot run here: {reason}")
        return CudaBackend(loaded, cards, context=context, slots=slots, split=split, progress=progress, kv=kv,
                           mmproj=mmproj, speculative=speculative, draft_tokens=draft_tokens,
                           sparse=require_profile(loaded.file) if sparse else None, thread_factory=thread_factory)
    raise RigllmError(f"unknown backend '{name}' (choose from: {', '.join(BACKEND_CHOICES)})")
