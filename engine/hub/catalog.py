"""Search the Hub for GGUF repositories and list one repository's files (sizes, quant types, checksums).

Search asks `/api/models` with the `gguf` library filter and the `gguf` expansion, the metadata the Hub
reads from each repository's GGUF header (architecture, parameter count, context length). A repository
is runnable when that architecture is `qwen35` (the Qwen3.5/3.6 dense hybrid); `qwen35moe` and every other
architecture are marked as not runnable, with the reason. A repository the Hub has no GGUF metadata for is
"unknown" until one of its files' headers has been read (`remote_header`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from engine.gguf.config import ARCH
from engine.gguf.validate import MOE_ARCH
from engine.hub.names import FileName, classify, pick_mmproj
from engine.hub.session import HubAccess, check_reachable, hub_errors

SEARCH_EXPAND = ["gguf", "downloads", "likes", "lastModified", "gated"]
DEFAULT_LIMIT = 40


def runnable_note(architecture: str | None) -> tuple[bool | None, str]:
    """(runnable, why) for a GGUF architecture name; None when the Hub did not say."""
    if architecture is None:
        return None, "architecture not published by the Hub: checked from the file header"
    if architecture == ARCH:
        return True, "Qwen3.5/3.6 dense hybrid"
    if architecture == MOE_ARCH:
        return False, f"MoE ({MOE_ARCH}): not runnable, rigllm runs the dense models"
    return False, f"architecture {architecture}: not runnable, rigllm runs Qwen3.5/3.6 dense (qwen35)"


@dataclass(frozen=True)
class RepoHit:
    repo: str
    architecture: str | None
    parameters: int | None  # the Hub's count from the GGUF header
    context_length: int | None
    downloads: int
    likes: int
    gated: bool
    last_modified: datetime | None
    runnable: bool | None
    note: str


def search(query: str, access: HubAccess | None = None, limit: int = DEFAULT_LIMIT) -> list[RepoHit]:
    """GGUF repositories matching `query`, runnable ones first (then by downloads, as the Hub sorts)."""
    access = access or HubAccess()
    check_reachable(access)
    with hub_errors(access):
        found = list(access.api().list_models(search=query, filter="gguf", expand=SEARCH_EXPAND, sort="downloads",
                                              limit=limit))
    hits = []
    for m in found:
        gguf = m.gguf or {}
        arch = gguf.get("architecture")
        runnable, note = runnable_note(arch)
        hits.append(RepoHit(m.id, arch, gguf.get("total"), gguf.get("context_length"), m.downloads or 0,
                            m.likes or 0, bool(m.gated), m.last_modified, runnable, note))
    order = {True: 0, None: 1, False: 2}
    return sorted(hits, key=lambda h: order[h.runnable])  # stable: the Hub's order within each group


@dataclass(frozen=True)
class RemoteFile:
    name: FileName
    size: int
    sha256: str | None  # the LFS object id the Hub recorded; None for a file kept in git itself
    blob_id: str | None  # git's blob id (a sha1), which checks a non-LFS file


@dataclass(frozen=True)
class RepoListing:
    repo: str
    commit: str  # every file below is of this revision
    architecture: str | None
    runnable: bool | None
    note: str
    files: tuple[RemoteFile, ...]  # GGUF files, models first, by size
    mmproj: str | None  # the vision projector paired with the models (names.pick_mmproj)

    def file(self, name: str) -> RemoteFile:
        for f in self.files:
            if f.name.name == name:
                return f
        raise KeyError(name)

    @property
    def models(self) -> list[RemoteFile]:
        return [f for f in self.files if f.name.kind in ("model", "split")]


def list_repo(repo: str, access: HubAccess | None = None, revision: str = "main") -> RepoListing:
    """The GGUF files of `repo` at `revision` with sizes and checksums (one `model_info(files_metadata=True)`)."""
    access = access or HubAccess()
    with hub_errors(access, repo):
        info = access.api().model_info(repo, revision=revision, files_metadata=True)
    files = []
    for s in info.siblings or []:
        name = classify(s.rfilename)
        if name.kind == "other":
            continue
        files.append(RemoteFile(name, int(s.size or 0), s.lfs.sha256 if s.lfs else None, s.blob_id))
    kinds = {"model": 0, "split": 1, "mmproj": 2}
    files.sort(key=lambda f: (kinds[f.name.kind], f.size, f.name.name))
    arch = (info.gguf or {}).get("architecture")
    runnable, note = runnable_note(arch)
    return RepoListing(repo, info.sha or revision, arch, runnable, note, tuple(files),
                       pick_mmproj([f.name.name for f in files]))
