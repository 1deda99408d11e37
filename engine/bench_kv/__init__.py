"""KV cache format benchmarks: quality (`python -m engine.bench_kv.quality`) and attention speed at depth
(`python -m engine.bench_kv.speed`, GPU)."""
