"""`rigllm bench` with the K-quant T = 1 GEMV variants that sweeps of the same call found fastest by width.

Usage (on the GPU machine): python3 tests/gpu/bench_kq_choice.py SWEEP.json [SWEEP.json ...] -- BENCH ARGS...
Each sweep JSON (`rigllm bench --gemv-sweep 1 --weights TYPE`) names its type and `fastest_by_width`; the
bench then runs in this process with kq_weight.DEFAULT_KQ_T1 holding those choices, so one device call can
sweep new variants and measure whole decode steps with the winners before the defaults are edited to match.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gguf import GGMLQuantizationType

from engine import cli
from engine.cuda.kq_weight import DEFAULT_KQ_T1, T1Choice


def main(argv: list[str]) -> int:
    split = argv.index("--")
    for path in argv[:split]:
        sweep = json.loads(Path(path).read_text())
        fastest = sweep["fastest_by_width"]
        choice = T1Choice(fastest["narrow"].removeprefix("t1"), fastest["wide"].removeprefix("t1"))
        DEFAULT_KQ_T1[GGMLQuantizationType[sweep["type"]]] = choice
        print(f"{sweep['type']}: {choice}", file=sys.stderr)
    return cli.main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
