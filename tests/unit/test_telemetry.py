"""engine.telemetry: NVML reader (against a patched pynvml), PCI bus ordering, missing metrics, no GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from engine.telemetry import NO_GPU, FakeSource, NvmlSource, cmp_100_210


class _FakeNvml:
    """Two devices enumerated out of PCI order; the second lacks a fan and HBM temperature."""

    def __init__(self):
        self.devices = [
            {"bus": "00000000:05:00.0", "name": "NVIDIA CMP 100-210", "hbm": 0, "fan": None},
            {"bus": "00000000:03:00.0", "name": b"NVIDIA CMP 100-210", "hbm": 71, "fan": 40},
        ]
        self.shutdown = False

    def install(self, monkeypatch):
        def unsupported():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

        def field_values(h, ids):
            assert ids == [pynvml.NVML_FI_DEV_MEMORY_TEMP]
            value = SimpleNamespace(uiVal=h["hbm"])
            return [SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS, valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                                    value=value)]

        def fan(h):
            return unsupported() if h["fan"] is None else h["fan"]

        calls = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: setattr(self, "shutdown", True),
            "nvmlDeviceGetCount": lambda: len(self.devices),
            "nvmlDeviceGetHandleByIndex": lambda i: self.devices[i],
            "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=h["bus"]),
            "nvmlDeviceGetName": lambda h: h["name"],
            "nvmlDeviceGetUUID": lambda h: "GPU-" + h["bus"],
            "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=16 << 30, used=1 << 30),
            "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=55, memory=10),
            "nvmlDeviceGetPowerUsage": lambda h: 81500,
            "nvmlDeviceGetEnforcedPowerLimit": lambda h: 250000,
            "nvmlDeviceGetTemperature": lambda h, kind: 60,
            "nvmlDeviceGetFieldValues": field_values,
            "nvmlDeviceGetFanSpeed": fan,
            "nvmlDeviceGetClockInfo": lambda h, kind: 1380 if kind == pynvml.NVML_CLOCK_SM else 877,
            "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: 1,
            "nvmlDeviceGetCurrPcieLinkWidth": lambda h: 1,
        }
        for name, fn in calls.items():
            monkeypatch.setattr(pynvml, name, fn)


def test_nvml_cards_in_pci_bus_order_with_missing_metrics_as_none(monkeypatch):
    fake = _FakeNvml()
    fake.install(monkeypatch)
    source = NvmlSource()
    snap = source.read()
    assert snap.error is None
    assert [c.pci_bus_id for c in snap.cards] == ["00000000:03:00.0", "00000000:05:00.0"]
    first, second = snap.cards
    assert (first.index, first.hbm_temperature_c, first.fan_percent) == (0, 71, 40)
    assert (second.index, second.hbm_temperature_c, second.fan_percent) == (1, None, None)
    assert first.name == second.name == "NVIDIA CMP 100-210"
    assert first.power_w == pytest.approx(81.5) and first.power_limit_w == pytest.approx(250)
    assert first.memory_free == 15 << 30
    assert (first.sm_clock_mhz, first.memory_clock_mhz, first.pcie_generation, first.pcie_width) == (1380, 877, 1, 1)
    source.close()
    assert fake.shutdown


def test_nvml_zero_devices_is_no_gpu(monkeypatch):
    fake = _FakeNvml()
    fake.devices = []
    fake.install(monkeypatch)
    snap = NvmlSource().read()
    assert snap.cards == () and snap.error == NO_GPU


def test_nvml_library_missing_is_a_clean_no_gpu(monkeypatch):
    def missing():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    source = NvmlSource()
    snap = source.read()
    assert snap.cards == () and snap.error.startswith(NO_GPU)
    source.close()  # nothing initialised: must not call nvmlShutdown (it would raise)


def test_fake_source_moves_and_can_be_changed():
    source = FakeSource([cmp_100_210(0), cmp_100_210(1)])
    first, second = source.read(), source.read()
    assert first.cards[0].power_w != second.cards[0].power_w
    source.set_card(1, temperature_c=95)
    assert source.read().cards[1].temperature_c == 95
