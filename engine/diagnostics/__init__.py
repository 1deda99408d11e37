"""`rigllm doctor`: find the setup problems that stop a rig (driver, cards, compiler, RAM, disk) and say how to fix each.

Works on any machine: without a GPU, pycuda or NVML each probe reports what is absent and the
checks that need none of them (NVRTC, RAM, disk, the desktop's system libraries) still run. Every
probe is guarded, so a broken driver or file yields a finding, never a traceback.

    from engine.diagnostics import run_doctor, render_text
    print(render_text(run_doctor(model=Path("model.gguf"))))
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from engine.diagnostics.cuda_driver import DriverProbe, probe_driver
from engine.diagnostics.findings import Check, guarded, render_text, to_json
from engine.diagnostics.gpu_checks import cards_check, driver_check, merge_cards
from engine.diagnostics.host_checks import DEFAULT_READ_BYTES, disk_check, ram_check
from engine.diagnostics.kernel_checks import kernel_check
from engine.diagnostics.nvml import NvmlProbe, probe_nvml
from engine.diagnostics.pci import PciCard, nvidia_cards
from engine.diagnostics.pycuda_check import pycuda_check
from engine.diagnostics.qt_platform import desktop_check


T = TypeVar("T")


def _safe(probe: Callable[[], T], fallback: Callable[[str], T]) -> T:
    try:
        return probe()
    except Exception as err:  # a probe that raises counts as "could not ask"; the checks then say so
        return fallback(f"{type(err).__name__}: {err}")


def run_doctor(model: Path | None = None, read_bytes: int = DEFAULT_READ_BYTES) -> list[Check]:
    """All checks in report order; `model` adds the disk read-speed check for that file."""
    driver = _safe(probe_driver, lambda e: DriverProbe(None, (), f"driver probe failed: {e}"))
    nvml = _safe(probe_nvml, lambda e: NvmlProbe(None, (), f"NVML probe failed: {e}"))
    pci: list[PciCard] = _safe(nvidia_cards, lambda e: [])
    cards = _safe(lambda: merge_cards(driver, nvml, pci), lambda e: [])
    archs = [c.arch for c in cards if c.arch is not None]
    checks = [
        guarded("driver", lambda: driver_check(driver, nvml, pci)),
        guarded("cards", lambda: cards_check(driver, nvml, pci)),
        guarded("NVRTC", lambda: kernel_check(archs)),
        guarded("pycuda", lambda: pycuda_check(bool(cards))),
        guarded("host RAM", ram_check),
        guarded("desktop", desktop_check),
    ]
    if model is not None:
        links = [c.link_mb_per_s for c in cards if c.cuda_index is not None and c.link_mb_per_s]
        checks.append(guarded("disk", lambda: disk_check(model, read_bytes, links)))
    return checks


__all__ = ["Check", "render_text", "run_doctor", "to_json"]
