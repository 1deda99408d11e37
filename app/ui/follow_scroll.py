"""Keep a scroll area at its end while its content grows, unless the user scrolled away from it.

The chat view follows a streaming answer and shows a newly sent message; a user who scrolls up to
read stays where they are, and a "Jump to latest" button brings them back (and follows again).
Growth is seen through the scroll bar's range, which changes after the layout has placed the new
content, so no timer guesses when the layout is done.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QPushButton, QScrollArea

AT_END_SLACK = 8  # pixels from the end that still count as "at the latest message"


class FollowScroll(QObject):
    def __init__(self, area: QScrollArea):
        super().__init__(area)
        self.area = area
        self.following = True
        self.jump_button = QPushButton("Jump to latest", area)
        self.jump_button.setToolTip("Scroll to the newest message and follow the answer as it streams")
        self.jump_button.setCursor(Qt.PointingHandCursor)
        self.jump_button.clicked.connect(self.follow)
        self.jump_button.setVisible(False)
        bar = area.verticalScrollBar()
        bar.rangeChanged.connect(self._range_changed)
        bar.valueChanged.connect(self._value_changed)
        area.installEventFilter(self)

    def follow(self) -> None:
        """Go to the end now and stay there as content arrives."""
        self.following = True
        self.jump_button.setVisible(False)
        bar = self.area.verticalScrollBar()
        bar.setValue(bar.maximum())

    def at_end(self) -> bool:
        bar = self.area.verticalScrollBar()
        return bar.value() >= bar.maximum() - AT_END_SLACK

    def _range_changed(self, _low: int, high: int) -> None:
        if self.following:
            self.area.verticalScrollBar().setValue(high)
        else:
            self._place_button()
            self.jump_button.setVisible(True)

    def _value_changed(self, _value: int) -> None:
        self.following = self.at_end()
        if self.following:
            self.jump_button.setVisible(False)

    def _place_button(self) -> None:
        size = self.jump_button.sizeHint()
        rect = self.area.viewport().geometry()
        self.jump_button.resize(size)
        self.jump_button.move(rect.right() - size.width() - 12, rect.bottom() - size.height() - 8)
        self.jump_button.raise_()

    def eventFilter(self, watched: QObject, event) -> bool:
        if watched is self.area and event.type() == event.Type.Resize:
            self._place_button()
        return False
