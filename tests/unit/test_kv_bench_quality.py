"""`python -m engine.bench_kv.quality` on small sizes: the measurements order the formats as their bits say.

Fewer bits must mean larger attention-output error (same data, same seed), keys kept exact must give
zero score error, and the logit divergence of the 8-bit cache on the demo model must be tiny next to
the 3-bit one; these catch a swapped K/V codec or a measurement against the wrong baseline.
"""

from __future__ import annotations

import json

from engine.bench_kv import quality
from engine.fixtures.demo_model import ensure_demo_model


def test_attention_errors_follow_the_bits():
    errors = quality.attention_errors(["k8v8", "k8v4", "k8v3", "k3v3", "k16v3"], n_keys=512, n_queries=8)
    assert errors["k8v8"]["rel_error_mean"] < errors["k8v4"]["rel_error_mean"] < errors["k8v3"]["rel_error_mean"]
    assert errors["k8v3"]["rel_error_mean"] < errors["k3v3"]["rel_error_mean"]
    score = {fmt: e["score_error_max"] for fmt, e in errors.items()}
    assert score["k16v3"] == 0.0 < score["k8v8"] < score["k3v3"]
    assert errors["k8v8"]["rel_error_max"] < 0.05


def test_logit_divergence_and_report(tmp_path):
    run = quality.logit_divergence(ensure_demo_model(), ["k8v8", "k3v3"], n_tokens=96)
    k8, k3 = run["formats"]["k8v8"], run["formats"]["k3v3"]
    assert run["tokens"] == 96 and run["prompt"] == "demo corpus text"
    assert 0.0 < k8["kl_mean"] < k3["kl_mean"] and k8["top1_agreement"] >= k3["top1_agreement"]
    out = tmp_path / "q.json"
    args = ["--formats", "k8v8", "--tokens", "32", "--keys", "256", "--queries", "4", "--out", str(out)]
    assert quality.main(args) == 0
    report = json.loads(out.read_text())
    assert set(report["attention"]) == {"k8v8"} and report["models"][-1]["model"].startswith("rigllm-demo")
    assert "| k8v8 |" in quality.render(report)
