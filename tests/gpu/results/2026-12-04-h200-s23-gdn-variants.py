"""Session 23's edits of cuda_src/gdn.cu (at 64feb47) for the GDN probe (…-s23a-gdn-probe.py): each variant is the
committed source with text replaced, built into OUT/NAME as an sm_90 fatbin (with the other cuda_src headers beside
it). The variants only time parts of the kernel; none is in the tree. Needs the kernels extra (NVRTC).
usage: python3 THIS OUT [NAME ...]   (default: every variant)
"""
import shutil
import sys
from pathlib import Path

from engine.cuda.kernel_build import CUDA_SRC_DIR, build_fatbins

TEXT = (CUDA_SRC_DIR / "gdn.cu").read_text()
BODY = TEXT.index("__device__ __forceinline__ void gdn_recurrent_body"), TEXT.index("#define RIGLLM_GDN_RECURRENT(")


def rep(text: str, old: str, new: str, body_only: bool = False) -> str:
    """`text` with `old` (which must occur exactly once, or anywhere in the recurrent body) replaced."""
    if body_only:
        head, body, tail = text[:BODY[0]], text[BODY[0]:BODY[1]], text[BODY[1]:]
        assert old in body, old
        return head + body.replace(old, new) + tail
    assert text.count(old) == 1, old
    return text.replace(old, new)


STATE_STORE = """    gdn_thread_rows<GROUPS>(ty, [&](int j, int i, int r) {
        if (col_ok && r < dk) S[(size_t)r * dv + c] = s[j][i];
    });
"""
FENCE_O = "    __threadfence();  // publish this block's o before it is counted\n"
KEY_ATOMIC = "        is_last_of_key = CONV && atomicAdd(key_done, 1u) == (unsigned)(Hv / Hk) * gridDim.y - 1;\n"
KEY_ADVANCE = """    if (CONV && is_last_of_key) {  // every reader of key head kh's q and k channels has read their state
        if (tid == 0) *key_done = 0u;
        __threadfence();
        for (int i = tid; i < 2 * dk; i += blockDim.x)
            gdn_conv_advance(mix, mix_stride, t0, conv_st(), (i < dk ? 0 : Ck - dk) + kh * dk + i, Cc);
    }
"""
SUMS = "        const float2 norms = gdn_block_sum2(ssq, ssk, scratch);  // its barriers also publish sq, sk, sv, sgate\n"
U_READ = """        const float u = sgate[0] * (sv[tx] - sk_dot);
        __syncthreads();  // everyone has read red, sv and sgate
"""
LOAD = "    if constexpr (!LATE_STATE) load_state();\n"
STORE_AND_RETURN = """{
        gdn_thread_rows<GROUPS>(ty, [&](int j, int i, int r) {
            if (col_ok && r < dk) S[(size_t)r * dv + c] = s[j][i] * %s;
        });
        return;
    }
"""
NORM_OLD = """    float ss = 0.f;
    for (int c = threadIdx.x; c < dv; c += blockDim.x) {
        const float x = __ldcg(o + c);
        ss += x * x;
    }
    ss = gdn_block_sum(ss, scratch);
    const float inv = 1.f / sqrtf(ss / (float)dv + eps);
    const int lane = threadIdx.x & 31;
    for (int c0 = threadIdx.x - lane; c0 < dv; c0 += blockDim.x) {  // warp-uniform loop over 32-blocks
        const int c = c0 + lane;
        float val = 0.f;
        if (c < dv) {
            val = (__ldcg(o + c) * inv) * w[c] * gdn_silu(z[c]);"""
NORM_NEW = """    float ss = 0.f, mine = 0.f, wz = 0.f;
    const bool own = (int)threadIdx.x < dv;
    if (own) wz = w[threadIdx.x];
    const float zz = own ? z[threadIdx.x] : 0.f;
    for (int c = threadIdx.x; c < dv; c += blockDim.x) {
        const float x = __ldcg(o + c);
        if (c == (int)threadIdx.x) mine = x;
        ss += x * x;
    }
    ss = gdn_block_sum(ss, scratch);
    const float inv = 1.f / sqrtf(ss / (float)dv + eps);
    const int lane = threadIdx.x & 31;
    for (int c0 = threadIdx.x - lane; c0 < dv; c0 += blockDim.x) {  // warp-uniform loop over 32-blocks
        const int c = c0 + lane;
        float val = 0.f;
        if (c < dv) {
            val = c == (int)threadIdx.x ? (mine * inv) * wz * gdn_silu(zz) : (__ldcg(o + c) * inv) * w[c] * gdn_silu(z[c]);"""
ADVANCE_OLD = """#pragma unroll
    for (int j = 0; j < GDN_CONV_K - 2; ++j) conv_state[(size_t)j * Cc + ch] = conv_state[(size_t)(j + 1) * Cc + ch];
    conv_state[(size_t)(GDN_CONV_K - 2) * Cc + ch] = mix[(size_t)row * mix_stride + ch];
"""
ADVANCE_NEW = """    float next[GDN_CONV_K - 1];
#pragma unroll
    for (int j = 0; j < GDN_CONV_K - 2; ++j) next[j] = conv_state[(size_t)(j + 1) * Cc + ch];
    next[GDN_CONV_K - 2] = mix[(size_t)row * mix_stride + ch];
#pragma unroll
    for (int j = 0; j < GDN_CONV_K - 1; ++j) conv_state[(size_t)j * Cc + ch] = next[j];
"""
V_ADVANCE = """        if (ty == 0) {
            sv[tx] = col_ok ? channel(t, 2 * Ck + n * dv + c) : 0.f;
            if (CONV && col_ok)  // its only reader
                gdn_conv_advance(mix, mix_stride, t0, conv_st(), 2 * Ck + n * dv + c, Cc);
        }
"""
LATE_LOAD = "        if constexpr (LATE_STATE) load_state();\n"
BOUNDS = "    extern \"C\" __global__ void __launch_bounds__(GDN_RECURRENT_THREADS, GDN_RECURRENT_MIN_BLOCKS) NAME("
ACQREL = 'asm volatile("fence.acq_rel.gpu;" ::: "memory");'


def store_late(t: str) -> str:
    t = rep(t, STATE_STORE + "\n" + FENCE_O, FENCE_O)
    return rep(t, KEY_ADVANCE, STATE_STORE + KEY_ADVANCE)


def early_key(t: str) -> str:
    t = rep(rep(t, KEY_ATOMIC, ""), KEY_ADVANCE, "")
    t = rep(t, SUMS, SUMS + """        if (CONV && tid == 0)  // every q and k channel of this block is read: count it now
            is_last_of_key = atomicAdd(counters + (size_t)t0 * (Hv + Hk) + Hv + kh, 1u) == (unsigned)(Hv / Hk) * gridDim.y - 1;
""")
    return rep(t, U_READ, U_READ + """        if (CONV && is_last_of_key) {  // every reader of key head kh's q and k channels has read their state
            if (tid == 0) counters[(size_t)t0 * (Hv + Hk) + Hv + kh] = 0u;
            __threadfence();
            for (int i = tid; i < 2 * dk; i += blockDim.x)
                gdn_conv_advance(mix, mix_stride, t0, conv_st(), (i < dk ? 0 : Ck - dk) + kh * dk + i, Cc);
        }
""")


def min_blocks(t: str, blocks: int) -> str:
    return rep(t, BOUNDS, BOUNDS.replace("GDN_RECURRENT_MIN_BLOCKS",
                                         f"(CONV && GROUPS == 1) ? {blocks} : GDN_RECURRENT_MIN_BLOCKS"))


tailfast = rep(TEXT, NORM_OLD, NORM_NEW)
VARIANTS = {
    "base": TEXT,
    "empty": rep(TEXT, "    const int t0 = blockIdx.z;\n", "    const int t0 = blockIdx.z;\n    if (gridDim.x > 0) return;\n",
                 body_only=True),
    "notail": rep(TEXT, FENCE_O, "    return;\n"),
    "nostore": rep(TEXT, "if (col_ok && r < dk) S[(size_t)r * dv + c] = s[j][i];\n    });\n\n    __threadfence();",
                   "if (col_ok && r < dk && s[j][i] == 1234.5f) S[(size_t)r * dv + c] = s[j][i];\n    });\n\n    __threadfence();"),
    "noprefetch": rep(TEXT, "        if (t == 0)\n            rigllm::prefetch_l2(", "        if (t < 0)\n            rigllm::prefetch_l2("),
    "acqrel": rep(TEXT, "__threadfence();", ACQREL, body_only=True),
    "tailfast": tailfast,
    "both": rep(tailfast, "__threadfence();", ACQREL, body_only=True),
    "nonorm": rep(TEXT, "        gdn_gated_norm_head(y + at", "        if (gridDim.x > 0) break;\n        gdn_gated_norm_head(y + at"),
    "nokey": rep(TEXT, KEY_ADVANCE, ""),
    "storelate": store_late(TEXT),
    "earlykey": early_key(TEXT),
    "combo": early_key(store_late(tailfast)),
    "staterw": rep(TEXT, LOAD, LOAD + "    if (gridDim.x > 0) " + STORE_AND_RETURN % "1.0001f"),
    "inputs": rep(TEXT, SUMS, SUMS + "        if (gridDim.x > 0) " + STORE_AND_RETURN % "(norms.x + norms.y + sv[tx] + sgate[0])"),
    "noconv": rep(rep(TEXT, "        if constexpr (CONV) return gdn_conv_one(mix, mix_stride, t0, conv_st(), conv_w, ch, Cc);\n",
                      "        if constexpr (CONV) return mix[(size_t)t0 * mix_stride + ch];\n"),
                  """            if (CONV && col_ok)  // its only reader
                gdn_conv_advance(mix, mix_stride, t0, conv_st(), 2 * Ck + n * dv + c, Cc);
""", ""),
    # s23f's "new": the conv state's advance loads every row before its first store, and the v channel's advance
    # comes after the token's other loads (tested for the tree, measured no faster, not kept)
    "new": rep(rep(rep(TEXT, ADVANCE_OLD, ADVANCE_NEW), V_ADVANCE,
                   "        if (ty == 0) sv[tx] = col_ok ? channel(t, 2 * Ck + n * dv + c) : 0.f;\n"),
               LATE_LOAD, LATE_LOAD + "        if (CONV && ty == 0 && col_ok) gdn_conv_advance(mix, mix_stride, t0, conv_st(), "
                                      "2 * Ck + n * dv + c, Cc);\n"),
    "mb2": min_blocks(TEXT, 2),
    "mb3": min_blocks(TEXT, 3),
}

if __name__ == "__main__":
    out = Path(sys.argv[1])
    for name in sys.argv[2:] or list(VARIANTS):
        src = out / "src" / name
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        for header in CUDA_SRC_DIR.glob("*.cuh"):
            shutil.copy(header, src)
        (src / "gdn.cu").write_text(VARIANTS[name])
        build_fatbins(out / name, src, sass_archs=(90,))
        print(name, flush=True)
