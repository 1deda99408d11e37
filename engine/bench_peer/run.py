"""`python -m engine.bench_peer.run`: rigllm and llama.cpp on the same GPU and GGUFs, in one call.

Steps (see the package docstring): get a CUDA wheel of llama-cpp-python (`--wheel` file or folder, or
built from `--sdist` into `--out` while the synthetic GGUFs are written), install it into a temporary
folder, then per shape: llama.cpp once per `--llama-variant` (each a
child process with its own environment), rigllm in this process; write `peer-bench.json` and
`peer-bench.md` into `--out` and print the markdown.

A variant is `NAME` or `NAME:VAR=VALUE[,VAR=VALUE]`, e.g. `no-graphs:GGML_CUDA_DISABLE_GRAPHS=1`.
GGML_CUDA_FORCE_MMQ is not a variant: it is a compile-time option of ggml-cuda (CMakeLists
`add_compile_definitions`), and on sm_75 and newer MMQ already runs on int8 tensor cores whatever it
says (report.py), so on the H200 it would measure the same code twice.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from engine.bench_peer import build
from engine.bench_peer.models import ensure_model
from engine.bench_peer.report import compare_shape, markdown_table, with_int_keys
from engine.gguf.shapes import SYNTHETIC_WEIGHTS
from engine.errors import RigllmError

REPO = Path(__file__).resolve().parents[2]
CUDA_LIB = Path("/usr/local/cuda/lib64")
GPU_QUERY = "name,pci.bus_id,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit,temperature.gpu"


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """`NAME[:VAR=VALUE,...]` -> (NAME, {VAR: VALUE})."""
    name, _, rest = text.partition(":")
    env = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise RigllmError(f"bad llama.cpp variant '{text}': write NAME or NAME:VAR=VALUE[,VAR=VALUE]")
        env[key] = value
    if not name:
        raise RigllmError(f"bad llama.cpp variant '{text}': it needs a name")
    return name, env


def positive_ints(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated positive integers (the peer benchmarks' count lists)."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not '{text}'") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, not '{text}'")
    return values


def _weight_types(text: str) -> tuple[str, ...]:
    types = tuple(t for t in text.split(",") if t)
    unknown = [t for t in types if t not in SYNTHETIC_WEIGHTS]
    if unknown or not types:
        raise argparse.ArgumentTypeError(f"expected file types among {', '.join(SYNTHETIC_WEIGHTS)}, not '{text}'")
    return types


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench_peer.run", description=__doc__.splitlines()[0])
    p.add_argument("--sdist", type=Path, help="llama-cpp-python sdist (.tar.gz, stripped or not, or a folder) to build")
    p.add_argument("--wheel", type=Path, help="a built wheel, or a folder holding one (or its .partNN pieces)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "peer-out")),
                   help="results, build log and the built wheel's pieces (default $OUT)")
    p.add_argument("--models", type=Path, default=Path(tempfile.gettempdir()) / "rigllm-peer-models",
                   help="folder of the synthetic GGUFs (written when missing)")
    p.add_argument("--shapes", default="9b,27b", help="comma-separated: 0.8b, 9b, 27b")
    p.add_argument("--weights", type=_weight_types, default=("q8_0",),
                   help=f"comma-separated file types, each shape written in each: {', '.join(SYNTHETIC_WEIGHTS)}")
    p.add_argument("--prompts", type=positive_ints, default=(512, 2048, 8192, 18432))
    p.add_argument("--depths", type=positive_ints, default=(512, 18432))
    p.add_argument("--steps", type=int, default=64, help="decode tokens timed per depth")
    p.add_argument("--reps", type=int, default=3, help="prefill repetitions (median)")
    p.add_argument("--llama-variant", action="append", dest="variants", metavar="NAME[:VAR=VALUE,...]",
                   help="repeatable; default: 'default' (no extra environment)")
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto", help="llama.cpp's (llama-bench default: auto)")
    p.add_argument("--build-timeout", type=float, default=540.0, help="seconds before the wheel build is given up")
    p.add_argument("--build-only", action="store_true",
                   help="build (or find) the wheel, writing the --shapes GGUFs meanwhile, and stop")
    p.add_argument("--skip-ours", action="store_true", help="llama.cpp only")
    p.add_argument("--skip-llama", action="store_true", help="rigllm only (no wheel needed)")
    return p


def gpu_state() -> list[dict[str, str]]:
    """nvidia-smi's view of each GPU (clocks as found: never set here)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [{"error": str(exc)}]
    keys = GPU_QUERY.split(",")
    return [dict(zip(keys, (c.strip() for c in line.split(",")))) for line in out.stdout.splitlines() if line.strip()]


def git_commit() -> str:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return os.environ.get("RIGLLM_COMMIT") or out.stdout.strip() or "unknown"


def obtain_wheel(args: argparse.Namespace, shapes: list[str]) -> Path:
    """The wheel to use, building it (while the GGUFs are written) when none is given or found in --out."""
    given = args.wheel
    if given is not None:
        wheel = given if given.is_file() else build.find_wheel(given)
        if wheel is None:
            raise RigllmError(f"no llama_cpp_python wheel (or .part00 pieces) in {given}")
        return wheel
    found = build.find_wheel(args.out)
    if found is not None:
        return found
    if args.sdist is None:
        raise RigllmError("give --wheel, or --sdist to build one")
    box: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="llama-wheel-"))

    def target() -> None:
        try:
            box["wheel"] = build.build_wheel(args.sdist, work, args.out / "llama-build.log", args.build_timeout)
            build.split_file(box["wheel"], args.out)  # at once: pieces come back through $OUT (16 MiB a file)
        except RigllmError as exc:
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    try:  # the GGUFs are written meanwhile (also with --build-only: a warm machine keeps them for the next call)
        for shape in shapes:
            for weights in args.weights:
                ensure_model(args.models, shape, weights)
    finally:
        thread.join()
    if "error" in box:
        raise box["error"]
    return box["wheel"]


def run_llama(wheel_site: Path, model: Path, name: str, env: dict[str, str], args: argparse.Namespace,
              scratch: Path) -> dict[str, Any]:
    out = scratch / f"llama-{model.stem}-{name}.json"
    cmd = [sys.executable, "-m", "engine.bench_peer.llama_side", str(model), "--json", str(out),
           "--prompts", ",".join(map(str, args.prompts)), "--depths", ",".join(map(str, args.depths)),
           "--steps", str(args.steps), "--reps", str(args.reps), "--flash-attn", args.flash_attn]
    child_env = {**os.environ, **env,
                 "PYTHONPATH": os.pathsep.join([str(wheel_site), str(REPO), os.environ.get("PYTHONPATH", "")])}
    if CUDA_LIB.is_dir():  # libggml-cuda needs the toolkit's cudart/cublas even where ld.so.conf lacks them
        child_env["LD_LIBRARY_PATH"] = os.pathsep.join([str(CUDA_LIB), os.environ.get("LD_LIBRARY_PATH", "")])
    result = subprocess.run(cmd, env=child_env, cwd=REPO, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RigllmError(f"llama.cpp ({name}) on {model.name} failed:\n{result.stderr[-3000:]}")
    return {**json.loads(out.read_text()), "command": " ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(cmd)}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    variants = [parse_variant(v) for v in (args.variants or ["default"])]
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.skip_llama and importlib.util.find_spec("diskcache") is None:
        raise RigllmError("llama_cpp imports diskcache, which is not installed: carry its wheel (see the report)")
    wheel_site = None
    wheel = None
    if not args.skip_llama:
        wheel = obtain_wheel(args, shapes)
        if args.build_only:
            print(f"wheel: {wheel}")
            return 0
        wheel_site = build.install_wheel(wheel, Path(tempfile.mkdtemp(prefix="llama-site-")))
    scratch = Path(tempfile.mkdtemp(prefix="peer-bench-"))
    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "command": " ".join([sys.executable, "-m", "engine.bench_peer.run", *sys.argv[1:]]),
        "gpus_before": gpu_state(), "wheel": wheel.name if wheel else None, "cmake_args": build.CMAKE_ARGS,
        "shapes": {},
    }
    tables = []
    for shape, weights in ((s, w) for s in shapes for w in args.weights):
        model = ensure_model(args.models, shape, weights)
        llama = {}
        if wheel_site is not None:
            for name, env in variants:
                llama[name] = with_int_keys(run_llama(wheel_site, model, name, env, args, scratch))
        if args.skip_ours:
            from engine.gguf.loader import load_model

            cfg, ours = load_model(model).config, None
        else:
            from engine.bench_peer.ours import measure_ours

            cfg, ours = measure_ours(model, shape, args.prompts, args.depths, args.steps, args.reps)
        table = compare_shape(shape, cfg, ours, llama, weights=weights)
        key = shape if weights == "q8_0" else f"{shape}-{weights}"
        result["shapes"][key] = {"shape": shape, "weights": weights, "model": model.name, "rigllm": ours,
                                 "llama": llama, "comparison": table}
        tables.append(markdown_table(table, [n for n, _ in variants] if llama else []))
        (args.out / "peer-bench.json").write_text(json.dumps(result, indent=1, default=str))  # after each shape
    result["gpus_after"] = gpu_state()
    (args.out / "peer-bench.json").write_text(json.dumps(result, indent=1, default=str))
    text = "\n\n".join(tables)
    (args.out / "peer-bench.md").write_text(text + "\n")
    print(text)
    return 0


def run_command(main: Callable[[], int]) -> NoReturn:
    """Exit with a benchmark command's status; a RigllmError ends it with its message and status 1."""
    try:
        sys.exit(main())
    except RigllmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run_command(main)
