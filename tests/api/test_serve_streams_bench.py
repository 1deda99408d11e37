"""engine.bench_peer.serve_streams on the CPU: the whole path (a `rigllm serve` child on the demo model with the
reference backend, concurrent streams through the openai client, the JSON and the table) at a small size,
so the H200 run of the same script only changes the backend and the model."""

from __future__ import annotations

import json

import pytest

from engine.bench_peer import serve_streams
from engine.bench_peer.serve_process import serving
from engine.errors import RigllmError

MAX_TOKENS = 8


def test_serve_streams_writes_the_measurements_and_the_bench_ratio(tmp_path, capsys):
    bench = tmp_path / "bench.json"  # as `rigllm bench --json` writes it (JSON keys are strings)
    bench.write_text(json.dumps({"concurrent_streams": {"depth": 512, "streams": {"1": {"tokens_per_s": 100.0},
                                                                                  "8": {"tokens_per_s": 700.0}}}}))
    out = tmp_path / "serve.json"
    assert serve_streams.main(["--shape", "demo", "--backend", "reference", "--streams", "1,2",
                               "--max-tokens", str(MAX_TOKENS), "--reps", "1", "--json", str(out),
                               "--bench-json", str(bench)]) == 0

    result = json.loads(out.read_text())
    assert {"date", "commit", "command", "gpus", "shape", "weights", "backend", "slots", "max_tokens"} <= set(result)
    assert (result["shape"], result["weights"], result["backend"], result["slots"]) == ("demo", "q8_0", "reference", 2)
    assert set(result["streams"]) == {"1", "2"}
    for n, r in result["streams"].items():
        assert len(r["per_stream"]) == int(n) == r["streams"]
        assert all(0 < s["completion_tokens"] <= MAX_TOKENS and s["tokens_from"] == "usage" for s in r["per_stream"])
        assert r["completion_tokens"] == sum(s["completion_tokens"] for s in r["per_stream"])
        assert r["short_streams"] == sum(s["completion_tokens"] < MAX_TOKENS for s in r["per_stream"])
        assert r["window_s"] > 0 and r["aggregate_runs"] == [r["aggregate_tokens_per_s"]]
    one = result["streams"]["1"]
    assert one["fraction_of_bench"] == pytest.approx(one["aggregate_tokens_per_s"] / 100.0)
    assert "fraction_of_bench" not in result["streams"]["2"]  # the bench file has no 2-stream row
    assert capsys.readouterr().out.splitlines()[1].startswith("streams   aggregate t/s")
    assert "[rigllm] stopped" in out.with_suffix(".server.log").read_text()  # stopped by SIGTERM, not killed


def test_a_server_that_cannot_start_fails_with_its_output(tmp_path):
    with pytest.raises(RigllmError, match="exited with .* before it was ready"):
        with serving(tmp_path / "missing.gguf", "reference", 1, 64, tmp_path / "server.log"):
            pass


def test_serve_streams_can_ask_every_stream_for_json(tmp_path):
    """`--response-format json_object`: every stream decodes under the server's JSON grammar, and the file says so."""
    out = tmp_path / "serve.json"
    assert serve_streams.main(["--shape", "demo", "--backend", "reference", "--streams", "2",
                               "--max-tokens", str(MAX_TOKENS), "--reps", "1", "--json", str(out),
                               "--response-format", "json_object"]) == 0
    result = json.loads(out.read_text())
    assert result["response_format"] == "json_object"
    assert all(0 < s["completion_tokens"] <= MAX_TOKENS for s in result["streams"]["2"]["per_stream"])
