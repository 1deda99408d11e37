"""Find the mmproj that belongs to a text model file: the app and the server pair them automatically.

Rule, in order: `mmproj-<model stem>.gguf` beside the model (what `rigllm convert` writes); else the
`mmproj*.gguf` files in the same folder whose projection width equals the text model's width (read
from their headers only). One candidate: use it; none: the model runs without images; several: a
`RigllmError` naming them, because guessing could pair the wrong tower silently.
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import ModelFileError, RigllmError
from engine.gguf.model_file import ModelFile
from engine.vision.config import VisionConfig

PROJECTION_KEY = "clip.vision.projection_dim"


def mmproj_path_for(model_path: str | Path) -> Path:
    """The mmproj file name `rigllm convert` writes beside a model: `mmproj-<model stem>.gguf`."""
    p = Path(model_path)
    return p.with_name(f"mmproj-{p.stem}.gguf")


def _projection_width(path: Path) -> int | None:
    try:
        value = ModelFile(path).fields.get(PROJECTION_KEY)
    except ModelFileError:
        return None  # unreadable candidates are skipped here; loading an explicit path reports them
    return value if isinstance(value, int) else None


def find_mmproj(model_path: str | Path, text_width: int) -> Path | None:
    """The mmproj beside `model_path` for a text model of width `text_width`, or None if there is none."""
    exact = mmproj_path_for(model_path)
    if exact.is_file():
        return exact
    folder = Path(model_path).parent
    matches = [p for p in sorted(folder.glob("mmproj*.gguf")) if _projection_width(p) == text_width]
    if len(matches) > 1:
        names = ", ".join(p.name for p in matches)
        raise RigllmError(f"several mmproj files beside {Path(model_path).name} fit it ({names}); choose one explicitly")
    return matches[0] if matches else None


def paired_vision_config(model_path: str | Path, text_width: int) -> VisionConfig | None:
    """The tower configuration of the mmproj a server would load beside the model, for memory plans made
    before loading (the load sheet, the admin API's inspect); None when there is none or it is unusable
    (loading the model then reports why)."""
    from engine.vision.mmproj import check_pairing, load_mmproj

    try:
        path = find_mmproj(model_path, text_width)
        if path is None:
            return None
        mmproj = load_mmproj(path)
        check_pairing(mmproj, text_width, Path(model_path).name)
    except RigllmError:
        return None
    return mmproj.config
