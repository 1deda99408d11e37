// Shared by the sampling kernels (sampling.cu) and the speculative rule (speculative_sampling.cu): the
// device structs whose layouts engine/cuda/sampling.py mirrors, order keys, fixed-point weights, the
// counter-based RNG, block reductions and the draw that walks a mass in id order. Semantics and the
// buffers' contract: the top of sampling.cu.
#pragma once

#define SAMPLE_THREADS 256
#define SAMPLE_BINS 2048
#define KEY_NEG_INF 0x007fffffu  // order_key(-inf); larger keys below KEY_POS_INF are finite
#define KEY_POS_INF 0xff800000u  // order_key(+inf)
#define FIXED_ONE 1099511627776.0f  // 2^40: fixed-point scale of a weight
#define NEG_INF_F __int_as_float(0xff800000)

struct SampleParams {
    double temperature;         // 0 = greedy
    double top_p;               // 1 = off
    double min_p;               // 0 = off
    double repetition_penalty;  // 1 = off
    double presence_penalty;
    double frequency_penalty;
    unsigned long long seed;
    unsigned long long counter;  // index of the next draw; advanced by sample_draw
    int top_k;                   // 0 = off
    int reserved;
};

// A request's logit_bias (OpenAI's: at most RIGLLM_MAX_LOGIT_BIAS distinct ids), added to the logits before the
// penalties; written by the host once per request.
#define RIGLLM_MAX_LOGIT_BIAS 300
struct LogitBias {
    int n;
    int ids[RIGLLM_MAX_LOGIT_BIAS];
    float values[RIGLLM_MAX_LOGIT_BIAS];
};

struct __align__(16) ArgmaxPartial {
    float value;
    int index;
    int n_finite;
    int bad;  // a NaN or +inf was seen
};

struct SampleState {
    unsigned final_key;  // support threshold (see the top of the file)
    int final_ntie;
    int done;            // 1: sample_prepare already wrote out_id (greedy or bad scores)
    int n_finite;
    float smax;
    float inv_temp;
    unsigned topk_key;   // top-k boundary: keys above it plus topk_ntie ids at it (KEY_NEG_INF: off)
    int topk_ntie;
    int active[2];       // select stages still to run: [0] top-k (count), [1] top-p (mass)
    unsigned prefix;     // key bits fixed so far by the running select
    int reserved;
    unsigned long long target;  // count or fixed-point mass still to cover below the prefix
};

struct __align__(16) DrawPartial {
    unsigned long long mass_gt;  // fixed-point weight of this block's tokens with key > final_key
    int n_eq;                    // this block's tokens with key == final_key
    int reserved;
};

__constant__ int kPassShift[3] = {21, 10, 0};
__constant__ int kPassBits[3] = {11, 11, 10};

// ---------------------------------------------------------------------------------------------
// Keys, weights, random numbers

__device__ __forceinline__ unsigned order_key(float x) {
    unsigned u = __float_as_uint(x);
    if ((u & 0x7fffffffu) == 0u) u = 0u;  // -0 equals +0: one key
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_value(unsigned key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

__device__ __forceinline__ bool key_finite(unsigned key) { return key > KEY_NEG_INF && key < KEY_POS_INF; }

__device__ __forceinline__ unsigned long long fixed_weight(float s, float smax, float inv_temp) {
    const float x = s < smax ? (s - smax) * inv_temp : 0.0f;
    return __float2ull_rn(expf(x) * FIXED_ONE);
}

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ double uniform01(unsigned long long seed, unsigned long long counter) {
    return (double)(splitmix64(seed ^ splitmix64(counter)) >> 11) * 0x1.0p-53;
}

// The reference's order of operations, in float64 with explicit roundings (no FMA contraction), so
// the fp32 result is the reference's float64 value rounded once.
__device__ __forceinline__ float penalize(float x, int count, const SampleParams& p) {
    if (count <= 0) return x;
    double s = (double)x;
    if (p.repetition_penalty != 1.0) s = s > 0.0 ? __ddiv_rn(s, p.repetition_penalty) : __dmul_rn(s, p.repetition_penalty);
    s = __dsub_rn(s, __dadd_rn(__dmul_rn((double)count, p.frequency_penalty), p.presence_penalty));
    return __double2float_rn(s);
}

// ---------------------------------------------------------------------------------------------
// Block reductions (256 threads)

struct Best {
    float value;
    int index;
};

__device__ __forceinline__ Best better(Best a, Best b) {
    return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

__device__ __forceinline__ ArgmaxPartial combine(ArgmaxPartial a, ArgmaxPartial b) {
    const Best m = better(Best{a.value, a.index}, Best{b.value, b.index});
    return ArgmaxPartial{m.value, m.index, a.n_finite + b.n_finite, a.bad | b.bad};
}

__device__ ArgmaxPartial block_reduce_argmax(ArgmaxPartial v) {
    __shared__ ArgmaxPartial warp_best[SAMPLE_THREADS / 32];
    for (int off = 16; off > 0; off >>= 1) {
        ArgmaxPartial o;
        o.value = __shfl_down_sync(0xffffffffu, v.value, off);
        o.index = __shfl_down_sync(0xffffffffu, v.index, off);
        o.n_finite = __shfl_down_sync(0xffffffffu, v.n_finite, off);
        o.bad = __shfl_down_sync(0xffffffffu, v.bad, off);
        v = combine(v, o);
    }
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) warp_best[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SAMPLE_THREADS / 32; ++w) v = combine(v, warp_best[w]);
    }
    __syncthreads();
    return v;  // valid in thread 0
}

__device__ unsigned long long block_sum_u64(unsigned long long v) {
    __shared__ unsigned long long warp_sum[SAMPLE_THREADS / 32];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SAMPLE_THREADS / 32; ++w) v += warp_sum[w];
    }
    __syncthreads();
    return v;  // valid in thread 0
}

// Exclusive prefix sum over the block in thread order; returns this thread's offset, *total gets the sum.
__device__ unsigned long long block_exclusive_scan_u64(unsigned long long v, unsigned long long* total) {
    __shared__ unsigned long long vals[SAMPLE_THREADS];
    vals[threadIdx.x] = v;
    __syncthreads();
    for (int off = 1; off < SAMPLE_THREADS; off <<= 1) {
        const unsigned long long add = threadIdx.x >= off ? vals[threadIdx.x - off] : 0ull;
        __syncthreads();
        vals[threadIdx.x] += add;
        __syncthreads();
    }
    const unsigned long long inclusive = vals[threadIdx.x];
    *total = vals[SAMPLE_THREADS - 1];
    __syncthreads();
    return inclusive - v;
}

__device__ __forceinline__ void block_slice(int n, int nparts, int part, int* begin, int* end) {
    const int len = (n + nparts - 1) / nparts;
    *begin = min(part * len, n);
    *end = min(*begin + len, n);
}

__device__ __forceinline__ void scan_slice(const float* scores, int begin, int end, ArgmaxPartial* acc) {
    for (int v = begin + (int)threadIdx.x; v < end; v += SAMPLE_THREADS) {
        const float s = scores[v];
        const unsigned key = order_key(s);
        if (s != s || key == KEY_POS_INF) {
            acc->bad = 1;
            continue;
        }
        acc->n_finite += key_finite(key);
        const Best m = better(Best{acc->value, acc->index}, Best{s, v});
        acc->value = m.value;
        acc->index = m.index;
    }
}

__device__ __forceinline__ ArgmaxPartial empty_partial() { return ArgmaxPartial{NEG_INF_F, 0x7fffffff, 0, 0}; }

__device__ __forceinline__ unsigned long long support_weight(float s, const SampleState& st) {
    const unsigned key = order_key(s);
    return (key > st.final_key && key_finite(key)) ? fixed_weight(s, st.smax, st.inv_temp) : 0ull;
}

// ---------------------------------------------------------------------------------------------
// Walking a mass in id order. Block-wide (all SAMPLE_THREADS threads call these, every thread gets the
// result). A vocabulary-wide pass has already summed each of the nparts slices (block_slice) into a
// DrawPartial; `weight(v)` is the integer weight of token v that the pass summed.

// The token at offset `want` (0 <= want < the slice's sum) of slice `slice`'s mass, or -1 when the
// weights do not reach it (inconsistent partials: never for sums this kernel family wrote).
template <class Weight>
__device__ int find_in_slice(int V, int nparts, int slice, unsigned long long want, Weight weight) {
    __shared__ int found;
    if (threadIdx.x == 0) found = -1;
    int begin, end;
    block_slice(V, nparts, slice, &begin, &end);
    const int chunk = (end - begin + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int my_begin = min(begin + (int)threadIdx.x * chunk, end);
    const int my_end = min(my_begin + chunk, end);
    unsigned long long mine = 0ull;
    for (int v = my_begin; v < my_end; ++v) mine += weight(v);
    unsigned long long slice_total;
    const unsigned long long before = block_exclusive_scan_u64(mine, &slice_total);  // its barriers publish `found`
    if (before <= want && want < before + mine) {
        unsigned long long cum = before;
        for (int v = my_begin; v < my_end; ++v) {
            cum += weight(v);
            if (want < cum) {
                found = v;
                break;
            }
        }
    }
    __syncthreads();
    const int result = found;
    __syncthreads();  // a later call's reset of `found` waits for every thread's read
    return result;
}

// The slice holding offset `rank` of a mass whose per-slice sums are `in_slice(b)`; `rank` becomes the
// offset inside it. Thread 0 only.
template <class InSlice>
__device__ int slice_of(int nparts, unsigned long long* rank, InSlice in_slice) {
    int b = 0;
    for (; b < nparts - 1; ++b) {
        const unsigned long long n = in_slice(b);
        if (*rank < n) break;
        *rank -= n;
    }
    return b;
}

// A draw at u in [0, 1) from a row's support (id order: tokens above the threshold by weight, then the
// tied tokens, lowest ids first, each of equal weight): first the slice, from sample_draw_partial's sums,
// then the token inside it. Returns the id (-1 on inconsistent partials).
__device__ int draw_support(const float* __restrict__ scores, int V, const SampleState& st,
                            const DrawPartial* __restrict__ dpart, int nparts, double u) {
    __shared__ int use_ties;             // 1: the draw lands among the tied tokens
    __shared__ unsigned long long want;  // mass offset (above-threshold part) or tie rank, inside the slice
    __shared__ int slice;
    unsigned long long mass = 0ull, eq = 0ull;
    for (int i = threadIdx.x; i < nparts; i += SAMPLE_THREADS) {
        mass += dpart[i].mass_gt;
        eq += (unsigned long long)dpart[i].n_eq;
    }
    mass = block_sum_u64(mass);
    eq = block_sum_u64(eq);
    if (threadIdx.x == 0) {
        const unsigned long long ntie = min(eq, (unsigned long long)st.final_ntie);
        const unsigned long long w_eq = ntie > 0ull ? fixed_weight(key_value(st.final_key), st.smax, st.inv_temp) : 0ull;
        const unsigned long long total = mass + ntie * w_eq;
        unsigned long long r = (unsigned long long)(u * (double)total);
        if (r >= total) r = total - 1ull;
        use_ties = r >= mass;
        unsigned long long rank = use_ties ? (r - mass) / w_eq : r;
        slice = use_ties ? slice_of(nparts, &rank, [&](int b) { return (unsigned long long)dpart[b].n_eq; })
                         : slice_of(nparts, &rank, [&](int b) { return dpart[b].mass_gt; });
        want = rank;
    }
    __syncthreads();
    const bool ties = use_ties;
    return find_in_slice(V, nparts, slice, want, [&](int v) {
        return ties ? (unsigned long long)(order_key(scores[v]) == st.final_key) : support_weight(scores[v], st);
    });
}
