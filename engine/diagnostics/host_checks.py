"""The doctor's host checks: RAM, the pinned-memory limit, and how fast the model file reads from disk.

Mining rigs often have 4-8 GB of RAM, a SATA SSD or a USB stick, and cards on Gen1 x1 risers; those
three numbers decide how long a load takes and whether it fits beside the OS, so they are measured
rather than assumed. The disk read drops the file's cached pages first (they are clean, nothing is
lost) so the number is the disk's, not the page cache's, and reads through the same bounded reader
the loader uses.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

from engine.diagnostics.findings import ERROR, WARNING, Check
from engine.errors import RigllmError
from engine.model.memory_plan import GIB, MIB, format_bytes
from engine.gguf.streaming_read import StreamingReader, cached_fraction, drop_cached, load_eta

LOW_RAM = 4 * GIB  # below this beside a loaded server the OS starts swapping or OOM-killing
SLOW_DISK_MB_PER_S = 100
DEFAULT_READ_BYTES = 1 * GIB
READ_SECONDS = 10.0


def meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    """/proc/meminfo in bytes (Linux); empty elsewhere."""
    values: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    except OSError:
        pass
    return values


def _limit_text(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else format_bytes(value)


def ram_check() -> Check:
    info = meminfo()
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    data = {"total": info.get("MemTotal"), "available": info.get("MemAvailable"), "swap": info.get("SwapTotal"),
            "memlock_soft": None if soft == resource.RLIM_INFINITY else soft,
            "memlock_hard": None if hard == resource.RLIM_INFINITY else hard}
    if "MemTotal" not in info:
        check = Check("host RAM", "unknown (no /proc/meminfo)", data=data)
    else:
        check = Check("host RAM", f"{format_bytes(info['MemTotal'])} total, {format_bytes(info.get('MemAvailable', 0))} "
                      f"available, swap {format_bytes(info.get('SwapTotal', 0))}", data=data)
        if info["MemTotal"] < LOW_RAM:
            check.problem(WARNING, f"only {format_bytes(info['MemTotal'])} of RAM",
                          "keep the rig headless (rigllm serve, no desktop) and close other programs while loading")
    check.details.append(f"locked-memory limit (ulimit -l): {_limit_text(soft)} (hard {_limit_text(hard)}); "
                         "pinned transfer buffers come out of host RAM")
    return check


def disk_check(model: Path, read_bytes: int = DEFAULT_READ_BYTES, card_link_mb_per_s: list[int] | None = None) -> Check:
    """Read up to `read_bytes` of the model's tensors from disk (cache dropped first) and time it."""
    try:
        reader = StreamingReader(model)
    except RigllmError as err:
        check = Check("disk", f"{model}: cannot be read as a GGUF")
        check.problem(ERROR, str(err), "check the path; if it is right, re-download the file")
        return check
    size = model.stat().st_size
    before = cached_fraction(model)
    drop_cached(model)
    after_drop = cached_fraction(model)
    done, start = 0, time.perf_counter()
    for chunk in reader.chunks():
        done = chunk.progress.done_bytes
        if done >= read_bytes or time.perf_counter() - start > READ_SECONDS:
            break
    seconds = time.perf_counter() - start
    rate = done / seconds if seconds > 0 else 0.0
    cache_note = ""
    if after_drop is not None and after_drop > 0.5:
        cache_note = " (the page cache could not be dropped: this may be the cache's speed)"
    check = Check("disk", f"{model.name}: {rate / 1e6:.0f} MB/s over {format_bytes(done)} of {format_bytes(size)}"
                  f"{cache_note}")
    check.data = {"file": str(model), "file_bytes": size, "read_bytes": done, "seconds": round(seconds, 3),
                  "mb_per_s": round(rate / 1e6, 1), "cached_before": before, "cached_after_drop": after_drop}
    if rate > 0:
        check.details.append(f"reading the whole file takes ~{size / rate:.1f} s at this speed")
        links = [r for r in (card_link_mb_per_s or []) if r]
        if links:
            share = size / len(links)
            eta = load_eta(size, [int(share)] * len(links), rate, min(links) * 1e6)
            check.details.append(f"load onto {len(links)} card(s): ~{eta:.0f} s (disk and the slowest link, "
                                 f"~{min(links)} MB/s theoretical, work in parallel)")
            check.data["load_eta_s"] = round(eta, 1)
    if 0 < rate / 1e6 < SLOW_DISK_MB_PER_S and done >= 64 * MIB:
        check.problem(WARNING, f"the model reads at {rate / 1e6:.0f} MB/s: a load takes {size / rate / 60:.0f} min",
                      "keep models on an SSD (not a USB stick or network share)")
    return check
