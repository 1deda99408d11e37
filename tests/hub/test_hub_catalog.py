"""Search, listing and fit verdicts against the loopback Hub (tests/hub_server.py): what the model browser
and `rigllm models search|files` show, from the Hub's metadata and the remote GGUF header alone."""

from __future__ import annotations

import socket

import pytest

from hub_server import TRAINED

from engine.errors import RigllmError
from engine.gguf.header import HeaderPrefixShort, parse_header
from engine.gguf.loader import load_model
from engine.hub import remote_header
from engine.hub.catalog import list_repo, search
from engine.hub.fit import Verdict, fit_on_cards, price_repo
from engine.hub.names import classify, pick_mmproj, quant_of
from engine.hub.session import HubAccess, HubUnreachable
from engine.model.memory_plan import GIB, CardProfile, cards_16gb
from engine.model.model_footprint import footprint_of

FIXTURE_REPO = "rigtest/Qwen3.5-Fixture-GGUF"
VISION_REPO = "rigtest/Qwen3.5-Vision-Tiny-GGUF"


@pytest.mark.parametrize("name, quant, kind", [
    ("Qwen3.5-27B-Q4_K_M.gguf", "Q4_K_M", "model"),
    ("Qwen3.5-27B-UD-Q4_K_XL.gguf", "Q4_K_XL", "model"),
    ("qwen3.5-9b-q8_0.gguf", "Q8_0", "model"),
    ("Qwen3.6-27B-BF16.gguf", "BF16", "model"),
    ("Qwen3.5-27B_IQ4_XS.gguf", "IQ4_XS", "model"),
    ("BF16/Qwen3.5-27B-BF16-00001-of-00002.gguf", "BF16", "split"),
    ("mmproj-F16.gguf", "F16", "mmproj"),
    ("Qwen3.5-27B-mmproj-fp16.gguf", "F16", "mmproj"),
    ("model.gguf", None, "model"),
    ("README.md", None, "other"),
])
def test_file_names_give_quant_and_kind(name, quant, kind):
    assert (classify(name).quant, classify(name).kind) == (quant, kind)
    assert quant_of(name) == (quant if kind != "other" else quant_of(name))


def test_the_f16_projector_is_paired_before_others():
    assert pick_mmproj(["mmproj-F32.gguf", "mmproj-BF16.gguf", "mmproj-F16.gguf", "a-Q8_0.gguf"]) == "mmproj-F16.gguf"
    assert pick_mmproj(["mmproj-model-f32.gguf", "x-Q8_0.gguf"]) == "mmproj-model-f32.gguf"
    assert pick_mmproj(["x-Q8_0.gguf"]) is None


def test_search_marks_dense_qwen35_runnable_and_moe_not(hub, access):
    hits = search("Qwen3.5", access)
    by_repo = {h.repo: h for h in hits}
    assert by_repo[FIXTURE_REPO].runnable is True and by_repo[FIXTURE_REPO].architecture == "qwen35"
    moe = by_repo["rigtest/Qwen3.5-35B-A3B-GGUF"]
    assert moe.runnable is False and "MoE" in moe.note
    assert hits[-1].repo == moe.repo  # runnable first, though the MoE has more downloads
    request = hub.requests("GET", "/api/models?")[0]["path"]
    assert "filter=gguf" in request and "expand=gguf" in request
    assert search("no-such-model", access) == []


def test_search_says_plainly_that_the_hub_is_unreachable():
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HubUnreachable, match="Hub is unreachable .*library still open"):
        search("Qwen3.5", HubAccess(f"http://127.0.0.1:{port}"))


def test_listing_has_sizes_quants_checksums_and_the_paired_mmproj(hub, access):
    listing = list_repo(FIXTURE_REPO, access)
    q8 = listing.file("Qwen3.5-Fixture-Q8_0.gguf")
    data = (TRAINED / "fixture-q8_0.gguf").read_bytes()
    assert (q8.size, q8.name.quant, q8.sha256) == (len(data), "Q8_0", hub.repos[FIXTURE_REPO].sha256(q8.name.name))
    assert "README.md" not in [f.name.name for f in listing.files]
    assert listing.commit == hub.repos[FIXTURE_REPO].commit and listing.mmproj is None
    vision = list_repo(VISION_REPO, access)
    assert vision.mmproj == "mmproj-F16.gguf"
    assert [f.name.kind for f in vision.files] == ["model", "mmproj", "mmproj"]


def test_a_header_is_parsed_from_a_prefix_and_asks_for_more_when_short():
    data = (TRAINED / "fixture-q8_0.gguf").read_bytes()
    whole = parse_header(data, "fixture")
    with pytest.raises(HeaderPrefixShort):
        parse_header(data[:4096], "fixture", file_size=len(data))
    tensors = min(t.offset for t in whole.tensors.values())
    assert parse_header(data[:tensors], "fixture", file_size=len(data)) == whole
    with pytest.raises(RigllmError, match="truncated"):  # a prefix is not a license to lie about the size
        parse_header(data[:tensors], "fixture", file_size=tensors)


def test_the_remote_header_is_read_in_growing_ranges_and_prices_like_the_local_file(hub, access, monkeypatch):
    monkeypatch.setattr(remote_header, "FIRST_READ_BYTES", 16 << 10)
    listing = list_repo(FIXTURE_REPO, access)
    f = listing.file("Qwen3.5-Fixture-F32.gguf")
    remote = remote_header.inspect_model(FIXTURE_REPO, f.name.name, f.size, listing.commit, access)
    local = footprint_of(load_model(TRAINED / "fixture-f32.gguf"))
    assert (remote.footprint.block_bytes, remote.footprint.embedding_bytes, remote.footprint.head_bytes) == (
        local.block_bytes, local.embedding_bytes, local.head_bytes)
    ranges = [r["range"] for r in hub.requests("GET", "/resolve/") if r["range"]]
    assert ranges and all(r.startswith("bytes=") for r in ranges)
    fetched = sum(int(b) - int(a) + 1 for a, b in (r.removeprefix("bytes=").split("-") for r in ranges))
    assert fetched < f.size  # the weights were not downloaded


def test_fit_verdicts_follow_the_planner(hub, access):
    listing = list_repo(FIXTURE_REPO, access)
    prices = price_repo(listing, cards_16gb(3), 32768, "k8v3", access)
    v = prices.verdicts
    assert v["Qwen3.5-Fixture-Q8_0.gguf"].text == "fits 1 card at 32K"
    assert v["Qwen3.5-Fixture-F32.gguf"].cards == 1
    assert v["Qwen3.5-Fixture-Q4_K_M.gguf"].text.startswith("not runnable: Q4_K_M weights")
    assert "split into parts" in v["Qwen3.5-Fixture-Q8_0-00001-of-00002.gguf"].text
    fp, context = prices.model.footprint, 1 << 22  # a long context, so the KV outweighs each card's fixed scratch

    def cards(size: int, n: int = 3) -> list[CardProfile]:
        return [CardProfile(f"card {i}", size, reserve_bytes=0, margin=0) for i in range(n)]

    def fits(size: int, n: int) -> bool:
        return fit_on_cards(fp, cards(size, n), context, "f16").cards is not None

    low, high = 1 << 20, 64 * GIB  # the smallest card size on which two cards hold the model
    while high - low > 1 << 20:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid, 2) else (mid, high)
    assert not fits(high, 1)
    assert fit_on_cards(fp, cards(high), context, "f16") == Verdict(
        "needs 2 cards at 4096K (beyond its trained 32K)", 2, True)
    too_big = fit_on_cards(fp, cards(high // 3), context, "f16")
    assert too_big.cards is None and too_big.text.startswith("too big for 3 × ")


def test_moe_and_vision_repositories_are_priced_as_loading_would(hub, access):
    moe = list_repo("rigtest/Qwen3.5-35B-A3B-GGUF", access)
    assert "MoE" in price_repo(moe, cards_16gb(1), 4096, "f16", access).verdicts["Qwen3.5-35B-A3B-Q8_0.gguf"].text
    assert not hub.requests("GET", "35B-A3B-GGUF/resolve/")  # no header read for a repository known not to run
    vision = list_repo(VISION_REPO, access)
    with_tower = price_repo(vision, cards_16gb(1), 4096, "f16", access)
    without = price_repo(vision, cards_16gb(1), 4096, "f16", access, with_vision=False)
    assert with_tower.tower is not None and without.tower is None
    assert with_tower.verdicts["Qwen3.5-Vision-Tiny-F32.gguf"].text == "fits 1 card at 4K (beyond its trained 512)"
