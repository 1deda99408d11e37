"""Per-card GPU telemetry for the desktop app's rig monitor and the headless admin API.

No Qt here: a `TelemetrySource` returns an immutable `RigSnapshot` each time it is read, and the
caller decides the thread and the polling rate. Cards are listed in PCI bus order, the one card
identity shown everywhere (nvidia-smi's order; CUDA's default order differs). A machine without an
NVIDIA driver or GPU gives a snapshot with no cards and `error` set, never an exception.

    from engine.telemetry import open_source
    source = open_source()          # NVML; a snapshot says "no NVIDIA GPU found ..." where there is none
    snap = source.read()
    for card in snap.cards: print(card.index, card.name, card.memory_free)
    source.close()
"""

from engine.telemetry.fake import FakeSource, cmp_100_210
from engine.telemetry.nvml_source import NvmlSource
from engine.telemetry.samples import NO_GPU, CardSample, RigSnapshot, TelemetrySource
from engine.telemetry.serialized import SerializedSource


def open_source() -> TelemetrySource:
    """The real source (NVML), the one production code uses."""
    return NvmlSource()


__all__ = ["NO_GPU", "CardSample", "FakeSource", "NvmlSource", "RigSnapshot", "SerializedSource", "TelemetrySource",
           "cmp_100_210", "open_source"]
