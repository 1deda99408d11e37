"""Per-card memory plan, made before any allocation (contracts.md "Hardware facts"; architecture rule 7).

A card profile is the card's total bytes minus a reserve for the CUDA context and driver (600 MiB),
a safety margin (3 % of the total) and memory other processes use (when known). The trunk layers are
cut into contiguous ranges, one per card, so that the fullest card is as empty as possible (exact:
a small dynamic programme over cut points, minimising the largest used/usable ratio). A layer costs
its device weights (model_footprint), its KV at the chosen context and KV format, and its GDN state
for `n_seqs` sequences. Card 0 also holds the token embedding (only rows are gathered, but all of
it lives there); the last card holds the final norm and the LM head (with more than one card and
tied embeddings or the MTP block, a second copy of `token_embd`), the MTP block when it is enabled,
and the logits.
Every card gets scratch for one prefill chunk of activations plus a fixed allowance for kernel
images, graphs and per-step buffers; these are estimates until the CUDA backend reports actual
bytes, which the app shows next to the plan. A plan that does not fit raises `RigllmError` naming the
card and the shortfall.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.errors import RigllmError
from engine.gguf.config import ModelConfig
from engine.model.kv_formats import CUDA_KERNEL_FORMATS, KVFormat, kv_format_for_bits, kv_format_of
from engine.model.model_footprint import FP32_BYTES, Footprint

MIB = 1 << 20
GIB = 1 << 30
CARD_16GB_BYTES = 16 * GIB  # a "16 GB card" is 16 GiB of HBM2
CUDA_CONTEXT_RESERVE = 600 * MIB
SAFETY_MARGIN = 0.03
SCRATCH_FIXED = 64 * MIB  # kernel images, CUDA graphs, per-step parameter and sampler buffers
DEFAULT_PREFILL_CHUNK = 512  # tokens per prefill chunk the activation scratch is sized for


@dataclass(frozen=True)
class CardProfile:
    """One card's capacity; `usable_bytes` is what the plan may fill."""

    name: str
    total_bytes: int
    reserve_bytes: int = CUDA_CONTEXT_RESERVE
    margin: float = SAFETY_MARGIN
    other_used_bytes: int = 0  # memory other processes hold, when known

    @property
    def usable_bytes(self) -> int:
        return self.total_bytes - self.reserve_bytes - self.other_used_bytes - int(self.margin * self.total_bytes)


def cards_16gb(n: int) -> list[CardProfile]:
    """`n` default 16 GB card profiles, named `card 0`..`card n-1`."""
    return [CardProfile(f"card {i}", CARD_16GB_BYTES) for i in range(n)]


@dataclass(frozen=True)
class CardPlan:
    """What one card holds and how many bytes each part takes."""

    profile: CardProfile
    layers: range  # trunk layers on this card
    embedding: bool
    head: bool
    mtp: bool
    weight_bytes: int
    kv_bytes: int
    state_bytes: int
    scratch_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.state_bytes + self.scratch_bytes

    @property
    def free_bytes(self) -> int:
        return self.profile.usable_bytes - self.total_bytes


@dataclass(frozen=True)
class MemoryPlan:
    cards: tuple[CardPlan, ...]
    context: int  # KV cells (tokens), shared by all sequences
    kv_format: str
    n_seqs: int  # sequences with their own GDN state
    with_mtp: bool
    notes: tuple[str, ...]
    kv_k: str = "fp16"  # the K side's codec (kv_formats.KVCodec name: fp16, int8, wht4, wht3)
    kv_v: str = "fp16"

    @property
    def total_bytes(self) -> int:
        return sum(c.total_bytes for c in self.cards)


def format_bytes(n: int) -> str:
    """Binary units, to two or one decimals: '14.93 GiB', '193.9 MiB', '32.0 KiB', '512 B'."""
    if abs(n) >= GIB:
        return f"{n / GIB:.2f} GiB"
    if abs(n) >= MIB:
        return f"{n / MIB:.1f} MiB"
    return f"{n / 1024:.1f} KiB" if abs(n) >= 1024 else f"{n} B"


def scratch_bytes(cfg: ModelConfig, prefill_chunk: int) -> int:
    """Activation workspace for one prefill chunk (double-buffered fp32: residual in/out + widest projection)."""
    widest = max(
        2 * cfg.d_ff, 2 * cfg.q_dim + 2 * cfg.kv_dim, cfg.ssm_conv_dim + cfg.ssm_d_inner + 2 * cfg.ssm_n_v_heads
    )
    return SCRATCH_FIXED + 2 * prefill_chunk * FP32_BYTES * (2 * cfg.d_model + widest)


def logits_bytes(cfg: ModelConfig, n_seqs: int) -> int:
    """fp32 logits and the sampler's equally sized workspace, per sequence."""
    return 2 * n_seqs * cfg.vocab_size * FP32_BYTES


def draft_logits_bytes(cfg: ModelConfig, n_seqs: int, draft_tokens: int) -> int:
    """The MTP head's fp32 draft logits rows, K per sequence: each slot of a round keeps its own until its rule has
    read them (several slots draft together, then verify together: engine.cuda.speculative)."""
    return n_seqs * draft_tokens * cfg.vocab_size * FP32_BYTES


def resolve_kv_format(kv: KVFormat | str | None, k_bits: int | None, v_bits: int | None) -> KVFormat:
    """`kv` (a format, a name, or None = f16) with its K and/or V side replaced by `k_bits` / `v_bits`."""
    base = kv_format_of(kv)
    if k_bits is None and v_bits is None:
        return base
    bits = {c: b for b, c in ((16, "fp16"), (8, "int8"), (4, "wht4"), (3, "wht3"))}
    return kv_format_for_bits(
        bits[base.k.name] if k_bits is None else k_bits, bits[base.v.name] if v_bits is None else v_bits
    )


def plan(
    fp: Footprint,
    cards: list[CardProfile],
    context: int,
    kv: KVFormat | str | None = None,
    n_seqs: int = 1,
    with_mtp: bool = False,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    *,
    k_bits: int | None = None,
    v_bits: int | None = None,
    verify_states: int = 0,
    split: Sequence[int] | None = None,
) -> MemoryPlan:
    """The balanced plan of `fp` over `cards`; raises RigllmError if it cannot fit.

    `with_mtp` adds the MTP block (weights and KV); `verify_states` the speculative verify's rollback states,
    extra GDN states per sequence and layer (the CUDA backend keeps its draft count: engine.cuda.gdn.GdnRing), and
    as many draft logits rows per sequence.

    The KV format is `kv` (default f16) with the K and V sides optionally chosen by bits (16, 8, 4, 3):
    `plan(fp, cards, 262144, k_bits=3, v_bits=3)` is the k3v3 plan. A vision tower in the footprint
    (`fp.vision_bytes`) goes on the first card, where image rows enter the model. `split`: layers per card
    chosen by the user (e.g. 22,22,20), checked like the balanced split it replaces.
    """
    kv = resolve_kv_format(kv, k_bits, v_bits)
    cfg = fp.config
    n = len(cards)
    if n < 1 or context < 1 or n_seqs < 1 or prefill_chunk < 1:
        raise RigllmError(
            "a memory plan needs at least one card, one token of context, one sequence and a prefill chunk"
        )
    if n > cfg.n_layers:
        raise RigllmError(f"cannot split {cfg.n_layers} layers over {n} cards")
    if with_mtp and cfg.n_mtp == 0:
        raise RigllmError("the model has no MTP block to enable")
    for card in cards:
        if card.usable_bytes <= 0:
            raise RigllmError(f"{card.name}: no usable memory ({format_bytes(card.total_bytes)} total)")

    states = 1 + verify_states  # the live GDN state, plus the verify's ring

    def layer_parts(block: int) -> tuple[int, int, int]:
        return (
            fp.block_bytes[block],
            context * fp.kv_bytes_per_token(block, kv),
            n_seqs * states * fp.state_bytes_per_sequence(block),
        )

    mtp_blocks = range(cfg.n_layers, cfg.n_blocks) if with_mtp else range(0)
    vision_bytes = fp.vision_bytes
    scratch = scratch_bytes(cfg, prefill_chunk)

    def extras(k: int) -> tuple[int, int, int, int]:
        """(weights, kv, state, scratch) a card holds besides its trunk layers."""
        weights, kv_bytes, state, extra_scratch = 0, 0, 0, scratch
        if k == 0:
            weights += fp.embedding_bytes + vision_bytes[0]
            extra_scratch += vision_bytes[1]
        if k == n - 1:
            # over several cards the last keeps its own token_embd: as the LM head (tied) or for the MTP head
            own_embedding = n > 1 and (cfg.tied_embeddings or with_mtp)
            weights += fp.head_bytes + (fp.embedding_bytes if own_embedding else 0)
            for block in mtp_blocks:
                w, c, s = layer_parts(block)
                weights, kv_bytes, state = weights + w, kv_bytes + c, state + s
            extra_scratch += logits_bytes(cfg, n_seqs)
            if with_mtp:
                extra_scratch += draft_logits_bytes(cfg, n_seqs, verify_states)
        return weights, kv_bytes, state, extra_scratch

    layer_cost = [sum(layer_parts(i)) for i in range(cfg.n_layers)]
    fixed = [sum(extras(k)) for k in range(n)]
    if split is not None:
        cuts = layer_cuts(cfg.n_layers, split)
        if len(cuts) != n + 1:
            raise RigllmError(f"the split gives {len(cuts) - 1} cards, {n} were given")
    else:
        cuts = _balanced_cuts(layer_cost, fixed, [c.usable_bytes for c in cards])

    plans = []
    for k, card in enumerate(cards):
        layers = range(cuts[k], cuts[k + 1])
        weights, kv_bytes, state, extra_scratch = extras(k)
        for block in layers:
            w, c, s = layer_parts(block)
            weights, kv_bytes, state = weights + w, kv_bytes + c, state + s
        plans.append(
            CardPlan(card, layers, k == 0, k == n - 1, with_mtp and k == n - 1, weights, kv_bytes, state, extra_scratch)
        )

    over = [p for p in plans if p.free_bytes < 0]
    if over:
        worst = min(over, key=lambda p: p.free_bytes)
        vision = (f" (the vision tower takes {format_bytes(sum(vision_bytes))} of it: serve without the mmproj "
                  f"to free that)" if worst.embedding and any(vision_bytes) else "")
        raise RigllmError(
            f"{worst.profile.name}: the plan needs {format_bytes(worst.total_bytes)} for layers "
            f"{worst.layers.start}-{worst.layers.stop - 1} (weights {format_bytes(worst.weight_bytes)}, "
            f"KV {format_bytes(worst.kv_bytes)} at {context} tokens in {kv.name}, GDN state {format_bytes(worst.state_bytes)}, "
            f"scratch {format_bytes(worst.scratch_bytes)}) but has {format_bytes(worst.profile.usable_bytes)} usable: "
            f"short by {format_bytes(-worst.free_bytes)} on {n} card(s){vision}; use more cards, a shorter context or a smaller KV format"
        )
    notes = _notes(fp, n, context, kv, with_mtp)
    if any(vision_bytes):
        notes.append(f"vision tower on {cards[0].name}: {format_bytes(vision_bytes[0])} of weights and "
                     f"{format_bytes(vision_bytes[1])} for the largest image")
    return MemoryPlan(tuple(plans), context, kv.name, n_seqs, with_mtp, tuple(notes), kv.k.name, kv.v.name)


def layer_cuts(n_layers: int, counts: Sequence[int]) -> list[int]:
    """Cut points `0 = c0 < ... < cn = n_layers` from per-card layer counts (a user's split like 22,22,20)."""
    if sum(counts) != n_layers or any(c < 1 for c in counts):
        raise RigllmError(f"a layer split must give every card at least one layer and {n_layers} in all, "
                          f"not {','.join(map(str, counts))}")
    cuts = [0]
    for c in counts:
        cuts.append(cuts[-1] + int(c))
    return cuts


def _balanced_cuts(cost: list[int], fixed: list[int], usable: list[int]) -> list[int]:
    """Cut points `0 = c0 < c1 < ... < cn = len(cost)` minimising max_k (fixed_k + layers of k) / usable_k."""
    n, length = len(fixed), len(cost)
    prefix = [0]
    for c in cost:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][b]: smallest worst ratio with cards 0..k holding layers [0, b); arg[k][b]: where card k starts
    best = [[inf] * (length + 1) for _ in range(n)]
    arg = [[0] * (length + 1) for _ in range(n)]
    for b in range(1, length + 1):
        best[0][b] = (fixed[0] + prefix[b]) / usable[0]
    for k in range(1, n):
        for b in range(k + 1, length + 1):
            for a in range(k, b):
                ratio = max(best[k - 1][a], (fixed[k] + prefix[b] - prefix[a]) / usable[k])
                if ratio < best[k][b]:
                    best[k][b], arg[k][b] = ratio, a
    cuts = [length]
    for k in range(n - 1, 0, -1):
        cuts.append(arg[k][cuts[-1]])
    cuts.append(0)
    return cuts[::-1]


MTP_LEFT_OFF = "the MTP head is left off: with it the model does not fit on these cards at this context"


def load_plan(fp: Footprint, cards: list[CardProfile], context: int, kv: KVFormat | str | None = None, *,
              with_mtp: bool, draft_tokens: int = 1, **kwargs: Any) -> MemoryPlan:
    """The plan the CUDA backend loads by (its own, the app's load sheet's, `rigllm info`'s): `with_mtp`, the
    MTP block and the verify's GDN rings (`draft_tokens` states per layer) when they fit, else the plan
    without them, noted (`plan`'s refusal when neither fits): speculation is worth having, never worth
    refusing a model that fits without it."""
    if not with_mtp:
        return plan(fp, cards, context, kv, **kwargs)
    try:
        return plan(fp, cards, context, kv, with_mtp=True, verify_states=draft_tokens, **kwargs)
    except RigllmError:
        made = plan(fp, cards, context, kv, **kwargs)
        return replace(made, notes=made.notes + (MTP_LEFT_OFF,))


def _notes(fp: Footprint, n_cards: int, context: int, kv: KVFormat, with_mtp: bool) -> list[str]:
    cfg = fp.config
    notes = [f"weights counted from {fp.source}"]
    if fp.requantised:
        notes.append(f"{fp.requantised} large F16/BF16/F32 weights are counted as requantised to Q8_0 at load")
    if cfg.tied_embeddings and n_cards > 1:
        notes.append("tied embeddings: the last card keeps its own copy of token_embd as the LM head")
    elif with_mtp and n_cards > 1:
        notes.append("MTP head: the last card keeps its own copy of token_embd for the head's input")
    if context > cfg.context_length:
        notes.append(f"context {context} is beyond the model's native {cfg.context_length} tokens")
    if kv.name not in CUDA_KERNEL_FORMATS:
        kernels = ", ".join(CUDA_KERNEL_FORMATS)
        notes.append(f"KV format {kv.name}: sizes only; the CUDA backend has kernels for {kernels}")
    return notes
