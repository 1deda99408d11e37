"""NVIDIA cards as the PCI bus sees them (Linux sysfs): present even when no driver is loaded.

sysfs is read first because it answers the question support needs most ("is the card there at all,
and is a driver bound to it?") without libcuda or NVML, and it also gives the PCIe link the card
trained to, current and maximum, which is how a Gen1 x1 CMP or a half-seated riser shows up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

NVIDIA_VENDOR = "0x10de"
SYSFS_PCI = Path("/sys/bus/pci/devices")
# PCIe transfer rate per lane (GT/s) → generation
_GENERATIONS = {"2.5": 1, "5.0": 2, "5": 2, "8.0": 3, "8": 3, "16.0": 4, "16": 4, "32.0": 5, "32": 5, "64.0": 6, "64": 6}


@dataclass(frozen=True)
class PciCard:
    bus_id: str  # dddd:bb:dd.f, lower case
    device_id: str  # e.g. 0x1dbe
    driver: str | None  # the kernel driver bound to it ("nvidia", "nouveau", "vfio-pci"), None when unbound
    link_gen: int | None
    link_width: int | None
    max_link_gen: int | None
    max_link_width: int | None


def normal_bus_id(bus_id: str) -> str:
    """`00000000:17:00.0` (NVML) and `0000:17:00.0` (sysfs) both become `0000:17:00.0`."""
    domain, rest = bus_id.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def link_generation(speed: str | None) -> int | None:
    """`2.5 GT/s PCIe` → 1, `32.0 GT/s PCIe` → 5; None when unknown."""
    if not speed:
        return None
    return _GENERATIONS.get(speed.split()[0])


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def nvidia_cards(root: Path = SYSFS_PCI) -> list[PciCard]:
    """NVIDIA display/3D controllers on the bus, in bus order (their audio functions are left out)."""
    cards = []
    if not root.is_dir():
        return cards
    for dev in sorted(root.iterdir()):
        if _read(dev / "vendor") != NVIDIA_VENDOR or not (_read(dev / "class") or "").startswith("0x03"):
            continue
        driver_link = dev / "driver"
        driver = os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None
        cards.append(PciCard(
            bus_id=normal_bus_id(dev.name),
            device_id=_read(dev / "device") or "?",
            driver=driver,
            link_gen=link_generation(_read(dev / "current_link_speed")),
            link_width=_int(_read(dev / "current_link_width")),
            max_link_gen=link_generation(_read(dev / "max_link_speed")),
            max_link_width=_int(_read(dev / "max_link_width")),
        ))
    return cards
