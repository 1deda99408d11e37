"""Themes: the platform's own look, or Fusion with a dark or light palette, and the few coloured text
styles the app uses (muted, warning, error, ok, the banner and the thinking block) for each.

A style's colours are picked for the palette in use (dark or light by the window's lightness), and every
pair of text and background is held to WCAG AA contrast (4.5:1) by tests/qt/test_theme_contrast.py.
Widgets take a style through `set_style`, which remembers it, so `apply_theme` can restyle every
widget when the theme changes at run time (a widget's style sheet otherwise keeps the old colours,
which is how a white thinking block ended up on the dark theme).
"""

from __future__ import annotations

from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory, QWidget

_DARK = {QPalette.Window: "#2b2b2b", QPalette.WindowText: "#e6e6e6", QPalette.Base: "#1e1e1e",
         QPalette.AlternateBase: "#2b2b2b", QPalette.Text: "#e6e6e6", QPalette.Button: "#3a3a3a",
         QPalette.ButtonText: "#e6e6e6", QPalette.Highlight: "#3b6fd8", QPalette.HighlightedText: "#ffffff",
         QPalette.ToolTipBase: "#3a3a3a", QPalette.ToolTipText: "#e6e6e6", QPalette.Link: "#7aa7ff",
         QPalette.PlaceholderText: "#a0a0a0", QPalette.BrightText: "#ffffff"}
_DARK_DISABLED = "#7a7a7a"  # disabled text: visibly dimmer than enabled text, still legible
# Fusion's light placeholder is half-transparent text (about 4:1 on white): a solid grey reads at 6:1+.
_LIGHT = {QPalette.PlaceholderText: "#5f5f5f", QPalette.Link: "#0b57d0"}

# style -> (text, background or None for the widget's own) per palette kind
STYLES: dict[str, dict[str, tuple[str, str | None]]] = {
    "light": {"muted": ("#595959", None), "warning": ("#8a4a00", None), "error": ("#b00020", None),
              "ok": ("#1b5e20", None), "banner": ("#664d03", "#fff3cd"), "thinking": ("#474747", "#f3f3f3"),
              "chip": ("#1f2937", "#dfe6f1")},
    "dark": {"muted": ("#b0b0b0", None), "warning": ("#f5b35c", None), "error": ("#ff8a94", None),
             "ok": ("#7fd68f", None), "banner": ("#ffe08a", "#46391a"), "thinking": ("#c4c4c4", "#303030"),
             "chip": ("#e6e6e6", "#3a4252")},
}
STYLE_PROPERTY = "rigllm_style"

_system: tuple[str, QPalette] | None = None  # the platform's style and palette, kept for "system"


def palette_kind(palette: QPalette | None = None) -> str:
    """"dark" or "light": which colour set reads on this palette's window."""
    palette = palette or QGuiApplication.palette()
    return "dark" if palette.color(QPalette.Window).lightness() < 128 else "light"


def colour(style: str, palette: QPalette | None = None) -> str:
    """The text colour of `style` (a key of STYLES) for the palette in use."""
    return STYLES[palette_kind(palette)][style][0]


def style_sheet(style: str, palette: QPalette | None = None, extra: str = "") -> str:
    text, background = STYLES[palette_kind(palette)][style]
    sheet = f"color: {text};" + (f" background: {background};" if background else "")
    return sheet + (f" {extra}" if extra else "")


def set_style(widget: QWidget, style: str, extra: str = "") -> None:
    """Give `widget` one of the text styles; it follows later theme changes."""
    widget.setProperty(STYLE_PROPERTY, (style, extra))
    widget.setStyleSheet(style_sheet(style, extra=extra))


def span(text: str, style: str, bold: bool = False) -> str:
    """Rich text in one of the styles (its colour is the theme's at the time it is drawn)."""
    inner = f"<b>{text}</b>" if bold else text
    return f"<span style='color:{colour(style)}'>{inner}</span>"


def apply_theme(app: QApplication, theme: str) -> None:
    global _system
    if _system is None:
        _system = (app.style().name(), QPalette(app.palette()))
    style, palette = _system
    if theme == "system":
        app.setStyle(QStyleFactory.create(style))
        app.setPalette(palette)
    else:
        app.setStyle(QStyleFactory.create("Fusion"))
        themed = app.style().standardPalette()
        for role, value in (_DARK if theme == "dark" else _LIGHT).items():
            themed.setColor(role, QColor(value))
        if theme == "dark":  # setColor set every group: give disabled text its own dimmer colour again
            for role in (QPalette.WindowText, QPalette.Text, QPalette.ButtonText):
                themed.setColor(QPalette.Disabled, role, QColor(_DARK_DISABLED))
        app.setPalette(themed)
    for widget in app.allWidgets():
        chosen = widget.property(STYLE_PROPERTY)
        if chosen:
            widget.setStyleSheet(style_sheet(chosen[0], extra=chosen[1]))


def relative_luminance(c: QColor) -> float:
    """WCAG 2.x relative luminance of an opaque colour."""
    def channel(v: int) -> float:
        s = v / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(c.red()) + 0.7152 * channel(c.green()) + 0.0722 * channel(c.blue())


def over(fg: QColor, bg: QColor) -> QColor:
    """`fg` composited over an opaque `bg` (a half-transparent placeholder is what the eye sees blended)."""
    a = fg.alphaF()
    return QColor(round(fg.red() * a + bg.red() * (1 - a)), round(fg.green() * a + bg.green() * (1 - a)),
                  round(fg.blue() * a + bg.blue() * (1 - a)))


def contrast_ratio(fg: QColor | str, bg: QColor | str) -> float:
    """WCAG contrast of text `fg` on background `bg` (1 to 21; AA asks 4.5 for body text)."""
    fg, bg = QColor(fg), QColor(bg)
    lighter, darker = sorted((relative_luminance(over(fg, bg)), relative_luminance(bg)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)
