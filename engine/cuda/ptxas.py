"""ptxas 12.9 as a subprocess: PTX → SASS cubin for one architecture, with its `-v` resource report.

NVRTC compiles each source once to compute_70 PTX; ptxas then lowers that PTX for every SASS target
(about 10 ms each, toolchain.md §1d) and, for sm_70, reports registers, shared memory and spills per
kernel so Volta's limits are checked without a Volta card (contracts.md "Kernel builds").
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.errors import RigllmError
from engine.cuda.nvrtc import significant_warnings

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM0 = re.compile(r"(\d+) bytes cmem\[0\]")


@dataclass(frozen=True)
class KernelResources:
    """ptxas's per-kernel report for one architecture."""

    registers: int
    shared_bytes: int  # static shared memory; dynamic shared memory is a launch-time value
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    param_bytes: int  # cmem[0]: kernel parameters plus driver constants

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def parse_verbose(output: str) -> dict[str, KernelResources]:
    """Per-entry resources from `ptxas -v` output (stack/spill lines may precede or follow the `Used` line)."""
    frames: dict[str, tuple[int, int, int]] = {}
    used: dict[str, tuple[int, int, int]] = {}
    entry: str | None = None
    props: str | None = None
    for line in output.splitlines():
        if m := _ENTRY.search(line):
            entry = props = m.group(1)
        elif m := _PROPS.search(line):
            props = m.group(1)
        elif (m := _FRAME.search(line)) and props is not None:
            frames[props] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and entry is not None:
            smem = _SMEM.search(line)
            cmem = _CMEM0.search(line)
            used[entry] = (int(m.group(1)), int(smem.group(1)) if smem else 0, int(cmem.group(1)) if cmem else 0)
    report = {}
    for name, (registers, smem, cmem) in used.items():
        stack, spill_st, spill_ld = frames.get(name, (0, 0, 0))
        report[name] = KernelResources(registers, smem, stack, spill_st, spill_ld, cmem)
    return report


@dataclass(frozen=True)
class PtxasResult:
    cubin: bytes
    output: str  # everything ptxas printed (the -v report when verbose)

    @property
    def warnings(self) -> tuple[str, ...]:
        return significant_warnings(self.output)

    def resources(self) -> dict[str, KernelResources]:
        return parse_verbose(self.output)


def assemble(ptxas: Path, ptx: bytes, arch: int, verbose: bool = False, name: str = "kernels") -> PtxasResult:
    """SASS for `sm_<arch>` from PTX (`name` labels files and messages); raise with ptxas's output on failure."""
    with tempfile.TemporaryDirectory(prefix="rigllm-ptxas-") as tmp:
        src = Path(tmp) / f"{name}.ptx"
        out = Path(tmp) / f"{name}.cubin"
        src.write_bytes(ptx)
        cmd = [str(ptxas), f"-arch=sm_{arch}", "-O3", *(["-v"] if verbose else []), str(src), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        output = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise RigllmError(f"ptxas failed on {name} for sm_{arch} (exit {proc.returncode}):\n{output}")
        return PtxasResult(cubin=out.read_bytes(), output=output)
