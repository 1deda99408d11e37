// Block-sparse flash prefill over the fp16 KV cache (issue 10), the GPU side of
// engine/reference/sparse_attention.py: per query head a pattern (dense, A-shape, vertical-slash, block
// top-k) becomes a block index built here in parallel, and the flash kernel walks only the key blocks
// the index names. Its fp32 partials have attention.cu's layout, so attn_merge_gate combines them.
//
// Blocks are SP_BLOCK = 64 cache rows (absolute, by cache order: block b = rows [64b, 64b+64)). This is
// also attention_tile.cuh's FLASH_BK (= FLASH_SPLIT_ALIGN), so every split starts on a block and a 64-key
// tile is one key block.
// Per-step geometry, with pos = step[RIGLLM_STEP_POS] and T new tokens (rows pos..pos+T-1):
//   qb0 = pos / 64         first query block of the chunk; index row i is absolute query block qb0 + i
//   n_qb                   query blocks of the chunk; n_kb = ceil((pos + T) / 64) key blocks
//   words                  uint32 words per index row (host: ceil(n_kb / 32)), the row stride
// Buffers:
//   patterns  int32 [n_head][4]: kind, a, b, 0 (a_shape: sink, window; vertical_slash: vertical, slash;
//             block_topk: topk, 0; counts in blocks)
//   index     uint32 [n_head][n_qb][words]: bit j of row i = query block qb0+i reads key block j (j <= qb0+i)
//   q_pool    fp32 [n_head][n_qb][Dh]: mean of the chunk's q rows of each query block (block top-k)
//   k_pool    fp32 [n_head_kv][n_kb][Dh]: mean of each key block's cached keys (block top-k)
//   vs_m/vs_l fp32 [n_head][64][words*32]: per last-query row and key block, the block's max score and
//             sum exp(score - max) (vertical-slash estimate, pass 1)
//   vs_row    fp32 [n_head][64][2]: per last-query row the softmax max and denominator (pass 2)
//   vs_col    fp32 [n_head][words*32]: softmax mass of each key block over the last queries (pass 3)
//   vs_diag   fp32 [n_head][words*32][2]: mass of key block j from last-query rows in query block
//             qbl (slot 0) and qbl+1 (slot 1), qbl = first query block of the last queries (pass 3)
//   vs_bits   uint32 [n_head][2][words]: chosen vertical key blocks, chosen block offsets (pass 4)
// Launch order: sparse_pool_q, sparse_pool_k, sparse_vs_stats, sparse_vs_rows, sparse_vs_mass,
// sparse_vs_select, sparse_index_fill, sparse_topk_select, then sparse_prefill and attn_merge_gate.
// Every index kernel covers all heads and returns at once for heads of other kinds, so one launch
// sequence serves a mixed profile. Top-k choices are a block-parallel radix select (32 block-wide counts
// over the order-preserving integer image of the scores) followed by a block scan that gives ties to
// the lowest index, as the numpy reference does; no thread ever loops serially over a k.
#include <cuda_fp16.h>
#include "attention_tile.cuh"
#include "common.cuh"

#define SP_NEG_INF __int_as_float(0xff800000)  // -inf

constexpr int SP_BLOCK = 64;
constexpr int SP_THREADS = FLASH_THREADS;  // the tile kernels stage through attention_tile.cuh's roles
constexpr int SP_MAX_KB = 4096;  // key blocks one selection ranks in shared memory: 262144 tokens

static_assert(SP_BLOCK == FLASH_BK, "a key block must be one attention_tile.cuh key tile");

enum : int { SP_DENSE = 0, SP_A_SHAPE = 1, SP_VERTICAL_SLASH = 2, SP_BLOCK_TOPK = 3 };

struct SpGeometry {
    int pos, qb0, n_qb, kv_len, n_kb;
};

__device__ __forceinline__ SpGeometry sp_geometry(const int* __restrict__ step, int n_tokens) {
    SpGeometry g;
    g.pos = step[RIGLLM_STEP_POS];
    g.qb0 = g.pos / SP_BLOCK;
    g.n_qb = (g.pos + n_tokens - 1) / SP_BLOCK - g.qb0 + 1;
    g.kv_len = g.pos + n_tokens;
    g.n_kb = (g.kv_len - 1) / SP_BLOCK + 1;
    return g;
}

// ---------------------------------------------------------------------------------------------
// Block-wide helpers (every thread of the block calls them, uniformly).
__device__ __forceinline__ int sp_block_sum(int v, int* sh) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(RIGLLM_FULL_MASK, v, off);
    __syncthreads();  // sh may still be read by the previous call
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    int total = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += sh[w];
    return total;
}

// Order-preserving unsigned image of a float (−0 folded onto +0, so equal floats give equal keys).
__device__ __forceinline__ unsigned sp_order_key(float x) {
    const unsigned b = x == 0.f ? 0u : __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Set bit (j + bit_offset) of `bits` (shared, zeroed by the caller) for the k largest of vals[0, n),
// ties to the lowest j. Radix select of the k-th largest key (one block-wide count per bit), then a
// block scan over the ties at that key. blockDim.x must be a multiple of 32 and at most 1024.
__device__ void sp_select_top(const float* vals, int n, int k, int bit_offset, unsigned* bits, int* sh) {
    if (k <= 0 || n <= 0) return;
    if (k >= n) {
        for (int j = threadIdx.x; j < n; j += blockDim.x) atomicOr(&bits[(j + bit_offset) >> 5], 1u << ((j + bit_offset) & 31));
        return;
    }
    unsigned prefix = 0;
    for (int bit = 31; bit >= 0; --bit) {
        const unsigned cand = prefix | (1u << bit);
        int c = 0;
        for (int j = threadIdx.x; j < n; j += blockDim.x) c += sp_order_key(vals[j]) >= cand;
        if (sp_block_sum(c, sh) >= k) prefix = cand;  // uniform: every thread sees the same total
    }
    int c = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) c += sp_order_key(vals[j]) > prefix;
    const int need = k - sp_block_sum(c, sh);  // ties at the threshold still to take, >= 1
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    int taken = 0;
    for (int base = 0; base < n; base += blockDim.x) {
        const int j = base + threadIdx.x;
        const unsigned key = j < n ? sp_order_key(vals[j]) : 0u;
        const bool tie = j < n && key == prefix;
        const unsigned ballot = __ballot_sync(RIGLLM_FULL_MASK, tie);
        __syncthreads();  // sh free again
        if (lane == 0) sh[warp] = __popc(ballot);
        __syncthreads();
        int before = taken;
        for (int w = 0; w < warp; ++w) before += sh[w];
        before += __popc(ballot & ((1u << lane) - 1u));
        if (j < n && (key > prefix || (tie && before < need)))
            atomicOr(&bits[(j + bit_offset) >> 5], 1u << ((j + bit_offset) & 31));
        for (int w = 0; w < n_warps; ++w) taken += sh[w];
    }
}

// ---------------------------------------------------------------------------------------------
// Pooling for block top-k. Block = Dh threads, one dim each.
// q_pool[h][i] = mean of q rows t of the chunk with (pos + t) / 64 == qb0 + i; grid = n_qb * n_head.
extern "C" __global__ void sparse_pool_q(const float* __restrict__ q, const int* __restrict__ step,
                                         float* __restrict__ q_pool, int n_tokens, int n_head, int n_qb_grid) {
    const SpGeometry g = sp_geometry(step, n_tokens);
    const int i = blockIdx.x % n_qb_grid, h = blockIdx.x / n_qb_grid;
    if (i >= g.n_qb) return;
    const int dh = blockDim.x, d = threadIdx.x;
    const int t0 = max(0, (g.qb0 + i) * SP_BLOCK - g.pos);
    const int t1 = min(n_tokens, (g.qb0 + i + 1) * SP_BLOCK - g.pos);
    float acc = 0.f;
    for (int t = t0; t < t1; ++t) acc += q[((size_t)t * n_head + h) * dh + d];
    q_pool[((size_t)h * g.n_qb + i) * dh + d] = acc / (float)(t1 - t0);
}

// k_pool[hk][j] = mean of cache rows [64j, min(64j + 64, kv_len)) of KV head hk; grid = n_kb * n_head_kv.
extern "C" __global__ void sparse_pool_k(const __half* __restrict__ k_cache, const int* __restrict__ step,
                                         float* __restrict__ k_pool, int n_tokens, int capacity, int n_kb_grid) {
    const SpGeometry g = sp_geometry(step, n_tokens);
    const int j = blockIdx.x % n_kb_grid, hk = blockIdx.x / n_kb_grid;
    if (j >= g.n_kb) return;
    const int dh = blockDim.x, d = threadIdx.x;
    const int r1 = min(g.kv_len, (j + 1) * SP_BLOCK);
    float acc = 0.f;
    for (int r = j * SP_BLOCK; r < r1; ++r) acc += __half2float(k_cache[((size_t)hk * capacity + r) * dh + d]);
    k_pool[((size_t)hk * g.n_kb + j) * dh + d] = acc / (float)(r1 - j * SP_BLOCK);
}

// ---------------------------------------------------------------------------------------------
// Vertical-slash estimate: softmax of the chunk's last L = min(64, T) queries over every key.
// Pass 1 (grid = n_kb * n_head): per (last-query row, key block) the block max and exp-sum.
// Pass 3 (same grid) recomputes the tile and sums exp(s - M_row) / L_row per key block and per slot.
template <int DH, bool MASS>
__device__ __forceinline__ void sp_vs_tile(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                           const int* __restrict__ step, const int* __restrict__ patterns,
                                           float* __restrict__ vs_m, float* __restrict__ vs_l,
                                           const float* __restrict__ vs_row, float* __restrict__ vs_col,
                                           float* __restrict__ vs_diag, int n_tokens, int n_head, int n_head_kv,
                                           int capacity, int words, int n_kb_grid, float scale) {
    __shared__ __align__(16) flash::QK tiles;
    __shared__ float red[2][SP_THREADS / 32];
    const SpGeometry g = sp_geometry(step, n_tokens);
    const int j = blockIdx.x % n_kb_grid, h = blockIdx.x / n_kb_grid;
    if (j >= g.n_kb || patterns[h * 4] != SP_VERTICAL_SLASH) return;
    const int kv_head = h / (n_head / n_head_kv);
    const int n_last = min(SP_BLOCK, n_tokens), t_first = n_tokens - n_last;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int ld_row = tid & 63, ld_dim = (tid >> 6) * 8;
    const float* q_src = ld_row < n_last ? q + ((size_t)(t_first + ld_row) * n_head + h) * DH + ld_dim : nullptr;
    const int key_ld = j * SP_BLOCK + ld_row;
    const __half* k_src = key_ld < g.kv_len ? k_cache + ((size_t)kv_head * capacity + key_ld) * DH + ld_dim : nullptr;
    float s[4][4];
    flash::score_tile<DH>(q_src, [&](int dc, float* kv) {
        if (k_src != nullptr) flash::load_halves<8>(k_src + dc, kv);
    }, tiles, s);

    const int kb_stride = words * 32;
    const int qbl = (g.pos + t_first) / SP_BLOCK;
    float slot_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = ty * 4 + i;  // last-query row; token t_first + r
        const int limit = r < n_last ? g.pos + t_first + r + 1 : 0;  // keys < limit are visible
        float mx = SP_NEG_INF;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int key = j * SP_BLOCK + tx * 4 + c;
            s[i][c] = key < limit ? s[i][c] * scale : SP_NEG_INF;
            mx = fmaxf(mx, s[i][c]);
        }
        if constexpr (!MASS) {
            mx = rigllm::group_max<16>(mx);
            float sum = 0.f;
#pragma unroll
            for (int c = 0; c < 4; ++c) sum += mx == SP_NEG_INF ? 0.f : __expf(s[i][c] - mx);
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(RIGLLM_FULL_MASK, sum, off);
            if (tx == 0 && r < SP_BLOCK) {
                vs_m[((size_t)h * SP_BLOCK + r) * kb_stride + j] = mx;
                vs_l[((size_t)h * SP_BLOCK + r) * kb_stride + j] = sum;
            }
        } else {
            if (r < n_last) {
                const float m_row = vs_row[((size_t)h * SP_BLOCK + r) * 2];
                const float inv_l = 1.f / vs_row[((size_t)h * SP_BLOCK + r) * 2 + 1];
                float p = 0.f;
#pragma unroll
                for (int c = 0; c < 4; ++c) p += s[i][c] == SP_NEG_INF ? 0.f : __expf(s[i][c] - m_row) * inv_l;
                slot_sum[(g.pos + t_first + r) / SP_BLOCK - qbl] += p;
            }
        }
    }
    if constexpr (MASS) {
#pragma unroll
        for (int slot = 0; slot < 2; ++slot) {
            const float v = rigllm::warp_sum(slot_sum[slot]);
            if ((tid & 31) == 0) red[slot][tid >> 5] = v;
        }
        __syncthreads();
        if (tid < 3) {  // slot 0, slot 1, and their sum: the column mass of key block j
            float total = 0.f;
            for (int w = 0; w < SP_THREADS / 32; ++w) total += tid < 2 ? red[tid][w] : red[0][w] + red[1][w];
            if (tid < 2) vs_diag[((size_t)h * kb_stride + j) * 2 + tid] = total;
            else vs_col[(size_t)h * kb_stride + j] = total;
        }
    }
}

// Pass 2: per (head, last-query row) the softmax max M and denominator over every key block; grid =
// n_head, block = 64 threads (one per row).
extern "C" __global__ void sparse_vs_rows(const int* __restrict__ step, const int* __restrict__ patterns,
                                          const float* __restrict__ vs_m, const float* __restrict__ vs_l,
                                          float* __restrict__ vs_row, int n_tokens, int words) {
    const SpGeometry g = sp_geometry(step, n_tokens);
    const int h = blockIdx.x, r = threadIdx.x;
    if (patterns[h * 4] != SP_VERTICAL_SLASH || r >= min(SP_BLOCK, n_tokens)) return;
    const float* m = vs_m + ((size_t)h * SP_BLOCK + r) * words * 32;
    const float* l = vs_l + ((size_t)h * SP_BLOCK + r) * words * 32;
    float mx = SP_NEG_INF;
    for (int j = 0; j < g.n_kb; ++j) mx = fmaxf(mx, m[j]);
    float sum = 0.f;
    for (int j = 0; j < g.n_kb; ++j)
        if (m[j] != SP_NEG_INF) sum = fmaf(l[j], __expf(m[j] - mx), sum);
    vs_row[((size_t)h * SP_BLOCK + r) * 2] = mx;
    vs_row[((size_t)h * SP_BLOCK + r) * 2 + 1] = sum;
}

// Pass 4: per head (grid = n_head, SP_THREADS) the `vertical` key blocks with the most column mass and
// the `slash` block offsets >= 1 with the most diagonal mass; offset 0 (the diagonal) is always set.
extern "C" __global__ void __launch_bounds__(SP_THREADS) sparse_vs_select(
    const int* __restrict__ step, const int* __restrict__ patterns, const float* __restrict__ vs_col,
    const float* __restrict__ vs_diag, unsigned* __restrict__ vs_bits, int n_tokens, int words) {
    __shared__ float diag[SP_MAX_KB];
    __shared__ unsigned bits[2][SP_MAX_KB / 32];
    __shared__ int sh[SP_THREADS / 32];
    const SpGeometry g = sp_geometry(step, n_tokens);
    const int h = blockIdx.x;
    if (patterns[h * 4] != SP_VERTICAL_SLASH) return;
    const int kb_stride = words * 32;
    const int qbl = (g.pos + n_tokens - min(SP_BLOCK, n_tokens)) / SP_BLOCK;
    for (int w = threadIdx.x; w < 2 * SP_MAX_KB / 32; w += blockDim.x) (&bits[0][0])[w] = 0u;
    for (int o = threadIdx.x; o < g.n_kb; o += blockDim.x) {  // mass of block offset o: slot b, key block qbl+b-o
        float mass = 0.f;
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            const int j = qbl + b - o;
            if (j >= 0 && j < g.n_kb) mass += vs_diag[((size_t)h * kb_stride + j) * 2 + b];
        }
        diag[o] = mass;
    }
    __syncthreads();
    sp_select_top(vs_col + (size_t)h * kb_stride, g.n_kb, patterns[h * 4 + 1], 0, bits[0], sh);
    sp_select_top(diag + 1, g.n_kb - 1, patterns[h * 4 + 2], 1, bits[1], sh);
    __syncthreads();
    if (threadIdx.x == 0) bits[1][0] |= 1u;
    __syncthreads();
    for (int w = threadIdx.x; w < words; w += blockDim.x) {
        vs_bits[((size_t)h * 2) * words + w] = bits[0][w];
        vs_bits[((size_t)h * 2 + 1) * words + w] = bits[1][w];
    }
}

// ---------------------------------------------------------------------------------------------
// Index rows of dense, A-shape and vertical-slash heads; grid = n_qb * n_head, any block size.
extern "C" __global__ void sparse_index_fill(const int* __restrict__ step, const int* __restrict__ patterns,
                                             const unsigned* __restrict__ vs_bits, unsigned* __restrict__ index,
                                             int n_tokens, int words, int n_qb_grid) {
    const SpGeometry g = sp_geometry(step, n_tokens);
    const int i = blockIdx.x % n_qb_grid, h = blockIdx.x / n_qb_grid;
    const int kind = patterns[h * 4];
    if (i >= g.n_qb || kind == SP_BLOCK_TOPK) return;
    const int a = patterns[h * 4 + 1], b = patterns[h * 4 + 2];
    const int qb = g.qb0 + i;
    const unsigned* vert = vs_bits + (size_t)h * 2 * words;
    const unsigned* offs = vert + words;
    for (int w = threadIdx.x; w < words; w += blockDim.x) {
        unsigned out = 0u;
        for (int bit = 0; bit < 32; ++bit) {
            const int j = w * 32 + bit;
            if (j > qb) break;
            bool on = true;
            if (kind == SP_A_SHAPE) on = j < a || qb - j < b;
            else if (kind == SP_VERTICAL_SLASH) on = ((vert[j >> 5] >> (j & 31)) & 1u) || ((offs[(qb - j) >> 5] >> ((qb - j) & 31)) & 1u);
            out |= on ? 1u << bit : 0u;
        }
        index[((size_t)h * g.n_qb + i) * words + w] = out;
    }
}

// Index rows of block top-k heads: per (query block, head) (grid = n_qb * n_head, SP_THREADS) the `topk`
// earlier key blocks with the largest q_pool·k_pool, plus the diagonal.
extern "C" __global__ void __launch_bounds__(SP_THREADS) sparse_topk_select(
    const int* __restrict__ step, const int* __restrict__ patterns, const float* __restrict__ q_pool,
    const float* __restrict__ k_pool, unsigned* __restrict__ index, int n_tokens, int n_head, int n_head_kv,
    int head_dim, int words, int n_qb_grid) {
    __shared__ float scores[SP_MAX_KB];
    __shared__ float qp[256];
    __shared__ unsigned bits[SP_MAX_KB / 32];
    __shared__ int sh[SP_THREADS / 32];
    const SpGeometry g = sp_geometry(step, n_tokens);
    const int i = blockIdx.x % n_qb_grid, h = blockIdx.x / n_qb_grid;
    if (i >= g.n_qb || patterns[h * 4] != SP_BLOCK_TOPK) return;
    const int qb = g.qb0 + i;
    const int kv_head = h / (n_head / n_head_kv);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qp[d] = q_pool[((size_t)h * g.n_qb + i) * head_dim + d];
    for (int w = threadIdx.x; w < SP_MAX_KB / 32; w += blockDim.x) bits[w] = 0u;
    __syncthreads();
    for (int j = threadIdx.x; j < qb; j += blockDim.x) {
        const float* kp = k_pool + ((size_t)kv_head * g.n_kb + j) * head_dim;
        float acc = 0.f;
        for (int d = 0; d < head_dim; ++d) acc = fmaf(qp[d], kp[d], acc);
        scores[j] = acc;
    }
    __syncthreads();
    sp_select_top(scores, qb, patterns[h * 4 + 1], 0, bits, sh);
    __syncthreads();
    if (threadIdx.x == 0) bits[qb >> 5] |= 1u << (qb & 31);
    __syncthreads();
    for (int w = threadIdx.x; w < words; w += blockDim.x) index[((size_t)h * g.n_qb + i) * words + w] = bits[w];
}

// ---------------------------------------------------------------------------------------------
// Sparse flash prefill: attention_tile.cuh's tile loop with its SparseRows over the fp16 cache. Block =
// (query block, query head, split), FLASH_THREADS threads. A block's query rows are the chunk's tokens
// of ONE absolute query block of ONE head (up to 64; patterns are per head, so the G heads of a KV head
// are not packed as in attention.cu), so every row reads the same key blocks: the block walks its
// split's keys one 64-key block at a time and skips those its index row does not name; inside a read
// block only the causal limit masks. Partial rows are (t * n_head + h) * n_splits + split, as in
// attention.cu, so attn_merge_gate merges them; with every block named, every row's arithmetic is
// attn_prefill's.
template <int DH>
__device__ __forceinline__ void sparse_prefill(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                               const __half* __restrict__ v_cache, const int* __restrict__ step,
                                               const unsigned* __restrict__ index, float* __restrict__ part_m,
                                               float* __restrict__ part_l, float* __restrict__ part_o, int n_tokens,
                                               int n_head, int n_head_kv, int capacity, int n_splits, int words,
                                               int n_qb_grid, float scale) {
    __shared__ unsigned row_bits[SP_MAX_KB / 32];
    const flash::SparseRows rows(step, row_bits, n_tokens, n_head, n_head_kv, capacity, n_splits, n_qb_grid);
    if (!rows.active()) return;  // uniform over the block, before any barrier
    rows.load_index(index, words, row_bits);
    __syncthreads();
    const size_t head_base = (size_t)rows.kv_head * capacity * DH;
    flash::prefill<DH, DH, DH>(q, rows, flash::HalfCache<DH>{k_cache + head_base, v_cache + head_base},
                               flash::Partials{part_m, part_l, part_o, n_splits}, scale);
}

// ---------------------------------------------------------------------------------------------
// Entry points, per head width (32, 64: tiny/demo models; 256: every Qwen3.5/3.6 size).
// sparse_vs_stats_d<Dh> / sparse_vs_mass_d<Dh>: grid = n_kb_grid * n_head, SP_THREADS.
// sparse_prefill_d<Dh>: grid = n_qb_grid * n_head * n_splits, SP_THREADS, n_qb_grid >= the chunk's
// query blocks (ceil(T / 64) + 1 covers any position).
#define SPARSE_ENTRIES(DH)                                                                                     \
    extern "C" __global__ void __launch_bounds__(SP_THREADS) sparse_vs_stats_d##DH(                           \
        const float* __restrict__ q, const __half* __restrict__ k_cache, const int* __restrict__ step,         \
        const int* __restrict__ patterns, float* __restrict__ vs_m, float* __restrict__ vs_l, int n_tokens,    \
        int n_head, int n_head_kv, int capacity, int words, int n_kb_grid, float scale) {                      \
        sp_vs_tile<DH, false>(q, k_cache, step, patterns, vs_m, vs_l, nullptr, nullptr, nullptr, n_tokens,     \
                              n_head, n_head_kv, capacity, words, n_kb_grid, scale);                           \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(SP_THREADS) sparse_vs_mass_d##DH(                            \
        const float* __restrict__ q, const __half* __restrict__ k_cache, const int* __restrict__ step,         \
        const int* __restrict__ patterns, const float* __restrict__ vs_row, float* __restrict__ vs_col,        \
        float* __restrict__ vs_diag, int n_tokens, int n_head, int n_head_kv, int capacity, int words,         \
        int n_kb_grid, float scale) {                                                                          \
        sp_vs_tile<DH, true>(q, k_cache, step, patterns, nullptr, nullptr, vs_row, vs_col, vs_diag, n_tokens,  \
                             n_head, n_head_kv, capacity, words, n_kb_grid, scale);                            \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS, 2) sparse_prefill_d##DH(                         \
        const float* __restrict__ q, const __half* __restrict__ k_cache, const __half* __restrict__ v_cache,   \
        const int* __restrict__ step, const unsigned* __restrict__ index, float* __restrict__ part_m,           \
        float* __restrict__ part_l, float* __restrict__ part_o, int n_tokens, int n_head, int n_head_kv,       \
        int capacity, int n_splits, int words, int n_qb_grid, float scale) {                                   \
        sparse_prefill<DH>(q, k_cache, v_cache, step, index, part_m, part_l, part_o, n_tokens, n_head,         \
                           n_head_kv, capacity, n_splits, words, n_qb_grid, scale);                            \
    }

SPARSE_ENTRIES(32)
SPARSE_ENTRIES(64)
SPARSE_ENTRIES(128)
SPARSE_ENTRIES(256)
