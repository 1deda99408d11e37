"""`rigllm info`'s text report of an `engine.model.model_info.describe()` dict."""

from __future__ import annotations

from typing import Any

from engine.model.memory_plan import format_bytes


def format_count(n: int) -> str:
    """Parameter counts as people quote them: '26.896 B', '254.0 K'."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3f} {suffix}" if suffix == "B" else f"{n / scale:.1f} {suffix}"
    return str(n)


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
