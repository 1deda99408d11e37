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
//
// Rows (issue 28): the sampling kernels also run for several logits rows in one launch, grid (.., rows):
// row r = blockIdx.y reads logits + r*V and uses row r of every scratch array (scores [rows][V], partials
// [rows][nparts], SampleState [rows], hist [rows][2048], DrawPartial [rows][nparts], out_id [rows]). The
// per-request state (SampleParams, counts) belongs to a slot: with row_slot not null, row r uses slot
// row_slot[r]'s (params + slot, counts + slot*V), so one captured step serves any set of slots; with
// row_slot null the pointers are the one slot's own. With one row (blockIdx.y = 0) nothing moves.
#include "sampling.cuh"

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

// Token counts: counts[ids[i]] += delta for i < n (ids outside [0, V) are ignored: -1 pads a list). A
// speculative round adds its drafts for the later rows' penalties and takes them back with delta = -1.
extern "C" __global__ void token_counts_add(int* __restrict__ counts, const int* __restrict__ ids, int n, int V,
                                           int delta) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int id = ids[i];
        if (id >= 0 && id < V) atomicAdd(&counts[id], delta);
    }
}

// A token the step's mask leaves out (bit v % 32 of word v / 32 clear) scores -inf.
__device__ __forceinline__ float masked(float s, const unsigned* mask, int v) {
    return mask != nullptr && !((mask[v >> 5] >> (v & 31)) & 1u) ? NEG_INF_F : s;
}

// scores = the request's view of the logits (may alias logits): its logit_bias added, the penalties applied, then
// the step's token mask; part[block] = that block's argmax / finite count / bad flag. Constraints (engine/cuda/
// token_masks.py): mask_entry [slots] holds each slot's entry in mask_pool ([entries][mask_words] bitsets) for this
// step, -1 for none; bias [slots] each slot's logit_bias. Both may be null (no constraints), and move per row with
// row_slot like params. The bias's few ids are rewritten by the block that owns them after the plain pass.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_scores(const float* logits, const int* __restrict__ counts, const SampleParams* __restrict__ params,
              float* scores, ArgmaxPartial* __restrict__ part, int V, const int* __restrict__ row_slot,
              const int* __restrict__ mask_entry, const unsigned* __restrict__ mask_pool, int mask_words,
              const LogitBias* __restrict__ bias) {
    const int row = blockIdx.y;
    logits += (size_t)row * V;
    scores += (size_t)row * V;
    part += (size_t)row * gridDim.x;
    if (row_slot != nullptr) {
        const int slot = row_slot[row];
        params += slot;
        counts += (size_t)slot * V;
        if (mask_entry != nullptr) mask_entry += slot;
        if (bias != nullptr) bias += slot;
    }
    const SampleParams& p = *params;  // read in place: a copy of the record spilled once params moved per row
    const bool penalties = p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
    const unsigned* mask = mask_entry != nullptr && *mask_entry >= 0 ? mask_pool + (size_t)*mask_entry * mask_words
                                                                     : nullptr;
    const int n_bias = bias != nullptr ? bias->n : 0;
    int begin, end;
    block_slice(V, gridDim.x, blockIdx.x, &begin, &end);
    if (penalties || mask != nullptr) {
        for (int v = begin + (int)threadIdx.x; v < end; v += SAMPLE_THREADS) {
            const float x = logits[v];
            scores[v] = masked(penalties ? penalize(x, counts[v], p) : x, mask, v);
        }
    } else if (scores != logits) {
        for (int v = begin + (int)threadIdx.x; v < end; v += SAMPLE_THREADS) scores[v] = logits[v];
    }
    if (n_bias > 0) {
        __syncthreads();  // the plain pass's writes to a biased id come first
        for (int i = threadIdx.x; i < n_bias; i += SAMPLE_THREADS) {
            const int v = bias->ids[i];
            if (v < begin || v >= end) continue;
            const float x = logits[v] + bias->values[i];
            scores[v] = masked(penalties ? penalize(x, counts[v], p) : x, mask, v);
        }
        __syncthreads();
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
               int* __restrict__ out_id, int V, const int* __restrict__ row_slot) {
    __shared__ int finished;
    __shared__ float smax;
    const int row = blockIdx.y;
    part += (size_t)row * nparts;
    st += row;
    hist += (size_t)row * SAMPLE_BINS;
    out_id += row;
    if (row_slot != nullptr) {
        params += row_slot[row];
        counts += (size_t)row_slot[row] * V;
    }
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
    scores += (size_t)blockIdx.y * V;  // row blockIdx.y (see "Rows" above)
    st += blockIdx.y;
    hist += (size_t)blockIdx.y * SAMPLE_BINS;
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
              unsigned long long* __restrict__ hist, int slot, const int* __restrict__ row_slot) {
    const int stage = slot / 3;
    const int pass = slot % 3;
    st += blockIdx.y;
    hist += (size_t)blockIdx.y * SAMPLE_BINS;
    if (row_slot != nullptr) params += row_slot[blockIdx.y];
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

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_draw_partial(const float* __restrict__ scores, int V, const SampleState* __restrict__ st_ptr,
                    DrawPartial* __restrict__ dpart) {
    scores += (size_t)blockIdx.y * V;
    dpart += (size_t)blockIdx.y * gridDim.x;
    const SampleState st = st_ptr[blockIdx.y];
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

// Draws u in [0, 1) and takes the token at that point of the support's mass (draw_support).
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_draw(const float* __restrict__ scores, int V, SampleParams* __restrict__ params,
            const SampleState* __restrict__ st_ptr, const DrawPartial* __restrict__ dpart, int nparts,
            int* __restrict__ counts, int* __restrict__ out_id, const int* __restrict__ row_slot) {
    const int row = blockIdx.y;
    scores += (size_t)row * V;
    dpart += (size_t)row * nparts;
    out_id += row;
    if (row_slot != nullptr) {
        params += row_slot[row];
        counts += (size_t)row_slot[row] * V;
    }
    const SampleState st = st_ptr[row];
    if (st.done) return;
    const int v = draw_support(scores, V, st, dpart, nparts, uniform01(params->seed, params->counter));
    if (threadIdx.x == 0) {
        out_id[0] = v;
        if (v >= 0) {
            counts[v] += 1;
            params->counter += 1ull;
        }
    }
}
