"""The rig monitor: one tile per card (PCI bus order) with live numbers, a 60 s sparkline and alerts;
a click opens the card's longer history. With no NVIDIA GPU it says so plainly."""

from __future__ import annotations

from collections import deque

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QDialog, QFrame, QGridLayout, QLabel, QVBoxLayout, QWidget

from engine.model.memory_plan import format_bytes
from engine.telemetry import CardSample, RigSnapshot

from app.alerts import AlertState
from app.theme import colour, set_style, span

HISTORY = 3600  # samples kept per card (one hour at 1 Hz)
SPARKLINE = 60
PLOTTED = (("utilization_percent", "utilisation %", "#3b6fd8"), ("temperature_c", "core °C", "#e67e22"),
           ("hbm_temperature_c", "HBM °C", "#9b59b6"), ("power_w", "power W", "#16a085"))


def _na(value: object, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def tile_text(card: CardSample, tokens_per_second: float | None) -> str:
    power = f"{_na(card.power_w, ' W')} / {_na(card.power_limit_w, ' W')}"
    pcie = "n/a" if card.pcie_generation is None else f"Gen{card.pcie_generation} x{card.pcie_width}"
    rows = [
        ("HBM", f"{format_bytes(card.memory_used)} / {format_bytes(card.memory_total)}"),
        ("core temp", _na(card.temperature_c, " °C")), ("HBM temp", _na(card.hbm_temperature_c, " °C")),
        ("power", power), ("fan", "passive / chassis" if card.fan_percent is None else f"{card.fan_percent} %"),
        ("clocks", f"SM {_na(card.sm_clock_mhz, ' MHz')} · mem {_na(card.memory_clock_mhz, ' MHz')}"),
        ("utilisation", _na(card.utilization_percent, " %")), ("PCIe", pcie),
        ("tokens/s", "idle" if tokens_per_second is None else f"{tokens_per_second:.1f}"),
    ]
    return "<table>" + "".join(f"<tr><td>{k}</td><td>&nbsp;<b>{v}</b></td></tr>" for k, v in rows) + "</table>"


class CardTile(QFrame):
    clicked = Signal(int)

    def __init__(self, index: int, parent: QWidget | None = None):
        super().__init__(parent)
        self.index = index
        self.setFrameShape(QFrame.Box)
        self.setCursor(Qt.PointingHandCursor)
        self.history: dict[str, deque] = {metric: deque(maxlen=HISTORY) for metric, _, _ in PLOTTED}
        layout = QVBoxLayout(self)
        self.title = QLabel()
        self.numbers = QLabel()
        self.alerts = QLabel()
        set_style(self.alerts, "error", "font-weight: bold;")
        self.alerts.setWordWrap(True)
        self.plot = pg.PlotWidget()
        self.plot.setFixedHeight(90)
        self.plot.setMouseEnabled(False, False)
        self.plot.hideButtons()
        self.plot.setYRange(0, 100)
        self.plot.getPlotItem().hideAxis("bottom")
        self.curves = {metric: self.plot.plot(pen=pg.mkPen(colour, width=2)) for metric, _, colour in PLOTTED
                       if metric != "power_w"}
        key = " ".join(f"<span style='color:{c}'>&#9644;</span> {label}" for m, label, c in PLOTTED if m in self.curves)
        self.legend = QLabel(f"<small>last {SPARKLINE} s: {key}</small>")
        for w in (self.title, self.numbers, self.plot, self.legend, self.alerts):
            layout.addWidget(w)
        self.setToolTip("Click for the longer history")

    def show_sample(self, card: CardSample, alerts: list[str], tokens_per_second: float | None) -> None:
        self.title.setText(f"<b>card {card.index}</b> · {card.name}<br><small>{card.pci_bus_id} · {card.uuid}</small>")
        self.numbers.setText(tile_text(card, tokens_per_second))
        self.alerts.setText("\n".join(alerts))
        self.alerts.setVisible(bool(alerts))
        self.setStyleSheet(f"CardTile {{ border: 2px solid {colour('error')}; }}" if alerts else "")
        for metric in self.history:
            self.history[metric].append(getattr(card, metric))
        for metric, curve in self.curves.items():
            recent = [v for v in list(self.history[metric])[-SPARKLINE:] if v is not None]
            curve.setData(recent)

    def mouseReleaseEvent(self, event) -> None:
        self.clicked.emit(self.index)
        super().mouseReleaseEvent(event)


class HistoryDialog(QDialog):
    """Every kept sample of one card, one graph per metric."""

    def __init__(self, tile: CardTile, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(f"card {tile.index}: history (last {HISTORY // 60} min at most)")
        layout = QVBoxLayout(self)
        for metric, label, colour in PLOTTED:
            values = [v for v in tile.history[metric] if v is not None]
            plot = pg.PlotWidget(title=label if values else f"{label}: n/a")
            plot.plot(values, pen=pg.mkPen(colour, width=2))
            layout.addWidget(plot)
        self.resize(700, 600)


class RigMonitor(QWidget):
    alert = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.alerts = AlertState()
        self.tiles: dict[int, CardTile] = {}
        self.model_cards: tuple[int, ...] = ()
        self.tokens_per_second: float | None = None
        layout = QVBoxLayout(self)
        self.machine = QLabel("<b>this computer</b>")
        layout.addWidget(self.machine)
        self.summary = QLabel()
        layout.addWidget(self.summary)
        self.empty = QLabel("Waiting for the first reading...")
        self.empty.setAlignment(Qt.AlignCenter)
        self.empty.setWordWrap(True)
        layout.addWidget(self.empty)
        self.grid_box = QWidget()
        self.grid = QGridLayout(self.grid_box)
        layout.addWidget(self.grid_box)
        layout.addStretch(1)

    def show_machine(self, name: str) -> None:
        """Watch another machine (this computer, or a rig): its cards' tiles and history start afresh."""
        self.machine.setText(f"<b>{name}</b>")
        for tile in self.tiles.values():
            self.grid.removeWidget(tile)
            tile.deleteLater()
        self.tiles = {}
        self.alerts = AlertState()
        self.summary.setText("")
        self.empty.setText("Waiting for the first reading...")
        self.empty.setVisible(True)
        self.grid_box.setVisible(False)

    def set_model(self, cards: tuple[int, ...]) -> None:
        self.model_cards = cards
        self.tokens_per_second = None

    def set_speed(self, tokens_per_second: float) -> None:
        self.tokens_per_second = tokens_per_second

    def show_snapshot(self, snap: RigSnapshot) -> None:
        if not snap.cards:
            self.empty.setText(f"<h2>No NVIDIA GPU found</h2>{snap.error or ''}<br>"
                               "Models run on the CPU reference backend.")
            self.empty.setVisible(True)
            self.grid_box.setVisible(False)
            self.summary.setText("")
            return
        self.empty.setVisible(False)
        self.grid_box.setVisible(True)
        for message in self.alerts.feed(snap.cards):
            self.alert.emit(message)
        for card in snap.cards:
            tile = self.tiles.get(card.index)
            if tile is None:
                tile = self.tiles[card.index] = CardTile(card.index)
                tile.clicked.connect(self.open_history)
                self.grid.addWidget(tile, card.index // 3, card.index % 3)
            serving = self.tokens_per_second if card.index in self.model_cards else None
            tile.show_sample(card, self.alerts.for_card(card.index), serving)
        power = sum(c.power_w or 0 for c in snap.cards)
        per_joule = f" · {self.tokens_per_second / power:.3f} tokens/J" if self.tokens_per_second and power else ""
        speed = f" · {self.tokens_per_second:.1f} tok/s" if self.tokens_per_second else ""
        self.summary.setText(f"<b>{len(snap.cards)} card(s)</b> · {power:.0f} W total{speed}{per_joule}"
                             + "".join(f"<br>{span(w, 'warning')}" for w in snap.warnings))

    def open_history(self, index: int) -> HistoryDialog:
        dialog = HistoryDialog(self.tiles[index], self)
        dialog.setAttribute(Qt.WA_DeleteOnClose)
        dialog.show()
        return dialog
