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
#define RIGLLM_STEP_INTS 2      // ints of one sequence's record (a slot's record follows the previous slot's)

// A slot-indexed decode step (issue 28): row t of a launch is one token of the sequence in slot row_slot[t],
// whose step record is step + RIGLLM_STEP_INTS * slot and whose buffers of the layer are the table entries
// slot_ptrs[slot * n + i] (engine/cuda/slot_batch.py writes them once: every slot's state stays where it was
// allocated). So one captured graph per batch width serves any set of slots: only row_slot changes between
// replays. row_slot == nullptr: the launch's rows are consecutive tokens of the one sequence passed directly.
#define RIGLLM_GDN_SLOT_PTRS 2  // a GDN layer's table entries per slot: conv state, recurrent state
#define RIGLLM_KV_SLOT_PTRS 4   // an attention layer's: K codes, K side, V codes, V side (fp16: codes only)

namespace rigllm {

// The step record of row t (see RIGLLM_STEP_INTS): its slot's in a slot-indexed launch, else the one passed.
__device__ __forceinline__ const int* slot_step(const int* step, const int* __restrict__ row_slot, int t) {
    return row_slot != nullptr ? step + RIGLLM_STEP_INTS * row_slot[t] : step;
}

// Table entry i of row t's slot (n entries per slot), as a typed pointer.
template <typename T>
__device__ __forceinline__ T* slot_ptr(const unsigned long long* __restrict__ slot_ptrs, const int* __restrict__ row_slot,
                                       int t, int n, int i) {
    return reinterpret_cast<T*>(slot_ptrs[(size_t)row_slot[t] * n + i]);
}

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
                                                    int capacity, int share, const int* __restrict__ row_slot) {
    DecodeBlock b;
    b.token = blockIdx.x;
    const int unit = blockIdx.y / n_splits;  // the block's KV head, or its query head when share > 1
    b.kv_head = unit / share;
    b.split = blockIdx.y - unit * n_splits;
    // a slot-indexed row is its sequence's only new token; a verify's token t sees t more rows
    const int ahead = row_slot != nullptr ? 0 : b.token;
    b.kv_len = min(slot_step(step, row_slot, b.token)[RIGLLM_STEP_POS] + 1 + ahead, capacity);
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

// An integer dot product read as a float without a conversion instruction. Conversions issue at a fraction of
// the rate of the integer and fp32 arithmetic around them, and the GEMV converted once per 16-byte slice, per
// row and token: with this form the 8-token GEMVs of a 9B step took 2,969 us against 3,352 (H200, 2026-12-03,
// together with gemv_warp_store's reduce-scatter). Instead the DP4A chain starts from DOT_FLOAT_BIAS, the bits of
// 1.5 * 2^23: adding an integer s with |s| < 2^22 to those bits only changes the mantissa, so the bits read as
// a float are exactly 12582912 + s, and one fp32 subtraction (exact: both are multiples of 1 below 2^24)
// returns exactly (float)s, the same bits I2F gives. Every caller's sum is far below 2^22: 32 products of
// int8 values (|q| <= 128, Q8_1 activations <= 127) stay under 32 * 128 * 127 = 520,192.
constexpr int DOT_FLOAT_BIAS = 0x4B400000;

__device__ __forceinline__ float biased_dot_to_float(int biased) {
    return __int_as_float(biased) - 12582912.0f;
}

// Prefetches into L2 block `part` of `parts`'s share of the 128-byte lines of [p, p + bytes). The decode step's short
// kernels (norms, SwiGLU, the GDN recurrence, attention prep) leave HBM idle for microseconds each; they prefetch the
// leading bytes of the weight the next GEMV reads, so that GEMV's first loads hit L2 (engine/cuda/l2_prefetch.py).
// A prefetch fills no register and no instruction waits on it, yet 7.5 MiB issued by the 8 blocks of a decode RMSNorm
// made it 4.8 us longer (H200, s17b: an SM issues only so many lines a microsecond, or a block leaves only once its
// lines have arrived; not separated), so kernels with small grids give the prefetch blocks of its own
// (prefetch_part below), one or more on every SM.
// p null or bytes 0: nothing.
__device__ __forceinline__ void prefetch_l2(const char* p, long long bytes, long long part, long long parts) {
    if (p == nullptr) return;
    const long long threads = (long long)blockDim.x * blockDim.y * blockDim.z;
    const long long thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
#pragma unroll 1
    for (long long off = (part * threads + thread) * 128; off < bytes; off += parts * threads * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
}

// A kernel whose own grid is (gx, gy) (gy = 1 for a 1-D one) launched as (gx, gy, 1 + extra): the blocks with
// blockIdx.z > 0 only prefetch, and this returns true for them, so the kernel returns at once. Its own blocks
// (z = 0) prefetch nothing: their loads never queue behind the prefetch.
__device__ __forceinline__ bool prefetch_part(const char* p, long long bytes) {
    if (blockIdx.z == 0) return false;
    const long long plane = (long long)gridDim.x * gridDim.y;
    prefetch_l2(p, bytes, (blockIdx.z - 1) * plane + blockIdx.y * gridDim.x + blockIdx.x, (gridDim.z - 1) * plane);
    return true;
}

}  // namespace rigllm
