"""Downloads from the loopback Hub: resumed after a cut connection and after a cancel (a restart), refused on
a checksum mismatch, a gated repository with and without HF_TOKEN, the free-disk check, the proxy setting,
the mmproj pulled beside its model, and the models folder's list and delete."""

from __future__ import annotations

import os
import threading

import pytest

from hub_server import TOKEN, TRAINED, serve, fixture_repos

from engine.errors import RigllmError
from engine.gguf.loader import load_model
from engine.hub import download
from engine.hub.download import PART_SUFFIX, ChecksumMismatch, DownloadCancelled
from engine.hub.library import Library
from engine.hub.pull import pull
from engine.hub.session import HubAccess, use_proxy
from engine.vision.mmproj_pairing import find_mmproj

REPO = "rigtest/Qwen3.5-Fixture-GGUF"
F32 = "Qwen3.5-Fixture-F32.gguf"
VISION_REPO = "rigtest/Qwen3.5-Vision-Tiny-GGUF"


def test_pull_takes_the_q8_0_file_by_default_and_records_it(hub, access, library):
    done = pull(REPO, library, access)
    assert done.model.read_bytes() == (TRAINED / "fixture-q8_0.gguf").read_bytes()
    assert done.mmproj is None and done.record.sha256 == hub.repos[REPO].sha256("Qwen3.5-Fixture-Q8_0.gguf")
    [entry] = library.entries()
    assert (entry.quant, entry.repo, entry.vision, entry.last_used) == ("Q8_0", REPO, False, None)
    library.mark_used(entry.path)
    assert library.entries()[0].last_used is not None
    with pytest.raises(RigllmError, match="no single-file Q5_K_M model .*quants there: F32, Q4_K_M, Q8_0"):
        pull(REPO, library, access, quant="Q5_K_M")


def test_a_connection_cut_mid_file_is_resumed_from_the_bytes_received(hub, access, library):
    hub.repos[REPO].cut_after[F32] = 2_500_000
    seen = []
    done = pull(REPO, library, access, quant="F32", progress=seen.append)
    assert done.model.read_bytes() == (TRAINED / "fixture-f32.gguf").read_bytes()
    gets = hub.requests("GET", f"/resolve/{hub.repos[REPO].commit}/{F32}")
    resumed = int(gets[-1]["range"].removeprefix("bytes=").rstrip("-"))
    assert len(gets) == 2 and 0 < resumed <= 2_500_000  # whole chunks received before the cut are kept
    assert seen[-1].stage == "verified" and seen[-1].done_bytes == seen[-1].total_bytes


def test_a_cancelled_download_resumes_after_a_restart(hub, access, library):
    cancel = threading.Event()
    with pytest.raises(DownloadCancelled, match="pull again to resume"):
        pull(REPO, library, access, quant="F32", progress=lambda p: cancel.set(), cancel=cancel)
    part = library.folder_for(REPO) / (F32 + PART_SUFFIX)
    kept = part.stat().st_size
    assert 0 < kept < (TRAINED / "fixture-f32.gguf").stat().st_size and not library.entries()
    done = pull(REPO, Library(library.root), HubAccess(hub.endpoint), quant="F32")  # a new process, in effect
    assert hub.requests("GET", F32)[-1]["range"] == f"bytes={kept}-"
    assert done.model.read_bytes() == (TRAINED / "fixture-f32.gguf").read_bytes() and not part.exists()


def test_a_checksum_mismatch_is_refused_and_nothing_is_kept(hub, access, library):
    hub.repos[REPO].wrong_sha256.add(F32)
    with pytest.raises(ChecksumMismatch, match="checksum mismatch .*deleted"):
        pull(REPO, library, access, quant="F32")
    assert list(library.folder_for(REPO).iterdir()) == [] and library.entries() == []


def test_a_gated_repository_needs_hf_token(hub, access, library, monkeypatch):
    hub.repos[REPO].gated = True
    with pytest.raises(RigllmError, match="is gated: .*HF_TOKEN"):
        pull(REPO, library, access)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert pull(REPO, library, HubAccess(hub.endpoint)).model.is_file()
    assert hub.requests("GET", "/resolve/")[-1]["auth"] == f"Bearer {TOKEN}"


def test_the_free_disk_check_runs_before_any_byte_is_fetched(hub, access, library, monkeypatch):
    monkeypatch.setattr(download, "free_bytes", lambda folder: 10 << 20)
    with pytest.raises(RigllmError, match="not enough free disk for Qwen3.5-Fixture-F32.gguf"):
        pull(REPO, library, access, quant="F32")
    assert not hub.requests("GET", "/resolve/") and not hub.requests("HEAD")


def test_the_proxy_setting_carries_the_hub_traffic(hub, library, monkeypatch, vision_files):
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    for var in ("HTTPS_PROXY", "HTTP_PROXY"):  # recorded before use_proxy sets them, so teardown restores these
        monkeypatch.delenv(var, raising=False)
    with serve(fixture_repos(vision_files)) as proxy:  # a second loopback server standing in for the proxy
        try:
            use_proxy(proxy.endpoint)
            pull(REPO, library, HubAccess(hub.endpoint))
        finally:
            for var in ("HTTPS_PROXY", "HTTP_PROXY"):
                os.environ.pop(var, None)
            use_proxy("")
    assert not hub.log
    assert proxy.log and all(r["path"].startswith(hub.endpoint + "/") for r in proxy.log)  # absolute-form: proxied


def test_the_mmproj_comes_with_its_model_and_goes_with_it(hub, access, library, vision_files):
    done = pull(VISION_REPO, library, access, quant="F32")
    assert done.mmproj is not None and done.mmproj.name == "mmproj-F16.gguf"
    assert done.mmproj.read_bytes() == vision_files[1]
    assert find_mmproj(done.model, load_model(done.model).config.d_model) == done.mmproj  # what serving pairs
    [entry] = library.entries()
    assert entry.vision and entry.record.mmproj == f"{VISION_REPO}/mmproj-F16.gguf"
    deleted = library.remove(library.find("Qwen3.5-Vision-Tiny-F32.gguf"))
    assert {p.name for p in deleted} == {"Qwen3.5-Vision-Tiny-F32.gguf", "mmproj-F16.gguf"}
    assert library.entries() == [] and not (library.root / VISION_REPO).exists()
