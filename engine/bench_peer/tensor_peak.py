"""The H200's int8 tensor-core rate, the ceiling llama.cpp's prefill runs against (report.py says why).

llama.cpp's MMQ kernels use int8 `mma` on sm_75 and newer, so on the H200 its prefill is not bound by
DP4A. To express its prefill as a fraction of a measured peak, this measures a large int8 matrix
product through torch (`torch._int_mm`, cuBLASLt) on random data, CUDA events, median of 10 after
warm-up. It runs in its own process (torch's CUDA context stays out of ours) and is a dev-only tool:
torch is imported here only. Prints one JSON object; `int8_tensor_tops` is null without torch+CUDA.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any


def int8_tensor_tops(size: int = 8192, reps: int = 10) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"int8_tensor_tops": None, "why": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"int8_tensor_tops": None, "why": "torch sees no CUDA device"}
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randint(-127, 128, (size, size), dtype=torch.int8, device="cuda", generator=gen)
    b = torch.randint(-127, 128, (size, size), dtype=torch.int8, device="cuda", generator=gen)
    for _ in range(3):
        torch._int_mm(a, b)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch._int_mm(a, b)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    seconds = statistics.median(times)
    return {"int8_tensor_tops": 2 * size**3 / seconds / 1e12, "how": f"torch._int_mm {size}^3 int8, median of {reps}",
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__}


if __name__ == "__main__":
    print(json.dumps(int8_tensor_tops()))
    sys.exit(0)
