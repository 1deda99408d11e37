"""Stacked per-card memory bars, drawn to the card's real capacity (16 GiB on a CMP 100-210).

Segments: weights, KV cache, GDN state, scratch, the CUDA reserve (+ safety margin), other
processes, then free space; a plan that does not fit shows its overflow as a red cap at the end.
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from engine.model.memory_plan import format_bytes

from app.budget import CardBudget

SEGMENTS = (("weights", "#3b6fd8"), ("KV", "#9b59b6"), ("GDN state", "#16a085"), ("scratch", "#e67e22"),
            ("reserve", "#7f8c8d"), ("other processes", "#4d4d4d"))
FREE = "#c8e6c9"
OVER = "#d32f2f"


def segment_sizes(card: CardBudget) -> list[int]:
    return [card.weights, card.kv, card.state, card.scratch, card.reserve, card.other]


class CardBar(QWidget):
    def __init__(self, card: CardBudget, parent: QWidget | None = None):
        super().__init__(parent)
        self.card = card
        self.setMinimumHeight(22)
        self.setToolTip("\n".join(f"{name}: {format_bytes(size)}" for (name, _), size in
                                  zip(SEGMENTS, segment_sizes(card))) + f"\nfree: {format_bytes(card.free)}")

    def sizeHint(self) -> QSize:
        return QSize(420, 22)

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        width, height = self.width(), self.height()
        used = sum(segment_sizes(self.card))
        scale = width / max(self.card.total, used)
        x = 0.0
        painter.fillRect(QRectF(0, 0, width, height), QColor(FREE))
        for (_, colour), size in zip(SEGMENTS, segment_sizes(self.card)):
            w = size * scale
            painter.fillRect(QRectF(x, 0, w, height), QColor(colour))
            x += w
        if used > self.card.total:
            capacity = self.card.total * scale
            painter.fillRect(QRectF(capacity, 0, width - capacity, height), QColor(OVER))
        painter.setPen(Qt.black)
        painter.drawRect(QRectF(0, 0, width - 1, height - 1))
        painter.end()


def legend() -> QWidget:
    box = QWidget()
    row = QHBoxLayout(box)
    row.setContentsMargins(0, 0, 0, 0)
    for name, colour in SEGMENTS + (("free", FREE), ("over", OVER)):
        row.addWidget(QLabel(f"<span style='color:{colour}'>&#9632;</span> {name}"))
    row.addStretch(1)
    return box


class BudgetBars(QWidget):
    """One labelled bar per card; `show_cards` replaces them."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.layout_ = QVBoxLayout(self)
        self.layout_.setContentsMargins(0, 0, 0, 0)
        self.bars: list[CardBar] = []
        self.labels: list[QLabel] = []

    def show_cards(self, cards: tuple[CardBudget, ...]) -> None:
        while self.layout_.count():
            self.layout_.takeAt(0).widget().deleteLater()
        self.bars, self.labels = [], []
        for card in cards:
            layers = f"layers {card.layers.start}-{card.layers.stop - 1}" if len(card.layers) else "no layers"
            label = QLabel(f"<b>{card.name}</b> · {layers} · {format_bytes(card.total)} · {card.verdict}")
            bar = CardBar(card)
            self.layout_.addWidget(label)
            self.layout_.addWidget(bar)
            self.labels.append(label)
            self.bars.append(bar)
