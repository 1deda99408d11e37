"""What NVML adds to the driver probe: the driver's release number, memory in use and the PCIe link.

pynvml (nvidia-ml-py) is a base dependency, but its library, libnvidia-ml, comes with the driver;
without it the probe reports NVML as absent and the doctor falls back to sysfs for the link.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.diagnostics.pci import normal_bus_id

T = TypeVar("T")


@dataclass(frozen=True)
class NvmlCard:
    bus_id: str  # dddd:bb:dd.f
    name: str
    memory_total: int | None
    memory_used: int | None
    link_gen: int | None
    link_width: int | None
    max_link_gen: int | None
    max_link_width: int | None


@dataclass(frozen=True)
class NvmlProbe:
    driver_version: str | None  # e.g. "580.95.05"
    cards: tuple[NvmlCard, ...]
    error: str | None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_nvml() -> NvmlProbe:
    """NVML's view of the cards; never raises (a missing library or a lost card is reported)."""
    try:
        import pynvml
    except ImportError as err:
        return NvmlProbe(None, (), f"nvidia-ml-py is not installed ({err})")

    def optional(read: Callable[[], T]) -> T | None:
        try:
            return read()
        except pynvml.NVMLError:
            return None

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return NvmlProbe(None, (), f"NVML unavailable: {err}")
    try:
        version = optional(lambda: _text(pynvml.nvmlSystemGetDriverVersion()))
        cards = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = optional(lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
            cards.append(NvmlCard(
                bus_id=normal_bus_id(_text(pynvml.nvmlDeviceGetPciInfo(h).busId)),
                name=_text(pynvml.nvmlDeviceGetName(h)),
                memory_total=None if memory is None else int(memory.total),
                memory_used=None if memory is None else int(memory.used),
                link_gen=optional(lambda: int(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h))),
                link_width=optional(lambda: int(pynvml.nvmlDeviceGetCurrPcieLinkWidth(h))),
                max_link_gen=optional(lambda: int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h))),
                max_link_width=optional(lambda: int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(h))),
            ))
        return NvmlProbe(version, tuple(cards), None)
    except pynvml.NVMLError as err:
        return NvmlProbe(None, (), f"NVML failed: {err}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
