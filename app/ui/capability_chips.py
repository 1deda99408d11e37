"""The chat header's capability chips: what the loaded model can do here, at a glance.

Vision (whether images can be attached), MTP speculation, the KV cache format, the cards it runs on
and the backend; each chip's tooltip says why it reads as it does, so "no vision" is explained before
a user drags an image in, not after.
"""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from app.chat_engine import ModelInfo
from app.theme import set_style


def chips_of(info: ModelInfo) -> list[tuple[str, str, str]]:
    """(name, text, tooltip) per chip, in header order."""
    if info.vision is None:
        vision = ("vision", "vision ?", "the rig does not say whether its model takes images; it refuses them if not")
    elif info.vision:
        vision = ("vision", "vision", "images can be attached: the model's vision projector is loaded")
    else:
        vision = ("vision", "no vision", info.no_images_reason)
    if info.mtp:
        mtp = ("mtp", "MTP", "speculative decoding with the model's MTP head (Settings > Speculation)")
    else:
        mtp = ("mtp", "no MTP", "the model has no MTP head")
    cards = ", ".join(map(str, info.cards))
    where = ("cards", f"cards {cards}" if len(info.cards) > 1 else f"card {cards}" if info.cards else "CPU",
             "the cards (PCI bus order) the model's layers are on" if info.cards else "runs in system RAM")
    return [vision, mtp, ("kv", f"KV {info.kv_format}", "the KV cache format the model was loaded with"), where,
            ("backend", info.backend, "the backend running the model")]


class CapabilityChips(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.chips: dict[str, QLabel] = {}
        self.show_info(None)

    def show_info(self, info: ModelInfo | None) -> None:
        while self.row.count():
            item = self.row.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        self.chips = {}
        for name, text, tip in chips_of(info) if info else []:
            chip = QLabel(text)
            chip.setObjectName(f"chip-{name}")
            chip.setToolTip(tip)
            set_style(chip, "chip", "border-radius: 6px; padding: 1px 6px;")
            self.row.addWidget(chip)
            self.chips[name] = chip
        self.row.addStretch(1)
        self.setVisible(info is not None)
