"""Files from the llama-cpp-python 0.3.36 sdist (llama.cpp's test vocabularies, templates, converter).

Tests need a few of its files but the repository must not carry them. `sdist_file(relpath)` returns a
local path to one file, taken from, in order:

1. `RIGLLM_LLAMA_SDIST`: an unpacked sdist folder or the `.tar.gz` itself (a wrong setting fails);
2. the cache `$XDG_CACHE_HOME/rigllm-test` (default `~/.cache/rigllm-test`), where files are unpacked
   one by one from the sdist tarball, which is fetched there with `pip download` on first use.

When the sdist cannot be fetched (offline), the calling test is skipped with the reason. Only tests
marked `peer` may fetch it (the default `pytest` run downloads nothing): tests/conftest.py sets
`downloads_allowed` for each test, and an unmarked test that would download fails and says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

VERSION = "0.3.36"
ROOT_NAME = f"llama_cpp_python-{VERSION}"
QWEN35_VOCAB = "vendor/llama.cpp/models/ggml-vocab-qwen35.gguf"

_download_failure: str | None = None  # remembered so an offline run tries pip only once
downloads_allowed = False  # set per test by tests/conftest.py: True only for tests marked `peer`


# The mark of a test that reads sdist files: `peer`, so the default run never downloads (a cached copy is
# not enough reason to run it by default: CI's fresh clone has none).
needs_sdist = pytest.mark.peer


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rigllm-test"


def sdist_file(relpath: str) -> Path:
    """Local path of `relpath` (relative to the sdist's top folder), fetching and unpacking as needed."""
    configured = os.environ.get("RIGLLM_LLAMA_SDIST")
    if configured:
        source = Path(configured)
        if source.is_dir():
            path = source / relpath
            if not path.is_file():
                pytest.fail(f"RIGLLM_LLAMA_SDIST={source} has no {relpath}")
            return path
        if not source.is_file():
            pytest.fail(f"RIGLLM_LLAMA_SDIST={source} is neither an unpacked sdist nor its tarball")
        return _unpack(source, relpath)
    cached = cache_dir() / ROOT_NAME / relpath
    if cached.is_file():
        return cached
    return _unpack(_tarball(), relpath)


def _tarball() -> Path:
    """The sdist tarball in the cache, downloaded with pip when missing (skips the test if that fails)."""
    global _download_failure
    folder = cache_dir()
    tarball = folder / f"{ROOT_NAME}.tar.gz"
    if tarball.is_file():
        return tarball
    if not downloads_allowed:
        pytest.fail(f"this test needs the llama-cpp-python {VERSION} sdist, which is not in {folder}: "
                    "mark it `peer` (only peer tests may download)", pytrace=False)
    if _download_failure is not None:
        pytest.skip(_download_failure)
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
           f"llama-cpp-python=={VERSION}", "-d", str(folder)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if result.returncode != 0 or not tarball.is_file():
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        _download_failure = f"llama-cpp-python {VERSION} sdist not available (offline?): pip download failed: {last}"
        pytest.skip(_download_failure)
    return tarball


def _unpack(tarball: Path, relpath: str) -> Path:
    """Extract one member into the cache atomically (parallel test workers may race)."""
    target = cache_dir() / ROOT_NAME / relpath
    if target.is_file():
        return target
    member = f"{ROOT_NAME}/{relpath}"
    with tarfile.open(tarball) as tar:
        try:
            fh = tar.extractfile(member)
        except KeyError:
            fh = None
        if fh is None:
            pytest.fail(f"{tarball.name} has no file {member}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
            tmp.write(fh.read())
        os.replace(tmp.name, target)
    return target
