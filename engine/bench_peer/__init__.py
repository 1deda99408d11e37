"""Peer benchmark (issue 11): rigllm and llama.cpp on the same GPU, the same synthetic GGUFs, in one call.

`python -m engine.bench_peer.run` builds (or reuses) a CUDA wheel of llama-cpp-python from its sdist
(build.py), writes the synthetic 9B/27B-shape Q8_0 GGUFs (models.py), times llama.cpp in one child
process per variant (llama_side.py, llama-cpp-python's low-level API, llama-bench's procedure) and
rigllm in this process (ours.py, the `rigllm bench` functions), then writes JSON and a markdown table
with ratios and CMP 100-210 projections (report.py; the projection method is documented there).

`python -m engine.bench_peer.serve_streams` (issue 28) times concurrent streams through a `rigllm serve`
child and the openai client on the same synthetic GGUFs (serve_process.py, stream_timing.py), beside
`rigllm bench`'s concurrent_streams.
"""
