"""Draw rigllm's icon (a mining card with a chat bubble) as SVG, hicolor PNGs and a Windows .ico.

One list of shapes is both written as SVG and painted with Pillow, so the scalable icon and the
bitmaps cannot drift apart, and no SVG renderer is needed. Run it after changing the shapes:

    python packaging/make_icons.py            # writes resources/icons/
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[1]
ICONS_DIR = ROOT / "resources" / "icons"
VIEWBOX = 256
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)  # 256 is the largest an .ico entry holds
SUPERSAMPLE = 4  # paint at 4x and downsample: Pillow's shapes have no anti-aliasing of their own

CARD, FAN, BLADE, HUB, GOLD, BRACKET, BUBBLE, DOT = (
    "#37474f", "#263238", "#455a64", "#76b900", "#f2b705", "#90a4ae", "#76b900", "#ffffff")


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    r: float
    fill: str


@dataclass(frozen=True)
class Circle:
    cx: float
    cy: float
    r: float
    fill: str


@dataclass(frozen=True)
class Polygon:
    points: tuple[tuple[float, float], ...]
    fill: str


Shape = Rect | Circle | Polygon


def _fan(cx: float, cy: float) -> list[Shape]:
    return [Circle(cx, cy, 44, FAN), Circle(cx, cy, 34, BLADE), Circle(cx, cy, 12, HUB)]


# Painted in order, in a 256 x 256 box: bracket, card, two fans, PCIe edge teeth, then the bubble on top.
SHAPES: tuple[Shape, ...] = (
    Rect(4, 76, 14, 148, 4, BRACKET),
    Rect(12, 84, 216, 124, 16, CARD),
    *_fan(74, 146),
    *_fan(166, 146),
    *(Rect(60 + 14 * i, 206, 10, 18, 2, GOLD) for i in range(9)),
    Rect(128, 12, 120, 76, 22, BUBBLE),
    Polygon(((150, 84), (140, 112), (182, 84)), BUBBLE),
    *(Circle(160 + 28 * i, 50, 9, DOT) for i in range(3)),
)


def svg_text(shapes: tuple[Shape, ...] = SHAPES) -> str:
    """The scalable icon (hicolor `scalable/apps/rigllm.svg`)."""
    body = []
    for s in shapes:
        if isinstance(s, Rect):
            body.append(f'  <rect x="{s.x:g}" y="{s.y:g}" width="{s.w:g}" height="{s.h:g}" rx="{s.r:g}" fill="{s.fill}"/>')
        elif isinstance(s, Circle):
            body.append(f'  <circle cx="{s.cx:g}" cy="{s.cy:g}" r="{s.r:g}" fill="{s.fill}"/>')
        else:
            points = " ".join(f"{x:g},{y:g}" for x, y in s.points)
            body.append(f'  <polygon points="{points}" fill="{s.fill}"/>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{VIEWBOX}" height="{VIEWBOX}" '
            f'viewBox="0 0 {VIEWBOX} {VIEWBOX}">\n  <title>rigllm</title>\n' + "\n".join(body) + "\n</svg>\n")


def render_png(size: int, shapes: tuple[Shape, ...] = SHAPES) -> Image.Image:
    """The icon as an RGBA bitmap of `size` x `size` pixels."""
    big = size * SUPERSAMPLE
    k = big / VIEWBOX
    image = Image.new("RGBA", (big, big), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    for s in shapes:
        if isinstance(s, Rect):
            draw.rounded_rectangle((s.x * k, s.y * k, (s.x + s.w) * k, (s.y + s.h) * k), radius=s.r * k, fill=s.fill)
        elif isinstance(s, Circle):
            draw.ellipse(((s.cx - s.r) * k, (s.cy - s.r) * k, (s.cx + s.r) * k, (s.cy + s.r) * k), fill=s.fill)
        else:
            draw.polygon([(x * k, y * k) for x, y in s.points], fill=s.fill)
    return image.resize((size, size), Image.Resampling.LANCZOS)


def png_path(out_dir: Path, size: int) -> Path:
    return out_dir / "hicolor" / f"{size}x{size}" / "apps" / "rigllm.png"


def svg_path(out_dir: Path) -> Path:
    return out_dir / "hicolor" / "scalable" / "apps" / "rigllm.svg"


def ico_path(out_dir: Path) -> Path:
    return out_dir / "rigllm.ico"


def write_icons(out_dir: Path) -> list[Path]:
    """Write the SVG, every PNG size and the multi-size .ico under `out_dir`; return the paths."""
    written = []
    svg = svg_path(out_dir)
    svg.parent.mkdir(parents=True, exist_ok=True)
    svg.write_text(svg_text())
    written.append(svg)
    bitmaps = {size: render_png(size) for size in PNG_SIZES}
    for size, image in bitmaps.items():
        path = png_path(out_dir, size)
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, optimize=True)
        written.append(path)
    ico = ico_path(out_dir)
    largest = bitmaps[max(ICO_SIZES)]
    # Each entry gets its own rendering (append_images) rather than a downscale of the 256 px one.
    largest.save(ico, sizes=[(s, s) for s in ICO_SIZES], append_images=[bitmaps[s] for s in ICO_SIZES])
    written.append(ico)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ICONS_DIR, help=f"output folder (default {ICONS_DIR})")
    args = parser.parse_args(argv)
    for path in write_icons(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
