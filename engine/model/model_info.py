"""Describe a validated model file: the facts `rigllm info` prints (engine.commands.info_text renders them), as a JSON-able dict.

Everything here is derived from the loaded file and the shared sizing code (model_footprint,
kv_formats, memory_plan), so `info` shows exactly what the loader and planner will use.
"""

from __future__ import annotations

from typing import Any

from engine.errors import RigllmError
from engine.gguf.loader import LoadedModel
from engine.gguf.tensor_layout import model_tensors
from engine.gguf.validate import block_of
from engine.model.kv_formats import DEFAULT_LONG_CONTEXT_FORMAT, KV_FORMATS, kv_format
from engine.model.memory_plan import MemoryPlan, cards_16gb, load_plan
from engine.model.model_footprint import footprint_of, gdn_conv_state_bytes, gdn_recurrent_state_bytes

MAX_CARDS = 4


def layer_pattern_text(recurrent: tuple[bool, ...], group: int) -> str:
    """`GGGA GGGA ...`: G = Gated DeltaNet, A = full attention, grouped by the attention interval."""
    letters = "".join("G" if r else "A" for r in recurrent)
    return " ".join(letters[i : i + group] for i in range(0, len(letters), group))


def describe(
    model: LoadedModel,
    context: int | None = None,
    kv_name: str = DEFAULT_LONG_CONTEXT_FORMAT,
    with_mtp: bool | None = None,
    split: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """The facts `rigllm info` reports; plans use `context` (default: the model's) and `kv_name`, for 1-4
    cards with the planner's split, or for len(split) cards with the user's `split` (layers per card)."""
    cfg = model.config
    kv = kv_format(kv_name)
    context = cfg.context_length if context is None else context
    with_mtp = cfg.n_mtp > 0 if with_mtp is None else with_mtp
    fp = footprint_of(model)
    card = cards_16gb(1)[0]

    params = {"trunk": 0, "mtp": 0}
    for name, _ in model_tensors(cfg):
        block = block_of(name)
        params["mtp" if block is not None and block >= cfg.n_layers else "trunk"] += model.file.tensors[name].n_elements
    conv, recurrent = gdn_conv_state_bytes(cfg), gdn_recurrent_state_bytes(cfg)
    n_gdn = len(cfg.gdn_layers)

    plans: list[dict[str, Any]] = []
    counts = [len(split)] if split is not None else range(1, min(MAX_CARDS, cfg.n_layers) + 1)
    for n_cards in counts:
        try:
            plans.append(
                {
                    "n_cards": n_cards,
                    "fits": True,
                    **_plan_dict(load_plan(fp, cards_16gb(n_cards), context, kv, with_mtp=with_mtp, split=split)),
                }
            )
        except RigllmError as err:
            plans.append({"n_cards": n_cards, "fits": False, "error": str(err)})

    return {
        "file": str(model.path),
        "architecture": model.file.architecture,
        "name": model.file.fields.get("general.name"),
        "parameters": {**params, "total": params["trunk"] + params["mtp"]},
        "layers": {
            "trunk": cfg.n_layers,
            "gdn": n_gdn,
            "attention": cfg.n_layers - n_gdn,
            "mtp": cfg.n_mtp,
            "pattern": layer_pattern_text(cfg.is_recurrent[: cfg.n_layers], cfg.full_attention_interval),
        },
        "context_length": cfg.context_length,
        "vocab_size": cfg.vocab_size,
        "tied_embeddings": cfg.tied_embeddings,
        "tensor_types": model.type_counts,
        "weight_bytes": {"file": fp.file_bytes, "device": fp.weight_bytes, "requantised_tensors": fp.requantised},
        "kv_bytes_per_token": {name: f.bytes_per_token(cfg) for name, f in KV_FORMATS.items()},
        "kv_bytes_per_token_with_mtp": (
            {name: f.bytes_per_token(cfg, with_mtp=True) for name, f in KV_FORMATS.items()} if cfg.n_mtp else None
        ),
        "gdn_state_bytes_per_sequence": {
            "conv": n_gdn * conv,
            "recurrent": n_gdn * recurrent,
            "total": n_gdn * (conv + recurrent),
        },
        "plan_settings": {
            "card_bytes": card.total_bytes,
            "usable_bytes": card.usable_bytes,
            "context": context,
            "kv_format": kv.name,
            "kv_k": kv.k.name,
            "kv_v": kv.v.name,
            "with_mtp": with_mtp,
            "split": list(split) if split is not None else None,
        },
        "plans": plans,
        "warnings": list(model.warnings),
    }


def _plan_dict(p: MemoryPlan) -> dict[str, Any]:
    cards = [
        {
            "name": c.profile.name,
            "first_layer": c.layers.start,
            "last_layer": c.layers.stop - 1,
            "embedding": c.embedding,
            "head": c.head,
            "mtp": c.mtp,
            "weight_bytes": c.weight_bytes,
            "kv_bytes": c.kv_bytes,
            "state_bytes": c.state_bytes,
            "scratch_bytes": c.scratch_bytes,
            "total_bytes": c.total_bytes,
            "usable_bytes": c.profile.usable_bytes,
            "free_bytes": c.free_bytes,
        }
        for c in p.cards
    ]
    return {"cards": cards, "notes": list(p.notes)}
