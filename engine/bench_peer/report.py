"""Ratios, roofline fractions and CMP 100-210 projections for the peer benchmark, as JSON and markdown.

Projection method (every projected number is labelled as one; targets.md: a projected CMP number is
the fraction of an H200 ceiling reached, applied to the CMP's ceiling for the same resource):

* Decode, both engines: bytes read per token (`engine.cuda.bench.speed.decode_bytes`: every weight but the
  embedding table, the GDN state, the fp16 KV cache up to the depth; the same file, so the same bytes
  for both) × tokens/s = achieved GB/s; its fraction of the H200 read ceiling (our GEMV on the LM head,
  measured in the same call) applied to the CMP's 818 GB/s.
* Prefill, rigllm: matmul ops per token (2 × trunk matmul weights; attention score work not counted)
  × tokens/s as a fraction of the DP4A peak measured in the same call, applied to the CMP's 17.2 DP4A
  TOPS (the same as `rigllm bench`'s H200 time × DP4A-peak ratio).
* Prefill, llama.cpp: not projected. On the H200 its MMQ kernels run on int8 tensor cores (`mma`),
  whatever GGML_CUDA_FORCE_MMQ says (mmq.cu: `turing_mma_available` returns true before that flag is
  read); the CMP's Volta has no int8 tensor cores at all (its fp16 ones are throttled), so there llama.cpp
  runs a different kernel (DP4A MMQ with FORCE_MMQ, or fp16 cuBLAS) whose efficiency the H200 cannot
  show. An earlier version took llama.cpp's fraction of a `torch._int_mm` "tensor peak"; on the H200 that
  probe measured 126 TOPS, less than llama.cpp itself reached (128 TOPS at 9B, 18K), so it was no
  ceiling and the projection was dropped. llama.cpp's published CMP numbers (LLAMA_CMP_PUBLISHED,
  anchor-qengine.md §1.1) are printed under each table instead.
"""

from __future__ import annotations

from typing import Any

from engine.cuda.bench.cmp_model import CMP_READ_GBPS
from engine.cuda.bench.speed import CMP_DP4A_TOPS, decode_bytes
from engine.gguf.config import ModelConfig

# llama.cpp measured on CMP 100-210 cards by qengine's README (anchor-qengine.md §1.1; build 8462, FORCE_MMQ
# not stated). Prefill keys are prompt tokens; the 27B numbers are 3 cards with layer split.
LLAMA_CMP_PUBLISHED = {
    "9b": {"prefill_tokens_per_s": {297: 199, 1160: 316, 4620: 361, 18400: 324}, "tg64_tokens_per_s": 46.6},
    "27b": {"prefill_tokens_per_s_3cards": {297: 74.2, 1160: 127.8, 4620: 146.0, 18400: 140.0},
            "tg128_tokens_per_s_3cards": 17.7},
}


def matmul_ops_per_token(cfg: ModelConfig) -> int:
    """Integer ops (2 per multiply-add) of the trunk matmuls for one prompt token (no LM head: a prefill
    computes logits for its last token only)."""
    c = cfg
    gdn = (c.ssm_conv_dim + c.ssm_d_inner + 2 * c.ssm_n_v_heads) * c.d_model + c.d_model * c.ssm_d_inner
    attn = (2 * c.q_dim + 2 * c.kv_dim) * c.d_model + c.d_model * c.q_dim
    ffn = 3 * c.d_ff * c.d_model
    return 2 * (len(c.gdn_layers) * gdn + len(c.attention_layers) * attn + c.n_layers * ffn)


def decode_projection(tps: float, bytes_per_token: int, read_gbps: float) -> dict[str, float]:
    gbps = tps * bytes_per_token / 1e9
    fraction = gbps / read_gbps
    return {"gb_per_s": gbps, "fraction_of_read_ceiling": fraction,
            "projected_cmp_tokens_per_s": CMP_READ_GBPS * 1e9 * fraction / bytes_per_token}


def prefill_projection(tps: float, ops_per_token: int, peak_tops: float | None) -> dict[str, float | None]:
    """Fraction of `peak_tops` reached and the CMP tokens/s at that fraction of 17.2 DP4A TOPS (None
    when the peak was not measured)."""
    if not peak_tops:
        return {"fraction_of_peak": None, "projected_cmp_tokens_per_s": None}
    fraction = tps * ops_per_token / (peak_tops * 1e12)
    return {"fraction_of_peak": fraction, "projected_cmp_tokens_per_s": fraction * CMP_DP4A_TOPS * 1e12 / ops_per_token}


def compare_shape(shape: str, cfg: ModelConfig, ours: dict[str, Any] | None, llama: dict[str, dict[str, Any]],
                  read_gbps: float | None = None, weights: str = "q8_0") -> dict[str, Any]:
    """One shape's table: per prompt length and per depth, each engine's tokens/s, the ratios
    rigllm ÷ llama.cpp (per llama.cpp variant), the fractions and the projections. `read_gbps` is
    needed when `ours` is None (llama.cpp only). Bytes per decode token are the ones rigllm counted on
    the file (its K-quant matrices as stored); without them (llama.cpp only) the Q8_0 count of the shape,
    which is why a K-quant file needs rigllm's side."""
    if ours is None and weights != "q8_0":
        raise ValueError(f"a {weights} comparison needs rigllm's measurements (its byte count of the file)")
    ceilings = dict(ours["ceilings"]) if ours else {"read_gb_per_s": read_gbps}
    read = ceilings["read_gb_per_s"]
    ops = matmul_ops_per_token(cfg)
    prompts = sorted(set(ours["prefill_tokens_per_s"] if ours else ()) |
                     {n for v in llama.values() for n in v["prefill_tokens_per_s"]})
    depths = sorted(set(ours["decode_tokens_per_s"] if ours else ()) |
                    {d for v in llama.values() for d in v["decode_tokens_per_s"]})
    prefill, decode = {}, {}
    for n in prompts:
        row: dict[str, Any] = {"llama": {}, "ratio": {}}
        mine = ours["prefill_tokens_per_s"].get(n) if ours else None
        if mine is not None:
            row["rigllm"] = {"tokens_per_s": mine, **prefill_projection(mine, ops, ceilings.get("dp4a_tops"))}
        for name, v in llama.items():
            theirs = v["prefill_tokens_per_s"].get(n)
            if theirs is None:
                continue
            row["llama"][name] = {"tokens_per_s": theirs}
            if mine is not None:
                row["ratio"][name] = mine / theirs
        prefill[n] = row
    for d in depths:
        counted = ours.get("decode_bytes_per_token", {}) if ours else {}
        nbytes = counted.get(d) or decode_bytes(cfg, d)
        row = {"bytes_per_token": nbytes, "llama": {}, "ratio": {}}
        mine = ours["decode_tokens_per_s"].get(d) if ours else None
        if mine is not None:
            row["rigllm"] = {"tokens_per_s": mine, **decode_projection(mine, nbytes, read)}
        for name, v in llama.items():
            theirs = v["decode_tokens_per_s"].get(d)
            if theirs is None:
                continue
            row["llama"][name] = {"tokens_per_s": theirs, **decode_projection(theirs, nbytes, read)} if read else \
                {"tokens_per_s": theirs}
            if mine is not None:
                row["ratio"][name] = mine / theirs
        decode[d] = row
    return {"shape": shape, "weights": weights, "matmul_ops_per_token": ops, "ceilings": ceilings,
            "prefill": prefill, "decode": decode,
            # qengine's llama.cpp figures are for Q8_0 files
            "llama_cmp_published": LLAMA_CMP_PUBLISHED.get(shape) if weights == "q8_0" else None}


def _num(x: float | None, digits: int = 0) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n >= 2048 and n % 1024 == 0 else str(n)


def markdown_table(shape_result: dict[str, Any], variants: list[str]) -> str:
    """The README table for one shape: both engines' tokens/s, ratios, fractions and CMP projections
    (the projections of llama.cpp are for its first variant)."""
    first = variants[0] if variants else None
    head = ["test", "rigllm t/s"] + [f"llama.cpp {v} t/s" for v in variants] + [f"ratio vs {v}" for v in variants]
    head += ["rigllm % of peak", f"llama.cpp {first} % of peak" if first else "llama.cpp % of peak",
             "projected CMP rigllm t/s", f"projected CMP llama.cpp {first} t/s" if first else "projected CMP llama.cpp t/s"]
    title = (f"**{shape_result['shape']} shape, {shape_result.get('weights', 'q8_0').upper()}** (% of peak: prefill of the DP4A peak, rigllm only — llama.cpp's "
             "prefill runs on int8 tensor cores here; decode of the read ceiling)")
    lines = [title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(label: str, r: dict[str, Any], frac_key: str) -> str:
        mine = r.get("rigllm", {})
        cells = [label, _num(mine.get("tokens_per_s"), 1 if frac_key != "fraction_of_peak" else 0)]
        cells += [_num(r["llama"].get(v, {}).get("tokens_per_s"), 1 if frac_key != "fraction_of_peak" else 0)
                  for v in variants]
        cells += [_num(r["ratio"].get(v), 2) + ("×" if v in r["ratio"] else "") for v in variants]
        theirs = r["llama"].get(first, {}) if first else {}
        cells += [_pct(mine.get(frac_key)), _pct(theirs.get(frac_key)),
                  _num(mine.get("projected_cmp_tokens_per_s"), 1), _num(theirs.get("projected_cmp_tokens_per_s"), 1)]
        return "| " + " | ".join(cells) + " |"

    for n, r in shape_result["prefill"].items():
        lines.append(row(f"prefill {_tokens(int(n))}", r, "fraction_of_peak"))
    for d, r in shape_result["decode"].items():
        lines.append(row(f"decode at depth {_tokens(int(d))}", r, "fraction_of_read_ceiling"))
    published = shape_result.get("llama_cmp_published")
    if published:
        lines += ["", f"llama.cpp measured on CMP 100-210 cards (published, not by us): {published_text(published)}"]
    return "\n".join(lines)


def published_text(published: dict[str, Any]) -> str:
    """LLAMA_CMP_PUBLISHED's entry for one shape as one line of prose."""
    parts = []
    for key, value in published.items():
        label = key.replace("_tokens_per_s", "").replace("_", " ")
        if isinstance(value, dict):
            parts.append(f"{label} " + ", ".join(f"{n} tokens {v:g} t/s" for n, v in value.items()))
        else:
            parts.append(f"{label} {value:g} t/s")
    return "; ".join(parts) + "."


def with_int_keys(measured: dict[str, Any]) -> dict[str, Any]:
    """One engine's measurements with their prompt lengths and depths as ints again (JSON made them strings)."""
    keyed = ("prefill_tokens_per_s", "decode_tokens_per_s", "decode_bytes_per_token")
    return {**measured, **{key: {int(k): v for k, v in measured[key].items()} for key in keyed if key in measured}}


def rerender(saved: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A saved `peer-bench.json` with its comparisons recomputed from the raw measurements it holds (no
    GPU needed), and the markdown tables: how a change to this file's method reaches a past run."""
    from engine.gguf.shapes import shape_config

    tables = []
    for key, entry in saved["shapes"].items():
        shape, weights = entry.get("shape", key), entry.get("weights", "q8_0")  # runs before --weights: Q8_0
        ours = entry["rigllm"] and with_int_keys(entry["rigllm"])
        llama = {name: with_int_keys(v) for name, v in entry["llama"].items()}
        read = None if ours else entry["comparison"]["ceilings"].get("read_gb_per_s")
        entry["comparison"] = compare_shape(shape, shape_config(shape), ours, llama, read, weights)
        tables.append(markdown_table(entry["comparison"], list(llama)))
    return saved, "\n\n".join(tables)


if __name__ == "__main__":
    import json
    import sys
    from pathlib import Path

    if len(sys.argv) != 2:
        sys.exit("usage: python -m engine.bench_peer.report peer-bench.json   (rewrites its comparisons, writes the .md, prints the tables)")
    path = Path(sys.argv[1])
    result, text = rerender(json.loads(path.read_text()))
    path.write_text(json.dumps(result, indent=1, default=str))
    path.with_suffix(".md").write_text(text + "\n")
    print(text)
