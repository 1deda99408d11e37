// attention_tile.cuh's Cache policy over the quantised KV cache, for kv_cache.cu's kv_prefill and
// sparse_kv.cu's kv_sparse_prefill: K and V rows are expanded from their stored codes into the staging
// tiles in each codec's attention domain (kv_cache.cuh: the head vector for int8, the rotated block for
// wht), fp32, never written back; a wht V side's output rows are un-rotated in shared memory before
// they are written (the merge is linear, so one transform per (row, split) instead of one per key).
#pragma once

#include "attention_tile.cuh"
#include "kv_cache.cuh"

namespace flash {

// The codebooks and signs the expansion and the un-rotation read, into the caller's shared arrays (kept
// apart so an int8 side's unused codebook costs no shared memory), by every thread before the tile
// loop; the caller's barrier publishes them.
__device__ __forceinline__ void stage_code_tables(float* k_centroids, float* v_centroids, float* signs, int kc, int vc,
                                                  const float* __restrict__ tables) {
    load_centroids(k_centroids, kc, tables);
    load_centroids(v_centroids, vc, tables);
    if (kv::rotated(vc) && threadIdx.x < kv::BLOCK) signs[threadIdx.x] = tables[kv::TABLE_SIGNS + threadIdx.x];
}

template <int KC, int VC, int DH>
struct CodeCache {
    static constexpr bool ROTATED_V = kv::rotated(VC);
    kv::HeadRows<KC, DH> k;
    kv::HeadRows<VC, DH> v;
    const float* k_centroids;  // shared memory, stage_code_tables
    const float* v_centroids;
    const float* signs;

    struct Key {
        bool in_tile;  // false: the key is outside the tile, its values stay 0
        kv::HeadRows<KC, DH> rows;
        int key, dim;  // the thread's key and its first dim within each staged chunk
        const float* centroids;
        __device__ __forceinline__ void load(int dc, float* out) const {
            if (in_tile) kv::dequant<KC, 8>(rows.code_row(key), rows.side_row(key), dc + dim, centroids, out);
        }
    };
    __device__ __forceinline__ Key key(bool in_tile, int key, int dim) const { return {in_tile, k, key, dim, k_centroids}; }
    __device__ __forceinline__ void load_v(int key, int dim, float* out) const {
        kv::dequant<VC, 8>(v.code_row(key), v.side_row(key), dim, v_centroids, out);
    }
    // n_floats consecutive floats of shared memory (whole 128-blocks), by the whole block.
    __device__ __forceinline__ void unrotate(float* buf, int n_floats) const {
        unrotate_shared(buf, n_floats / kv::BLOCK, signs, threadIdx.x, FLASH_THREADS);
    }
};

}  // namespace flash
