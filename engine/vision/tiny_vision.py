"""A tiny random HF `Qwen3_5ForConditionalGeneration` folder (text + vision tower) for tests: dev-only, needs torch.

The text part reuses a variant of engine.gguf.tiny_models (same tokenizer, template and offset
re-draws); the vision tower is small but keeps every structural feature that can go wrong:
16-pixel patches and a 2×2 merge (so the 32-pixel resize factor is the real one), two heads (the
2D rotary splits each head into y and x halves), a 4×4 learned position grid (so every real image
interpolates it, up or down), biases everywhere, LayerNorm gains and biases drawn at random, and a
depth of two blocks. Weights use std ~1/sqrt(fan_in) so activations neither vanish nor explode.

Files written: what `make_tiny_model` writes (without its GGUF), with a multimodal config.json and
model.safetensors, plus preprocessor_config.json (the image mean/std the mmproj converter copies).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from engine.gguf.tiny_models import DEFAULT_TEMPLATE, VARIANTS, hf_config, randomize_offsets, write_tokenizer_files

VISION_SPECIALS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
IMAGE_MEAN = [0.48, 0.5, 0.52]  # deliberately not all equal: a channel mix-up changes the numbers
IMAGE_STD = [0.5, 0.45, 0.55]
MIN_PIXELS = 32 * 32  # tiny bounds so tests exercise both the up- and the down-scaling branch quickly
MAX_PIXELS = 256 * 256


def vision_config(out_hidden: int) -> dict[str, Any]:
    """Keyword arguments for `Qwen3_5VisionConfig` of the tiny tower (out_hidden = the text model width)."""
    return dict(
        depth=2,
        hidden_size=32,
        num_heads=2,
        intermediate_size=48,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        in_channels=3,
        out_hidden_size=out_hidden,
        num_position_embeddings=16,
        hidden_act="gelu_pytorch_tanh",
    )


def _special_ids(hf_dir: Path) -> dict[str, int]:
    vocab = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))
    added = {t["content"]: t["id"] for t in vocab.get("added_tokens", [])}
    return {name: added[name] for name in VISION_SPECIALS}


def _redraw_vision(model: Any, seed: int) -> None:
    """Random LayerNorm gains/biases and fan-in scaled weights for every `visual.*` parameter."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.model.visual.named_parameters():
            if ".norm" in name or name.startswith("norm"):
                mean = 1.0 if name.endswith("weight") else 0.0
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + mean)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif name == "pos_embed.weight":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=gen) * fan_in**-0.5)


def make_tiny_vlm(out_dir: str | Path, variant: str = "gqa2-hv2", seed: int = 0) -> Path:
    """Write a tiny multimodal HF folder to `out_dir` and return it (no GGUF: convert it with rigllm)."""
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    v = VARIANTS[variant]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text_ids = write_tokenizer_files(out, DEFAULT_TEMPLATE.read_text(encoding="utf-8"))
    vision_ids = _special_ids(out)
    torch.manual_seed(seed)
    config = Qwen3_5Config(
        text_config=hf_config(v, text_ids),
        vision_config=vision_config(v.hidden),
        image_token_id=vision_ids["<|image_pad|>"],
        video_token_id=vision_ids["<|video_pad|>"],
        vision_start_token_id=vision_ids["<|vision_start|>"],
        vision_end_token_id=vision_ids["<|vision_end|>"],
        tie_word_embeddings=v.tied,
    )
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    model = Qwen3_5ForConditionalGeneration(config).float().eval()
    randomize_offsets(model.model.language_model.state_dict(), np.random.default_rng(seed))
    _redraw_vision(model, seed + 1)
    model.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Qwen2VLImageProcessor",
                "image_mean": IMAGE_MEAN,
                "image_std": IMAGE_STD,
                "patch_size": 16,
                "temporal_patch_size": 2,
                "merge_size": 2,
                "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    return out
