"""`rigllm bench [MODEL] --synthetic 9b|27b`: speed of one card as JSON (+ a short table), see engine.cuda.bench.speed
(`--mtp`: engine.cuda.bench.mtp_bench)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

from engine.gguf.shapes import SYNTHETIC_WEIGHTS

TRAINED_FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "trained" / "fixture-q8_0.gguf"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="measure prefill and decode speed on a GPU (JSON output)")
    p.add_argument("model", nargs="?", help="a qwen35 GGUF (omit with --synthetic)")
    p.add_argument("--synthetic", choices=("0.8b", "9b", "27b"), help="random weights of this shape, made on the GPU")
    p.add_argument("--weights", choices=SYNTHETIC_WEIGHTS, default="q8_0",
                   help="--synthetic weight type: q8_0 (default), or a K-quant file type with llama.cpp's per-tensor "
                        "types (q4_k_m, q5_k_m, q6_k); with --gemv-sweep 1, sweeps that type's K-quant GEMVs")
    p.add_argument("--prompts", default="512,2048,4096,8192,18432", help="prefill lengths, comma-separated")
    p.add_argument("--depths", default="512,4096,18432", help="decode context depths, comma-separated")
    p.add_argument("--chunk", type=int, default=256, help="prefill chunk (tokens per GEMM)")
    p.add_argument("--kv-sweep", metavar="FORMATS",
                   help="instead: prefill (--prompts) and decode (--depths) tokens/s per KV format, e.g. f16,k8v3,k3v3")
    p.add_argument("--sparse-sweep", metavar="LENGTHS",
                   help="instead: prefill tokens/s dense vs sparse (fixed A-shape profile) at these prompt lengths, "
                        "e.g. 16384,65536,131072,262144, estimated from chunks timed at sampled depths; dense also "
                        "in the --kv-sweep formats (default f16,k3v3); see engine/cuda/bench/sparse_bench.py")
    p.add_argument("--pipeline", help="instead: multi-card runs with these card counts, e.g. 1,2,3,4 (with --synthetic)")
    p.add_argument("--devices", default="0", help="GPUs the pipeline's cards sit on, cycled (e.g. 0,1; default 0: "
                                                   "logical cards sharing GPU 0)")
    p.add_argument("--mtp", action="store_true",
                   help="instead: MTP speculative decoding at the first --depths value: verify and draft cost against a "
                        "decode step, speculative tokens/s, and a projection at the acceptance of --mtp-acceptance or "
                        "of --mtp-fixture (a random head for --synthetic); with --pipeline N, speculative rounds over "
                        "N cards against plain steps")
    p.add_argument("--mtp-acceptance", type=float, help="per-draft acceptance for the projection (default: measured "
                                                        "on --mtp-fixture)")
    p.add_argument("--mtp-fixture", default=str(TRAINED_FIXTURE),
                   help="a trained fixture with an MTP head whose greedy acceptance (arith answers) the projection uses")
    p.add_argument("--gemv-sweep", type=int, choices=tuple(range(1, 9)), metavar="TOKENS",
                   help="instead: every GEMV kernel variant for 1 to 8 tokens on the --synthetic shape's decode matrices "
                        "(GB/s per matrix, GEMV time per step), to choose engine.cuda.gemv.DEFAULT_GEMV")
    p.add_argument("--json", dest="json_out", help="write the results here (default: stdout only)")
    p.set_defaults(func=run)


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _pipeline(args: argparse.Namespace, prompts: tuple[int, ...]) -> int:
    from engine.cuda.bench.pipeline_bench import render_pipeline_table, run_pipeline_bench
    from engine.errors import RigllmError
    from engine.gguf.shapes import shape_config

    if not args.synthetic:
        raise RigllmError("--pipeline needs --synthetic SHAPE")
    counts = tuple(int(x) for x in args.pipeline.split(","))
    devices = tuple(int(x) for x in args.devices.split(","))
    result = run_pipeline_bench(shape_config(args.synthetic), args.synthetic, counts, devices, prompt=max(prompts),
                                chunk=args.chunk)
    _emit(args, {"gpus": _gpu_names(devices), **result})
    print(render_pipeline_table(result), file=sys.stderr)
    return 0


def _pipeline_mtp(args: argparse.Namespace, depth: int) -> int:
    """`--pipeline N --mtp`: the fixture's acceptance (its own card, closed again), then rounds over N cards."""
    from engine.cuda.bench.pipeline_mtp import render_pipeline_mtp, run_pipeline_mtp_bench
    from engine.errors import RigllmError
    from engine.gguf.shapes import shape_config

    counts = [int(x) for x in args.pipeline.split(",")]
    if not args.synthetic or len(counts) != 1:
        raise RigllmError("--pipeline N --mtp needs --synthetic SHAPE and one card count")
    cfg = shape_config(args.synthetic)
    if not cfg.n_mtp:
        raise RigllmError(f"the {args.synthetic} shape has no MTP block")
    fixture = _fixture_acceptance(args)
    acceptance = args.mtp_acceptance if fixture is None else fixture["acceptance"]
    devices = tuple(int(x) for x in args.devices.split(","))
    result = run_pipeline_mtp_bench(cfg, args.synthetic, counts[0], devices, depth, acceptance,
                                    weight_type=args.weights)
    _emit(args, {"gpus": _gpu_names(devices), **result, "fixture_acceptance": fixture})
    print(render_pipeline_mtp(result), file=sys.stderr)
    return 0


def _gpu_names(devices: tuple[int, ...]) -> list[str]:
    """The names of the GPUs a multi-card run's cards sat on, each once."""
    from engine.cuda.driver import CudaCard

    names = []
    for d in sorted(set(devices)):
        with CudaCard(d) as card:
            names.append(card.device_name)
    return names


def _fixture_acceptance(args: argparse.Namespace) -> dict | None:
    """The trained fixture's measured acceptance (its own card, closed again), unless --mtp-acceptance is given."""
    from engine.cuda.bench.mtp_bench import fixture_acceptance
    from engine.errors import RigllmError

    if args.mtp_acceptance is not None:
        return None
    if not Path(args.mtp_fixture).is_file():
        raise RigllmError(f"no fixture at {args.mtp_fixture}: give --mtp-acceptance or --mtp-fixture")
    return fixture_acceptance(args.mtp_fixture)


def _mtp(args: argparse.Namespace, depth: int) -> int:
    """`--mtp`: the fixture's acceptance first (its own card, closed again), then the costs on the model."""
    from engine.cuda.driver import CudaCard
    from engine.cuda.bench.mtp_bench import render_mtp, run_mtp_bench
    from engine.errors import RigllmError

    fixture = _fixture_acceptance(args)
    acceptance = args.mtp_acceptance if fixture is None else fixture["acceptance"]
    card = CudaCard(0)
    try:
        if args.synthetic:
            from engine.cuda.bench.synthetic_weights import random_model_weights, random_mtp_weights
            from engine.gguf.shapes import shape_config

            cfg, shape = shape_config(args.synthetic), args.synthetic
            if not cfg.n_mtp:
                raise RigllmError(f"the {shape} shape has no MTP block")
            weights = random_model_weights(card, cfg, weight_type=args.weights)
            mtp = random_mtp_weights(card, cfg, weights, weight_type=args.weights)
        else:
            from engine.cuda.weights import has_mtp, upload_mtp_weights, upload_weights
            from engine.gguf.loader import load_model

            loaded = load_model(args.model)
            cfg, shape = loaded.config, Path(args.model).name
            if not has_mtp(loaded.file, cfg):
                raise RigllmError(f"{shape} has no MTP head")
            weights = upload_weights(card, loaded.file, cfg)
            mtp = upload_mtp_weights(card, loaded.file, cfg, weights)
        result = run_mtp_bench(card, cfg, weights, mtp, shape, depth, acceptance, chunk=args.chunk)
        gpu = card.device_name
    finally:
        card.close()
    _emit(args, {"gpu": gpu, **result, "fixture_acceptance": fixture})
    print(render_mtp(result, fixture), file=sys.stderr)
    return 0


def _gemv_sweep(args: argparse.Namespace) -> int:
    """`--gemv-sweep T`: every T-token GEMV variant on the shape's matrices (random weights, no model needed)."""
    from engine.cuda.driver import CudaCard
    from engine.cuda.bench.microbench import gemv_sweep
    from engine.errors import RigllmError

    if not args.synthetic:
        raise RigllmError("--gemv-sweep needs --synthetic SHAPE")
    if args.weights != "q8_0":
        return _kq_gemv_sweep(args)
    with CudaCard(0) as card:
        result = gemv_sweep(card, args.synthetic, n_tokens=args.gemv_sweep)
    _emit(args, result)
    print(f"{args.gemv_sweep}-token GEMV per step on {args.synthetic} (default {result['default']}):", file=sys.stderr)
    for name, us in result["per_token_us"].items():
        print(f"  {name:<24} {us:8.1f} us", file=sys.stderr)
    return 0


def _kq_gemv_sweep(args: argparse.Namespace) -> int:
    """`--gemv-sweep 1 --weights TYPE`: the T = 1 K-quant GEMV variants in the file type's base type."""
    from engine.cuda.driver import CudaCard
    from engine.cuda.bench.kq_bench import kq_gemv_sweep
    from engine.errors import RigllmError
    from engine.gguf.tensor_plan import KQUANT_FILE_TYPES

    if args.gemv_sweep != 1:
        raise RigllmError("K-quant GEMV variants exist for one token only (--gemv-sweep 1)")
    qtype = KQUANT_FILE_TYPES[args.weights][1]
    with CudaCard(0) as card:
        result = kq_gemv_sweep(card, args.synthetic, qtype)
    _emit(args, result)
    print(f"{qtype.name} 1-token GEMV per step on {args.synthetic}, one variant for every matrix:", file=sys.stderr)
    for name, us in result["per_token_us"].items():
        print(f"  {name:<24} {us:8.1f} us", file=sys.stderr)
    for label, key in (("default", "default"), ("fastest", "fastest_by_width")):
        c = result[key]
        print(f"  {label} by width: narrow {c['narrow']}, wide {c['wide']}: {c['per_token_us']:.1f} us", file=sys.stderr)
    return 0


def _emit(args: argparse.Namespace, result: dict) -> None:
    """Write the JSON (with date, commit and command) to --json or stdout."""
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("RIGLLM_COMMIT") or _commit(),
        "command": "rigllm " + " ".join(sys.argv[1:]),
        **result,
    }
    text = json.dumps(result, indent=1, default=str)
    if args.json_out:
        Path(args.json_out).write_text(text)
    else:
        print(text)


def run(args: argparse.Namespace) -> int:
    from engine.cuda.bench.speed import render_table, run_bench
    from engine.cuda.driver import CudaCard, gpu_unavailable_reason
    from engine.errors import RigllmError

    reason = gpu_unavailable_reason()
    if reason:
        raise RigllmError(f"rigllm bench needs a GPU: {reason}")
    if (args.model is None) == (args.synthetic is None):
        raise RigllmError("give either a MODEL file or --synthetic SHAPE")
    prompts = tuple(int(x) for x in args.prompts.split(","))
    depths = tuple(int(x) for x in args.depths.split(","))
    if args.pipeline and args.mtp:
        return _pipeline_mtp(args, depths[0])
    if args.pipeline:
        return _pipeline(args, prompts)
    if args.mtp:
        return _mtp(args, depths[0])
    if args.gemv_sweep:
        return _gemv_sweep(args)
    card = CudaCard(0)
    try:
        if args.synthetic:
            from engine.cuda.bench.synthetic_weights import random_model_weights
            from engine.gguf.shapes import shape_config

            cfg, shape = shape_config(args.synthetic), args.synthetic
            weights = random_model_weights(card, cfg, weight_type=args.weights)
        else:
            from engine.cuda.weights import upload_weights
            from engine.gguf.loader import load_model

            loaded = load_model(args.model)
            cfg, shape = loaded.config, Path(args.model).name
            weights = upload_weights(card, loaded.file, cfg)
        if args.sparse_sweep:
            from engine.cuda.bench.sparse_bench import render_sparse_sweep, sparse_sweep

            formats = tuple(args.kv_sweep.split(",")) if args.kv_sweep else ("f16", "k3v3")
            lengths = tuple(int(x) for x in args.sparse_sweep.split(","))
            sweep = sparse_sweep(card, cfg, weights, shape, lengths, formats, chunk=args.chunk)
            _emit(args, {"gpu": card.device_name, "shape": shape, **sweep})
            print(render_sparse_sweep(sweep), file=sys.stderr)
            return 0
        if args.kv_sweep:
            from engine.cuda.bench.speed import kv_sweep, render_kv_sweep

            formats = tuple(args.kv_sweep.split(","))
            sweep = kv_sweep(card, cfg, weights, formats, prompts, depths, chunk=args.chunk)
            _emit(args, {"gpu": card.device_name, "shape": shape, **sweep})
            print(render_kv_sweep(sweep), file=sys.stderr)
            return 0
        result = run_bench(card, cfg, weights, shape, prompts, depths, chunk=args.chunk)
    finally:
        card.close()
    _emit(args, {"gpu": result["microbench"]["device"], "weights": args.weights if args.synthetic else "file", **result})
    print(render_table(result), file=sys.stderr)
    return 0
