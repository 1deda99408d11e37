"""A fit verdict for each file of a repository on the user's cards, at a context and KV format, from the
memory planner (engine.model.memory_plan): "fits 1 card at 32K", "needs 2 cards at 32K", "too big for
3 × 16 GB at 32K", or why the file cannot run at all.

One model header per repository is read over HTTP (the smallest runnable file's: `remote_header`); it
gives the exact footprint of that file and the model's shape, from which the other runnable quants are
priced as llama.cpp's converter would write them (`footprint_for`). F16/BF16/F32 weights are counted as
requantised to Q8_0 at load, so a BF16 file needs about the card memory of its Q8_0 sibling (twice the
disk). The paired mmproj's tower is added to the first card, as serving with it would.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import RigllmError
from engine.hub.catalog import RemoteFile, RepoListing
from engine.hub.names import RUNNABLE_QUANTS, context_label
from engine.hub.remote_header import RemoteModel, inspect_mmproj, inspect_model
from engine.hub.session import HubAccess
from engine.model.memory_plan import GIB, CardProfile, plan
from engine.model.model_footprint import Footprint, footprint_for
from engine.vision.config import VisionConfig
from engine.vision.device_footprint import with_tower


@dataclass(frozen=True)
class Verdict:
    text: str
    cards: int | None = None  # cards the file needs; None: it does not fit, or cannot run
    runnable: bool = False


def cards_label(cards: list[CardProfile]) -> str:
    """'3 × 16 GB' for alike cards, '16 GB + 8 GB' otherwise."""
    sizes = [f"{round(c.total_bytes / GIB)} GB" for c in cards]
    return f"{len(sizes)} × {sizes[0]}" if len(set(sizes)) == 1 else " + ".join(sizes)


def fit_on_cards(fp: Footprint, cards: list[CardProfile], context: int, kv: str) -> Verdict:
    """The fewest of `cards` (roomiest first) that hold `fp` at `context` tokens in `kv`."""
    if not cards:
        return Verdict("no cards to plan on: the CPU reference backend only", None, True)
    roomiest = sorted(cards, key=lambda c: c.usable_bytes, reverse=True)
    at = context_label(context)
    for n in range(1, len(roomiest) + 1):
        try:
            plan(fp, roomiest[:n], context, kv)
        except RigllmError:
            continue
        text = f"fits 1 card at {at}" if n == 1 else f"needs {n} cards at {at}"
        if context > fp.config.context_length:  # the plan holds, but the model was not trained that long
            text += f" (beyond its trained {context_label(fp.config.context_length)})"
        return Verdict(text, n, True)
    return Verdict(f"too big for {cards_label(cards)} at {at}", None, True)


@dataclass(frozen=True)
class RepoModel:
    """What one header read tells about a repository's models: enough to price every file offline."""

    listing: RepoListing
    model: RemoteModel | None
    source: RemoteFile | None  # the file whose header was read
    tower: VisionConfig | None  # the paired mmproj's, when it was read
    problem: str | None  # why the header says the models cannot run (MoE, not qwen35, broken)

    def verdicts(self, cards: list[CardProfile], context: int, kv: str) -> dict[str, Verdict]:
        """A verdict for every model file, by name (no network: re-priced as the knobs change)."""
        return {f.name.name: _verdict(f, self, cards, context, kv) for f in self.listing.models}


@dataclass(frozen=True)
class RepoPrices:
    """Verdicts by file name, and the header that priced them (None when no file could be read)."""

    verdicts: dict[str, Verdict]
    model: RemoteModel | None
    tower: VisionConfig | None


def header_file(listing: RepoListing) -> RemoteFile | None:
    """The file whose header prices the repository: its smallest single-file model in a runnable quant."""
    candidates = [f for f in listing.files if f.name.kind == "model" and f.name.runnable_quant]
    return min(candidates, key=lambda f: f.size) if candidates else None


def read_repo_model(listing: RepoListing, access: HubAccess, with_vision: bool = True) -> RepoModel:
    """Read one model header of `listing` (and the paired mmproj's) over HTTP."""
    model, problem = None, None
    source = header_file(listing)
    if listing.runnable is not False and source is not None:
        try:
            model = inspect_model(listing.repo, source.name.name, source.size, listing.commit, access)
        except RigllmError as err:  # MoE, not qwen35, a broken header: every model of the repo says so
            problem = str(err)
    tower = None
    if model is not None and with_vision and listing.mmproj is not None:
        mmproj = listing.file(listing.mmproj)
        try:
            tower = inspect_mmproj(listing.repo, mmproj.name.name, mmproj.size, listing.commit, access)
        except RigllmError:
            tower = None  # priced without the tower; loading reports the mmproj's problem
    return RepoModel(listing, model, source, tower, problem)


def price_repo(listing: RepoListing, cards: list[CardProfile], context: int, kv: str,
               access: HubAccess, with_vision: bool = True) -> RepoPrices:
    """A verdict for every model file of `listing` (reads one model header, and the mmproj's when paired)."""
    read = read_repo_model(listing, access, with_vision)
    return RepoPrices(read.verdicts(cards, context, kv), read.model, read.tower)


def _verdict(f: RemoteFile, read: RepoModel, cards: list[CardProfile], context: int, kv: str) -> Verdict:
    listing, model = read.listing, read.model
    if listing.runnable is False:
        return Verdict(listing.note)
    if f.name.kind == "split":
        return Verdict("not runnable: split into parts (rigllm loads single-file GGUFs; "
                       "join them with llama-gguf-split --merge)")
    if not f.name.runnable_quant:
        quant = f.name.quant or "unknown"
        return Verdict(f"not runnable: {quant} weights (rigllm runs {', '.join(RUNNABLE_QUANTS)} files)")
    if read.problem is not None:
        return Verdict(f"not runnable: {read.problem}")
    if model is None:
        return Verdict("not priced: no model header could be read")
    fp = model.footprint if f is read.source else footprint_for(model.config, f.name.quant.lower())  # type: ignore[union-attr]
    return fit_on_cards(with_tower(fp, read.tower), cards, context, kv)


def detected_cards() -> tuple[list[CardProfile], str]:
    """The NVIDIA cards on this machine as planner profiles (memory other processes use counted), and a note."""
    from engine.telemetry import open_source

    source = open_source()
    try:
        snap = source.read()
    finally:
        source.close()
    cards = [CardProfile(f"card {c.index}", c.memory_total, other_used_bytes=c.memory_used) for c in snap.cards]
    return cards, (f"{len(cards)} card(s) found" if cards else f"no NVIDIA card found ({snap.error or 'NVML'})")
