#!/usr/bin/env bash
# s22's device calls after the narrow GEMM token tiles: GPU tests of the changed paths, then `rigllm bench` of this tree
# and of the base tree (c66a782: .kbz/base-tree.tar.xz and its kernels .kbz/kbuild-base.tar.xz) in one call, with
# short prompts (16 and 54 tokens: a chat turn, serve_streams' prompt) beside 512.
# usage: bash THIS tests|bench WEIGHTS|serve   (carry [".kbz", ".whl"])
set -u
R=$OUT/results; mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/s .whl/*.whl > /dev/null 2>&1
mkdir -p .kbuild && tar -C .kbuild -xJf .kbz/kbuild.tar.xz
export PYTHONPATH=/tmp/s:$PWD RIGLLM_KERNEL_DIR=$PWD/.kbuild PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
export RIGLLM_COMMIT=${RIGLLM_COMMIT:-s22}
base=/tmp/rigllm-base
bench_pair() {  # bench_pair WEIGHTS: this tree, then the base tree
    local w=$1 args=(bench --synthetic 9b --weights "$1" --prompts 16,54,512 --depths 512)
    timeout 200 python3 -m engine.cli "${args[@]}" --json "$R/s22-bench-9b-$w-new.json" > "$R/s22-bench-9b-$w-new.log" 2>&1
    echo "new $w rc=$?"
    rm -rf "$base" && mkdir -p "$base/.kbuild" && tar -C "$base" -xJf .kbz/base-tree.tar.xz \
        && tar -C "$base/.kbuild" -xJf .kbz/kbuild-base.tar.xz
    ( cd "$base" && PYTHONPATH="/tmp/s:$base" RIGLLM_KERNEL_DIR="$base/.kbuild" RIGLLM_COMMIT=c66a782 \
      timeout 200 python3 -m engine.cli "${args[@]}" --json "$R/s22-bench-9b-$w-base.json" > "$R/s22-bench-9b-$w-base.log" 2>&1
      echo "base $w rc=$?" )
    for side in new base; do echo "== $w $side"; grep -E "^prefill|^ +(16|54|512) |^depth|^   512" "$R/s22-bench-9b-$w-$side.log" | head -12; done
}
case "${1:-}" in
tests)
    timeout 330 python3 -m pytest -o addopts='' -m 'not peer' -q -rfE -n 14 -p no:benchmark \
        -k 'not keeps_the_token_distribution' tests/gpu/test_gemm.py tests/gpu/test_kquant_kernels.py \
        tests/gpu/test_kquant_backend.py tests/gpu/test_teeth_fixture.py tests/gpu/test_teeth_batches.py \
        tests/gpu/test_cuda_backend.py tests/gpu/test_driver.py tests/gpu/test_pipeline.py tests/gpu/test_sampling.py \
        tests/gpu/test_sparse_forward_gpu.py > "$R/s22-gpu-tests.log" 2>&1
    echo "tests rc=$?"; tail -4 "$R/s22-gpu-tests.log"
    bench_pair q8_0 ;;
bench) bench_pair "$2" ;;
serve)
    timeout 200 python3 -m engine.cli bench --synthetic 9b --weights q8_0 --prompts 512 --depths 512 \
        --json "$R/s22-serve-bench-9b-q8_0.json" > "$R/s22-serve-bench-9b-q8_0.log" 2>&1; echo "bench rc=$?"
    timeout 300 python3 -m engine.bench_peer.serve_streams --shape 9b --weights q8_0 --streams 1,4,8 --max-tokens 256 \
        --bench-json "$R/s22-serve-bench-9b-q8_0.json" --json "$R/s22-serve-streams-9b-q8_0.json" \
        > "$R/s22-serve-streams.log" 2>&1; echo "serve rc=$?"; tail -8 "$R/s22-serve-streams.log" ;;
esac
