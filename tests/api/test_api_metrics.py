"""`/metrics` (issue 32): the counts agree with what the responses said, the gauges with the server and
the cards, and the endpoint needs the API key unless the server was told to publish it.

Runs on the trained fixture (it has an MTP head, so the reference backend drafts and the MTP counters
move) with a fixed two-card telemetry source standing in for NVML.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.model.kv_formats import kv_format
from engine.model.memory_plan import CardProfile, plan
from engine.model.model_footprint import footprint_of
from engine.gguf.loader import load_model
from engine.server.kv_usage import kv_usage
from engine.telemetry import CardSample, RigSnapshot, cmp_100_210
from api_fixtures import TEST_BACKEND, live_server, model_backend

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "fixture-q8_0.gguf"
KEY = "sk-metrics"
CARDS = (cmp_100_210(0, memory_used=3 << 30), cmp_100_210(1, memory_used=5 << 30))


class FixedCards:
    """A telemetry source whose cards never change, so a scrape can be compared with them exactly."""

    def __init__(self, cards: tuple[CardSample, ...]):
        self.cards = cards

    def read(self) -> RigSnapshot:
        return RigSnapshot(self.cards, time.monotonic())

    def close(self) -> None:
        """Nothing to release."""


@pytest.fixture(scope="module")
def loaded():
    return load_model(FIXTURE)


@pytest.fixture(scope="module")
def server(loaded):
    with live_server(loaded, model_backend(loaded), telemetry=FixedCards(CARDS), context_length=512) as live:
        yield live


def scrape(root: str, **kwargs) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, keyed by (name, sorted labels)."""
    r = httpx.get(f"{root}/metrics", timeout=10, **kwargs)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def delta(after: dict, before: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_counters_add_up_to_what_the_responses_reported(server):
    root = server.base_url.removesuffix("/v1")
    client = server.client()
    before = scrape(root)
    first = [{"role": "user", "content": "[QK=4821] ?QK="}]
    one = client.chat.completions.create(model=server.model_id, messages=first, max_tokens=6, temperature=0)
    follow = first + [{"role": "assistant", "content": one.choices[0].message.content or ""},
                      {"role": "user", "content": "?QK="}]
    two = client.chat.completions.create(model=server.model_id, messages=follow, max_tokens=6, temperature=0)
    text = client.completions.create(model=server.model_id, prompt="12+30=", max_tokens=4, temperature=0)
    assert httpx.post(f"{server.base_url}/chat/completions", json={"model": "nope", "messages": first}).status_code == 404
    assert httpx.get(f"{root}/no/such/route").status_code == 404
    after = scrape(root)

    usages = [r.usage for r in (one, two, text)]
    assert delta(after, before, "rigllm_requests_total", endpoint="/chat/completions", status="200") == 2
    assert delta(after, before, "rigllm_requests_total", endpoint="/chat/completions", status="404") == 1
    assert delta(after, before, "rigllm_requests_total", endpoint="/completions", status="200") == 1
    assert delta(after, before, "rigllm_requests_total", endpoint="unmatched", status="404") == 1
    assert delta(after, before, "rigllm_prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta(after, before, "rigllm_generated_tokens_total") == sum(u.completion_tokens for u in usages)
    cached = [u.prompt_tokens_details.cached_tokens for u in usages]
    assert cached[1] > 0  # the follow-up started from the first turn's kept state
    assert delta(after, before, "rigllm_prompt_cached_tokens_total") == sum(cached)
    assert delta(after, before, "rigllm_prefix_cache_hits_total") == sum(c > 0 for c in cached)
    details = [u.completion_tokens_details for u in usages]
    accepted = sum(d.accepted_prediction_tokens for d in details)
    drafted = accepted + sum(d.rejected_prediction_tokens for d in details)
    assert drafted > 0  # the fixture's MTP head drafted: the counters are not trivially zero
    assert delta(after, before, "rigllm_mtp_draft_tokens_total") == drafted
    assert delta(after, before, "rigllm_mtp_accepted_tokens_total") == accepted
    assert delta(after, before, "rigllm_time_to_first_token_seconds_count") == 3
    assert delta(after, before, "rigllm_decode_tokens_per_second_count") == sum(u.completion_tokens > 1 for u in usages)
    assert delta(after, before, "rigllm_time_to_first_token_seconds_sum") > 0


def test_gauges_show_the_server_and_its_cards(server):
    after = scrape(server.base_url.removesuffix("/v1"))
    assert after[("rigllm_model_loaded", (("backend", TEST_BACKEND), ("model", server.model_id)))] == 1
    assert after[("rigllm_slots", ())] == 4 and after[("rigllm_slots_busy", ())] == 0
    assert after[("rigllm_queue_depth", ())] == 0 and after[("rigllm_queue_limit", ())] == 16
    assert after[("rigllm_kv_capacity_tokens", ())] == 4 * 512
    assert 0 <= after[("rigllm_kv_tokens", ())] <= 4 * 512
    assert after[("rigllm_telemetry_up", ())] == 1
    for card in CARDS:
        label = (("card", str(card.index)),)
        info = (("card", str(card.index)), ("name", card.name), ("pci_bus_id", card.pci_bus_id), ("uuid", card.uuid))
        assert after[("rigllm_card_info", info)] == 1
        assert after[("rigllm_card_memory_used_bytes", label)] == card.memory_used
        assert after[("rigllm_card_temperature_celsius", label)] == card.temperature_c
        assert after[("rigllm_card_hbm_temperature_celsius", label)] == card.hbm_temperature_c
        assert after[("rigllm_card_power_watts", label)] == card.power_w
        assert after[("rigllm_card_sm_clock_hertz", label)] == card.sm_clock_mhz * 1e6
        assert after[("rigllm_card_memory_clock_hertz", label)] == card.memory_clock_mhz * 1e6
        assert ("rigllm_card_fan_ratio", label) not in after  # a passive card reports no fan: no sample, not 0


def test_kv_use_per_card_follows_the_memory_plan(loaded):
    """Per-card KV bytes come from the CUDA backends' plan; checked here on a real plan for two cards."""
    context, slots = 512, 2
    two_cards = plan(footprint_of(loaded), [CardProfile("cuda:0", 16 << 30), CardProfile("cuda:1", 16 << 30)],
                     context * slots, kv_format("f16"), n_seqs=slots, split=[2, 2])
    scheduler = SimpleNamespace(backend=SimpleNamespace(plan=two_cards),
                                slots=[SimpleNamespace(tokens=list(range(n))) for n in (100, 28)])
    usage = kv_usage(scheduler, context)
    assert (usage.held_tokens, usage.capacity_tokens) == (128, 1024)
    assert [c.device for c in usage.cards] == ["cuda:0", "cuda:1"]
    for card, card_plan in zip(usage.cards, two_cards.cards):
        assert card.reserved_bytes == card_plan.kv_bytes
        assert card.used_bytes == card_plan.kv_bytes * 128 // 1024
    assert sum(c.reserved_bytes > 0 for c in usage.cards) == 1  # the fixture's one attention layer is on card 1


def test_metrics_need_the_key_unless_published(loaded):
    with live_server(loaded, model_backend(loaded), api_key=KEY) as keyed:
        root = keyed.base_url.removesuffix("/v1")
        assert httpx.get(f"{root}/metrics").status_code == 401
        assert scrape(root, headers={"Authorization": f"Bearer {KEY}"})[("rigllm_slots", ())] == 4
    with live_server(loaded, model_backend(loaded), api_key=KEY, public_metrics=True) as published:
        root = published.base_url.removesuffix("/v1")
        counted = scrape(root)
        assert ("rigllm_slots", ()) in counted and ("rigllm_telemetry_up", ()) not in counted  # no telemetry given
        assert httpx.get(f"{published.base_url}/models").status_code == 401  # only /metrics was opened
        refused = scrape(root)
        assert delta(refused, counted, "rigllm_requests_total", endpoint="/models", status="401") == 1
