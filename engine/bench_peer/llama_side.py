"""llama.cpp's side of the peer benchmark: one child process per variant, llama-cpp-python's low-level API.

Why a child process: ggml-cuda reads its environment (GGML_CUDA_DISABLE_GRAPHS, ...) once at
initialisation, and the CUDA context of llama.cpp must not share a process with ours. Why the
low-level API (`llama_decode` on batches) and not `Llama`: the high-level class adds sampling,
logits copies of every position and Python bookkeeping that llama-bench does not do.

The procedure follows llama-bench (vendor/llama.cpp/tools/llama-bench/llama-bench.cpp, test_prompt
and test_gen) with its defaults: all layers offloaded, n_batch 2048, n_ubatch 512, flash attention
`auto`, f16 KV cache, random token ids. Prefill of n tokens: clear the memory, `llama_decode` the
tokens in n_batch pieces (`llama_batch_get_one`: only the last token's logits), then
`llama_synchronize`; timed with perf_counter around the whole loop. Decode at depth d: clear, prefill
d tokens (untimed), then time `steps` one-token `llama_decode` + `llama_synchronize` calls (each
computes that token's logits, as llama-bench's tg does). One warm-up prefill and decode first.

Run: `python -m engine.bench_peer.llama_side MODEL --prompts 512,2048 --depths 512 --json OUT`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from typing import Any

FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type
GGML_LOG_LEVEL_ERROR = 4


def _errors_only(level: int, text: bytes, user_data: Any) -> None:
    """llama.cpp's log callback: keep errors (a failed load says why), drop the per-tensor chatter."""
    if level == GGML_LOG_LEVEL_ERROR:
        sys.stderr.write(text.decode(errors="replace"))


class LlamaRunner:
    """One model and one context, sized for the largest prefill or depth + decode steps."""

    def __init__(self, model_path: str, n_ctx: int, n_batch: int = 2048, n_ubatch: int = 512,
                 flash_attn: str = "auto", n_gpu_layers: int = 999, threads: int | None = None):
        import llama_cpp as lc

        self.lc = lc
        lc.llama_backend_init()
        self._log = lc.llama_log_callback(_errors_only)  # kept alive: the C side holds the pointer
        lc.llama_log_set(self._log, ctypes.c_void_p())
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        self.model = lc.llama_model_load_from_file(model_path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {model_path}")
        cparams = lc.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = n_ctx, min(n_batch, n_ctx), min(n_ubatch, n_batch, n_ctx)
        cparams.flash_attn_type = FLASH_ATTN[flash_attn]
        cparams.no_perf = True
        n_threads = threads or max(1, (os.cpu_count() or 2) // 2)
        cparams.n_threads = cparams.n_threads_batch = n_threads
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.n_ctx, self.n_batch, self.n_ubatch = n_ctx, cparams.n_batch, cparams.n_ubatch
        self.flash_attn, self.n_threads = flash_attn, n_threads
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.one = lc.llama_batch_init(1, 0, 1)
        self.rng_state = 12345

    def info(self) -> dict[str, Any]:
        lc = self.lc
        return {
            "llama_cpp_python": lc.__version__,
            "system_info": lc.llama_print_system_info().decode(errors="replace").strip(),
            "gpu_offload": bool(lc.llama_supports_gpu_offload()),
            "n_params": lc.llama_model_n_params(self.model),
            "model_bytes": lc.llama_model_size(self.model),
            "n_ctx": self.n_ctx, "n_batch": self.n_batch, "n_ubatch": self.n_ubatch,
            "flash_attn": self.flash_attn, "n_threads": self.n_threads,
        }

    def _ids(self, n: int) -> Any:
        """n pseudo-random token ids (an LCG: no numpy needed, the values only have to vary)."""
        out = (self.lc.llama_token * n)()
        s = self.rng_state
        for i in range(n):
            s = (s * 1103515245 + 12345) & 0x7FFFFFFF
            out[i] = s % self.n_vocab
        self.rng_state = s
        return out

    def _clear(self) -> None:
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), False)

    def _prefill(self, n: int) -> None:
        lc, done = self.lc, 0
        while done < n:
            k = min(self.n_batch, n - done)
            ids = self._ids(k)  # held here: the batch only points at it
            rc = lc.llama_decode(self.ctx, lc.llama_batch_get_one(ids, k))
            if rc != 0:
                raise RuntimeError(f"llama_decode failed (rc={rc}) at {done}/{n} prompt tokens")
            done += k
        lc.llama_synchronize(self.ctx)

    def prefill_seconds(self, n: int) -> float:
        self._clear()
        t0 = time.perf_counter()
        self._prefill(n)
        return time.perf_counter() - t0

    def decode_seconds(self, depth: int, steps: int) -> float:
        """Seconds for `steps` single-token decodes after a (untimed) prefill of `depth` tokens."""
        lc, b = self.lc, self.one
        self._clear()
        if depth:
            self._prefill(depth)
        b.n_tokens = 1
        b.n_seq_id[0] = 1
        b.seq_id[0][0] = 0
        b.logits[0] = 1
        ids = self._ids(steps)
        t0 = time.perf_counter()
        for i in range(steps):
            b.token[0], b.pos[0] = ids[i], depth + i
            rc = lc.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed (rc={rc}) at depth {depth + i}")
            lc.llama_synchronize(self.ctx)
        return time.perf_counter() - t0

    def close(self) -> None:
        lc = self.lc
        lc.llama_batch_free(self.one)
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)


def context_size(prompts: tuple[int, ...], depths: tuple[int, ...], steps: int) -> int:
    """Smallest context (a multiple of 256) holding the longest prompt and the deepest decode run."""
    need = max(max(prompts, default=0), max(depths, default=0) + steps + 1, 1)
    return -(-need // 256) * 256


def measure(model_path: str, prompts: tuple[int, ...], depths: tuple[int, ...], steps: int = 64, reps: int = 3,
            flash_attn: str = "auto", require_gpu: bool = True, threads: int | None = None) -> dict[str, Any]:
    """Median prefill tokens/s per prompt length and decode tokens/s per depth, with the run's settings."""
    runner = LlamaRunner(model_path, context_size(prompts, depths, steps), flash_attn=flash_attn, threads=threads)
    try:
        info = runner.info()
        if require_gpu and not info["gpu_offload"]:
            raise RuntimeError("this llama-cpp-python build has no GPU offload (built without CUDA?)")
        runner.prefill_seconds(min(512, max(prompts, default=512)))  # warm-up: kernels, cuBLAS/graph setup
        runner.decode_seconds(0, 2)
        prefill_runs = {n: [n / runner.prefill_seconds(n) for _ in range(reps)] for n in prompts}
        decode = {d: steps / runner.decode_seconds(d, steps) for d in depths}
    finally:
        runner.close()
    return {
        **info,
        "environment": {k: v for k, v in os.environ.items() if k.startswith("GGML_")},
        "prefill_tokens_per_s": {n: statistics.median(r) for n, r in prefill_runs.items()},
        "prefill_runs": prefill_runs,
        "decode_steps": steps,
        "decode_tokens_per_s": decode,
    }


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--prompts", type=_ints, default=(512,))
    p.add_argument("--depths", type=_ints, default=(512,))
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--flash-attn", choices=tuple(FLASH_ATTN), default="auto")
    p.add_argument("--cpu", action="store_true", help="allow a build without GPU offload (CPU dry run)")
    p.add_argument("--threads", type=int)
    p.add_argument("--json", required=True, help="write the result here")
    args = p.parse_args(argv)
    result = measure(args.model, args.prompts, args.depths, args.steps, args.reps, args.flash_attn,
                     require_gpu=not args.cpu, threads=args.threads)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
