"""The Volta rules every kernel build is held to, in one place (contracts.md "Kernel builds").

- No tensor-core instruction in the PTX: the CMP 100-210's tensor cores are throttled to ~6 TFLOP/s,
  slower than DP4A and HFMA2, so `mma`/`wmma`/`ldmatrix` (HMMA/IMMA in SASS) never appear.
- At most 96 KiB of shared memory per block (Volta's opt-in maximum); ptxas reports the static part,
  launchers must keep static + dynamic under the same bound.
- No register spills in the hot kernels (the ones a decode or prefill step runs many times). A helper
  that adds a hot kernel adds its name to `HOT_KERNELS`; the CI test fails if a listed name no longer
  exists, so a rename cannot silently drop a kernel from the check.
"""

from __future__ import annotations

import re

from engine.cuda.ptxas import KernelResources

MAX_SHARED_BYTES = 96 * 1024

HOT_KERNELS = frozenset(
    {
        "quantize_q8_1",
        *(f"gemv_q8_t{t}" for t in range(1, 9)),
        "gemm_q8_0_q8_1",
        "gemm_q8_0_q8_1_db",
        "embed_q8_0",
        *(f"gemv_{q}_t{t}" for q in ("q4_k", "q5_k", "q6_k") for t in range(1, 9)),
        # the T = 1 variants kq_weight.DEFAULT_KQ_T1 launches (a unit test keeps the two in step)
        *(f"gemv_{q}_t1{v}" for q in ("q4_k", "q5_k", "q6_k") for v in ("_p2", "_r4_u1")),
        *(f"gemm_{q}_q8_1{s}" for q in ("q4_k", "q5_k", "q6_k") for s in ("", "_db")),
        *(f"embed_{q}" for q in ("q4_k", "q5_k", "q6_k")),
        "rmsnorm_q8_1",
        "attn_prep",
        "attn_decode_d256_g4",
        "attn_decode_d256_g6",
        "attn_prefill_d256",
        "attn_merge_gate",
        "kv_encode_int8",
        "kv_encode_wht4",
        "kv_encode_wht3",
        "kv_rotate_q",
        *(f"kv_decode_{f}_d256_g{g}" for f in ("k8v3", "k3v3") for g in (4, 6)),
        "kv_prefill_k8v3_d256",
        "kv_prefill_k3v3_d256",
        "sparse_prefill_d256",
        "swiglu_q8_1",
        "gdn_conv_silu",
        "gdn_recurrent",
        "gdn_recurrent_wide",
        "gdn_recurrent_conv",
        "gdn_recurrent_conv_wide",
        "gdn_chunk_prefill",
        "gdn_gated_norm",
        "argmax_partial",
        "argmax_final",
        "sample_scores",
        "sample_prepare",
        "sample_hist",
        "sample_select",
        "sample_draw_partial",
        "sample_draw",
    }
)

# PTX instructions that run on tensor cores (or only feed them). Matched as opcodes, not as substrings
# of names, so a kernel called e.g. `summary` is not flagged.
_TENSOR_CORE_OPCODE = re.compile(r"(?<![\w.$%])(wmma|mma|ldmatrix|stmatrix|movmatrix|wgmma|HMMA|IMMA)\b")


def tensor_core_instructions(ptx: str) -> list[str]:
    """PTX lines (comments stripped) that use a tensor-core instruction."""
    hits = []
    for line in ptx.splitlines():
        code = line.split("//", 1)[0]
        if _TENSOR_CORE_OPCODE.search(code):
            hits.append(line.strip())
    return hits


def resource_violations(resources: dict[str, KernelResources]) -> list[str]:
    """Human-readable breaches of the shared-memory bound (any kernel) and of the no-spill rule (hot kernels)."""
    problems = []
    for name, res in sorted(resources.items()):
        if res.shared_bytes > MAX_SHARED_BYTES:
            problems.append(f"{name}: {res.shared_bytes} bytes of static shared memory > {MAX_SHARED_BYTES}")
        if name in HOT_KERNELS and res.spills:
            problems.append(
                f"{name}: hot kernel spills ({res.spill_store_bytes} B stores, {res.spill_load_bytes} B loads "
                f"at {res.registers} registers)"
            )
    return problems
