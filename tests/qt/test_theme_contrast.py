"""Every text style reads in both themes (issue 27, finding 8): WCAG AA contrast (4.5:1) computed over the
palette for message text, the thinking block, placeholders and the status styles, and the widgets that
show them really use those colours after a theme switch at run time."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QLineEdit

from app.chat_records import Message
from app.theme import STYLES, apply_theme, contrast_ratio, palette_kind, style_sheet
from app.ui.message_widget import MessageWidget

AA = 4.5


@pytest.fixture(params=["light", "dark"])
def theme(request, qapp):
    app = QApplication.instance()
    apply_theme(app, request.param)
    yield request.param
    apply_theme(app, "system")


def test_message_and_placeholder_text_meet_aa_on_their_backgrounds(theme):
    pal = QApplication.instance().palette()
    pairs = {"message text": (QPalette.Text, QPalette.Base), "window text": (QPalette.WindowText, QPalette.Window),
             "button text": (QPalette.ButtonText, QPalette.Button), "placeholder": (QPalette.PlaceholderText, QPalette.Base)}
    for name, (fg, bg) in pairs.items():
        ratio = contrast_ratio(pal.color(fg), pal.color(bg))
        assert ratio >= AA, f"{theme} {name}: {ratio:.2f}"


def test_every_style_meets_aa_on_the_window_and_the_base(theme):
    pal = QApplication.instance().palette()
    assert palette_kind(pal) == theme
    for style, (text, background) in STYLES[theme].items():
        grounds = [background] if background else [pal.color(QPalette.Window), pal.color(QPalette.Base)]
        for ground in grounds:
            ratio = contrast_ratio(text, ground)
            assert ratio >= AA, f"{theme} {style} on {ground}: {ratio:.2f}"


def test_the_thinking_block_follows_a_theme_switch_made_after_it_was_built(qtbot):
    app = QApplication.instance()
    apply_theme(app, "light")
    widget = MessageWidget(Message("assistant", "answer", reasoning="thinking it over", reasoning_seconds=1.0))
    qtbot.addWidget(widget)
    try:
        apply_theme(app, "dark")
        assert widget.thinking_view.styleSheet() == style_sheet("thinking")
        text, background = STYLES["dark"]["thinking"]
        assert text in widget.thinking_view.styleSheet() and background in widget.thinking_view.styleSheet()
        assert STYLES["dark"]["muted"][0] in widget.stats_label.styleSheet() or not widget.message.stats
    finally:
        apply_theme(app, "system")


def test_the_dark_placeholder_is_the_palettes_readable_one(qtbot):
    app = QApplication.instance()
    apply_theme(app, "dark")
    try:
        edit = QLineEdit(placeholderText="Search chats")
        qtbot.addWidget(edit)
        pal = edit.palette()
        assert contrast_ratio(pal.color(QPalette.PlaceholderText), pal.color(QPalette.Base)) >= AA
    finally:
        apply_theme(app, "system")


def test_disabled_text_looks_disabled_in_both_themes(theme):
    pal = QApplication.instance().palette()
    for role in (QPalette.ButtonText, QPalette.WindowText):
        enabled, disabled = pal.color(QPalette.Active, role), pal.color(QPalette.Disabled, role)
        assert contrast_ratio(enabled, disabled) > 1.5, f"{theme}: disabled text looks enabled"
