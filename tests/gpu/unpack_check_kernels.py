"""Kernels for the H200 check call, taken from the carried bundle: `rigllm/_internal/resources/kernels/`.

Usage: python3 tests/gpu/unpack_check_kernels.py WHEEL_DIR DEST. The bundle carries sm_70 SASS with compute_70
PTX (the images a user's double-click app loads); on a newer card the loader builds for it with the machine's
NVRTC where there is one, else has the driver compile the PTX (engine/cuda/kernel_build.py). A separate
packed `.kbuild` no longer fits beside the bundle in one call's 64 MiB.
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

BUNDLE_KERNELS = "rigllm/_internal/resources/kernels/"


def unpack(wheels: Path, dest: Path) -> int:
    """Copy the bundle's kernel folder into `dest`; the number of fatbins copied."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(wheels / "bundle.tar.xz") as tar:
        for member in tar:
            if member.isfile() and member.name.startswith(BUNDLE_KERNELS):
                (dest / member.name[len(BUNDLE_KERNELS):]).write_bytes(tar.extractfile(member).read())
    return len(list(dest.glob("*.fatbin")))


if __name__ == "__main__":
    count = unpack(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"kernels in {sys.argv[2]} from {sys.argv[1]}/bundle.tar.xz: {count} fatbins")
