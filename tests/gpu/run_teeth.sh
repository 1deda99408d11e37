#!/usr/bin/env bash
# What to run on the H200 for issue 25 ([Correctness teeth]), in order. Each numbered step is one device call
# (under the 10-minute limit); run them from the repository root. Logs go to tests/gpu/results/ (commit them).
# (For a whole session's H200 work in three calls, sized from a measured run, see tests/gpu/run_h200_session.sh.)
#
# 0. On the dev machine first (the H200 image has NVRTC 13 only): prebuilt kernels for the card, carried along.
#        python -m engine.cli build-kernels --out .kbuild --arch 90
#    and pass carry=[".kbuild"] to the device calls. Patched .cu files in step 6 are compiled by the H200's
#    NVRTC 13 at run time (their source hash no longer matches .kbuild); everything else comes from .kbuild.
#
# Usage on the H200:  bash tests/gpu/run_teeth.sh STEP     (STEP = 1..7, or "all" where time allows)
set -u
export RIGLLM_KERNEL_DIR="${RIGLLM_KERNEL_DIR:-.kbuild}"
PY="${PYTHON:-python}"
DAY="$(date +%Y-%m-%d)"
OUT="tests/gpu/results"
mkdir -p "$OUT"
run() {  # name, command...: run it, keep its output in tests/gpu/results/<day>-h200-teeth-<name>.log
    local name="$1"; shift
    local log="$OUT/$DAY-h200-teeth-$name.log"
    { echo "# $DAY, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD); command: $*"; "$@"; } 2>&1 | tee "$log"
    return "${PIPESTATUS[0]}"
}
step="${1:-}"
case "$step" in
1)  # kernels of the any-group decode path, every head width and KV format; head groupings 3/5, GDN ratios 1-4
    run kernels-and-groups "$PY" -m pytest -o addopts='' -q -s -rA tests/gpu/test_attention_any_group.py \
        tests/gpu/test_teeth_head_groups.py ;;
2)  # the trained fixture on one card, every KV format (whole model + layer-local; floors printed per run)
    run fixture-one-card "$PY" -m pytest -o addopts='' -q -s -rA tests/gpu/test_teeth_fixture.py -k one_card ;;
3)  # logical cards (contexts on GPU 0 unless RIGLLM_TEST_DEVICES lists GPUs) and the MTP verify rows
    run fixture-pipeline-verify "$PY" -m pytest -o addopts='' -q -s -rA tests/gpu/test_teeth_fixture.py \
        -k "logical_cards or verify_rows" ;;
4)  # mixed batches, the mended slot test, and `rigllm debug compare --backend cuda`
    run batches-and-compare "$PY" -m pytest -o addopts='' -q -s -rA tests/gpu/test_teeth_batches.py \
        tests/gpu/test_slots.py tests/gpu/test_teeth_debug_compare.py ;;
5)  # issue 25 item 6: the API suite on the cuda backend (schemathesis is not on the GPU image)
    export RIGLLM_TEST_BACKEND=cuda
    run api-contract-cuda "$PY" -m pytest -o addopts='' -v tests/api \
        --ignore=tests/api/test_admin.py --ignore=tests/api/test_api_schema_fuzz.py ;;
6)  # the mutation check: patches in tests/gpu/mutations/ (stored, applied only by this script; needs a git checkout: on a copy without .git run `git init -q && git add -A && git commit -qm base` first); two calls to fit 10 minutes
    run mutations-a bash tests/gpu/mutations/run_mutations.sh baseline 1 2 ;;
7)  run mutations-b bash tests/gpu/mutations/run_mutations.sh 3 4 ;;
all) for s in 1 2 3 4 5 6 7; do bash "$0" "$s"; done ;;
*)  sed -n '2,12p;/^# Expected/,$p' "$0"; exit 2 ;;
esac

# Expected outcome (fill the measured numbers into README "Correctness"; P = pending the H200 run):
#   step  test                                        bound                                    measured
#   1     any-group kernels (f16 + 5 formats)         float64 1e-4, reference 5e-3 of max|y|   P
#   1     head groups g3/g5 x GDN ratios 1-4 x 6 KV   layer-local: max 4x floor, p90 10x/1e-4 P
#   2     fixture one card, 6 KV formats, 594 pos.    whole model 2x floor; top-1 >= 99%       P
#   3     2 and 4 logical cards (f16, k8v8, k3v3)     == one card bit for bit + the above      P
#   3     MTP verify rows (K=2), 3 formats            whole-model bounds                       P
#   4     mixed batch (sampled/greedy/speculating)    bit-for-bit vs alone; pick == arg-max    P
#   4     debug compare --backend cuda --layer-local  worst row < 0.01 in every place          P
#   5     API suite on cuda                           green                                    P
#   6-7   mutations 1-4                               each caught by >= 1 test (table last)    P
