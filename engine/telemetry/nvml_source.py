"""Telemetry from NVML (nvidia-ml-py): the numbers nvidia-smi shows, read directly and without a subprocess.

NVML is initialised on the first read, so constructing a source is free and a machine without a
driver only learns it when it asks. Each metric is read on its own: a card that does not support
one (HBM temperature, fan) gives `None` for it instead of losing the whole sample.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from engine.telemetry.samples import NO_GPU, CardSample, RigSnapshot

T = TypeVar("T")


def _optional(read: Callable[[], T]) -> T | None:
    try:
        return read()
    except pynvml.NVMLError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _hbm_temperature(handle: Any) -> int | None:
    """Memory temperature from NVML's field API; None where the board does not report it."""
    value = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])[0]
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    member = {pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
              pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
              pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal"}.get(value.valueType)
    reading = getattr(value.value, member) if member else None
    return int(reading) if reading else None  # 0 is what unsupported boards report


def read_card(index: int, handle: Any) -> CardSample:
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    util = _optional(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle))
    power_mw = _optional(lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
    limit_mw = _optional(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    return CardSample(
        index=index,
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
        memory_total=int(memory.total),
        memory_used=int(memory.used),
        temperature_c=_optional(lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
        hbm_temperature_c=_optional(lambda: _hbm_temperature(handle)),
        power_w=None if power_mw is None else power_mw / 1000,
        power_limit_w=None if limit_mw is None else limit_mw / 1000,
        fan_percent=_optional(lambda: pynvml.nvmlDeviceGetFanSpeed(handle)),
        sm_clock_mhz=_optional(lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
        memory_clock_mhz=_optional(lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
        utilization_percent=None if util is None else int(util.gpu),
        pcie_generation=_optional(lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
        pcie_width=_optional(lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
    )


class NvmlSource:
    """The real rig. Not thread-safe: poll it from one thread (the app's monitor thread)."""

    def __init__(self) -> None:
        self._initialised = False
        self._init_error: str | None = None

    def _init(self) -> str | None:
        if not self._initialised and self._init_error is None:
            try:
                pynvml.nvmlInit()
                self._initialised = True
            except pynvml.NVMLError as err:
                self._init_error = f"{NO_GPU} (NVML: {err})"
        return self._init_error

    def read(self) -> RigSnapshot:
        now = time.monotonic()
        error = self._init()
        if error:
            return RigSnapshot((), now, error)
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            if not handles:
                return RigSnapshot((), now, NO_GPU)
            by_bus = sorted(handles, key=lambda h: _text(pynvml.nvmlDeviceGetPciInfo(h).busId))
            cards, warnings = [], []
            for index, handle in enumerate(by_bus):
                try:
                    cards.append(read_card(index, handle))
                except pynvml.NVMLError as err:  # e.g. "GPU is lost": report it, keep the other cards
                    warnings.append(f"card {index}: {err}")
            return RigSnapshot(tuple(cards), now, None if cards else f"{NO_GPU} (NVML: {'; '.join(warnings)})",
                               tuple(warnings))
        except pynvml.NVMLError as err:
            return RigSnapshot((), now, f"NVML failed: {err}")

    def close(self) -> None:
        if self._initialised:
            pynvml.nvmlShutdown()
            self._initialised = False
