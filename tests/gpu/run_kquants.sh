#!/usr/bin/env bash
# The K-quant GPU run ([K-quants], issue 29), to paste on the GPU machine from the repository root.
# (For a whole session's H200 work in three calls, sized from a measured run, see tests/gpu/run_h200_session.sh.)
#
# Before: build the fatbins where NVRTC 12.x is (the H200 image has NVRTC 13 only) and carry .kbuild:
#     rigllm build-kernels --out .kbuild --arch 90
# Each step writes its log or JSON to tests/gpu/results/ with today's date; commit those.
# Times on an H200 (estimates, not measured): kernel tests ~3 min, backend test ~6 min (it writes 7
# synthetic GGUFs and runs the numpy reference on each), benches ~2-4 min each.
set -u -o pipefail
export RIGLLM_KERNEL_DIR="${RIGLLM_KERNEL_DIR:-.kbuild}"
day=$(date -u +%F)
out=tests/gpu/results
mkdir -p "$out"

# 1. Every K-quant kernel against numpy on random blocks (GEMV T=1..8 and the T=1 variants, GEMM, mixed stacks
#    with residual, embedding gathers bit for bit). A failure names the kernel, shape, max error and where.
python -m pytest -q -p no:cacheprovider tests/gpu/test_kquant_kernels.py 2>&1 | tee "$out/$day-h200-kquant-kernels.log"

# 2. The whole CUDA backend on Q4_K_M / Q5_K_M / Q6_K files against the reference (teacher-forced logits,
#    floor-derived tolerance, greedy agreement); -s prints each model's error and its floor.
python -m pytest -q -s -p no:cacheprovider tests/gpu/test_kquant_backend.py 2>&1 | tee "$out/$day-h200-kquant-backend.log"

# 3. The Q8_0 paths still pass after the matmul dispatch change (forward, GEMV, GEMM, embedding, MTP).
python -m pytest -q -p no:cacheprovider tests/gpu/test_gemv.py tests/gpu/test_gemm.py tests/gpu/test_embedding.py \
    tests/gpu/test_cuda_backend.py tests/gpu/test_mtp_gpu.py 2>&1 | tee "$out/$day-h200-kquant-q8-regression.log"

# 4. The T=1 K-quant GEMV sweep per type on the 9B shape (picks engine/cuda/kq_weight.py DEFAULT_KQ_T1).
for w in q4_k_m q5_k_m q6_k; do
    python -m engine.cli bench --synthetic 9b --weights "$w" --gemv-sweep 1 --json "$out/$day-h200-gemv-sweep-9b-$w.json"
done

# 5. Decode and prefill with fractions of the read ceiling and the DP4A peak: Q8_0 and Q4_K_M in the same
#    session (the decode read-fraction target compares them), 9B and 27B, and Q6_K on 9B.
for shape in 9b 27b; do
    for w in q8_0 q4_k_m; do
        python -m engine.cli bench --synthetic "$shape" --weights "$w" --prompts 512,4096 --depths 512,4096 \
            --json "$out/$day-h200-bench-$shape-$w.json"
    done
done
python -m engine.cli bench --synthetic 9b --weights q6_k --prompts 512,4096 --depths 512,4096 \
    --json "$out/$day-h200-bench-9b-q6_k.json"
