"""`pull`: choose a repository's file (by name, by quant, or its Q8_0), fetch it and the paired mmproj into
the models folder, and record them in the library. Used by `rigllm pull`, the admin API and the app."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from engine.errors import RigllmError
from engine.hub.catalog import RemoteFile, RepoListing, list_repo
from engine.hub.download import ProgressFn, check_free_disk, fetch_file, PART_SUFFIX
from engine.hub.library import Library, Record
from engine.hub.session import HubAccess

DEFAULT_QUANT = "Q8_0"


def choose_file(listing: RepoListing, file: str | None = None, quant: str | None = None) -> RemoteFile:
    """The model file to pull: `file` by name, else the single-file model of `quant`, else the Q8_0 one."""
    models = [f for f in listing.files if f.name.kind == "model"]
    if file is not None:
        try:
            return listing.file(file)
        except KeyError:
            names = ", ".join(f.name.name for f in models) or "none"
            raise RigllmError(f"{listing.repo} has no file {file} (its model files: {names})") from None
    want = (quant or DEFAULT_QUANT).upper()
    matches = [f for f in models if f.name.quant == want]
    if len(matches) == 1:
        return matches[0]
    quants = ", ".join(sorted({f.name.quant or "?" for f in models})) or "none"
    if not matches:
        raise RigllmError(f"{listing.repo} has no single-file {want} model (quants there: {quants}); "
                          "choose one with --quant or --file")
    raise RigllmError(f"{listing.repo} has several {want} files ({', '.join(f.name.name for f in matches)}): "
                      "choose one with --file")


@dataclass(frozen=True)
class Pulled:
    model: Path
    mmproj: Path | None
    record: Record


def pull(repo: str, library: Library, access: HubAccess | None = None, file: str | None = None,
         quant: str | None = None, with_mmproj: bool = True, progress: ProgressFn | None = None,
         cancel: threading.Event | None = None, listing: RepoListing | None = None) -> Pulled:
    access = access or HubAccess()
    listing = listing or list_repo(repo, access)
    target = choose_file(listing, file, quant)
    if target.name.kind == "mmproj":
        raise RigllmError(f"{target.name.name} is a vision projector; pull a model file (its mmproj comes with it)")
    folder = library.folder_for(repo)
    todo = [target] + ([listing.file(listing.mmproj)] if with_mmproj and listing.mmproj else [])
    missing = 0
    for f in todo:
        dest = folder / f.name.name.rsplit("/", 1)[-1]
        part = dest.with_name(dest.name + PART_SUFFIX)
        if not dest.exists():
            missing += f.size - (part.stat().st_size if part.exists() else 0)
    check_free_disk(folder, missing, " and ".join(f.name.name for f in todo))  # all of it, before the first byte
    paths = [fetch_file(repo, f.name.name, folder, access, listing.commit, progress, cancel) for f in todo]
    mmproj = paths[1] if len(paths) > 1 else None
    record = library.record(paths[0], repo, target.name.name, listing.commit, target.sha256, mmproj)
    return Pulled(paths[0], mmproj, record)
