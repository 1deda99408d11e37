// Shared device helpers for every kernel family: warp reductions, DP4A dots of 16 int8 pairs, and the layout
// of the per-step buffer that CUDA-graph replays read (contracts.md "CUDA graphs").
//
// Rules for everything under cuda_src/ (architecture.md, contracts.md): compiles for compute_70 with NVRTC 12.9;
// no tensor-core instruction (engine/cuda/kernel_limits.py lists the banned opcodes); no <stdint.h> (NVRTC cannot open it: use <cuda/std/cstdint>
// or plain int/long long); size_t for offsets that can pass 2^31; no grid.y/grid.z that grows with context.
#pragma once

#include <cuda_fp16.h>

#define RIGLLM_FULL_MASK 0xffffffffu

// Per-step values live in a small int32 device buffer written before each graph replay, so a captured graph
// never bakes a position or length. Slot indices (the Python writer mirrors them):
#define RIGLLM_STEP_POS 0       // position of the first token of this batch
#define RIGLLM_STEP_N_TOKENS 1  // tokens in this batch

namespace rigllm {

// Where a flash-decode block works: grid (T, n_head_kv * n_splits), block (token, KV head, split). Token t
// of the batch (a decode step has T = 1; a speculative verify a few) sees cache rows [0, pos + t], so each
// token's partials equal a one-token decode's at its position, bit for bit. The T blocks that read the same
// keys are launch neighbours, so the second read of a key row is an L2 hit.
// Any-group kernels (a group size without its own instantiation) run with group = 1 and share = the real
// group: grid (T, n_head * n_splits), one query head per block, which reads KV head (query head / share).
struct DecodeBlock {
    int token, kv_head, split;
    int kv_len;        // keys visible to this token
    size_t q_row;      // query row of the KV head's first query head: t * n_head + kv_head * group
    size_t first_row;  // its partial row: q_row * n_splits + split
};

__device__ __forceinline__ DecodeBlock decode_block(const int* __restrict__ step, int n_splits, int group,
                                                    int capacity, int share = 1) {
    DecodeBlock b;
    b.token = blockIdx.x;
    const int unit = blockIdx.y / n_splits;  // the block's KV head, or its query head when share > 1
    b.kv_head = unit / share;
    b.split = blockIdx.y - unit * n_splits;
    b.kv_len = min(step[RIGLLM_STEP_POS] + 1 + b.token, capacity);
    b.q_row = ((size_t)b.token * (gridDim.y / n_splits) + unit) * group;
    b.first_row = b.q_row * n_splits + b.split;
    return b;
}

// Sum / max over the 32 lanes of a warp; every lane gets the result. All 32 lanes must call it.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(RIGLLM_FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(RIGLLM_FULL_MASK, v, offset));
    return v;
}

// Max over aligned groups of GROUP lanes (GROUP a power of two <= 32); every lane of a group gets its group's
// max. All 32 lanes must call it.
template <int GROUP>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
    for (int offset = GROUP / 2; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(RIGLLM_FULL_MASK, v, offset));
    return v;
}

// Dot product of 16 int8 pairs added to acc, exactly (int32).
__device__ __forceinline__ int dot_int8x16(int4 a, int4 b, int acc) {
    acc = __dp4a(a.x, b.x, acc);
    acc = __dp4a(a.y, b.y, acc);
    acc = __dp4a(a.z, b.z, acc);
    acc = __dp4a(a.w, b.w, acc);
    return acc;
}

}  // namespace rigllm
