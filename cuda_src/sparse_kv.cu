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
// are kv_prefill's, so with a causal index every row's arithmetic is kv_prefill's. Both kernels are
// attention_tile.cuh's flash::prefill over kv_tile.cuh's CodeCache (this one with SparseRows), so they
// cannot drift apart.
#include <cuda_fp16.h>
#include "common.cuh"
#include "kv_cache.cuh"
#include "kv_tile.cuh"

constexpr int SKV_MAX_KB = 4096;  // sparse_attention.cu's SP_MAX_KB: key blocks an index row names

template <int KC, int VC, int DH>
__device__ __forceinline__ void kv_sparse_prefill(const float* __restrict__ q, kv::Side<KC, DH> k_side,
                                                  kv::Side<VC, DH> v_side, const int* __restrict__ step,
                                                  const unsigned* __restrict__ index, float* __restrict__ part_m,
                                                  float* __restrict__ part_l, float* __restrict__ part_o,
                                                  int n_tokens, int n_head, int n_head_kv, int n_splits, int words,
                                                  int n_qb_grid, float scale, const float* __restrict__ tables) {
    __shared__ float k_centroids[16], v_centroids[16], signs[kv::BLOCK];
    __shared__ unsigned row_bits[SKV_MAX_KB / 32];
    const flash::SparseRows rows(step, row_bits, n_tokens, n_head, n_head_kv, k_side.capacity, n_splits, n_qb_grid);
    if (!rows.active()) return;  // uniform over the block, before any barrier
    flash::stage_code_tables(k_centroids, v_centroids, signs, KC, VC, tables);
    rows.load_index(index, words, row_bits);
    __syncthreads();
    const flash::CodeCache<KC, VC, DH> cache{k_side.head(rows.kv_head), v_side.head(rows.kv_head), k_centroids,
                                             v_centroids, signs};
    flash::prefill<DH, kv::domain(KC, DH), kv::domain(VC, DH)>(q, rows, cache,
                                                               flash::Partials{part_m, part_l, part_o, n_splits}, scale);
}

// ---------------------------------------------------------------------------------------------
// Entry points sparse_prefill_<fmt>_d<Dh>: grid = n_qb_grid * n_head * n_splits, block FLASH_THREADS,
// n_qb_grid >= the chunk's query blocks (ceil(T / 64) + 1 covers any position). Arguments: q in the K
// domain; K codes/side, V codes/side; step; the block index; partials; then the sizes; `tables` last.
// Dh 256 (every Qwen3.5/3.6 size) and 128 (the trained fixtures); each format kv_cache.cu builds.
#define SPARSE_KV_ENTRY(FMT, KC, VC, DH)                                                                      \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS, 2) sparse_prefill_##FMT##_d##DH(                \
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
