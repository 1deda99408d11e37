// The CUDA device language as plain C++ for the emulated card (tests/emu/README.md): cuda_src/ compiles with g++
// against this header instead of NVRTC's, and each CUDA thread of a launch runs as a fiber of fibers.cpp.
//
// Why: sessions without a GPU could not run a kernel, so code written for the card went untested until the next
// GPU session. This runs the same kernels' arithmetic on the CPU (slowly) so the GPU tests can run anywhere.
// It is a test tool, not a second backend: fp32 maths is the host's (fast-math intrinsics such as __expf are
// the exact function), L2 prefetches and memory ordering between blocks do nothing (blocks run one after the
// other), and timings mean nothing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

// ---- the language's keywords -------------------------------------------------------------------------------
#ifdef EMU_LIST_KERNELS
#define __global__ emu_kernel_marker  // build.py finds each kernel's name after it in the preprocessed source
#else
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// Blocks run one at a time and a block's threads are fibers of one host thread, so a function-local static is
// exactly one block's shared memory. build.py moves all of them into one section, which fibers.cpp fills with
// 0xFF bytes (NaN floats, -1 ints) before every block: a real card's shared memory starts undefined, and a kernel
// that reads what it did not write then shows it, the same way every run.
#define __shared__ static
#define __constant__ static const

namespace emu {
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
// Set by the scheduler before every switch into a fiber (fibers.cpp).
extern dim3 threadIdx, blockIdx, blockDim, gridDim;
// Warp barrier / block barrier: the calling fiber waits until every live thread of its warp / block arrives.
void warp_barrier();
void block_barrier();
// A warp's exchange slot of `lane` (16 bytes; shuffles of wider values go in pieces).
unsigned char* warp_slot(unsigned lane);
unsigned lane_id();
void* dynamic_shared();
[[noreturn]] void trap(const char* why);
}  // namespace emu

using emu::blockDim;
using emu::blockIdx;
using emu::gridDim;
using emu::threadIdx;
constexpr int warpSize = 32;

inline void __syncthreads() { emu::block_barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_barrier(); }
inline void __threadfence() {}
inline void __threadfence_block() {}
[[noreturn]] inline void __trap() { emu::trap("__trap()"); }

// ---- vector types ------------------------------------------------------------------------------------------
#define EMU_VEC2(T, N) \
    struct alignas(2 * sizeof(T)) N { T x, y; };
#define EMU_VEC4(T, N, A) \
    struct alignas(A) N { T x, y, z, w; };
EMU_VEC2(float, float2)
EMU_VEC4(float, float4, 16)
EMU_VEC2(int, int2)
EMU_VEC4(int, int4, 16)
EMU_VEC2(unsigned, uint2)
EMU_VEC4(unsigned, uint4, 16)
EMU_VEC4(unsigned char, uchar4, 4)
EMU_VEC4(signed char, char4, 4)
EMU_VEC2(unsigned short, ushort2)
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }

// ---- fp16 --------------------------------------------------------------------------------------------------
// _Float16 converts with round-to-nearest-even, as __float2half_rn; an operation on halves is done in fp32 and
// rounded once, which is exact for products and for sums of halves whose exponents are close.
struct __half {
    _Float16 v;
    __half() = default;
    __half(float f) : v((_Float16)f) {}
    __half(double f) : v((_Float16)(float)f) {}
    __half(int i) : v((_Float16)(float)i) {}
    operator float() const { return (float)v; }
};
struct alignas(4) __half2 {
    __half x, y;
};
using half = __half;
using half2 = __half2;
static_assert(sizeof(__half) == 2 && sizeof(__half2) == 4);

inline __half operator+(__half a, __half b) { return __half((float)a + (float)b); }
inline __half operator-(__half a, __half b) { return __half((float)a - (float)b); }
inline __half operator*(__half a, __half b) { return __half((float)a * (float)b); }
inline __half operator/(__half a, __half b) { return __half((float)a / (float)b); }
inline __half operator-(__half a) { return __half(-(float)a); }
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __low2float(__half2 h) { return (float)h.x; }
inline float __high2float(__half2 h) { return (float)h.y; }
inline float2 __half22float2(__half2 h) { return {(float)h.x, (float)h.y}; }
inline __half2 __float2half2_rn(float f) { return {__half(f), __half(f)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __half2 __float22half2_rn(float2 f) { return {__half(f.x), __half(f.y)}; }
inline unsigned short __half_as_ushort(__half h) {
    unsigned short u;
    std::memcpy(&u, &h, 2);
    return u;
}
inline __half __ushort_as_half(unsigned short u) {
    __half h;
    std::memcpy(&h, &u, 2);
    return h;
}
// One rounding of the exact a*b+c: the product of two halves is exact in fp32 and the sum is exact in double.
inline __half emu_hfma(__half a, __half b, __half c) { return __half((double)(float)a * (float)b + (float)c); }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return {emu_hfma(a.x, b.x, c.x), emu_hfma(a.y, b.y, c.y)}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return {a.x * b.x, a.y * b.y}; }
inline __half2 __hadd2(__half2 a, __half2 b) { return {a.x + b.x, a.y + b.y}; }
inline __half __hfma(__half a, __half b, __half c) { return emu_hfma(a, b, c); }
inline __half __hmul(__half a, __half b) { return a * b; }
inline __half __hadd(__half a, __half b) { return a + b; }

// ---- bit casts and rounding intrinsics ---------------------------------------------------------------------
template <typename To, typename From>
inline To emu_bits(From f) {
    static_assert(sizeof(To) == sizeof(From));
    To t;
    std::memcpy(&t, &f, sizeof(To));
    return t;
}
inline float __int_as_float(int i) { return emu_bits<float>(i); }
inline int __float_as_int(float f) { return emu_bits<int>(f); }
inline float __uint_as_float(unsigned u) { return emu_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return emu_bits<unsigned>(f); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __double2float_rn(double d) { return (float)d; }
inline int __float2int_rn(float f) { return (int)std::nearbyint(f); }
inline int __float2int_rz(float f) { return (int)f; }
inline int __float2int_rd(float f) { return (int)std::floor(f); }
inline unsigned long long __float2ull_rn(float f) { return (unsigned long long)std::nearbyint(f); }
inline float __int2float_rn(int i) { return (float)i; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
using std::isfinite;
using std::isinf;
using std::isnan;
using std::max;
using std::min;
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline long long min(long long a, int b) { return min(a, (long long)b); }
inline long long min(int a, long long b) { return min((long long)a, b); }
inline long long max(long long a, int b) { return max(a, (long long)b); }
inline long long max(int a, long long b) { return max((long long)a, b); }
inline size_t min(size_t a, size_t b) { return a < b ? a : b; }
inline size_t max(size_t a, size_t b) { return a > b ? a : b; }

// ---- DP4A and byte-wise SIMD -------------------------------------------------------------------------------
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {  // the unsigned form: bytes as u8
    for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
    return c;
}
inline unsigned __vsub4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= ((((a >> (8 * i)) & 0xffu) - ((b >> (8 * i)) & 0xffu)) & 0xffu) << (8 * i);
    return r;
}

// ---- loads (cache hints do nothing here) and atomics (fibers switch only at barriers, so each is atomic) ----
template <typename T>
inline T __ldg(const T* p) { return *p; }
template <typename T>
inline T __ldcs(const T* p) { return *p; }
template <typename T>
inline T __ldcg(const T* p) { return *p; }
template <typename T>
inline T atomicAdd(T* p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
template <typename T>
inline T atomicOr(T* p, T v) {
    T old = *p;
    *p = old | v;
    return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
    T old = *p;
    *p = old > v ? old : v;
    return old;
}

// ---- warp exchanges ----------------------------------------------------------------------------------------
// Every lane posts its value, the warp meets, each reads its source lane's post, and the warp meets again before
// a slot can be reused. All masks in cuda_src/ are full, so the mask is not modelled (fibers.cpp waits for every
// live lane of the warp).
template <typename T>
inline T emu_shuffle_from(T v, unsigned src) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16, "a shuffle moves at most 16 bytes here");
    std::memcpy(emu::warp_slot(emu::lane_id()), &v, sizeof(T));
    emu::warp_barrier();
    T out;
    std::memcpy(&out, emu::warp_slot(src), sizeof(T));
    emu::warp_barrier();
    return out;
}
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    const unsigned lane = emu::lane_id();
    const unsigned src = lane ^ (unsigned)mask;
    return emu_shuffle_from(v, (src / width == lane / width) ? src : lane);
}
template <typename T>
inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    const unsigned lane = emu::lane_id();
    return emu_shuffle_from(v, (lane % width) + delta < (unsigned)width ? lane + delta : lane);
}
template <typename T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
    const unsigned lane = emu::lane_id();
    return emu_shuffle_from(v, (lane % width) >= delta ? lane - delta : lane);
}
template <typename T>
inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    const unsigned lane = emu::lane_id();
    return emu_shuffle_from(v, (lane / width) * width + ((unsigned)src % width));
}
unsigned emu_ballot(int pred);
inline unsigned __ballot_sync(unsigned, int pred) { return emu_ballot(pred); }

// ---- launching: build.py lists every kernel of a file as {name, emu::entry<&name>} ------------------------
#include <utility>
namespace emu {
// Calls f with its parameters read from args[i], each pointing at a value of the parameter's type (card.py).
template <typename... A, size_t... I>
inline void invoke(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}
template <auto F>
void entry(void** args) {
    []<typename... A>(void (*f)(A...), void** a) { invoke(f, a, std::index_sequence_for<A...>{}); }(F, args);
}
struct KernelEntry {
    const char* name;
    void (*run)(void**);
};
}  // namespace emu
