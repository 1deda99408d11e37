"""The CUDA driver as the engine will meet it, through ctypes on libcuda (no pycuda needed).

Only queries that need no context are made (cuInit, versions, device attributes), so the probe
cannot leave memory allocated on a card or disturb a server already running on it. Devices are
listed in CUDA's enumeration order, which is what a CUDA device index means; the doctor compares it
with the PCI bus order that nvidia-smi and rigllm's telemetry use.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

LIBCUDA = "libcuda.so.1"
_CC_MAJOR, _CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}
_PCI_BUS, _PCI_DEVICE, _PCI_DOMAIN = 33, 34, 50  # CU_DEVICE_ATTRIBUTE_PCI_{BUS,DEVICE,DOMAIN}_ID


@dataclass(frozen=True)
class CudaDevice:
    index: int  # CUDA ordinal (honours CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER)
    name: str
    compute_capability: tuple[int, int]
    total_bytes: int
    bus_id: str  # dddd:bb:dd.0

    @property
    def arch(self) -> int:
        return self.compute_capability[0] * 10 + self.compute_capability[1]


@dataclass(frozen=True)
class DriverProbe:
    """`error` is set when the driver could not be asked (missing library, cuInit failure)."""

    version: tuple[int, int] | None  # CUDA level the driver supports, e.g. (12, 9)
    devices: tuple[CudaDevice, ...]
    error: str | None


class _Lib:
    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib

    def error_name(self, code: int) -> str:
        name = ctypes.c_char_p()
        try:
            if self.lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
                return f"{name.value.decode()} ({code})"
        except AttributeError:
            pass
        return f"CUresult {code}"

    def call(self, fn: str, *args: object) -> None:
        code = getattr(self.lib, fn)(*args)
        if code != 0:
            raise _DriverError(f"{fn}: {self.error_name(code)}")


class _DriverError(Exception):
    pass


def probe_driver(library: str = LIBCUDA) -> DriverProbe:
    """Driver version and devices; never raises for a missing or broken driver (the probe says so)."""
    try:
        lib = _Lib(ctypes.CDLL(library))
    except OSError as err:
        # A PyInstaller bundle's ctypes says "Failed to load dynlib/dll ..."; the loader's own error is its cause.
        missing = "cannot open shared object file" in str(err.__cause__ or err)
        return DriverProbe(None, (), f"{library} not found (no NVIDIA driver installed)" if missing
                           else f"{library} cannot be loaded ({err})")
    version = None
    try:
        raw = ctypes.c_int()
        lib.call("cuDriverGetVersion", ctypes.byref(raw))
        version = (raw.value // 1000, raw.value % 1000 // 10)
        lib.call("cuInit", 0)
        count = ctypes.c_int()
        lib.call("cuDeviceGetCount", ctypes.byref(count))
        devices = tuple(_device(lib, i) for i in range(count.value))
    except _DriverError as err:
        return DriverProbe(version, (), str(err))
    return DriverProbe(version, devices, None)


def _device(lib: _Lib, index: int) -> CudaDevice:
    dev = ctypes.c_int()
    lib.call("cuDeviceGet", ctypes.byref(dev), index)
    name = ctypes.create_string_buffer(256)
    lib.call("cuDeviceGetName", name, 256, dev)
    total = ctypes.c_size_t()
    lib.call("cuDeviceTotalMem_v2", ctypes.byref(total), dev)

    def attr(which: int) -> int:
        value = ctypes.c_int()
        lib.call("cuDeviceGetAttribute", ctypes.byref(value), which, dev)
        return value.value

    bus_id = f"{attr(_PCI_DOMAIN):04x}:{attr(_PCI_BUS):02x}:{attr(_PCI_DEVICE):02x}.0"
    return CudaDevice(index, name.value.decode(errors="replace"), (attr(_CC_MAJOR), attr(_CC_MINOR)),
                      total.value, bus_id)
