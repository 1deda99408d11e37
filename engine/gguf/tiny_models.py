"""Tiny random Qwen3.5 checkpoints (HF folder + GGUF) for tests: dev-only, needs torch and transformers.

Each variant stresses a different way a converter or forward pass can go wrong: GQA ratios 1, 2
and 4; GDN value/key head ratios 1, 2 and 3 (the V-head reorder is a no-op at 1 and hides bugs
there); tied and untied embeddings; layer counts that are not a multiple of 4; one with an MTP
block. transformers initialises RMSNorm weights to 0 (gain 1+w), the gated norm to 1 and `dt_bias`
to 1; all of those are re-drawn at random here, so a missing or doubled `+1`, or a transform applied
to the wrong tensor, changes the numbers instead of hiding behind a constant. Weights use std 0.1
instead of 0.02 so logits are spread out and comparisons mean something.

The tokenizer is a small byte-level BPE trained on the built-in corpus with every Qwen3.5 special
token (engine.generation.train_tokenizer), and the real chat template is copied in. Files written:
config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
chat_template.jinja, and `model-<type>.gguf` from our converter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.generation.demo_corpus import DEMO_CORPUS
from engine.generation.train_tokenizer import train_byte_level_bpe
from engine.gguf.convert import convert
from engine.paths import RESOURCES_DIR

DEFAULT_TEMPLATE = RESOURCES_DIR / "chat_template_qwen35.jinja"
VOCAB_SIZE = 512
INIT_STD = 0.1


@dataclass(frozen=True)
class TinyVariant:
    """Shape knobs of one tiny model (everything else is shared: head_dim 32, GDN head dims 16)."""

    n_layers: int
    n_head: int
    n_head_kv: int
    n_k_heads: int
    n_v_heads: int
    tied: bool
    mtp: bool = False
    hidden: int = 64
    ffn: int = 128


VARIANTS: dict[str, TinyVariant] = {
    "gqa2-hv2": TinyVariant(n_layers=4, n_head=4, n_head_kv=2, n_k_heads=2, n_v_heads=4, tied=False),
    "mha-hv1-tied": TinyVariant(n_layers=4, n_head=4, n_head_kv=4, n_k_heads=2, n_v_heads=2, tied=True),
    "gqa4-hv3-l6": TinyVariant(n_layers=6, n_head=8, n_head_kv=2, n_k_heads=2, n_v_heads=6, tied=False),
    "gqa4-hv2-l5-tied": TinyVariant(n_layers=5, n_head=4, n_head_kv=1, n_k_heads=4, n_v_heads=8, tied=True),
    "mtp": TinyVariant(n_layers=4, n_head=4, n_head_kv=2, n_k_heads=2, n_v_heads=4, tied=False, mtp=True),
}


def hf_config(v: TinyVariant, special_ids: dict[str, int]) -> dict[str, Any]:
    """Keyword arguments for `Qwen3_5TextConfig` (text model, layer i full attention iff (i+1) % 4 == 0)."""
    extra = {"mtp_num_hidden_layers": 1} if v.mtp else {}
    return dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=v.hidden,
        intermediate_size=v.ffn,
        num_hidden_layers=v.n_layers,
        num_attention_heads=v.n_head,
        num_key_value_heads=v.n_head_kv,
        head_dim=32,
        linear_num_key_heads=v.n_k_heads,
        linear_num_value_heads=v.n_v_heads,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        max_position_embeddings=512,
        tie_word_embeddings=v.tied,
        initializer_range=INIT_STD,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        bos_token_id=special_ids["<|endoftext|>"],
        eos_token_id=special_ids["<|im_end|>"],
        **extra,
    )


def randomize_offsets(state: dict[str, Any], rng: np.random.Generator) -> None:
    """Re-draw the tensors transformers initialises to constants (norm gains, dt_bias) and A_log."""
    import torch

    for name, t in state.items():
        if name.endswith("linear_attn.norm.weight"):
            new = 1.0 + rng.uniform(-0.3, 0.3, t.shape)
        elif name.endswith("norm.weight"):
            new = rng.uniform(-0.3, 0.3, t.shape)
        elif name.endswith(".A_log"):
            new = np.log(rng.uniform(1.0, 16.0, t.shape))
        elif name.endswith(".dt_bias"):
            new = rng.uniform(-1.0, 1.0, t.shape)
        else:
            continue
        with torch.no_grad():
            t.copy_(torch.from_numpy(new.astype(np.float32)))


def mtp_tensors(v: TinyVariant, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A random MTP block in the HF checkpoint layout (`mtp.*`: fc, its three norms, one attention layer)."""

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, INIT_STD, (rows, cols)).astype(np.float32)

    def gain(n: int) -> np.ndarray:
        return rng.uniform(-0.3, 0.3, n).astype(np.float32)

    d, q, kv = v.hidden, v.n_head * 32, v.n_head_kv * 32
    layer = "mtp.layers.0."
    return {
        "mtp.fc.weight": mat(d, 2 * d),
        "mtp.pre_fc_norm_embedding.weight": gain(d),
        "mtp.pre_fc_norm_hidden.weight": gain(d),
        "mtp.norm.weight": gain(d),
        layer + "input_layernorm.weight": gain(d),
        layer + "post_attention_layernorm.weight": gain(d),
        layer + "self_attn.q_proj.weight": mat(2 * q, d),
        layer + "self_attn.k_proj.weight": mat(kv, d),
        layer + "self_attn.v_proj.weight": mat(kv, d),
        layer + "self_attn.o_proj.weight": mat(d, q),
        layer + "self_attn.q_norm.weight": gain(32),
        layer + "self_attn.k_norm.weight": gain(32),
        layer + "mlp.gate_proj.weight": mat(v.ffn, d),
        layer + "mlp.up_proj.weight": mat(v.ffn, d),
        layer + "mlp.down_proj.weight": mat(d, v.ffn),
    }


def write_tokenizer_files(out_dir: Path, template: str) -> dict[str, int]:
    """tokenizer.json, tokenizer_config.json and chat_template.jinja as a Qwen3.5 folder has them; returns special ids."""
    trained = train_byte_level_bpe(DEMO_CORPUS, VOCAB_SIZE)
    trained.tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "add_bos_token": False,
                "add_prefix_space": False,
                "bos_token": None,
                "clean_up_tokenization_spaces": False,
                "eos_token": "<|im_end|>",
                "errors": "replace",
                "model_max_length": 512,
                "pad_token": "<|endoftext|>",
                "split_special_tokens": False,
                "tokenizer_class": "Qwen2Tokenizer",
                "unk_token": None,
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    (out_dir / "chat_template.jinja").write_text(template, encoding="utf-8")
    return {t: trained.token_id(t) for t in ("<|endoftext|>", "<|im_end|>")}


def make_tiny_model(
    out_dir: str | Path,
    variant: str = "gqa2-hv2",
    seed: int = 0,
    gguf_type: str | None = "f32",
    template_path: str | Path = DEFAULT_TEMPLATE,
) -> Path:
    """Write the HF folder of `variant` to `out_dir` (and `model-<gguf_type>.gguf` unless None); returns `out_dir`."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny variant '{variant}' (known: {', '.join(VARIANTS)})")
    v = VARIANTS[variant]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    special_ids = write_tokenizer_files(out, Path(template_path).read_text(encoding="utf-8"))

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    config = Qwen3_5TextConfig(**hf_config(v, special_ids))
    config.architectures = ["Qwen3_5ForCausalLM"]
    model = Qwen3_5ForCausalLM(config).eval()
    randomize_offsets(model.state_dict(), rng)
    model.save_pretrained(out)
    (out / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": special_ids["<|endoftext|>"],
                "do_sample": True,
                "eos_token_id": [special_ids["<|im_end|>"], special_ids["<|endoftext|>"]],
                "pad_token_id": special_ids["<|endoftext|>"],
                "repetition_penalty": 1.05,
                "temperature": 1.0,
                "top_k": 20,
                "top_p": 0.95,
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    if v.mtp:
        from safetensors.torch import load_file

        weights = load_file(str(out / "model.safetensors"))
        weights.update({k: torch.from_numpy(a) for k, a in mtp_tensors(v, rng).items()})
        save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    if gguf_type is not None:
        convert(out, out / f"model-{gguf_type}.gguf", gguf_type)
    return out
