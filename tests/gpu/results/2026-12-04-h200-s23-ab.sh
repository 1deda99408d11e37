#!/usr/bin/env bash
# s23f, the device call after the GDN conv-advance reorder (cuda_src/gdn.cu, the `new` variant of
# 2026-12-04-h200-s23-gdn-variants.py; measured no faster and not kept): the GDN-related GPU tests, the s23a probe with
# the recurrence kernel of the base build and of the reorder's (that file's base and new, built into a folder packed
# as .kbz/gdnvar.tar.xz) in one process, then `rigllm bench` of the tree with the reorder and of the base tree
# (64feb47: .kbz/base-tree.tar.xz and its kernels .kbz/kbuild-base.tar.xz) in one call.
# usage: bash THIS tests   (carry [".kbz", ".whl"])
set -u
R=$OUT/results; mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/s .whl/*.whl > /dev/null 2>&1
mkdir -p .kbuild /tmp/gv && tar -C .kbuild -xJf .kbz/kbuild.tar.xz && tar -C /tmp/gv -xJf .kbz/gdnvar.tar.xz
export PYTHONPATH=/tmp/s:$PWD RIGLLM_KERNEL_DIR=$PWD/.kbuild PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
export RIGLLM_COMMIT=${RIGLLM_COMMIT:-s23}
base=/tmp/rigllm-base
bench_pair() {
    local args=(bench --synthetic 9b --weights q8_0 --prompts 512 --depths 512)
    timeout 200 python3 -m engine.cli "${args[@]}" --json "$R/s23-bench-9b-q8_0-new.json" > "$R/s23-bench-9b-q8_0-new.log" 2>&1
    echo "new rc=$?"
    rm -rf "$base" && mkdir -p "$base/.kbuild" && tar -C "$base" -xJf .kbz/base-tree.tar.xz \
        && tar -C "$base/.kbuild" -xJf .kbz/kbuild-base.tar.xz
    ( cd "$base" && PYTHONPATH="/tmp/s:$base" RIGLLM_KERNEL_DIR="$base/.kbuild" RIGLLM_COMMIT=64feb47 \
      timeout 200 python3 -m engine.cli "${args[@]}" --json "$R/s23-bench-9b-q8_0-base.json" > "$R/s23-bench-9b-q8_0-base.log" 2>&1
      echo "base rc=$?" )
    for side in new base; do echo "== $side"; grep -E "^ +512 |^depth|^   512|^      [1248] " "$R/s23-bench-9b-q8_0-$side.log" | head -12
        grep -A3 -E "^decode step at" "$R/s23-bench-9b-q8_0-$side.log"; grep -E "gdn_recurrent" "$R/s23-bench-9b-q8_0-$side.log"; done
}
case "${1:-}" in
tests)
    timeout 300 python3 -m pytest -o addopts='' -m 'not peer' -q -rfE -n 14 -p no:benchmark \
        -k 'not keeps_the_token_distribution' tests/gpu/test_gdn.py tests/gpu/test_slots.py tests/gpu/test_slot_batch.py \
        tests/gpu/test_teeth_batches.py tests/gpu/test_teeth_fixture.py tests/gpu/test_mtp_gpu.py \
        tests/gpu/test_cuda_backend.py tests/gpu/test_pipeline.py > "$R/s23-gpu-tests.log" 2>&1
    echo "tests rc=$?"; tail -3 "$R/s23-gpu-tests.log"
    timeout 120 python3 tests/gpu/results/2026-12-04-h200-s23a-gdn-probe.py /tmp/gv "$R/s23f-gdn-probe.json" \
        base,new,empty,notail,inputs 2>&1 | grep -v -i -E 'pycuda|context|cleanly|aborted|^-+$|^$' > "$R/s23f-gdn-probe.log"
    grep -E 'round 2' "$R/s23f-gdn-probe.log"
    bench_pair ;;
esac
