// Q8_1 quantisation of one 32-value block held one value per lane of a warp: the form the fused
// epilogues of RMSNorm, SwiGLU and the attention output gate use to write the input of the next GEMV.
//
// Same rule as quantize.cu (engine/reference/activation_rounding.py, the reference's kernel mode):
//     amax = max|x|;  d = amax / 127 (fp32);  q = amax == 0 ? 0 : roundf(x / d)   (IEEE division, half away from 0)
// and the stored scale is fp16(d) (round to nearest even) widened back to fp32.
#pragma once

#include "common.cuh"

// All 32 lanes must call it, lane i holding element i of the block; `q` is this lane's output byte,
// `d` the block's scale (written by lane 0).
__device__ __forceinline__ void q8_1_quantize_warp(float v, signed char* q, float* d) {
    const float amax = rigllm::warp_max(fabsf(v));
    const float scale = amax / 127.0f;
    *q = (signed char)(amax == 0.0f ? 0 : (int)roundf(v / scale));
    if ((threadIdx.x & 31) == 0) *d = __half2float(__float2half_rn(scale));
}
