"""Themes: the platform's own look, or Fusion with a dark or light palette (no style sheets to maintain)."""

from __future__ import annotations

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory

_DARK = {QPalette.Window: "#2b2b2b", QPalette.WindowText: "#e6e6e6", QPalette.Base: "#1e1e1e",
         QPalette.AlternateBase: "#2b2b2b", QPalette.Text: "#e6e6e6", QPalette.Button: "#3a3a3a",
         QPalette.ButtonText: "#e6e6e6", QPalette.Highlight: "#3b6fd8", QPalette.HighlightedText: "#ffffff",
         QPalette.ToolTipBase: "#3a3a3a", QPalette.ToolTipText: "#e6e6e6", QPalette.Link: "#7aa7ff"}


_system: tuple[str, QPalette] | None = None  # the platform's style and palette, kept for "system"


def apply_theme(app: QApplication, theme: str) -> None:
    global _system
    if _system is None:
        _system = (app.style().name(), QPalette(app.palette()))
    style, palette = _system
    if theme == "system":
        app.setStyle(QStyleFactory.create(style))
        app.setPalette(palette)
        return
    app.setStyle(QStyleFactory.create("Fusion"))
    themed = app.style().standardPalette()
    if theme == "dark":
        for role, colour in _DARK.items():
            themed.setColor(role, QColor(colour))
    app.setPalette(themed)
