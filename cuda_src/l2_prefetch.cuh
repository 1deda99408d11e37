// Prefetch of a weight region into L2 (issue 30 experiment): `rows` rows of `row_stride` bytes from `base`, the
// first `lines` * `step` bytes of each, one `prefetch.global.L2` per `step` bytes, by block `block` of `blocks`.
// The requests are fire-and-forget: the block exits once they are issued.
#pragma once

__device__ __forceinline__ void l2_prefetch_region(const char* base, long long row_stride, int rows, int lines, int step,
                                                   int block, int blocks) {
    const long long total = (long long)rows * lines;
    for (long long i = (long long)block * blockDim.x + threadIdx.x; i < total; i += (long long)blocks * blockDim.x) {
        const long long row = i / lines;
        const char* p = base + row * row_stride + (i - row * lines) * step;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
}
