// Block-sparse flash prefill over the quantised KV cache (issue 10 composed with the KV formats):
// sparse_attention.cu's sparse_prefill with kv_cache.cu's kv_prefill reads. Attention reads the stored
// codes (contracts.md "KV cache formats"), never an fp16 copy of the history.
//
// The block index comes from sparse_attention.cu's sparse_index_fill, which reads no keys, so the
// quantised path serves dense and A-shape heads (the host refuses vertical-slash and block top-k heads
// with a quantised cache: their index passes score fp16 keys).
//
// Block = (query block, query head, split), 256 threads, as sparse_prefill: the chunk's tokens of ONE
// absolute 64-row query block of ONE head, so every row reads the same key blocks; the block walks its
// split's keys one 64-key block at a time and skips those its index row does not name. Inside a tile the
// math is kv_prefill's: q in the K codec's attention domain (kv_rotate_q's output for wht keys), keys and
// values dequantised into shared memory in that domain, online softmax per half-warp row, and for a wht V
// side the split's output rows un-rotated once in shared memory before they are written. Partial rows are
// (t * n_head + h) * n_splits + split, attention.cu's layout, so attn_merge_gate merges them; split ranges
// are kv_prefill's, so with a causal index every row's arithmetic is kv_prefill's.
#include <cuda_fp16.h>
#include "common.cuh"
#include "kv_cache.cuh"

#define SKV_NEG_INF __int_as_float(0xff800000)

constexpr int SKV_BLOCK = 64;    // SP_BLOCK: rows per query / key block
constexpr int SKV_THREADS = 256;
constexpr int SKV_DC = 32;
constexpr int SKV_VC = 16;
constexpr int SKV_LD = SKV_BLOCK + 4;
constexpr int SKV_MAX_KB = 4096;  // SP_MAX_KB

template <int KC, int VC, int DH>
__device__ __forceinline__ void kv_sparse_prefill(const float* __restrict__ q, kv::Side<KC, DH> k_side,
                                                  kv::Side<VC, DH> v_side, const int* __restrict__ step,
                                                  const unsigned* __restrict__ index, float* __restrict__ part_m,
                                                  float* __restrict__ part_l, float* __restrict__ part_o,
                                                  int n_tokens, int n_head, int n_head_kv, int n_splits, int words,
                                                  int n_qb_grid, float scale, const float* __restrict__ tables) {
    constexpr int DWK = kv::domain(KC, DH), DWV = kv::domain(VC, DH);
    constexpr int DPT = DWV / 16;
    constexpr int CW = DPT < 4 ? DPT : 4;
    constexpr int NCH = DPT / CW;
    static_assert(DH % 32 == 0 && DH <= 256, "head_dim must be a multiple of 32, at most 256");
    __shared__ __align__(16) float p_tile[SKV_BLOCK][SKV_LD];
    __shared__ __align__(16) union {
        struct {
            float q[SKV_DC][SKV_LD];
            float k[SKV_DC][SKV_LD];
        } qk;
        float v[SKV_VC][DWV];
    } tile;
    __shared__ float k_centroids[16], v_centroids[16], signs[kv::BLOCK];
    __shared__ unsigned row_bits[SKV_MAX_KB / 32];

    const int capacity = k_side.capacity;
    const int pos = step[RIGLLM_STEP_POS];
    const int qb0 = pos / SKV_BLOCK;
    const int n_qb = (pos + n_tokens - 1) / SKV_BLOCK - qb0 + 1;
    const int qt = blockIdx.x % n_qb_grid;  // index row: query block qb0 + qt
    const int h = (blockIdx.x / n_qb_grid) % n_head;
    const int split = blockIdx.x / (n_qb_grid * n_head);
    if (qt >= n_qb) return;  // uniform over the block, before any barrier
    const int kv_head = h / (n_head / n_head_kv);
    const int t0 = max(0, (qb0 + qt) * SKV_BLOCK - pos);               // the query block's first token
    const int t_end = min(n_tokens, (qb0 + qt + 1) * SKV_BLOCK - pos);  // and one past its last
    int k0, k1;
    {  // kv_prefill's split range (kv_split_range over the visible rows)
        const int kv_len = min(pos + n_tokens, capacity);
        int chunk = (kv_len + n_splits - 1) / n_splits;
        chunk = (chunk + SKV_BLOCK - 1) / SKV_BLOCK * SKV_BLOCK;
        k0 = split * chunk;
        k1 = min(k0 + chunk, kv_len);
    }
    k1 = min(k1, pos + t_end);  // no row of the tile sees further

    const int tid = threadIdx.x;
    const int tx = tid & 15, ty = tid >> 4;
    load_centroids(k_centroids, KC, tables);
    load_centroids(v_centroids, VC, tables);
    if (kv::rotated(VC) && tid < kv::BLOCK) signs[tid] = tables[kv::TABLE_SIGNS + tid];
    for (int w = tid; w < words; w += SKV_THREADS) row_bits[w] = index[((size_t)h * n_qb + qt) * words + w];
    __syncthreads();

    // Row i of this thread is token t0 + ty*4 + i and sees keys below row_end + i (causal). Rows past the
    // query block have q = 0 and are never written.
    const int row_end = pos + t0 + ty * 4 + 1;
    float m[4], l[4], o[4][DPT];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        m[i] = SKV_NEG_INF;
        l[i] = 0.f;
#pragma unroll
        for (int e = 0; e < DPT; ++e) o[i][e] = 0.f;
    }
    const int ld_row = tid & 63, ld_dim = (tid >> 6) * 8;
    const kv::HeadRows<KC, DH> k_rows = k_side.head(kv_head);
    const kv::HeadRows<VC, DH> v_rows = v_side.head(kv_head);
    const float* q_src = t0 + ld_row < t_end ? q + ((size_t)(t0 + ld_row) * n_head + h) * DWK + ld_dim : nullptr;

    for (int kt = k0; kt < k1; kt += SKV_BLOCK) {
        const int j = kt / SKV_BLOCK;  // splits start on blocks, so the tile is key block j
        if (!((row_bits[j >> 5] >> (j & 31)) & 1u)) continue;  // not read: uniform over the block

        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int c = 0; c < 4; ++c) s[i][c] = 0.f;
        const int ld_key = kt + ld_row;
        for (int dc = 0; dc < DWK; dc += SKV_DC) {
            {
                float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
                if (q_src != nullptr) {
                    a = *reinterpret_cast<const float4*>(q_src + dc);
                    b = *reinterpret_cast<const float4*>(q_src + dc + 4);
                }
                const float qv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int e = 0; e < 8; ++e) tile.qk.q[ld_dim + e][ld_row] = qv[e];
            }
            {
                float kv_vals[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                if (ld_key < k1)
                    kv::dequant<KC, 8>(k_rows.code_row(ld_key), k_rows.side_row(ld_key), dc + ld_dim, k_centroids,
                                       kv_vals);
#pragma unroll
                for (int e = 0; e < 8; ++e) tile.qk.k[ld_dim + e][ld_row] = kv_vals[e];
            }
            __syncthreads();
#pragma unroll 4
            for (int dd = 0; dd < SKV_DC; ++dd) {
                const float4 a = *reinterpret_cast<const float4*>(&tile.qk.q[dd][ty * 4]);
                const float4 b = *reinterpret_cast<const float4*>(&tile.qk.k[dd][tx * 4]);
                const float av[4] = {a.x, a.y, a.z, a.w};
                const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int c = 0; c < 4; ++c) s[i][c] = fmaf(av[i], bv[c], s[i][c]);
            }
            __syncthreads();
        }

#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int limit = min(row_end + i, k1);
            float tile_max = SKV_NEG_INF;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                s[i][c] = kt + tx * 4 + c < limit ? s[i][c] * scale : SKV_NEG_INF;
                tile_max = fmaxf(tile_max, s[i][c]);
            }
            tile_max = rigllm::group_max<16>(tile_max);
            const float m_new = fmaxf(m[i], tile_max);
            const float m_ref = m_new == SKV_NEG_INF ? 0.f : m_new;
            const float corr = __expf(m[i] - m_ref);
            float row_sum = 0.f;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const float p = __expf(s[i][c] - m_ref);
                p_tile[tx * 4 + c][ty * 4 + i] = p;
                row_sum += p;
            }
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) row_sum += __shfl_xor_sync(RIGLLM_FULL_MASK, row_sum, off);
            l[i] = fmaf(l[i], corr, row_sum);
#pragma unroll
            for (int e = 0; e < DPT; ++e) o[i][e] *= corr;
            m[i] = m_new;
        }

        for (int vc = 0; vc < SKV_BLOCK; vc += SKV_VC) {
            __syncthreads();
            for (int idx = tid; idx < SKV_VC * DWV / 8; idx += SKV_THREADS) {
                const int c = idx / (DWV / 8);
                const int dim = (idx - c * (DWV / 8)) * 8;
                const int key = kt + vc + c;
                float vv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                if (key < k1) kv::dequant<VC, 8>(v_rows.code_row(key), v_rows.side_row(key), dim, v_centroids, vv);
                *reinterpret_cast<float4*>(&tile.v[c][dim]) = make_float4(vv[0], vv[1], vv[2], vv[3]);
                *reinterpret_cast<float4*>(&tile.v[c][dim + 4]) = make_float4(vv[4], vv[5], vv[6], vv[7]);
            }
            __syncthreads();
#pragma unroll 2
            for (int c = 0; c < SKV_VC; ++c) {
                const float4 p4 = *reinterpret_cast<const float4*>(&p_tile[vc + c][ty * 4]);
                const float pv[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                for (int ch = 0; ch < NCH; ++ch) {
                    float vv[CW];
                    if constexpr (CW == 4) {
                        const float4 v4 = *reinterpret_cast<const float4*>(&tile.v[c][ch * 64 + tx * 4]);
                        vv[0] = v4.x; vv[1] = v4.y; vv[2] = v4.z; vv[3] = v4.w;
                    } else {
                        const float2 v2 = *reinterpret_cast<const float2*>(&tile.v[c][tx * 2]);
                        vv[0] = v2.x; vv[1] = v2.y;
                    }
#pragma unroll
                    for (int i = 0; i < 4; ++i)
#pragma unroll
                        for (int e = 0; e < CW; ++e) o[i][ch * CW + e] = fmaf(pv[i], vv[e], o[i][ch * CW + e]);
                }
            }
        }
        __syncthreads();  // the next tile's staging overwrites tile.v
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int t = t0 + ty * 4 + i;
        if (t >= t_end) continue;
        const size_t row = ((size_t)t * n_head + h) * n_splits + split;
        if (tx == 0) {
            part_m[row] = m[i];
            part_l[row] = l[i];
        }
        if constexpr (!kv::rotated(VC)) {
            if (m[i] == SKV_NEG_INF) continue;
#pragma unroll
            for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
                for (int e = 0; e < CW; ++e) part_o[row * DH + ch * CW * 16 + tx * CW + e] = o[i][ch * CW + e];
        }
    }
    if constexpr (kv::rotated(VC)) {
        // Output rows in passes of SKV_VC (= 16) through tile.v: rows 16p..16p+15 belong to ty in [4p, 4p+4).
#pragma unroll 1
        for (int pass = 0; pass < SKV_BLOCK / SKV_VC; ++pass) {
            if ((ty >> 2) == pass) {
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
                        for (int e = 0; e < CW; ++e)
                            tile.v[(ty & 3) * 4 + i][ch * CW * 16 + tx * CW + e] = o[i][ch * CW + e];
            }
            unrotate_shared(&tile.v[0][0], SKV_VC * DWV / kv::BLOCK, signs, tid, SKV_THREADS);
            for (int idx = tid; idx < SKV_VC * DH; idx += SKV_THREADS) {
                const int lr = idx / DH;
                const int dim = idx - lr * DH;
                const int t = t0 + pass * SKV_VC + lr;
                if (t >= t_end) continue;
                part_o[(((size_t)t * n_head + h) * n_splits + split) * DH + dim] = tile.v[lr][dim];
            }
            __syncthreads();  // the next pass overwrites tile.v
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points sparse_prefill_<fmt>_d<Dh>: grid = n_qb_grid * n_head * n_splits, block SKV_THREADS,
// n_qb_grid >= the chunk's query blocks (ceil(T / 64) + 1 covers any position). Arguments: q in the K
// domain; K codes/side, V codes/side; step; the block index; partials; then the sizes; `tables` last.
// Dh 256 (every Qwen3.5/3.6 size) and 128 (the trained fixtures); each format kv_cache.cu builds.
#define SPARSE_KV_ENTRY(FMT, KC, VC, DH)                                                                      \
    extern "C" __global__ void __launch_bounds__(SKV_THREADS, 2) sparse_prefill_##FMT##_d##DH(                \
        const float* __restrict__ q, const unsigned char* __restrict__ k_codes, const __half* __restrict__ k_side, \
        const unsigned char* __restrict__ v_codes, const __half* __restrict__ v_side,                          \
        const int* __restrict__ step, const unsigned* __restrict__ index, float* __restrict__ part_m,           \
        float* __restrict__ part_l, float* __restrict__ part_o, int n_tokens, int n_head, int n_head_kv,       \
        int capacity, int n_splits, int words, int n_qb_grid, float scale, const float* __restrict__ tables) { \
        kv_sparse_prefill<KC, VC, DH>(q, kv::Side<KC, DH>{k_codes, k_side, capacity},                          \
                                      kv::Side<VC, DH>{v_codes, v_side, capacity}, step, index, part_m, part_l, \
                                      part_o, n_tokens, n_head, n_head_kv, n_splits, words, n_qb_grid, scale,  \
                                      tables);                                                                 \
    }

#define SPARSE_KV_FORMAT(FMT, KC, VC)      \
    SPARSE_KV_ENTRY(FMT, KC, VC, 256)      \
    SPARSE_KV_ENTRY(FMT, KC, VC, 128)

SPARSE_KV_FORMAT(k8v8, kv::INT8, kv::INT8)
SPARSE_KV_FORMAT(k8v4, kv::INT8, kv::WHT4)
SPARSE_KV_FORMAT(k8v3, kv::INT8, kv::WHT3)
SPARSE_KV_FORMAT(k4v4, kv::WHT4, kv::WHT4)
SPARSE_KV_FORMAT(k3v3, kv::WHT3, kv::WHT3)
