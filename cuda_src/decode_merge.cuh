// The flash decode kernels' last step, written once for attention.cu's attn_decode and kv_cache.cu's
// kv_decode: each of WARPS warps has walked its own keys with an online softmax per query head g of the
// group (m[g] = max score, l[g] = sum of weights, o[g] = weighted sum of values, lane l holding dims
// [l*PL, (l+1)*PL) of o), and the block's single state per query head is their merge: every warp's
// state scaled to the block maximum, then summed (a warp with no key of the split has m = -inf and is
// skipped). The states go through shared memory the caller declares (kv_decode reuses sh_o[0] to
// un-rotate the merged rows).
#pragma once

#include "common.cuh"

namespace flash {

// Every thread of the block calls it. After one barrier, each merged element (g, dim), dim < DW, is
// handed to exactly one thread as emit(g, dim, o, m, l) (o unnormalised, m and l the block's max and
// sum for head g), so emit may overwrite sh_o[0][g][dim] in place.
template <int WARPS, int G, int DW, int PL, class Emit>
__device__ __forceinline__ void merge_warp_states(float (&sh_m)[WARPS][G], float (&sh_l)[WARPS][G],
                                                  float (&sh_o)[WARPS][G][DW], const float (&m)[G],
                                                  const float (&l)[G], const float (&o)[G][PL], Emit emit) {
    const float neg_inf = __int_as_float(0xff800000);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            sh_m[warp][g] = m[g];
            sh_l[warp][g] = l[g];
        }
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < PL; ++i) sh_o[warp][g][lane * PL + i] = o[g][i];
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * DW; idx += blockDim.x) {
        const int g = idx / DW;
        const int dim = idx - g * DW;
        float m_max = neg_inf;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) m_max = fmaxf(m_max, sh_m[w][g]);
        float acc = 0.f, l_sum = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            if (sh_m[w][g] == neg_inf) continue;  // a warp that had no key of this split
            const float f = __expf(sh_m[w][g] - m_max);
            acc = fmaf(f, sh_o[w][g][dim], acc);
            l_sum = fmaf(f, sh_l[w][g], l_sum);
        }
        emit(g, dim, acc, m_max, l_sum);
    }
}

}  // namespace flash
