// Attention over the quantised KV cache (formats k8v8, k8v4, k8v3, k4v4, k3v3; the f16 cache stays with
// attention.cu): append (encode new rows), q rotation, flash decode and flash prefill that read the
// stored codes directly (the history is never expanded to fp16), writing the same fp32 split partials
// as attention.cu so its attn_merge_gate combines them and applies the output gate.
//
// Storage and the attention domain: kv_cache.cuh. The rotated-domain trick: for a wht K side the
// kernels score kv_rotate_q's rotated q against centroid * norm; for a wht V side they sum
// p * centroid * norm in the rotated domain and un-rotate each split's output once, in shared memory,
// before writing it (the merge is linear, so un-rotating per split equals un-rotating the merged
// output; it costs one 128-point transform per (query head, split) instead of one per key).
//
// Step buffer, split ranges and partial layouts are attention.cu's (see there): token t of a batch at
// pos = step[RIGLLM_STEP_POS] sees cache rows [0, pos + t]; grids depend only on batch size and split
// count, so decode launches can be captured in a CUDA graph. Append and decode may be slot-indexed (common.cuh,
// issue 28): row t then writes or reads slot row_slot[t]'s cache at that slot's position.
#include <cuda_fp16.h>
#include "common.cuh"
#include "decode_merge.cuh"
#include "kv_cache.cuh"
#include "kv_tile.cuh"

#define KV_NEG_INF __int_as_float(0xff800000)

// ---------------------------------------------------------------------------------------------
// Append: encode T new rows of one cache side. Source: fp16 staging rows [n_head_kv][src_rows][Dh] (what
// attn_prep writes when its cache is a staging buffer: row t = token t of the batch). Destination rows
// pos + t of codes/side (rows past the capacity are dropped, as attn_prep does). Grid T * n_head_kv,
// block KV_ENCODE_THREADS (= one 128-block, or four int8 32-blocks, per pass).
constexpr int KV_ENCODE_THREADS = 128;

template <int C>
__device__ __forceinline__ void kv_encode(const __half* __restrict__ src, int src_rows, const int* __restrict__ step,
                                          const int* __restrict__ row_slot,
                                          const unsigned long long* __restrict__ slot_ptrs,
                                          unsigned char* __restrict__ codes, __half* __restrict__ side,
                                          int n_head_kv, int head_dim, int capacity, const float* __restrict__ tables) {
    __shared__ float buf[kv::BLOCK];
    __shared__ float warp_part[KV_ENCODE_THREADS / 32];
    const int t = blockIdx.x / n_head_kv;
    const int head = blockIdx.x - t * n_head_kv;
    int row = step[RIGLLM_STEP_POS] + t;
    if (row_slot != nullptr) {  // slot-indexed (common.cuh): slot_ptrs points at this side's codes, side pair
        row = rigllm::slot_step(step, row_slot, t)[RIGLLM_STEP_POS];
        codes = rigllm::slot_ptr<unsigned char>(slot_ptrs, row_slot, t, RIGLLM_KV_SLOT_PTRS, 0);
        side = rigllm::slot_ptr<__half>(slot_ptrs, row_slot, t, RIGLLM_KV_SLOT_PTRS, 1);
    }
    if (row >= capacity) return;
    const __half* x = src + ((size_t)head * src_rows + t) * head_dim;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t out_row = (size_t)head * capacity + row;

    if constexpr (C == kv::INT8) {
        unsigned char* q = codes + out_row * head_dim;
        for (int d = tid; d < head_dim; d += KV_ENCODE_THREADS) {  // head_dim % 32 == 0: whole warps
            const float v = __half2float(x[d]);
            const float amax = rigllm::warp_max(fabsf(v));
            const __half d16 = __float2half_rn(amax / 127.0f);
            const float scale = __half2float(d16);
            int c = scale > 0.f ? __float2int_rn(v / scale) : 0;
            c = max(-127, min(127, c));
            q[d] = (unsigned char)(signed char)c;
            if (lane == 0) side[out_row * (head_dim / 32) + (d >> 5)] = d16;
        }
    } else {
        const int n_blocks = (head_dim + kv::BLOCK - 1) / kv::BLOCK;
        const float* bounds = tables + kv::table_boundaries(C);
        unsigned char* out = codes + out_row * (size_t)(n_blocks * 16 * (C == kv::WHT4 ? 4 : 3));
        for (int blk = 0; blk < n_blocks; ++blk) {
            const int d = blk * kv::BLOCK + tid;
            const float v = d < head_dim ? __half2float(x[d]) : 0.f;
            __syncthreads();  // the previous block's buf reads are done
            buf[tid] = v * tables[kv::TABLE_SIGNS + tid];
            kv::fwht_shared(buf, 1, tid, KV_ENCODE_THREADS);
            const float y = buf[tid] * kv::INV_SQRT_BLOCK;
            const float sq = rigllm::warp_sum(y * y);
            if (lane == 0) warp_part[warp] = sq;
            __syncthreads();
            const float norm = sqrtf((warp_part[0] + warp_part[1]) + (warp_part[2] + warp_part[3]));
            const float u = norm > 0.f ? y / norm : 0.f;
            int code = 0;
#pragma unroll
            for (int i = 0; i < kv::levels(C) - 1; ++i) code += u > bounds[i];
            if constexpr (C == kv::WHT4) {
                const int next = __shfl_down_sync(RIGLLM_FULL_MASK, code, 1);
                if ((tid & 1) == 0) out[blk * 64 + (tid >> 1)] = (unsigned char)(code | (next << 4));
            } else {
#pragma unroll
                for (int b = 0; b < 3; ++b) {
                    const unsigned int plane = __ballot_sync(RIGLLM_FULL_MASK, (code >> b) & 1);
                    if (lane == 0) *reinterpret_cast<unsigned int*>(out + blk * 48 + b * 16 + warp * 4) = plane;
                }
            }
            if (tid == 0) side[out_row * n_blocks + blk] = __float2half_rn(norm);
        }
    }
}

extern "C" __global__ void __launch_bounds__(KV_ENCODE_THREADS) kv_encode_int8(
    const __half* __restrict__ src, int src_rows, const int* __restrict__ step, const int* __restrict__ row_slot,
    const unsigned long long* __restrict__ slot_ptrs, unsigned char* __restrict__ codes, __half* __restrict__ side,
    int n_head_kv, int head_dim, int capacity, const float* __restrict__ tables) {
    kv_encode<kv::INT8>(src, src_rows, step, row_slot, slot_ptrs, codes, side, n_head_kv, head_dim, capacity, tables);
}
extern "C" __global__ void __launch_bounds__(KV_ENCODE_THREADS) kv_encode_wht4(
    const __half* __restrict__ src, int src_rows, const int* __restrict__ step, const int* __restrict__ row_slot,
    const unsigned long long* __restrict__ slot_ptrs, unsigned char* __restrict__ codes, __half* __restrict__ side,
    int n_head_kv, int head_dim, int capacity, const float* __restrict__ tables) {
    kv_encode<kv::WHT4>(src, src_rows, step, row_slot, slot_ptrs, codes, side, n_head_kv, head_dim, capacity, tables);
}
extern "C" __global__ void __launch_bounds__(KV_ENCODE_THREADS) kv_encode_wht3(
    const __half* __restrict__ src, int src_rows, const int* __restrict__ step, const int* __restrict__ row_slot,
    const unsigned long long* __restrict__ slot_ptrs, unsigned char* __restrict__ codes, __half* __restrict__ side,
    int n_head_kv, int head_dim, int capacity, const float* __restrict__ tables) {
    kv_encode<kv::WHT3>(src, src_rows, step, row_slot, slot_ptrs, codes, side, n_head_kv, head_dim, capacity, tables);
}

// ---------------------------------------------------------------------------------------------
// q into the rotated domain, once per (token, query head): q [n_rows][Dh] fp32 (attn_prep's q_out, rows =
// T * n_head) → q_rot [n_rows][ceil(Dh/128)*128] = R q (zero-padded). Grid n_rows, block 128.
extern "C" __global__ void __launch_bounds__(kv::BLOCK) kv_rotate_q(const float* __restrict__ q,
                                                                     float* __restrict__ q_rot, int head_dim,
                                                                     const float* __restrict__ tables) {
    __shared__ float buf[kv::BLOCK];
    const int tid = threadIdx.x;
    const int n_blocks = (head_dim + kv::BLOCK - 1) / kv::BLOCK;
    const float* x = q + (size_t)blockIdx.x * head_dim;
    float* y = q_rot + (size_t)blockIdx.x * n_blocks * kv::BLOCK;
    for (int blk = 0; blk < n_blocks; ++blk) {
        const int d = blk * kv::BLOCK + tid;
        __syncthreads();
        buf[tid] = (d < head_dim ? x[d] : 0.f) * tables[kv::TABLE_SIGNS + tid];
        kv::fwht_shared(buf, 1, tid, kv::BLOCK);
        y[d] = buf[tid] * kv::INV_SQRT_BLOCK;
    }
}

// ---------------------------------------------------------------------------------------------
// Flash decode (T = 1), attention.cu's attn_decode over stored codes. Block = (KV head, split), 4 warps;
// each warp takes KEYS key rows per step (all loaded, packed, before any is expanded), lane l holding
// domain dims [l*KPL, (l+1)*KPL) of K and [l*VPL, (l+1)*VPL) of V. q: the K domain's q rows [n_head][DWK]
// (kv_rotate_q's output for wht K, attn_prep's q_out for int8 K), unscaled.
constexpr int KV_DECODE_WARPS = 4;
// Rows a warp loads before using any (packed, a few registers each): quantised rows are small, so a
// warp needs many in flight to cover memory latency at ~3 blocks per SM; fewer for wide groups,
// whose per-key scores take registers (G 6 and 8 stay at 2 so the kernel keeps <= 170 registers for
// 3 blocks per SM; G 4 with 4 keys uses <= 167).
__host__ __device__ constexpr int kv_decode_keys(int group) { return group <= 4 ? 4 : 2; }

template <int KC, int VC, int DH, int G>
__device__ __forceinline__ void kv_decode(const float* __restrict__ q, kv::Side<KC, DH> k_side, kv::Side<VC, DH> v_side,
                                          const int* __restrict__ step, const int* __restrict__ row_slot,
                                          const unsigned long long* __restrict__ slot_ptrs, float* __restrict__ part_m,
                                          float* __restrict__ part_l, float* __restrict__ part_o, int n_splits,
                                          float scale, const float* __restrict__ tables, int share) {
    constexpr int DWK = kv::domain(KC, DH), DWV = kv::domain(VC, DH);
    constexpr int KPL = DWK / 32, VPL = DWV / 32;
    constexpr int KEYS = kv_decode_keys(G);
    __shared__ float sh_m[KV_DECODE_WARPS][G];
    __shared__ float sh_l[KV_DECODE_WARPS][G];
    __shared__ __align__(16) float sh_o[KV_DECODE_WARPS][G][DWV];
    __shared__ float k_centroids[16], v_centroids[16], signs[kv::BLOCK];

    const int capacity = k_side.capacity;
    const rigllm::DecodeBlock blk = rigllm::decode_block(step, n_splits, G, capacity, share, row_slot);
    if (row_slot != nullptr) {  // a slot-indexed step: this row's sequence's cache (common.cuh)
        k_side.codes = rigllm::slot_ptr<const unsigned char>(slot_ptrs, row_slot, blk.token, RIGLLM_KV_SLOT_PTRS, 0);
        k_side.side = rigllm::slot_ptr<const __half>(slot_ptrs, row_slot, blk.token, RIGLLM_KV_SLOT_PTRS, 1);
        v_side.codes = rigllm::slot_ptr<const unsigned char>(slot_ptrs, row_slot, blk.token, RIGLLM_KV_SLOT_PTRS, 2);
        v_side.side = rigllm::slot_ptr<const __half>(slot_ptrs, row_slot, blk.token, RIGLLM_KV_SLOT_PTRS, 3);
    }
    const int kv_head = blk.kv_head;
    int start, end;
    flash::split_range(blk.kv_len, n_splits, blk.split, &start, &end);
    const size_t first_row = blk.first_row;
    if (start >= end) {
        if (threadIdx.x < G) {
            part_m[first_row + threadIdx.x * n_splits] = KV_NEG_INF;
            part_l[first_row + threadIdx.x * n_splits] = 0.f;
        }
        return;
    }
    load_centroids(k_centroids, KC, tables);
    load_centroids(v_centroids, VC, tables);
    if (kv::rotated(VC)) signs[threadIdx.x] = tables[kv::TABLE_SIGNS + threadIdx.x];  // blockDim == 128
    __syncthreads();

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const kv::HeadRows<KC, DH> k_rows = k_side.head(kv_head);
    const kv::HeadRows<VC, DH> v_rows = v_side.head(kv_head);
    float qr[G][KPL];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < KPL; ++i) qr[g][i] = q[(blk.q_row + g) * DWK + lane * KPL + i] * scale;

    float m[G], l[G], o[G][VPL];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = KV_NEG_INF;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < VPL; ++i) o[g][i] = 0.f;
    }

    for (int base = start + warp * KEYS; base < end; base += KV_DECODE_WARPS * KEYS) {
        kv::Packed<KC, KPL> kp[KEYS];
        kv::Packed<VC, VPL> vp[KEYS];
#pragma unroll
        for (int kk = 0; kk < KEYS; ++kk) {  // all KEYS rows in flight before any is used
            const int key = min(base + kk, end - 1);  // a clamped duplicate is masked below
            kv::load_packed<KC, KPL>(k_rows.code_row(key), k_rows.side_row(key), lane * KPL, kp[kk]);
            kv::load_packed<VC, VPL>(v_rows.code_row(key), v_rows.side_row(key), lane * VPL, vp[kk]);
        }
        float s[G][KEYS];  // scores, then softmax weights
#pragma unroll
        for (int kk = 0; kk < KEYS; ++kk) {
            float kf[KPL];
            kv::expand<KC, KPL>(kp[kk], k_centroids, kf);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float acc = 0.f;
#pragma unroll
                for (int i = 0; i < KPL; ++i) acc = fmaf(qr[g][i], kf[i], acc);
                acc = rigllm::warp_sum(acc * kp[kk].scale);  // each lane's dims share one block scale
                s[g][kk] = base + kk < end ? acc : KV_NEG_INF;
            }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float tile_max = KV_NEG_INF;
#pragma unroll
            for (int kk = 0; kk < KEYS; ++kk) tile_max = fmaxf(tile_max, s[g][kk]);
            const float m_new = fmaxf(m[g], tile_max);  // finite: key `base` is always valid
            const float corr = __expf(m[g] - m_new);
            l[g] *= corr;
#pragma unroll
            for (int i = 0; i < VPL; ++i) o[g][i] *= corr;
#pragma unroll
            for (int kk = 0; kk < KEYS; ++kk) {
                s[g][kk] = __expf(s[g][kk] - m_new);
                l[g] += s[g][kk];
            }
            m[g] = m_new;
        }
#pragma unroll
        for (int kk = 0; kk < KEYS; ++kk) {
            float vf[VPL];
            kv::expand<VC, VPL>(vp[kk], v_centroids, vf);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float pv = s[g][kk] * vp[kk].scale;
#pragma unroll
                for (int i = 0; i < VPL; ++i) o[g][i] = fmaf(pv, vf[i], o[g][i]);
            }
        }
    }

    // Merge the warps into sh_o[0] (each element read and written by one thread), un-rotate, write.
    flash::merge_warp_states<KV_DECODE_WARPS, G, DWV, VPL>(
        sh_m, sh_l, sh_o, m, l, o, [&](int g, int dim, float acc, float m_max, float l_sum) {
            sh_o[0][g][dim] = acc;
            if (dim == 0) {
                const size_t row = first_row + (size_t)g * n_splits;
                part_m[row] = m_max;
                part_l[row] = l_sum;
            }
        });
    if constexpr (kv::rotated(VC)) {
        unrotate_shared(&sh_o[0][0][0], G * DWV / kv::BLOCK, signs, threadIdx.x, blockDim.x);
    } else {
        __syncthreads();
    }
    for (int idx = threadIdx.x; idx < G * DH; idx += blockDim.x) {
        const int g = idx / DH;
        const int dim = idx - g * DH;
        part_o[(first_row + (size_t)g * n_splits) * DH + dim] = sh_o[0][g][dim];
    }
}

// ---------------------------------------------------------------------------------------------
// Flash prefill, attention.cu's attn_prefill over stored codes: attention_tile.cuh's tile loop with
// kv_tile.cuh's CodeCache (block = (query tile, KV head, split), FLASH_THREADS threads, 64x64 score
// tiles, fp32 FMA). K chunks of 32 domain dims and V chunks of 16 keys are expanded from codes into
// shared memory per tile; for a wht V side the block's output rows are un-rotated 16 at a time through
// the V tile's shared memory before writing.
template <int KC, int VC, int DH>
__device__ __forceinline__ void kv_prefill(const float* __restrict__ q, kv::Side<KC, DH> k_side,
                                           kv::Side<VC, DH> v_side,
                                           const int* __restrict__ step, float* __restrict__ part_m,
                                           float* __restrict__ part_l, float* __restrict__ part_o, int n_tokens,
                                           int n_head, int n_head_kv, int n_splits, float scale,
                                           const float* __restrict__ tables) {
    __shared__ float k_centroids[16], v_centroids[16], signs[kv::BLOCK];
    const flash::DenseRows rows(step, n_tokens, n_head, n_head_kv, k_side.capacity, n_splits);
    flash::stage_code_tables(k_centroids, v_centroids, signs, KC, VC, tables);
    __syncthreads();
    const flash::CodeCache<KC, VC, DH> cache{k_side.head(rows.kv_head), v_side.head(rows.kv_head), k_centroids,
                                             v_centroids, signs};
    flash::prefill<DH, kv::domain(KC, DH), kv::domain(VC, DH)>(q, rows, cache,
                                                               flash::Partials{part_m, part_l, part_o, n_splits}, scale);
}

// ---------------------------------------------------------------------------------------------
// Entry points, one per (format, Dh[, G]): kv_decode_<fmt>_d<Dh>_g<G> (grid (T, n_head_kv * n_splits), block
// 128) and kv_prefill_<fmt>_d<Dh> (grid ceil(T*G/64) * n_head_kv * n_splits, block 256). Arguments: q in
// the K domain; K codes/side, V codes/side; step, row_slot and slot_ptrs (a slot-indexed step, common.cuh; null
// otherwise); partials; then the sizes; `tables` last.
#define KV_DECODE_ENTRY(FMT, KC, VC, DH, G)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * KV_DECODE_WARPS, 2) kv_decode_##FMT##_d##DH##_g##G(      \
        const float* __restrict__ q, const unsigned char* __restrict__ k_codes, const __half* __restrict__ k_side, \
        const unsigned char* __restrict__ v_codes, const __half* __restrict__ v_side,                          \
        const int* __restrict__ step, const int* __restrict__ row_slot,                                        \
        const unsigned long long* __restrict__ slot_ptrs, float* __restrict__ part_m, float* __restrict__ part_l, \
        float* __restrict__ part_o, int capacity, int n_splits, float scale, const float* __restrict__ tables) { \
        kv_decode<KC, VC, DH, G>(q, kv::Side<KC, DH>{k_codes, k_side, capacity},                               \
                                 kv::Side<VC, DH>{v_codes, v_side, capacity}, step, row_slot, slot_ptrs,       \
                                 part_m, part_l, part_o, n_splits, scale, tables, 1);                          \
    }

// Any other group size (see attention.cu's attn_decode_d<Dh>_gany): kv_decode_<fmt>_d<Dh>_gany, grid
// (T, n_head * n_splits), one query head per block, `group` (query heads per KV head) after `tables`.
#define KV_DECODE_ANY_GROUP_ENTRY(FMT, KC, VC, DH)                                                             \
    extern "C" __global__ void __launch_bounds__(32 * KV_DECODE_WARPS, 2) kv_decode_##FMT##_d##DH##_gany(      \
        const float* __restrict__ q, const unsigned char* __restrict__ k_codes, const __half* __restrict__ k_side, \
        const unsigned char* __restrict__ v_codes, const __half* __restrict__ v_side,                          \
        const int* __restrict__ step, const int* __restrict__ row_slot,                                        \
        const unsigned long long* __restrict__ slot_ptrs, float* __restrict__ part_m, float* __restrict__ part_l, \
        float* __restrict__ part_o, int capacity, int n_splits, float scale, const float* __restrict__ tables,  \
        int group) {                                                                                           \
        kv_decode<KC, VC, DH, 1>(q, kv::Side<KC, DH>{k_codes, k_side, capacity},                               \
                                 kv::Side<VC, DH>{v_codes, v_side, capacity}, step, row_slot, slot_ptrs,       \
                                 part_m, part_l, part_o, n_splits, scale, tables, group);                      \
    }

#define KV_PREFILL_ENTRY(FMT, KC, VC, DH)                                                                      \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS, 2) kv_prefill_##FMT##_d##DH(                   \
        const float* __restrict__ q, const unsigned char* __restrict__ k_codes, const __half* __restrict__ k_side, \
        const unsigned char* __restrict__ v_codes, const __half* __restrict__ v_side,                          \
        const int* __restrict__ step, float* __restrict__ part_m, float* __restrict__ part_l,                  \
        float* __restrict__ part_o, int n_tokens, int n_head, int n_head_kv, int capacity, int n_splits,       \
        float scale, const float* __restrict__ tables) {                                                       \
        kv_prefill<KC, VC, DH>(q, kv::Side<KC, DH>{k_codes, k_side, capacity},                                 \
                               kv::Side<VC, DH>{v_codes, v_side, capacity}, step, part_m, part_l, part_o,      \
                               n_tokens, n_head, n_head_kv, n_splits, scale, tables);                          \
    }

// Dh 256 (every Qwen3.5/3.6 size: G 4 and 6; 1, 2 and 8 as headroom) gets every group; the test-model
// widths 32 and 64 get the groups the tiny and demo models use (1, 2, 4). Each entry is ~75 KB of SASS
// per architecture, so add one only for a model that needs it.
#define KV_FORMAT_ENTRIES(FMT, KC, VC)          \
    KV_DECODE_ENTRY(FMT, KC, VC, 256, 1)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 256, 2)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 256, 4)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 256, 6)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 256, 8)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 128, 1)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 128, 2)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 128, 4)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 64, 1)         \
    KV_DECODE_ENTRY(FMT, KC, VC, 64, 2)         \
    KV_DECODE_ENTRY(FMT, KC, VC, 64, 4)         \
    KV_DECODE_ENTRY(FMT, KC, VC, 32, 1)         \
    KV_DECODE_ENTRY(FMT, KC, VC, 32, 2)         \
    KV_DECODE_ENTRY(FMT, KC, VC, 32, 4)         \
    KV_DECODE_ANY_GROUP_ENTRY(FMT, KC, VC, 256) \
    KV_DECODE_ANY_GROUP_ENTRY(FMT, KC, VC, 128) \
    KV_DECODE_ANY_GROUP_ENTRY(FMT, KC, VC, 64)  \
    KV_DECODE_ANY_GROUP_ENTRY(FMT, KC, VC, 32)  \
    KV_PREFILL_ENTRY(FMT, KC, VC, 256)          \
    KV_PREFILL_ENTRY(FMT, KC, VC, 128)          \
    KV_PREFILL_ENTRY(FMT, KC, VC, 64)           \
    KV_PREFILL_ENTRY(FMT, KC, VC, 32)

KV_FORMAT_ENTRIES(k8v8, kv::INT8, kv::INT8)
KV_FORMAT_ENTRIES(k8v4, kv::INT8, kv::WHT4)
KV_FORMAT_ENTRIES(k8v3, kv::INT8, kv::WHT3)
KV_FORMAT_ENTRIES(k4v4, kv::WHT4, kv::WHT4)
KV_FORMAT_ENTRIES(k3v3, kv::WHT3, kv::WHT3)
