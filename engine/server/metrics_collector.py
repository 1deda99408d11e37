"""The gauges a scrape reads at that moment: the loaded model, its queue, slots and KV cache, and the cards.

A prometheus-client custom collector: `collect` runs on each scrape of `/metrics`, so the numbers are
current and nothing polls between scrapes. Card telemetry comes from the same source as
`/admin/cards` (NVML; cards numbered in PCI bus order). A metric a card does not report (no fan,
no HBM temperature) is left out for that card rather than shown as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.server.kv_usage import kv_usage
from engine.server.metrics import PREFIX
from engine.telemetry import CardSample, TelemetrySource

if TYPE_CHECKING:
    from engine.cuda.step_gaps import StepGaps
    from engine.server.app import ModelSource

MHZ = 1e6

# (name without the prefix, help, the reading in base units or None)
CARD_READINGS: tuple[tuple[str, str, Callable[[CardSample], float | None]], ...] = (
    ("card_memory_used_bytes", "Card memory in use, all processes (NVML)", lambda c: c.memory_used),
    ("card_memory_total_bytes", "Card memory (NVML)", lambda c: c.memory_total),
    ("card_temperature_celsius", "GPU core temperature", lambda c: c.temperature_c),
    ("card_hbm_temperature_celsius", "HBM temperature, where the board reports it", lambda c: c.hbm_temperature_c),
    ("card_power_watts", "Power draw", lambda c: c.power_w),
    ("card_power_limit_watts", "Enforced power limit", lambda c: c.power_limit_w),
    ("card_sm_clock_hertz", "SM clock", lambda c: None if c.sm_clock_mhz is None else c.sm_clock_mhz * MHZ),
    ("card_memory_clock_hertz", "Memory clock",
     lambda c: None if c.memory_clock_mhz is None else c.memory_clock_mhz * MHZ),
    ("card_utilization_ratio", "GPU utilisation (0-1)",
     lambda c: None if c.utilization_percent is None else c.utilization_percent / 100),
    ("card_fan_ratio", "Fan speed (0-1), where the card has a fan",
     lambda c: None if c.fan_percent is None else c.fan_percent / 100),
)


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


class ServingCollector(Collector):
    """Scrape-time gauges over whatever model `models` holds and the cards `telemetry` reads."""

    def __init__(self, models: ModelSource, telemetry: TelemetrySource | None):
        self._models = models
        self._telemetry = telemetry

    def collect(self) -> Iterator[Metric]:
        yield from self._serving()
        if self._telemetry is not None:
            yield from self._cards(self._telemetry)

    def _serving(self) -> Iterator[Metric]:
        now = self._models.current
        loaded = _gauge("model_loaded", "1 while a model is loaded, labelled by model and backend",
                        ("model", "backend"))
        queue = _gauge("queue_depth", "Requests waiting for a slot")
        limit = _gauge("queue_limit", "Requests allowed to wait; more are refused with 503")
        slots = _gauge("slots", "Sequence slots (requests decoded together)")
        busy = _gauge("slots_busy", "Slots running a request (prefilling or decoding)")
        held = _gauge("kv_tokens", "Tokens whose state the slots hold (running requests and turns kept for follow-ups)")
        capacity = _gauge("kv_capacity_tokens", "Tokens the slots can hold (slots x context)")
        reserved = _gauge("kv_cache_bytes", "KV cache reserved on each card by the memory plan", ("device",))
        used = _gauge("kv_cache_used_bytes", "Of the reserved KV cache, the bytes holding tokens", ("device",))
        if now is not None:
            service, worker = now
            loaded.add_metric([service.model_id, worker.backend_name], 1)
            queue.add_metric([], worker.waiting)
            limit.add_metric([], worker.queue_limit)
            slots.add_metric([], worker.slot_count)
            busy.add_metric([], worker.active)
            scheduler = worker.scheduler
            if scheduler is not None:
                kv = kv_usage(scheduler, service.context_length)
                held.add_metric([], kv.held_tokens)
                capacity.add_metric([], kv.capacity_tokens)
                for card in kv.cards:
                    reserved.add_metric([card.device], card.reserved_bytes)
                    used.add_metric([card.device], card.used_bytes)
                gaps = getattr(scheduler.backend, "step_gaps", None)
                if gaps is not None:
                    yield from _idle_between_steps(gaps)
        yield from (loaded, queue, limit, slots, busy, held, capacity, reserved, used)

    def _cards(self, telemetry: TelemetrySource) -> Iterator[Metric]:
        snap = telemetry.read()
        up = _gauge("telemetry_up", "1 when card telemetry could be read (NVML), else 0")
        up.add_metric([], 0 if snap.error else 1)
        info = _gauge("card_info", "Each card's identity; `card` is its number in PCI bus order, as nvidia-smi counts",
                      ("card", "name", "uuid", "pci_bus_id"))
        readings = [(_gauge(name, doc, ("card",)), read) for name, doc, read in CARD_READINGS]
        for card in snap.cards:
            label = str(card.index)
            info.add_metric([label, card.name, card.uuid, card.pci_bus_id], 1)
            for family, read in readings:
                value = read(card)
                if value is not None:
                    family.add_metric([label], value)
        yield up
        yield info
        yield from (family for family, _ in readings)


def _idle_between_steps(gaps: StepGaps) -> Iterator[Metric]:
    """The card's idle time between consecutive decode steps (engine.cuda.step_gaps): how much of the card the
    host's own work leaves unused while requests decode."""
    steps = CounterMetricFamily(f"{PREFIX}_decode_steps_followed", "Decode steps that directly followed another "
                                "(each one's idle gap before it is counted)")
    idle = CounterMetricFamily(f"{PREFIX}_decode_idle_seconds", "Card idle time between consecutive decode steps")
    steps.add_metric([], gaps.steps)
    idle.add_metric([], gaps.idle_ms / 1e3)
    yield from (steps, idle)
