"""A scripted telemetry source for tests, screenshots and demos: no driver, deterministic numbers.

Each read advances a step counter and moves the readings along fixed smooth curves, so graphs and
alert debouncing can be exercised; `set_card` changes one card's base reading (e.g. to overheat it).
It is never chosen by production code (`open_source` returns NVML).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from engine.telemetry.samples import CardSample, RigSnapshot

GIB = 1 << 30


def cmp_100_210(index: int, memory_used: int = 310 << 20) -> CardSample:
    """A CMP 100-210 as NVML reports it: 16 GiB HBM2, PCIe Gen1 x1, 250 W limit, passive cooling."""
    return CardSample(
        index=index, name="NVIDIA CMP 100-210", uuid=f"GPU-00000000-0000-0000-0000-00000000000{index}",
        pci_bus_id=f"00000000:{3 + index:02X}:00.0", memory_total=16 * GIB, memory_used=memory_used,
        temperature_c=52 + 3 * index, hbm_temperature_c=60 + 3 * index, power_w=78.0 + 5 * index,
        power_limit_w=250.0, fan_percent=None, sm_clock_mhz=1380, memory_clock_mhz=877,
        utilization_percent=40, pcie_generation=1, pcie_width=1,
    )


class FakeSource:
    def __init__(self, cards: list[CardSample], error: str | None = None):
        self._cards = list(cards)
        self._error = error
        self.step = 0
        self.closed = False

    def set_card(self, index: int, **changes: object) -> None:
        self._cards[index] = replace(self._cards[index], **changes)

    def read(self) -> RigSnapshot:
        if self.closed:
            raise RuntimeError("FakeSource read after close")
        self.step += 1
        wobble = math.sin(self.step / 5)
        cards = tuple(
            replace(c, utilization_percent=None if c.utilization_percent is None
                    else int(min(100, max(0, c.utilization_percent + 30 * wobble))),
                    power_w=None if c.power_w is None else round(c.power_w + 20 * wobble, 1))
            for c in self._cards
        )
        return RigSnapshot(cards, time.monotonic(), self._error)

    def close(self) -> None:
        self.closed = True
