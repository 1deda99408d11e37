"""`rigllm bench` with the Q8_0 GEMV choices that sweeps of the same call measured (engine.cuda.bench.gemv_choice).

Usage (on the GPU machine): python3 tests/gpu/bench_q8_choice.py SWEEP.json [SWEEP.json ...] -- BENCH ARGS...
Each sweep JSON (`rigllm bench --synthetic 9b --gemv-sweep T`) sets gemv.DEFAULT_GEMV[T] and that width's
gemv.SHAPE_GEMV entries by the rule the unit test holds the committed tables to; the bench then runs in this
process, so one device call can sweep new variants and time whole steps with the winners before the tables
are edited to match.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from engine import cli
from engine.cuda.bench.gemv_choice import choose
from engine.cuda.gemv import DEFAULT_GEMV, SHAPE_GAIN, SHAPE_GEMV


def main(argv: list[str]) -> int:
    split = argv.index("--")
    for path in argv[:split]:
        sweep = json.loads(Path(path).read_text())
        tokens = int(sweep["tokens"])
        default, entries = choose(sweep, SHAPE_GAIN)
        DEFAULT_GEMV[tokens] = default
        for key in [key for key in SHAPE_GEMV if key[0] == tokens]:
            del SHAPE_GEMV[key]
        SHAPE_GEMV.update(entries)
        print(f"T={tokens}: {default}, {entries}", file=sys.stderr)
    return cli.main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
