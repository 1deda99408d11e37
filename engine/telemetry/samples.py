"""What one telemetry read returns: a sample per card and the rig-wide snapshot, plus the source protocol.

Every metric a card may not report (a passive card has no fan; only HBM boards report memory
temperature; some drivers hide power) is `None`, which the UI shows as "n/a" rather than 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

NO_GPU = "no NVIDIA GPU found"


@dataclass(frozen=True)
class CardSample:
    """One card at one moment; `index` is its position in PCI bus order (the card number users see)."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total: int  # bytes
    memory_used: int  # bytes, all processes
    temperature_c: int | None = None
    hbm_temperature_c: int | None = None  # NVML field NVML_FI_DEV_MEMORY_TEMP
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_percent: int | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    utilization_percent: int | None = None
    pcie_generation: int | None = None  # current link
    pcie_width: int | None = None

    @property
    def memory_free(self) -> int:
        return max(0, self.memory_total - self.memory_used)


@dataclass(frozen=True)
class RigSnapshot:
    """All cards at `time` (seconds, monotonic clock); `error` says why there are none, when there are none."""

    cards: tuple[CardSample, ...]
    time: float
    error: str | None = None
    warnings: tuple[str, ...] = field(default=())


class TelemetrySource(Protocol):
    """Anything that can be polled for a snapshot (NVML, or a scripted fake in tests and screenshots)."""

    def read(self) -> RigSnapshot:
        """A fresh snapshot; never raises for a missing or failing GPU (the snapshot says so)."""

    def close(self) -> None:
        """Release the library handle; reading afterwards is not allowed."""
