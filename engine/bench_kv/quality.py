"""KV format quality: `python -m engine.bench_kv.quality [--out FILE.json]` prints a table per measurement.

1. Attention-output error on realistic random data, 27B attention shape (24 query / 4 KV heads, head
   width 256, partial RoPE on 64 dims, θ = 1e7): keys are RMS-normed rows with per-channel scales and
   a few large persistent outlier channels (what q/k-normed, RoPE'd keys of real models look like),
   rotated by RoPE at their positions; values have per-channel scales and outliers too. Half of the
   queries repeat an earlier key's content (retrieval: one key dominates the softmax), half are fresh
   (diffuse attention). Reported per format: relative error ||o - o_exact|| / ||o_exact|| of each
   (query, head) output over the exact cache (mean, p99, max), and the largest score error of the
   keys (in logits, i.e. after the 1/√Dh scale).
2. End-to-end logits against the exact (f16) cache on the reference model over a long prompt
   (teacher-forced, one prefill): KL(p_f16 || p_format) per position (mean, p99, max, in nats),
   top-1 agreement, and for trained fixtures the accuracy on the task's answer tokens.
   Models: the demo model (random weights: engine/fixtures/demo_model.py; contracts.md says random
   weights say nothing about quality, so its numbers are a sanity check) and every GGUF under
   tests/fixtures/trained/ (small trained models: the quality numbers that count).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine.model.kv_formats import KV_FORMATS
from engine.gguf.shapes import shape_config
from engine.paths import REPO_ROOT
from engine.reference.attention import attend_stored
from engine.reference.norms import rmsnorm
from engine.reference.rope import Rope, text_positions
from engine.reference.state import KVCache, SequenceState

FORMATS = [name for name in KV_FORMATS if name != "f16"] + ["k16v3", "k3v8"]
TRAINED_DIR = REPO_ROOT / "tests" / "fixtures" / "trained"
MIN_FIXTURE_TOKENS = 512  # a recall prompt with 8 queries and its distractors


# ---- 1. attention output on synthetic data --------------------------------------------------------
def _channel_profile(rng: np.random.Generator, shape: tuple[int, int], n_outliers: int, size: float):
    """(scale, mean) per (head, channel): log-normal scales, `n_outliers` channels per head with a large mean."""
    scale = np.exp(0.5 * rng.standard_normal(shape))
    mean = np.zeros(shape)
    for h in range(shape[0]):
        idx = rng.choice(shape[1], n_outliers, replace=False)
        mean[h, idx] = size * rng.choice([-1.0, 1.0], n_outliers) * rng.uniform(0.5, 1.0, n_outliers)
    return scale, mean


def attention_data(rng: np.random.Generator, n_keys: int, n_queries: int):
    """(q [Tq, H, Dh], k [S, Hkv, Dh], v [S, Hkv, Dh], n_past) at 27B shapes, as described in the module doc."""
    cfg = shape_config("27b")
    rope = Rope(cfg)
    hkv, h, dh = cfg.n_head_kv, cfg.n_head, cfg.head_dim
    k_scale, k_mean = _channel_profile(rng, (hkv, dh), 4, 8.0)
    v_scale, v_mean = _channel_profile(rng, (hkv, dh), 2, 4.0)
    k_gain = (1.0 + 0.3 * rng.standard_normal(dh)).astype(np.float32)
    raw_k = rng.standard_normal((n_keys, hkv, dh)) * k_scale + k_mean
    k = rope.apply(rmsnorm(raw_k.astype(np.float32), k_gain, cfg.rms_eps), text_positions(0, n_keys))
    v = (rng.standard_normal((n_keys, hkv, dh)) * v_scale + v_mean).astype(np.float32)

    n_past = n_keys - n_queries
    group = h // hkv
    raw_q = rng.standard_normal((n_queries, h, dh)) * np.repeat(k_scale, group, axis=0)
    retrieval = np.arange(n_queries) % 2 == 0
    sources = rng.integers(0, n_past, n_queries)
    raw_q[retrieval] = 3.0 * raw_k[sources[retrieval]].repeat(group, axis=1) + raw_q[retrieval]
    q_gain = (1.0 + 0.3 * rng.standard_normal(dh)).astype(np.float32)
    q = rope.apply(rmsnorm(raw_q.astype(np.float32), q_gain, cfg.rms_eps), text_positions(n_past, n_queries))
    return q, k, v, n_past


def attention_errors(formats: list[str], n_keys: int, n_queries: int, seed: int = 0) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(seed)
    q, k, v, n_past = attention_data(rng, n_keys, n_queries)
    hkv, dh = k.shape[1:]

    def run(fmt: str | None) -> tuple[np.ndarray, np.ndarray]:
        cache = KVCache(hkv, dh, fmt)
        cache.append(k[:n_past], v[:n_past])
        cache.append(k[n_past:], v[n_past:])
        return attend_stored(q, cache, n_past, dh), cache.keys

    exact, _ = run(None)
    out = {}
    for fmt in formats:
        o, keys = run(fmt)
        rel = np.linalg.norm(o - exact, axis=-1) / np.linalg.norm(exact, axis=-1)
        group = q.shape[1] // hkv
        kv_of = np.arange(q.shape[1]) // group
        score_err = np.einsum("thd,shd->ths", q, (keys - k)[:, kv_of]) / np.sqrt(dh)
        out[fmt] = {
            "rel_error_mean": float(rel.mean()),
            "rel_error_p99": float(np.quantile(rel, 0.99)),
            "rel_error_max": float(rel.max()),
            "score_error_max": float(np.abs(score_err).max()),
        }
    return out


# ---- 2. end-to-end logits -------------------------------------------------------------------------
def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _prompt(model_path: Path, n_tokens: int, seed: int) -> tuple[list[int], list[bool] | None, str]:
    """Token ids (and which are task answers) for a long prompt: a fixture task for trained fixtures
    (their vocabulary has the task words), else the demo corpus through the model's tokenizer."""
    from engine.generation.tokenizer import Tokenizer
    from engine.gguf.model_file import ModelFile

    tokenizer = Tokenizer.from_model_file(ModelFile(model_path))
    rng = np.random.default_rng(seed)
    if model_path.parent == TRAINED_DIR:
        from engine.fixtures.tasks import SampleBuilder

        sample = SampleBuilder(tokenizer.encode).sample("recall", rng, n_tokens, n_queries=8)
        return sample.ids, sample.supervised, "recall task, 8 queries"
    from engine.generation.demo_corpus import DEMO_CORPUS

    ids: list[int] = []
    while len(ids) < n_tokens:
        ids += tokenizer.encode(" ".join(DEMO_CORPUS[i] for i in rng.permutation(len(DEMO_CORPUS))))
    return ids[:n_tokens], None, "demo corpus text"


def logit_divergence(model_path: Path, formats: list[str], n_tokens: int, seed: int = 0) -> dict[str, Any]:
    from engine.gguf.loader import load_model
    from engine.reference import ReferenceModel

    model = ReferenceModel.from_model_file(load_model(model_path).file)
    ids, supervised, prompt = _prompt(model_path, n_tokens, seed)
    exact = _log_softmax(model.forward(ids, SequenceState(model.cfg)))
    result: dict[str, Any] = {"model": model_path.name, "tokens": len(ids), "prompt": prompt, "formats": {}}
    answers = np.flatnonzero(np.asarray(supervised[1:])) if supervised is not None else None
    targets = np.asarray(ids[1:])
    if answers is not None:
        result["f16_answer_accuracy"] = float(np.mean(exact[:-1].argmax(-1)[answers] == targets[answers]))
    for fmt in formats:
        logp = _log_softmax(model.forward(ids, SequenceState(model.cfg, kv_format=fmt)))
        kl = np.sum(np.exp(exact) * (exact - logp), axis=-1)
        entry = {
            "kl_mean": float(kl.mean()),
            "kl_p99": float(np.quantile(kl, 0.99)),
            "kl_max": float(kl.max()),
            "top1_agreement": float(np.mean(logp.argmax(-1) == exact.argmax(-1))),
        }
        if answers is not None:
            entry["answer_accuracy"] = float(np.mean(logp[:-1].argmax(-1)[answers] == targets[answers]))
        result["formats"][fmt] = entry
    return result


# ---- report -----------------------------------------------------------------------------------------
def render(report: dict[str, Any]) -> str:
    lines = [f"attention output, 27B shape, {report['attention_keys']} keys, {report['attention_queries']} queries:",
             "| format | rel. error mean | p99 | max | max score error (logits) |", "|---|---:|---:|---:|---:|"]
    for fmt, e in report["attention"].items():
        lines.append(f"| {fmt} | {e['rel_error_mean']:.4f} | {e['rel_error_p99']:.4f} | {e['rel_error_max']:.4f} "
                     f"| {e['score_error_max']:.3f} |")
    for run in report["models"]:
        acc = f", f16 answer accuracy {run['f16_answer_accuracy']:.3f}" if "f16_answer_accuracy" in run else ""
        lines += ["", f"logits vs f16 KV: {run['model']}, {run['tokens']} tokens ({run['prompt']}){acc}:",
                  "| format | KL mean (nats) | KL p99 | KL max | top-1 agreement |"
                  + (" answer accuracy |" if acc else ""),
                  "|---|---:|---:|---:|---:|" + ("---:|" if acc else "")]
        for fmt, e in run["formats"].items():
            extra = f" {e['answer_accuracy']:.3f} |" if "answer_accuracy" in e else ""
            lines.append(f"| {fmt} | {e['kl_mean']:.2e} | {e['kl_p99']:.2e} | {e['kl_max']:.2e} "
                         f"| {e['top1_agreement']:.4f} |{extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--tokens", type=int, default=2048, help="prompt length for the logit comparison")
    parser.add_argument("--keys", type=int, default=4096, help="cached keys for the attention-error data")
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--no-demo", action="store_true", help="skip the random-weight demo model")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    formats = args.formats.split(",")
    start = time.time()
    report: dict[str, Any] = {
        "attention_keys": args.keys,
        "attention_queries": args.queries,
        "attention": attention_errors(formats, args.keys, args.queries),
        "models": [],
    }
    # A recall prompt needs room for its planted pairs and queries; shorter runs use the demo model only.
    fixtures_fit = args.tokens >= MIN_FIXTURE_TOKENS
    models = sorted(TRAINED_DIR.glob("*.gguf")) if TRAINED_DIR.is_dir() and fixtures_fit else []
    if not args.no_demo:
        from engine.fixtures.demo_model import ensure_demo_model

        models.append(ensure_demo_model())
    for path in models:
        report["models"].append(logit_divergence(Path(path), formats, args.tokens))
    report["seconds"] = time.time() - start
    print(render(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
