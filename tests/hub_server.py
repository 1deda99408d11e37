"""A Hugging Face Hub on loopback for tests: the endpoints huggingface_hub 2.x calls, over real HTTP.

    GET  /api/models?search=&filter=gguf&expand=...        search (the `gguf` expansion included)
    GET  /api/models/{repo}[/revision/{rev}]?blobs=true    model_info (siblings with sizes and LFS sha256)
    POST /api/models/{repo}/paths-info/{rev}               get_paths_info
    GET  /api/models/{repo}/tree/{rev}[/{path}]            list_repo_tree (HfFileSystem lists before it reads)
    HEAD/GET /{repo}/resolve/{rev}/{file}                  X-Repo-Commit, ETag, X-Linked-Etag, X-Linked-Size,
                                                           Range requests answered 206 with Content-Range

Faults a test can set on a repository: a file whose connection is cut after N bytes (once), a recorded
sha256 that is not the served bytes' (a corrupted upload), a gated repository that wants a token. Every
request is logged (method, path, Range, Authorization) so tests can say what the client did. Bound to
127.0.0.1 only; `serve()` is a context manager that stops it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "hf_test_token_for_gated_repos"


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    gguf: dict | None = None  # what the Hub's GGUF metadata says (architecture, total, context_length)
    gated: bool = False
    downloads: int = 0
    commit: str = ""
    wrong_sha256: set[str] = field(default_factory=set)  # files whose recorded sha256 is not their bytes'
    cut_after: dict[str, int] = field(default_factory=dict)  # file -> bytes sent before the connection is cut (once)

    def __post_init__(self) -> None:
        self.commit = self.commit or hashlib.sha1(self.repo_id.encode()).hexdigest()

    def sha256(self, name: str) -> str:
        real = hashlib.sha256(self.files[name]).hexdigest()
        return hashlib.sha256(b"not " + real.encode()).hexdigest() if name in self.wrong_sha256 else real

    def entry(self, name: str) -> dict:
        data = self.files[name]
        return {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest(),
                "lfs": {"oid": self.sha256(name), "size": len(data), "pointerSize": 134}}

    def info(self) -> dict:
        body = {"id": self.repo_id, "modelId": self.repo_id, "sha": self.commit, "private": False,
                "gated": "auto" if self.gated else False, "downloads": self.downloads, "likes": 0,
                "lastModified": "2026-11-20T10:00:00.000Z", "tags": ["gguf"], "library_name": "gguf",
                "siblings": [{"rfilename": n, "size": len(d), "blobId": hashlib.sha1(d).hexdigest(),
                              "lfs": {"sha256": self.sha256(n), "size": len(d), "pointerSize": 134}}
                             for n, d in sorted(self.files.items())]}
        if self.gguf is not None:
            body["gguf"] = self.gguf
        return body


class FakeHub:
    def __init__(self, repos: list[FakeRepo]):
        self.repos = {r.repo_id: r for r in repos}
        self.log: list[dict] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-hub", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def requests(self, method: str | None = None, contains: str = "") -> list[dict]:
        return [r for r in self.log if (method is None or r["method"] == method) and contains in r["path"]]


def _split_repo(parts: list[str]) -> tuple[str, list[str]]:
    return "/".join(parts[:2]), parts[2:]


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args) -> None:  # quiet: the log list is the record
            pass

        def _record(self) -> None:
            hub.log.append({"method": self.command, "path": self.path, "range": self.headers.get("Range"),
                            "auth": self.headers.get("Authorization")})

        def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, value, status: int = 200) -> None:
            self._send(status, json.dumps(value).encode(), {"Content-Type": "application/json"})

        def _error(self, status: int, code: str, message: str, head: bool = False) -> None:
            self._send(status, json.dumps({"error": message}).encode(),
                       {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}, head)

        def _repo(self, repo_id: str) -> FakeRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", f"Repository {repo_id} not found", self.command == "HEAD")
            return repo

        def _revision_ok(self, repo: FakeRepo, rev: str) -> bool:
            if unquote(rev) in ("main", repo.commit):
                return True
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", self.command == "HEAD")
            return False

        def do_GET(self) -> None:
            self._record()
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.strip("/").split("/")]
            query = parse_qs(url.query)
            if parts[:2] == ["api", "models"] and len(parts) == 2:
                return self._search(query)
            if parts[:2] == ["api", "models"]:
                repo_id, rest = _split_repo(parts[2:])
                repo = self._repo(repo_id)
                if repo is None:
                    return None
                if not rest or (rest[0] == "revision" and self._revision_ok(repo, rest[1])):
                    return self._json(repo.info())
                if rest[0] == "tree" and self._revision_ok(repo, rest[1]):
                    prefix = "/".join(rest[2:])
                    return self._json([repo.entry(n) for n in sorted(repo.files) if n.startswith(prefix)])
                return None if rest[0] in ("revision", "tree") else self._error(404, "NotFound", "no such route")
            return self._resolve(parts, head=False)

        def do_HEAD(self) -> None:
            self._record()
            self._resolve([unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")], head=True)

        def do_POST(self) -> None:
            self._record()
            parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode())
            if parts[:2] != ["api", "models"] or len(parts) < 6 or parts[4] != "paths-info":
                return self._error(404, "NotFound", "no such route")
            repo = self._repo("/".join(parts[2:4]))
            if repo is None or not self._revision_ok(repo, parts[5]):
                return None
            return self._json([repo.entry(p) for p in form.get("paths", []) if p in repo.files])

        def _search(self, query: dict) -> None:
            words = query.get("search", [""])[0].lower().split()
            found = [r for r in hub.repos.values() if all(w in r.repo_id.lower() for w in words)]
            if "gguf" in query.get("filter", []):
                found = [r for r in found if any(n.endswith(".gguf") for n in r.files)]
            found.sort(key=lambda r: -r.downloads)
            fields = ("id", "gguf", "downloads", "likes", "lastModified", "gated")
            self._json([{k: v for k, v in r.info().items() if k in fields} for r in found])

        def _resolve(self, parts: list[str], head: bool) -> None:
            if len(parts) < 5 or parts[2] != "resolve":
                return self._error(404, "NotFound", "no such route", head)
            repo = self._repo("/".join(parts[:2]))
            if repo is None or not self._revision_ok(repo, parts[3]):
                return None
            name = "/".join(parts[4:])
            if name not in repo.files:
                return self._error(404, "EntryNotFound", f"{name} does not exist", head)
            if repo.gated and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._error(401, "GatedRepo", f"Access to model {repo.repo_id} is restricted", head)
            data = repo.files[name]
            etag = repo.sha256(name)
            headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"', "X-Linked-Etag": f'"{etag}"',
                       "X-Linked-Size": str(len(data)), "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            start, end, status = 0, len(data) - 1, 200
            ranged = self.headers.get("Range")
            if ranged:
                first, _, last = ranged.removeprefix("bytes=").partition("-")
                start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
                if start >= len(data):
                    return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, head)
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            body = data[start:end + 1]
            cut = repo.cut_after.pop(name, None) if not head else None
            if cut is None:
                return self._send(status, body, headers, head)
            self.send_response(status)  # announce the whole body, send part of it, then hang up
            for k, v in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)

    return Handler


@contextmanager
def serve(repos: list[FakeRepo]) -> Iterator[FakeHub]:
    hub = FakeHub(repos)
    hub.thread.start()
    try:
        yield hub
    finally:
        hub.server.shutdown()
        hub.server.server_close()


# ---- the repositories the tests serve --------------------------------------------------------------------

TRAINED = Path(__file__).resolve().parent / "fixtures" / "trained"
QWEN35_GGUF = {"architecture": "qwen35", "total": 1_100_000, "context_length": 4096}


def fixture_repos(vision: tuple[bytes, bytes] | None = None) -> list[FakeRepo]:
    """The trained fixture as a qwen35 repo (Q8_0 and F32 files, a K-quant name, a split file), an MoE repo,
    and, given (text model bytes, mmproj bytes), a vision repo with two projectors to pair from."""
    q8 = (TRAINED / "fixture-q8_0.gguf").read_bytes()
    f32 = (TRAINED / "fixture-f32.gguf").read_bytes()
    repos = [
        FakeRepo("rigtest/Qwen3.5-Fixture-GGUF", {"Qwen3.5-Fixture-Q8_0.gguf": q8, "Qwen3.5-Fixture-F32.gguf": f32,
                                                  "Qwen3.5-Fixture-Q4_K_M.gguf": q8[: len(q8) // 2],
                                                  "Qwen3.5-Fixture-Q8_0-00001-of-00002.gguf": q8[:4096],
                                                  "README.md": b"# fixture\n"},
                 gguf=QWEN35_GGUF, downloads=50),
        FakeRepo("rigtest/Qwen3.5-35B-A3B-GGUF", {"Qwen3.5-35B-A3B-Q8_0.gguf": q8[:8192]},
                 gguf={"architecture": "qwen35moe", "total": 35_000_000_000, "context_length": 262144}, downloads=90),
    ]
    if vision is not None:
        text, mmproj = vision
        repos.append(FakeRepo("rigtest/Qwen3.5-Vision-Tiny-GGUF",
                              {"Qwen3.5-Vision-Tiny-F32.gguf": text, "mmproj-F32.gguf": mmproj,
                               "mmproj-F16.gguf": mmproj}, gguf=QWEN35_GGUF, downloads=10))
    return repos


def tiny_vision_files(root: Path) -> tuple[bytes, bytes]:
    """(text GGUF, mmproj GGUF) bytes of engine.fixtures.tiny_vision's model, converted as rigllm converts it
    (needs torch and transformers: callers importorskip them)."""
    from engine.fixtures.tiny_vision import make_tiny_vlm
    from engine.gguf.convert import convert
    from engine.vision.convert_mmproj import convert_mmproj

    hf_dir = make_tiny_vlm(root / "hf", "gqa2-hv2", seed=0)
    text = convert(hf_dir, root / "model.gguf", "f32")
    mmproj = convert_mmproj(hf_dir, root / "mmproj-model.gguf", "f32")
    return Path(text).read_bytes(), Path(mmproj).read_bytes()
