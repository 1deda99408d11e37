// Gated full attention over the fp16 KV cache (spec §6.5): flash decode (one new token), flash prefill
// (any number of new tokens, causal: prompt chunks and speculative-verify batches alike), both split
// over the context with fp32 partials, and one merge kernel that combines the partials and applies the
// sigmoid output gate (optionally quantising the result to Q8_1 for the out-projection GEMV).
//
// Layouts (shared with norm_rope.cu's attn_prep, which writes q and the cache):
//   q        [T][n_head][Dh] fp32, normed and rotated, not scaled
//   caches   [n_head_kv][capacity][Dh] fp16 per layer; the T new tokens are already at rows pos..pos+T-1
//   partials part_m/part_l [T*n_head][n_splits], part_o [T*n_head][n_splits][Dh], fp32; a split holds
//            m = max score, l = sum exp(score - m), o = sum exp(score - m) * v over its keys, or
//            m = -inf, l = 0 (o not written) when it has no visible key
// Query head h reads KV head h / G, G = n_head / n_head_kv (HF repeat_kv). Token t of the batch sees
// cache rows [0, pos + t] (pos = step[RIGLLM_STEP_POS]). The context is cut into n_splits equal chunks
// (multiples of FLASH_SPLIT_ALIGN = 64 keys, attention_tile.cuh) computed from the current length read
// on the device, so a launch with a fixed grid serves every length and can be captured in a CUDA graph;
// splits with nothing to do exit at once. A decode launch may be slot-indexed (common.cuh, issue 28): token t
// is then one row of a batched step and reads slot row_slot[t]'s caches and position instead.
#include <cuda_fp16.h>
#include "activations.cuh"
#include "attention_tile.cuh"
#include "decode_merge.cuh"
#include "q8_1_warp.cuh"

#define ATTN_NEG_INF __int_as_float(0xff800000)  // -inf

// ---------------------------------------------------------------------------------------------
// Flash decode: one new token per query (a decode step, or each token of a few-token verify, see
// rigllm::decode_block). Block = (token, KV head, split), DECODE_WARPS warps; each warp walks
// its keys DECODE_KEYS at a time, one key row per warp (lane l holds dims [l*Dh/32, (l+1)*Dh/32), so
// a key row is one coalesced load), and keeps its own online softmax for all G query heads of the KV
// head: K and V are read once for the whole group. The warps' states are merged in shared memory and
// written as one partial per (query head, split). Templated on Dh and G so the per-lane q and
// output accumulators stay in registers.
constexpr int DECODE_WARPS = 4;
constexpr int DECODE_KEYS = 2;

template <int DH, int G>
__device__ __forceinline__ void attn_decode(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                            const __half* __restrict__ v_cache, const int* __restrict__ step,
                                            const int* __restrict__ row_slot,
                                            const unsigned long long* __restrict__ slot_ptrs,
                                            float* __restrict__ part_m, float* __restrict__ part_l,
                                            float* __restrict__ part_o, int capacity, int n_splits, float scale,
                                            int share) {
    constexpr int DPL = DH / 32;  // dims per lane
    __shared__ float sh_m[DECODE_WARPS][G];
    __shared__ float sh_l[DECODE_WARPS][G];
    __shared__ float sh_o[DECODE_WARPS][G][DH];

    const rigllm::DecodeBlock blk = rigllm::decode_block(step, n_splits, G, capacity, share, row_slot);
    if (row_slot != nullptr) {  // a slot-indexed step: this row's sequence's cache (common.cuh)
        k_cache = rigllm::slot_ptr<const __half>(slot_ptrs, row_slot, blk.token, RIGLLM_KV_SLOT_PTRS, 0);
        v_cache = rigllm::slot_ptr<const __half>(slot_ptrs, row_slot, blk.token, RIGLLM_KV_SLOT_PTRS, 2);
    }
    const int kv_head = blk.kv_head;
    int start, end;
    flash::split_range(blk.kv_len, n_splits, blk.split, &start, &end);
    const size_t first_row = blk.first_row;  // partial row of the block's first query head
    if (start >= end) {
        if (threadIdx.x < G) {
            part_m[first_row + threadIdx.x * n_splits] = ATTN_NEG_INF;
            part_l[first_row + threadIdx.x * n_splits] = 0.f;
        }
        return;
    }

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    float qr[G][DPL];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < DPL; ++i) qr[g][i] = q[(blk.q_row + g) * DH + lane * DPL + i] * scale;

    float m[G], l[G], o[G][DPL];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = ATTN_NEG_INF;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) o[g][i] = 0.f;
    }

    const size_t head_base = (size_t)kv_head * capacity * DH + lane * DPL;
    for (int base = start + warp * DECODE_KEYS; base < end; base += DECODE_WARPS * DECODE_KEYS) {
        float kf[DECODE_KEYS][DPL], vf[DECODE_KEYS][DPL];
#pragma unroll
        for (int kk = 0; kk < DECODE_KEYS; ++kk) {
            const int key = min(base + kk, end - 1);  // a clamped duplicate is masked below
            flash::load_halves<DPL>(k_cache + head_base + (size_t)key * DH, kf[kk]);
            flash::load_halves<DPL>(v_cache + head_base + (size_t)key * DH, vf[kk]);
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float s[DECODE_KEYS];
            float tile_max = ATTN_NEG_INF;
#pragma unroll
            for (int kk = 0; kk < DECODE_KEYS; ++kk) {
                float acc = 0.f;
#pragma unroll
                for (int i = 0; i < DPL; ++i) acc = fmaf(qr[g][i], kf[kk][i], acc);
                acc = rigllm::warp_sum(acc);
                s[kk] = base + kk < end ? acc : ATTN_NEG_INF;
                tile_max = fmaxf(tile_max, s[kk]);
            }
            const float m_new = fmaxf(m[g], tile_max);  // finite: key `base` is always valid
            const float corr = __expf(m[g] - m_new);
            l[g] *= corr;
#pragma unroll
            for (int i = 0; i < DPL; ++i) o[g][i] *= corr;
#pragma unroll
            for (int kk = 0; kk < DECODE_KEYS; ++kk) {
                const float p = __expf(s[kk] - m_new);
                l[g] += p;
#pragma unroll
                for (int i = 0; i < DPL; ++i) o[g][i] = fmaf(p, vf[kk][i], o[g][i]);
            }
            m[g] = m_new;
        }
    }

    flash::merge_warp_states<DECODE_WARPS, G, DH, DPL>(
        sh_m, sh_l, sh_o, m, l, o, [&](int g, int dim, float acc, float m_max, float l_sum) {
            const size_t row = first_row + (size_t)g * n_splits;
            part_o[row * DH + dim] = acc;
            if (dim == 0) {
                part_m[row] = m_max;
                part_l[row] = l_sum;
            }
        });
}

// ---------------------------------------------------------------------------------------------
// Flash prefill: T new tokens, causal, attention_tile.cuh's tile loop over the fp16 cache. Block = (query
// tile, KV head, split), FLASH_THREADS threads; a query tile is FLASH_BQ consecutive rows r = t*G + g of
// one KV head (all G heads of a token side by side), walking its split's keys FLASH_BK at a time.
template <int DH>
__device__ __forceinline__ void attn_prefill(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                             const __half* __restrict__ v_cache, const int* __restrict__ step,
                                             float* __restrict__ part_m, float* __restrict__ part_l,
                                             float* __restrict__ part_o, int n_tokens, int n_head, int n_head_kv,
                                             int capacity, int n_splits, float scale) {
    const flash::DenseRows rows(step, n_tokens, n_head, n_head_kv, capacity, n_splits);
    const size_t head_base = (size_t)rows.kv_head * capacity * DH;
    flash::prefill<DH, DH, DH>(q, rows, flash::HalfCache<DH>{k_cache + head_base, v_cache + head_base},
                               flash::Partials{part_m, part_l, part_o, n_splits}, scale);
}

// ---------------------------------------------------------------------------------------------
// Merge + output gate: one block of Dh threads per (token, query head), grid = T * n_head.
//   o = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s   over splits with a visible key (M = max m_s)
//   y = o * sigmoid(gate)   gate element (t, h, d) at gate[t*gate_row_stride + h*gate_head_stride + d]
//                           (read straight from the q GEMV output: gate = qg + Dh, strides 2*H*Dh and
//                           2*Dh; or from a separate [T][H*Dh] buffer: strides H*Dh and Dh)
// y goes to `y` [T][H*Dh] fp32 and/or (yq, yd) Q8_1 for the out-projection GEMV; either may be null.
extern "C" __global__ void attn_merge_gate(const float* __restrict__ part_m, const float* __restrict__ part_l,
                                           const float* __restrict__ part_o, int n_splits,
                                           const float* __restrict__ gate, int gate_row_stride,
                                           int gate_head_stride, int n_head, float* __restrict__ y,
                                           signed char* __restrict__ yq, float* __restrict__ yd) {
    const int head_dim = blockDim.x;
    const int d = threadIdx.x;
    const size_t row = blockIdx.x;  // t * n_head + h
    const int t = (int)(row / n_head);
    const int h = (int)(row - (size_t)t * n_head);
    // the gate element first: its load overlaps the merge instead of following it
    const float gate_x = gate[(size_t)t * gate_row_stride + (size_t)h * gate_head_stride + d];
    const float* pm = part_m + row * n_splits;
    const float* pl = part_l + row * n_splits;
    // The block finds the largest split maximum and the last split with a visible key together (each thread
    // over every head_dim-th split, then across the block): a maximum has the same bits in any order, and
    // the splits past the last visible one add nothing. Each thread then sums only splits 0..last, in order,
    // as before. The launch's splits are sized for the card (99 for the 9B on the H200) and a short context
    // fills few of them (8 at 512 keys): walking all of them twice, serially, cost 6.4 us per merge, 3.8 after
    // (H200, 9B decode at 512 keys, 2026-12-03).
    // Up to 32 splits (a prefill's are at most 8) are cheaper walked by each thread than found by the block, whose
    // barrier cost a 256-token prefill chunk's merges 90 -> 113 us on the 9B: there every thread walks them all.
    __shared__ float block_max[32];
    __shared__ int block_last[32];
    float m_max = ATTN_NEG_INF;
    int last = n_splits - 1;
    if (n_splits <= 32) {
        for (int s = 0; s < n_splits; ++s) m_max = fmaxf(m_max, pm[s]);
    } else {  // uniform over the block: every thread takes this branch or none does
        last = -1;
        for (int s = d; s < n_splits; s += head_dim) {
            m_max = fmaxf(m_max, pm[s]);
            if (pm[s] != ATTN_NEG_INF) last = s;
        }
        m_max = rigllm::warp_max(m_max);
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1)
            last = max(last, __shfl_xor_sync(RIGLLM_FULL_MASK, last, offset));
        if ((d & 31) == 0) {
            block_max[d >> 5] = m_max;
            block_last[d >> 5] = last;
        }
        __syncthreads();
        for (int w = 0; w < (head_dim >> 5); ++w) {
            m_max = fmaxf(m_max, block_max[w]);
            last = max(last, block_last[w]);
        }
    }
    float acc = 0.f, l_sum = 0.f;
    for (int s = 0; s <= last; ++s) {
        if (pm[s] == ATTN_NEG_INF) continue;
        const float f = expf(pm[s] - m_max);
        l_sum = fmaf(f, pl[s], l_sum);
        acc = fmaf(f, part_o[(row * n_splits + s) * head_dim + d], acc);
    }
    const float o = l_sum > 0.f ? acc / l_sum : 0.f;
    const float out = o * rigllm::sigmoid(gate_x);
    const size_t idx = row * head_dim + d;
    if (y != nullptr) y[idx] = out;
    if (yq != nullptr) q8_1_quantize_warp(out, yq + idx, yd + idx / 32);
}

// ---------------------------------------------------------------------------------------------
// Entry points. Decode: attn_decode_d<Dh>_g<G>, grid = (T, n_head_kv * n_splits), block = 32*DECODE_WARPS.
// Prefill: attn_prefill_d<Dh>, grid = ceil(T*G / FLASH_BQ) * n_head_kv * n_splits, block = FLASH_THREADS.
// `scale` is 1/sqrt(Dh) (passed so the host states it once). Instantiated for Dh 32, 64, 128, 256 and G 1,
// 2, 4, 6, 8: Dh 256 with G 4 or 6 is every Qwen3.5/3.6 size, Dh 32/64 with G 1, 2, 4 are the tiny test
// models and the demo model, Dh 128 with G 2 the trained fixtures (tests/fixtures/trained), G 8 is
// headroom. Each pair costs compile time on six architectures, so add one only for a model that needs it. Choosing n_splits: enough blocks to fill
// the card (decode: n_head_kv * n_splits around 3x the SM count; prefill: multiply the q tiles up to
// about 2x); split boundaries are multiples of FLASH_SPLIT_ALIGN keys, so short contexts use fewer splits.
#define ATTN_DECODE_ENTRY(DH, G)                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * DECODE_WARPS, 2) attn_decode_d##DH##_g##G(          \
        const float* __restrict__ q, const __half* __restrict__ k_cache, const __half* __restrict__ v_cache, \
        const int* __restrict__ step, const int* __restrict__ row_slot,                                   \
        const unsigned long long* __restrict__ slot_ptrs, float* __restrict__ part_m,                     \
        float* __restrict__ part_l, float* __restrict__ part_o, int capacity, int n_splits, float scale) { \
        attn_decode<DH, G>(q, k_cache, v_cache, step, row_slot, slot_ptrs, part_m, part_l, part_o, capacity, \
                           n_splits, scale, 1);                                                            \
    }

#define ATTN_DECODE_ENTRIES(DH) \
    ATTN_DECODE_ENTRY(DH, 1)    \
    ATTN_DECODE_ENTRY(DH, 2)    \
    ATTN_DECODE_ENTRY(DH, 4)    \
    ATTN_DECODE_ENTRY(DH, 6)    \
    ATTN_DECODE_ENTRY(DH, 8)

ATTN_DECODE_ENTRIES(32)
ATTN_DECODE_ENTRIES(64)
ATTN_DECODE_ENTRIES(128)
ATTN_DECODE_ENTRIES(256)

// Any other group size G' (a valid model may carry 3, 5, 7, ... query heads per KV head): attn_decode_d<Dh>_gany,
// grid (T, n_head * n_splits), one query head per block (rigllm::decode_block with share = G'), so each
// KV row is read G' times instead of once: slower, the same partials layout and the same math.
#define ATTN_DECODE_ANY_GROUP_ENTRY(DH)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * DECODE_WARPS, 2) attn_decode_d##DH##_gany(          \
        const float* __restrict__ q, const __half* __restrict__ k_cache, const __half* __restrict__ v_cache, \
        const int* __restrict__ step, const int* __restrict__ row_slot,                                   \
        const unsigned long long* __restrict__ slot_ptrs, float* __restrict__ part_m,                     \
        float* __restrict__ part_l, float* __restrict__ part_o, int capacity, int n_splits, float scale,  \
        int group) {                                                                                       \
        attn_decode<DH, 1>(q, k_cache, v_cache, step, row_slot, slot_ptrs, part_m, part_l, part_o, capacity, \
                           n_splits, scale, group);                                                        \
    }

ATTN_DECODE_ANY_GROUP_ENTRY(32)
ATTN_DECODE_ANY_GROUP_ENTRY(64)
ATTN_DECODE_ANY_GROUP_ENTRY(128)
ATTN_DECODE_ANY_GROUP_ENTRY(256)

#define ATTN_PREFILL_ENTRY(DH)                                                                             \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS, 2) attn_prefill_d##DH(                        \
        const float* __restrict__ q, const __half* __restrict__ k_cache, const __half* __restrict__ v_cache, \
        const int* __restrict__ step, float* __restrict__ part_m, float* __restrict__ part_l,             \
        float* __restrict__ part_o, int n_tokens, int n_head, int n_head_kv, int capacity, int n_splits,  \
        float scale) {                                                                                     \
        attn_prefill<DH>(q, k_cache, v_cache, step, part_m, part_l, part_o, n_tokens, n_head, n_head_kv,  \
                         capacity, n_splits, scale);                                                       \
    }

ATTN_PREFILL_ENTRY(32)
ATTN_PREFILL_ENTRY(64)
ATTN_PREFILL_ENTRY(128)
ATTN_PREFILL_ENTRY(256)
