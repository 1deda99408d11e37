"""The models folder: what was pulled from the Hub (and what was put there by hand), when each model was
last used, and deleting a model with its vision projector.

Layout: `<models folder>/<owner>/<repo>/<file>.gguf`, the repository's paired `mmproj-*.gguf` beside its
models (so the engine's pairing, engine.vision.mmproj_pairing, finds it), and `library.json` at the top
recording each pulled file's repository, revision, sha256 and times. GGUFs without a record are listed
too (name and quant from the file name). Everything here works without a network.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from engine.errors import RigllmError
from engine.hub.names import classify
from engine.hub.download import PART_SUFFIX
from engine.paths import user_data_dir

INDEX_NAME = "library.json"
INDEX_VERSION = 1


def default_models_dir() -> Path:
    """`RIGLLM_MODELS_DIR`, else `<user data dir>/models` (the app's `models_dir` setting starts there too)."""
    override = os.environ.get("RIGLLM_MODELS_DIR")
    return Path(override) if override else user_data_dir() / "models"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Record:
    """One pulled file, as library.json keeps it (paths relative to the models folder, with /)."""

    path: str
    repo: str
    file: str
    commit: str
    sha256: str | None
    size: int
    mmproj: str | None  # the projector pulled with it, relative path
    downloaded: str
    last_used: str | None = None


@dataclass(frozen=True)
class Entry:
    """A model of the library view."""

    path: Path
    name: str
    quant: str | None
    size: int
    vision: bool
    repo: str | None  # None: put in the folder by hand
    last_used: str | None
    record: Record | None


class Library:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else default_models_dir()

    @property
    def index_path(self) -> Path:
        return self.root / INDEX_NAME

    def records(self) -> dict[str, Record]:
        try:
            raw = json.loads(self.index_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            raise RigllmError(f"{self.index_path}: unreadable library index ({err}); move it away to start a new one")
        return {r["path"]: Record(**r) for r in raw.get("models", [])}

    def _write(self, records: dict[str, Record]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.index_path.with_name(INDEX_NAME + ".tmp")
        body = {"version": INDEX_VERSION, "models": [asdict(r) for r in sorted(records.values(), key=lambda r: r.path)]}
        tmp.write_text(json.dumps(body, indent=1), encoding="utf-8")
        os.replace(tmp, self.index_path)

    def relative(self, path: Path) -> str:
        try:
            return Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            raise RigllmError(f"{path} is not in the models folder {self.root}") from None

    def folder_for(self, repo: str) -> Path:
        if repo.count("/") != 1 or ".." in repo.split("/"):
            raise RigllmError(f"not a Hub repository id: {repo!r} (expected owner/name)")
        return self.root / repo

    def record(self, path: Path, repo: str, file: str, commit: str, sha256: str | None, mmproj: Path | None) -> Record:
        records = self.records()
        rel = self.relative(path)
        rec = Record(rel, repo, file, commit, sha256, path.stat().st_size,
                     self.relative(mmproj) if mmproj else None, now_iso(), getattr(records.get(rel), "last_used", None))
        records[rel] = rec
        self._write(records)
        return rec

    def mark_used(self, path: Path) -> None:
        """Note that `path` was loaded now (a file outside the folder, or not recorded, is left alone)."""
        try:
            rel = self.relative(path)
        except RigllmError:
            return
        records = self.records()
        if rel in records:
            records[rel] = replace(records[rel], last_used=now_iso())
            self._write(records)

    def entries(self) -> list[Entry]:
        """Every model GGUF in the folder, most recently used first, then by name."""
        if not self.root.is_dir():
            return []
        records = self.records()
        found = []
        for path in sorted(self.root.rglob("*.gguf")):
            if classify(path.name).kind == "mmproj":
                continue
            rel = path.relative_to(self.root).as_posix()
            rec = records.get(rel)
            vision = bool(rec and rec.mmproj and (self.root / rec.mmproj).is_file()) or any(path.parent.glob("mmproj*.gguf"))
            found.append(Entry(path, rec.repo + "/" + rec.file if rec else path.stem, classify(path.name).quant,
                               path.stat().st_size, vision, rec.repo if rec else None, rec.last_used if rec else None, rec))
        found.sort(key=lambda e: e.name)
        found.sort(key=lambda e: e.last_used or "", reverse=True)  # stable: never-used ones last, by name
        return found

    def find(self, name: str) -> Entry:
        """An entry by path (absolute or relative to the folder), by `repo/file`, or by unique file name."""
        entries = self.entries()
        for e in entries:
            if name in (str(e.path), self.relative(e.path), e.name):
                return e
        by_file = [e for e in entries if e.path.name == name]
        if len(by_file) == 1:
            return by_file[0]
        if by_file:
            raise RigllmError(f"several models are named {name}: give the path ({', '.join(self.relative(e.path) for e in by_file)})")
        raise RigllmError(f"no model {name} in {self.root} (see `rigllm models list`)")

    def remove(self, entry: Entry) -> list[Path]:
        """Delete the model file, its partial downloads, and its mmproj when no other model beside it remains."""
        deleted = [entry.path]
        entry.path.unlink(missing_ok=True)
        records = self.records()
        records.pop(self.relative(entry.path), None)
        folder = entry.path.parent
        if not any(classify(p.name).kind != "mmproj" for p in folder.glob("*.gguf")):
            for p in sorted(folder.glob("mmproj*.gguf")) + sorted(folder.glob(f"*{PART_SUFFIX}*")):
                p.unlink(missing_ok=True)
                deleted.append(p)
        self._write(records)
        for d in (folder, folder.parent):
            if d != self.root and d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        return deleted
