// Sampling on the GPU, so only the chosen token id crosses PCIe (architecture rule 8).
//
// Semantics: engine/generation/sampler.py (the truth). Penalties on the tokens counted so far, then
// greedy when temperature == 0; otherwise top-k, temperature, top-p (mass measured over the top-k
// set), min-p, renormalise, draw. Every filter keeps a prefix of the vocabulary sorted by score
// (descending, ties by lower id), so the support is one prefix, described by a threshold on an
// order-preserving 32-bit key of the score:
//
//   support = { v : key(v) > final_key }  plus the first final_ntie ids (lowest first) with key == final_key
//
// and it is found without sorting the vocabulary:
//   top-k  a 3-pass radix select on the key (11 + 11 + 10 bits, 2048-bin histograms) for the k-th
//          largest score, counting tokens;
//   top-p  the same radix select weighing tokens by their weight instead of counting them: the cut
//          is the first key (from the top) where the cumulative weight reaches top_p * total;
//   min-p  a threshold on the key found by a 256-way search with the reference's float64 predicate
//          exp(s/T - smax/T) >= min_p (monotone in s).
// The draw then walks the support in id order (the distribution is the same in any order).
//
// Weights: w = expf((s - smax) / T) in fp32 (the best token weighs exactly 1), summed as fixed-point
// integers w * 2^40 (unsigned 64-bit). Integer sums are associative, so atomics give the same totals
// on every run: a replayed step draws the same token, and the partial sums of the draw pass agree
// exactly with the sums the final search recomputes.
//
// RNG: counter-based, u = top 53 bits of splitmix64(seed ^ splitmix64(counter)) / 2^53. `counter` lives in
// the parameter buffer and the draw advances it by one, so a captured graph draws fresh numbers on
// every replay without host writes, and writing the counter back replays a draw exactly. Greedy
// steps consume no number (like the reference).
//
// Buffers (all on the device; layouts below are the contract with the host):
//   SampleParams  written by the host per request (float64 like the reference, so penalties are exact)
//   counts int32 [V]  how often each token occurred; the host zeroes or seeds it per request
//                     (token_counts_add), the sampler adds its pick.
//   scores fp32 [V]   the penalised logits (may alias logits)
//   ArgmaxPartial [nparts], SampleState, hist u64 [2048] (zero before the first step; the kernels leave
//   it zeroed), DrawPartial [nparts]
//
// Launch sequence for one full sampling step (static, so it can be captured once; stages that a
// request does not use exit at once):
//   sample_scores        grid nparts, block 256   penalties + per-block argmax
//   sample_prepare       grid 1,      block 256   greedy / error exit, min-p threshold, select set-up
//   sample_hist slot s   grid any,    block 256   } for s = 0..5: slots 0-2 top-k passes,
//   sample_select slot s grid 1,      block 256   } slots 3-5 top-p passes
//   sample_draw_partial  grid nparts, block 256
//   sample_draw          grid 1,      block 256   writes out_id, counts[out_id] += 1, counter += 1
// out_id = -1 when the scores contain NaN or +inf, or (not greedy) no score is finite: a backend bug,
// which the reference reports as an error too.
// Greedy alone (no penalties): argmax_partial (grid nparts) + argmax_final (grid 1).

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

// ---------------------------------------------------------------------------------------------
// Greedy argmax (ties -> lowest id, like numpy.argmax); out_id = -1 on NaN/+inf.

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
argmax_partial(const float* __restrict__ x, int n, ArgmaxPartial* __restrict__ part) {
    int begin, end;
    block_slice(n, gridDim.x, blockIdx.x, &begin, &end);
    ArgmaxPartial acc = empty_partial();
    scan_slice(x, begin, end, &acc);
    acc = block_reduce_argmax(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

__device__ ArgmaxPartial reduce_partials(const ArgmaxPartial* part, int nparts) {
    ArgmaxPartial acc = empty_partial();
    for (int i = threadIdx.x; i < nparts; i += SAMPLE_THREADS) acc = combine(acc, part[i]);
    return block_reduce_argmax(acc);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
argmax_final(const ArgmaxPartial* __restrict__ part, int nparts, int* __restrict__ out_id) {
    const ArgmaxPartial best = reduce_partials(part, nparts);
    if (threadIdx.x == 0) out_id[0] = best.bad ? -1 : best.index;
}

// ---------------------------------------------------------------------------------------------
// Full sampler

// Token counts: counts[ids[i]] += 1 for i < n (ids outside [0, V) are ignored).
extern "C" __global__ void token_counts_add(int* __restrict__ counts, const int* __restrict__ ids, int n, int V) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int id = ids[i];
        if (id >= 0 && id < V) atomicAdd(&counts[id], 1);
    }
}

// scores = penalised logits (may alias logits); part[block] = that block's argmax / finite count / bad flag.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_scores(const float* logits, const int* __restrict__ counts, const SampleParams* __restrict__ params,
              float* scores, ArgmaxPartial* __restrict__ part, int V) {
    const SampleParams p = *params;
    const bool penalties = p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
    int begin, end;
    block_slice(V, gridDim.x, blockIdx.x, &begin, &end);
    if (penalties) {
        for (int v = begin + (int)threadIdx.x; v < end; v += SAMPLE_THREADS) scores[v] = penalize(logits[v], counts[v], p);
    } else if (scores != logits) {
        for (int v = begin + (int)threadIdx.x; v < end; v += SAMPLE_THREADS) scores[v] = logits[v];
    }
    ArgmaxPartial acc = empty_partial();
    scan_slice(scores, begin, end, &acc);
    acc = block_reduce_argmax(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

__device__ __forceinline__ void narrow_support(SampleState* st, unsigned key, int ntie) {
    if (key > st->final_key || (key == st->final_key && ntie < st->final_ntie)) {
        st->final_key = key;
        st->final_ntie = ntie;
    }
}

__device__ __forceinline__ bool passes_min_p(unsigned key, const SampleParams& p, double scaled_max) {
    return exp((double)key_value(key) / p.temperature - scaled_max) >= p.min_p;
}

// Smallest key whose score passes min-p with the reference's float64 test exp(s/T - smax/T) >= min_p,
// which is monotone in s. A 256-way search: each round every thread tests one of 256 evenly spaced
// keys of [lo, hi] (the answer lies there and hi passes), and the interval shrinks to the gap after
// the last failing probe, so about 4 rounds of one exp per thread. All threads call it; all get the key.
__device__ unsigned min_p_key(const SampleParams& p, float smax) {
    __shared__ unsigned lo, hi;
    __shared__ int last_fail;
    const double scaled_max = (double)smax / p.temperature;
    if (threadIdx.x == 0) {
        lo = KEY_NEG_INF + 1u;  // the lowest finite key
        hi = order_key(smax);   // exp(0) = 1 >= min_p
        last_fail = -1;
    }
    __syncthreads();
    while (lo < hi) {
        const unsigned l = lo, h = hi;
        const unsigned probe = l + (unsigned)(((unsigned long long)(h - l) * threadIdx.x) / SAMPLE_THREADS);
        if (!passes_min_p(probe, p, scaled_max)) atomicMax(&last_fail, (int)threadIdx.x);
        __syncthreads();
        if (threadIdx.x == 0) {
            const int i = last_fail;
            if (i < 0) {
                hi = l;  // the lowest key passes
            } else {
                lo = l + (unsigned)(((unsigned long long)(h - l) * i) / SAMPLE_THREADS) + 1u;
                hi = i + 1 < SAMPLE_THREADS ? l + (unsigned)(((unsigned long long)(h - l) * (i + 1)) / SAMPLE_THREADS) : h;
            }
            last_fail = -1;
        }
        __syncthreads();
    }
    return lo;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_prepare(const ArgmaxPartial* __restrict__ part, int nparts, const SampleParams* __restrict__ params,
               SampleState* __restrict__ st, unsigned long long* __restrict__ hist, int* __restrict__ counts,
               int* __restrict__ out_id) {
    __shared__ int finished;
    __shared__ float smax;
    for (int b = threadIdx.x; b < SAMPLE_BINS; b += SAMPLE_THREADS) hist[b] = 0ull;
    const ArgmaxPartial best = reduce_partials(part, nparts);
    const SampleParams p = *params;
    if (threadIdx.x == 0) {
        const bool greedy = p.temperature == 0.0;
        finished = 1;
        st->done = 1;
        if (best.bad || (!greedy && best.n_finite == 0)) {
            out_id[0] = -1;
        } else if (greedy) {
            out_id[0] = best.index;
            counts[best.index] += 1;
        } else {
            finished = 0;
            smax = best.value;
            st->done = 0;
            st->n_finite = best.n_finite;
            st->smax = best.value;
            st->inv_temp = (float)(1.0 / p.temperature);
            st->final_key = KEY_NEG_INF;  // every finite token
            st->final_ntie = 0;
            st->topk_key = KEY_NEG_INF;
            st->topk_ntie = 0;
            st->active[0] = p.top_k > 0 && p.top_k < best.n_finite;
            st->active[1] = p.top_p < 1.0;
            st->prefix = 0u;
            st->target = (unsigned long long)p.top_k;  // top-k target; the top-p target is set by its first pass
        }
    }
    __syncthreads();
    if (finished || p.min_p <= 0.0) return;
    const unsigned key = min_p_key(p, smax);
    if (threadIdx.x == 0) narrow_support(st, key, 0x7fffffff);
}

// One radix pass: histogram of the keys below the prefix found so far, bins = this pass's key bits.
// Top-k passes count tokens; top-p passes add fixed-point weights of the top-k set, leaving out the
// tokens tied at the top-k boundary (only topk_ntie of them belong to the set: sample_select adds them).
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_hist(const float* __restrict__ scores, int V, const SampleState* __restrict__ st,
            unsigned long long* __restrict__ hist, int slot) {
    const int stage = slot / 3;
    const int pass = slot % 3;
    if (st->done || !st->active[stage]) return;
    const int shift = kPassShift[pass];
    const int nbins = 1 << kPassBits[pass];
    const unsigned prefix = st->prefix;
    const unsigned topk_key = st->topk_key;
    const float smax = st->smax;
    const float inv_temp = st->inv_temp;

    __shared__ unsigned long long local[SAMPLE_BINS];
    for (int b = threadIdx.x; b < nbins; b += SAMPLE_THREADS) local[b] = 0ull;
    __syncthreads();
    for (int v = blockIdx.x * SAMPLE_THREADS + threadIdx.x; v < V; v += gridDim.x * SAMPLE_THREADS) {
        const float s = scores[v];
        const unsigned key = order_key(s);
        if (!key_finite(key)) continue;
        if (pass > 0 && (key >> (shift + kPassBits[pass])) != prefix) continue;
        unsigned long long add = 1ull;
        if (stage == 1) {
            if (key <= topk_key) continue;
            add = fixed_weight(s, smax, inv_temp);
            if (add == 0ull) continue;
        }
        atomicAdd(&local[(key >> shift) & (nbins - 1)], add);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < nbins; b += SAMPLE_THREADS) {
        if (local[b] != 0ull) atomicAdd(&hist[b], local[b]);
    }
}

// Consumes one histogram: finds the bin (from the top) where the running count or mass reaches the
// target, extends the prefix by it, zeroes the histogram. After the third pass the prefix is a whole
// key: the stage's threshold.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_select(const SampleParams* __restrict__ params, SampleState* __restrict__ st,
              unsigned long long* __restrict__ hist, int slot) {
    const int stage = slot / 3;
    const int pass = slot % 3;
    if (st->done || !st->active[stage]) return;  // uniform over the block
    const int shift = kPassShift[pass];
    const int bits = kPassBits[pass];
    const int nbins = 1 << bits;
    const unsigned prefix = st->prefix;

    __shared__ unsigned long long target;
    __shared__ int found_bin;
    __shared__ unsigned long long found_before;
    if (threadIdx.x == 0) {
        if (stage == 1 && st->topk_ntie > 0 && (pass == 0 || (st->topk_key >> (shift + bits)) == prefix)) {
            const unsigned k = st->topk_key;
            hist[(k >> shift) & (nbins - 1)] +=
                (unsigned long long)st->topk_ntie * fixed_weight(key_value(k), st->smax, st->inv_temp);
        }
        target = st->target;
        found_bin = -1;
    }
    __syncthreads();

    // Thread i owns a run of bins in descending order: bins [nbins - (i+1)*per, nbins - i*per).
    const int per = nbins / SAMPLE_THREADS;
    const int top = nbins - threadIdx.x * per;
    unsigned long long run = 0ull;
    for (int b = top - 1; b >= top - per; --b) run += hist[b];
    unsigned long long total;
    const unsigned long long before = block_exclusive_scan_u64(run, &total);
    if (stage == 1 && pass == 0) {  // top-p: target mass = top_p * (weight of the top-k set)
        if (threadIdx.x == 0) {
            unsigned long long t = (unsigned long long)ceil(params->top_p * (double)total);
            target = t < 1ull ? 1ull : (t > total ? total : t);
        }
        __syncthreads();
    }
    if (before < target && target <= before + run) {
        unsigned long long cum = before;
        for (int b = top - 1; b >= top - per; --b) {
            if (target <= cum + hist[b]) {
                found_bin = b;
                found_before = cum;
                break;
            }
            cum += hist[b];
        }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < nbins; b += SAMPLE_THREADS) hist[b] = 0ull;
    if (threadIdx.x != 0) return;
    if (found_bin < 0) {  // cannot happen for a consistent state; never cut on a bad one
        st->active[stage] = 0;
        return;
    }
    const unsigned new_prefix = (prefix << bits) | (unsigned)found_bin;
    const unsigned long long remaining = target - found_before;
    st->prefix = new_prefix;
    st->target = remaining;
    if (pass < 2) return;
    // new_prefix is now a whole key: the stage's threshold; `remaining` is what its tie group must cover.
    if (stage == 0) {
        st->topk_key = new_prefix;
        st->topk_ntie = (int)remaining;
        narrow_support(st, new_prefix, (int)remaining);
        st->prefix = 0u;  // the top-p select (if active) starts from scratch
    } else {
        const unsigned long long w = fixed_weight(key_value(new_prefix), st->smax, st->inv_temp);
        narrow_support(st, new_prefix, (int)((remaining + w - 1ull) / w));
    }
}

__device__ __forceinline__ unsigned long long support_weight(float s, const SampleState& st) {
    const unsigned key = order_key(s);
    return (key > st.final_key && key_finite(key)) ? fixed_weight(s, st.smax, st.inv_temp) : 0ull;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_draw_partial(const float* __restrict__ scores, int V, const SampleState* __restrict__ st_ptr,
                    DrawPartial* __restrict__ dpart) {
    const SampleState st = *st_ptr;
    if (st.done) return;
    int begin, end;
    block_slice(V, gridDim.x, blockIdx.x, &begin, &end);
    unsigned long long mass = 0ull;
    int n_eq = 0;
    for (int v = begin + (int)threadIdx.x; v < end; v += SAMPLE_THREADS) {
        const float s = scores[v];
        mass += support_weight(s, st);
        n_eq += order_key(s) == st.final_key;
    }
    mass = block_sum_u64(mass);
    const unsigned long long eq = block_sum_u64((unsigned long long)n_eq);
    if (threadIdx.x == 0) dpart[blockIdx.x] = DrawPartial{mass, (int)eq, 0};
}

// Draws u in [0, 1), maps it to a position in the support's fixed-point mass (id order: tokens above
// the threshold by weight, then the tied tokens, lowest ids first, each of equal weight), and finds
// the token: first the block of sample_draw_partial's slices, then the token inside the slice.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_draw(const float* __restrict__ scores, int V, SampleParams* __restrict__ params,
            const SampleState* __restrict__ st_ptr, const DrawPartial* __restrict__ dpart, int nparts,
            int* __restrict__ counts, int* __restrict__ out_id) {
    const SampleState st = *st_ptr;
    if (st.done) return;
    __shared__ int use_ties;               // 1: the draw lands among the tied tokens
    __shared__ unsigned long long want;    // mass offset (above-threshold part) or tie rank, inside the slice
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
        const double u = uniform01(params->seed, params->counter);
        unsigned long long r = (unsigned long long)(u * (double)total);
        if (r >= total) r = total - 1ull;
        use_ties = r >= mass;
        unsigned long long rank = use_ties ? (r - mass) / w_eq : r;
        int b = 0;
        for (; b < nparts - 1; ++b) {
            const unsigned long long in_block = use_ties ? (unsigned long long)dpart[b].n_eq : dpart[b].mass_gt;
            if (rank < in_block) break;
            rank -= in_block;
        }
        want = rank;
        slice = b;
        out_id[0] = -1;  // overwritten below by the thread that finds the token
    }
    __syncthreads();

    int begin, end;
    block_slice(V, nparts, slice, &begin, &end);
    const int chunk = (end - begin + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int my_begin = min(begin + (int)threadIdx.x * chunk, end);
    const int my_end = min(my_begin + chunk, end);
    unsigned long long mine = 0ull;
    for (int v = my_begin; v < my_end; ++v) {
        mine += use_ties ? (unsigned long long)(order_key(scores[v]) == st.final_key) : support_weight(scores[v], st);
    }
    unsigned long long slice_total;
    const unsigned long long before = block_exclusive_scan_u64(mine, &slice_total);
    if (before <= want && want < before + mine) {
        unsigned long long cum = before;
        for (int v = my_begin; v < my_end; ++v) {
            cum += use_ties ? (unsigned long long)(order_key(scores[v]) == st.final_key) : support_weight(scores[v], st);
            if (want < cum) {
                out_id[0] = v;
                counts[v] += 1;
                params->counter += 1ull;
                break;
            }
        }
    }
}
