"""Turn the driver, NVML and PCI probes into the doctor's "driver" and "cards" checks.

These are pure functions of the probe results, so every diagnosis (no driver, a card the driver
does not list, a narrow link, CUDA order differing from bus order) is tested with made-up probes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine.diagnostics.cuda_driver import DriverProbe
from engine.diagnostics.findings import ERROR, WARNING, Check
from engine.diagnostics.nvml import NvmlProbe
from engine.diagnostics.pci import PciCard
from engine.model.memory_plan import format_bytes

MIN_ARCH = 70  # kernels are built for compute_70 (Volta) and up
MIN_DRIVER = (12, 0)  # the kernels' toolchain is CUDA 12
PTX_JIT_DRIVER = (12, 9)  # prebuilt compute_70 PTX is ISA 8.8 (toolchain.md §1d)
LANE_MB_PER_S = {1: 250, 2: 500, 3: 985, 4: 1969, 5: 3938, 6: 7877}  # PCIe payload per lane, theoretical
DRIVER_FIX = ("install the NVIDIA driver (a branch that still supports your cards; R580 is the last one "
              "announced for Volta/CMP 100-210) and reboot")


@dataclass(frozen=True)
class Card:
    """One card, merged from the probes by PCI bus id."""

    bus_id: str
    cuda_index: int | None
    name: str
    arch: int | None
    total_bytes: int | None
    used_bytes: int | None
    link_gen: int | None
    link_width: int | None
    max_link_gen: int | None
    max_link_width: int | None
    seen_by_driver: bool  # CUDA or NVML lists it (False: only on the PCI bus)
    driver: str | None  # kernel driver bound to it per sysfs (None: unbound or unknown)

    @property
    def link_mb_per_s(self) -> int | None:
        """Theoretical host link rate now (current generation × width)."""
        if self.link_gen is None or self.link_width is None:
            return None
        return LANE_MB_PER_S.get(self.link_gen, 0) * self.link_width


def merge_cards(driver: DriverProbe, nvml: NvmlProbe, pci: list[PciCard]) -> list[Card]:
    """Every card any probe saw, in PCI bus order; NVML's link readings win over sysfs's."""
    by_cuda = {d.bus_id: d for d in driver.devices}
    by_nvml = {c.bus_id: c for c in nvml.cards}
    by_pci = {c.bus_id: c for c in pci}
    cards = []
    for bus in sorted({*by_cuda, *by_nvml, *by_pci}):
        d, n, p = by_cuda.get(bus), by_nvml.get(bus), by_pci.get(bus)

        def link(attr: str) -> int | None:
            value = getattr(n, attr) if n is not None else None
            return value if value is not None else (getattr(p, attr) if p is not None else None)

        name = d.name if d else n.name if n else f"NVIDIA device {p.device_id if p else '?'}"
        cards.append(Card(
            bus_id=bus,
            cuda_index=d.index if d else None,
            name=name,
            arch=d.arch if d else None,
            total_bytes=d.total_bytes if d else (n.memory_total if n else None),
            used_bytes=n.memory_used if n else None,
            link_gen=link("link_gen"), link_width=link("link_width"),
            max_link_gen=link("max_link_gen"), max_link_width=link("max_link_width"),
            seen_by_driver=d is not None or n is not None,
            driver=p.driver if p is not None else None,
        ))
    return cards


def driver_check(driver: DriverProbe, nvml: NvmlProbe, pci: list[PciCard]) -> Check:
    level = f"CUDA {driver.version[0]}.{driver.version[1]}" if driver.version else "CUDA level unknown"
    release = f"NVIDIA {nvml.driver_version}, " if nvml.driver_version else ""
    if driver.version is None:
        check = Check("driver", f"not usable: {driver.error}")
    else:
        check = Check("driver", f"{release}{level}" + (f" (but {driver.error})" if driver.error else ""))
    check.data = {"cuda_version": list(driver.version) if driver.version else None,
                  "release": nvml.driver_version, "error": driver.error, "nvml_error": nvml.error}
    if nvml.error:
        check.details.append(f"NVML: {nvml.error}")
    if driver.version is None or driver.error:
        if pci:
            unbound = [c.bus_id for c in pci if c.driver != "nvidia"]
            bound = f" (bound to: {', '.join(sorted({c.driver or 'none' for c in pci}))})" if unbound else ""
            check.problem(ERROR, f"{len(pci)} NVIDIA card(s) on the PCI bus but the CUDA driver is not usable{bound}",
                          DRIVER_FIX)
        return check
    if driver.version < MIN_DRIVER:
        check.problem(ERROR, f"the driver supports only {level}; rigllm's kernels need CUDA 12",
                      "update the NVIDIA driver to R525 or newer (R580 is the last branch for Volta)")
    elif driver.version < PTX_JIT_DRIVER:
        check.details.append(f"{level} < 12.9: the driver cannot JIT the prebuilt compute_70 PTX, "
                             "so kernels must come as SASS (prebuilt fatbin or NVRTC on this machine)")
    return check


def cards_check(driver: DriverProbe, nvml: NvmlProbe, pci: list[PciCard]) -> Check:
    cards = merge_cards(driver, nvml, pci)
    if not cards:
        check = Check("cards", "no NVIDIA GPU found (PCI bus, CUDA driver and NVML all report none)")
        check.problem(ERROR, "no NVIDIA GPU: only the CPU reference backend can run (slow, for tests)",
                      "check that the card is seated and powered (lspci | grep -i nvidia), then install the driver")
        return check
    seen = [c for c in cards if c.seen_by_driver]
    hidden = [c for c in cards if not c.seen_by_driver]
    shown = seen or hidden  # with no driver, list what the bus has
    check = Check("cards", f"{len(shown)} card(s), in PCI bus order (the numbering of nvidia-smi and the rig monitor)")
    for i, c in enumerate(shown):
        check.details.append(_card_line(i, c))
        _card_problems(check, i, c)
    cuda_order = [c.bus_id for c in sorted((c for c in cards if c.cuda_index is not None), key=lambda c: c.cuda_index)]
    if cuda_order != sorted(cuda_order) and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        check.problem(WARNING, "CUDA numbers the cards in a different order than the PCI bus (nvidia-smi, rig monitor)",
                      "export CUDA_DEVICE_ORDER=PCI_BUS_ID (the rigllm systemd unit sets it)")
    if seen and hidden:
        # A card the nvidia module drives but we cannot see is hidden on purpose (a container given some
        # of the host's GPUs, CUDA_VISIBLE_DEVICES); one it did not take is unsupported or broken.
        buses = ", ".join(c.bus_id for c in hidden)
        check.details.append(f"also on the PCI bus but not visible to CUDA/NVML here: {buses}")
        refused = [c.bus_id for c in hidden if c.driver != "nvidia"]
        if refused:
            check.problem(WARNING, f"the NVIDIA driver did not take the card(s) at {', '.join(refused)}",
                          "check `dmesg | grep NVRM`; newer driver branches drop Volta (use R580 or older)")
    check.data = {"cards": [c.__dict__ | {"link_mb_per_s": c.link_mb_per_s} for c in cards]}
    return check


def _link_text(gen: int | None, width: int | None) -> str:
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def _card_line(i: int, c: Card) -> str:
    cuda = f"cuda:{c.cuda_index}" if c.cuda_index is not None else "not in CUDA"
    arch = f"sm_{c.arch}" if c.arch is not None else "sm_?"
    memory = format_bytes(c.total_bytes) if c.total_bytes is not None else "memory ?"
    used = f" ({format_bytes(c.used_bytes)} in use)" if c.used_bytes is not None else ""
    link = f"PCIe {_link_text(c.link_gen, c.link_width)} (max {_link_text(c.max_link_gen, c.max_link_width)})"
    rate = f", ~{c.link_mb_per_s} MB/s" if c.link_mb_per_s else ""
    return f"card {i}  {c.bus_id}  {cuda}  {c.name}  {arch}  {memory}{used}  {link}{rate}"


def _card_problems(check: Check, i: int, c: Card) -> None:
    if c.arch is not None and c.arch < MIN_ARCH:
        check.problem(ERROR, f"card {i} ({c.name}) is sm_{c.arch}; rigllm's kernels need sm_70 (Volta) or newer",
                      "use a Volta or newer card (CMP 100-210, V100, T4, ...)")
    if c.link_width is not None and c.max_link_width is not None and c.link_width < c.max_link_width:
        check.problem(WARNING, f"card {i} link runs x{c.link_width} of its x{c.max_link_width}",
                      "reseat the card or its riser, or move it to a slot wired for more lanes")
    if c.link_gen is not None and c.max_link_gen is not None and c.link_gen < c.max_link_gen:
        check.details.append(f"  card {i}: link at Gen{c.link_gen} of Gen{c.max_link_gen} now; idle cards "
                             "train down to save power, so check again under load")
