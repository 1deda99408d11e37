"""Describe a validated model file: what `rigllm info` prints, as a JSON-able dict and as text.

Everything here is derived from the loaded file and the shared sizing code (model_footprint,
kv_formats, memory_plan), so `info` shows exactly what the loader and planner will use.
"""

from __future__ import annotations

from typing import Any

from engine.errors import RigllmError
from engine.gguf.loader import LoadedModel
from engine.gguf.tensor_layout import model_tensors
from engine.gguf.validate import block_of
from engine.generation.kv_formats import DEFAULT_LONG_CONTEXT_FORMAT, KV_FORMATS, kv_format
from engine.generation.memory_plan import MemoryPlan, cards_16gb, format_bytes, plan
from engine.generation.model_footprint import footprint_of, gdn_conv_state_bytes, gdn_recurrent_state_bytes

MAX_CARDS = 4


def layer_pattern_text(recurrent: tuple[bool, ...], group: int) -> str:
    """`GGGA GGGA ...`: G = Gated DeltaNet, A = full attention, grouped by the attention interval."""
    letters = "".join("G" if r else "A" for r in recurrent)
    return " ".join(letters[i : i + group] for i in range(0, len(letters), group))


def format_count(n: int) -> str:
    """Parameter counts as people quote them: '26.896 B', '254.0 K'."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3f} {suffix}" if suffix == "B" else f"{n / scale:.1f} {suffix}"
    return str(n)


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
                    **_plan_dict(plan(fp, cards_16gb(n_cards), context, kv, with_mtp=with_mtp, split=split)),
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


def _sizes(table: dict[str, int]) -> str:
    return "  ".join(f"{name} {format_bytes(n)}" for name, n in table.items())


def render_text(info: dict[str, Any]) -> str:
    """The human-readable report of a `describe()` dict."""
    params, layers, weights = info["parameters"], info["layers"], info["weight_bytes"]
    state, settings = info["gdn_state_bytes_per_sequence"], info["plan_settings"]
    name = f", {info['name']}" if info["name"] else ""
    mtp = " + " + "M" * layers["mtp"] if layers["mtp"] else ""
    head = "LM head tied to token_embd" if info["tied_embeddings"] else "separate LM head"
    requantised = (
        f" ({weights['requantised_tensors']} tensors requantised to Q8_0)" if weights["requantised_tensors"] else ""
    )
    rows = [
        ("file", info["file"]),
        ("architecture", f"{info['architecture']} (Qwen3.5/3.6 dense hybrid){name}"),
        (
            "parameters",
            f"{format_count(params['trunk'])} trunk + {format_count(params['mtp'])} MTP = {format_count(params['total'])}",
        ),
        (
            "layers",
            f"{layers['trunk']} ({layers['gdn']} GDN, {layers['attention']} attention) + {layers['mtp']} MTP block(s)",
        ),
        ("pattern", layers["pattern"] + mtp),
        ("context", f"{info['context_length']} tokens"),
        ("vocabulary", f"{info['vocab_size']} tokens, {head}"),
        ("tensor types", ", ".join(f"{t} x{n}" for t, n in info["tensor_types"].items())),
        (
            "weights",
            f"{format_bytes(weights['file'])} in the file, {format_bytes(weights['device'])} on cards{requantised}",
        ),
        ("KV per token", _sizes(info["kv_bytes_per_token"])),
    ]
    if info["kv_bytes_per_token_with_mtp"]:
        rows.append(("  with MTP", _sizes(info["kv_bytes_per_token_with_mtp"])))
    conv, recurrent = format_bytes(state["conv"]), format_bytes(state["recurrent"])
    rows.append(("GDN state", f"{format_bytes(state['total'])} per sequence (conv {conv} + recurrent {recurrent})"))

    out = [f"{key:<14}{value}" for key, value in rows]
    out.append(
        f"per-card split: 16 GB cards ({format_bytes(settings['usable_bytes'])} usable each), "
        f"{settings['context']} tokens of context, {settings['kv_format']} KV (K {settings['kv_k']}, V {settings['kv_v']}), "
        f"MTP {'on' if settings['with_mtp'] else 'off'}"
        + (f", layers per card {','.join(map(str, settings['split']))} (given)" if settings.get("split") else "")
    )
    notes: list[str] = []
    for entry in info["plans"]:
        label = f"  {entry['n_cards']} card{'s' if entry['n_cards'] > 1 else ' '}  "
        if not entry["fits"]:
            out.append(f"{label}does not fit: {entry['error']}")
            continue
        cards = [
            f"{c['name']}: layers {c['first_layer']}-{c['last_layer']} {format_bytes(c['total_bytes'])}"
            f" (free {format_bytes(c['free_bytes'])})"
            for c in entry["cards"]
        ]
        out.append(label + " | ".join(cards))
        notes += [n for n in entry["notes"] if n not in notes]
    out += [f"note: {n}" for n in notes]
    out += [f"warning: {w}" for w in info["warnings"]]
    return "\n".join(out)
