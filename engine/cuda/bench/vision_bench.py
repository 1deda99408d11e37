"""`python -m engine.cuda.bench.vision_bench`: vision-tower time per image on this GPU, random weights at real shapes.

Weights are random (speed does not depend on their values) at the released towers' shapes (spec §9.1):
9B and 27B share the tower (depth 27, width 1152, MLP 4304, 16 heads) and differ only in the output
width. Each image size is run once to warm up, then `--repeat` times between CUDA events; the table
gives the mean milliseconds per image (upload of the fp16 pixels, tower, download of the embeddings).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from engine.vision.config import VisionConfig
from engine.vision.preprocess import PreparedImage
from engine.vision.random_mmproj import random_tower_weights

SHAPES = {
    "9b": VisionConfig(n_embd=1152, n_ff=4304, n_layers=27, n_head=16, patch_size=16, merge_size=2, image_size=768,
                       eps=1e-6, projection_dim=4096, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5)),
    "27b": VisionConfig(n_embd=1152, n_ff=4304, n_layers=27, n_head=16, patch_size=16, merge_size=2, image_size=768,
                        eps=1e-6, projection_dim=5120, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5)),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="27b")
    parser.add_argument("--sizes", default="448x448,1024x1024,2048x2048",
                        help="comma-separated HxW image sizes, multiples of 32 (2048x2048 = 4096 tokens, the default cap)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    from engine.cuda.driver import CudaCard
    from engine.cuda.vision import GpuVisionTower

    cfg = SHAPES[args.shape]
    with CudaCard(0, name="vision-bench") as card:
        start = time.perf_counter()
        tower = GpuVisionTower(card, cfg, random_tower_weights(cfg, np.random.default_rng(0)))
        print(f"{args.shape} tower on {card.device_name}: weights up in {time.perf_counter() - start:.1f} s")
        print(f"{'image':>11} {'patches':>8} {'tokens':>7} {'ms/image':>9}")
        rng = np.random.default_rng(1)
        for size in args.sizes.split(","):
            h, w = (int(v) for v in size.lower().split("x"))
            image = PreparedImage(rng.uniform(-1, 1, (3, h, w)).astype(np.float32), cfg.patch_size, cfg.merge_size)
            tower.encode(image)  # warm-up: module load, first allocations
            begin = card.event().record()
            for _ in range(args.repeat):
                tower.encode(image)
            ms = card.event().record().elapsed_ms(begin) / args.repeat
            gh, gw = image.grid
            print(f"{size:>11} {gh * gw:>8} {image.n_tokens:>7} {ms:>9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
