"""Read-only markdown with a "Copy" link above every fenced code block.

QTextBrowser renders CommonMark (QTextDocument.setMarkdown) without a web engine; it cannot hold
buttons inside the text, so each code block gets a `copy:N` link, and clicking it puts block N on
the clipboard. The view grows with its text instead of scrolling, so a chat scrolls as one page.

Markdown joins the lines of a paragraph; chat apps keep a single line break as written, so each one
outside code becomes a hard break first (`keep_line_breaks`). A user's own text is shown as plain
text (`set_plain`): what they typed, not markup.
"""

from __future__ import annotations

import re

from PySide6.QtCore import QSize, QUrl, Qt
from PySide6.QtGui import QGuiApplication, QPalette, QTextBlockFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import QSizePolicy, QTextBrowser

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def code_blocks(markdown: str) -> list[str]:
    return [m.group(1).rstrip("\n") for m in _FENCE.finditer(markdown)]


def keep_line_breaks(markdown: str) -> str:
    """Single line breaks made hard (two trailing spaces, which CommonMark ignores where a block ends anyway),
    except inside fenced code and in tables."""
    lines = markdown.split("\n")
    fenced = False
    for i, line in enumerate(lines[:-1]):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        following = lines[i + 1]
        if (fenced or not line.strip() or not following.strip() or following.lstrip().startswith("```")
                or line.lstrip().startswith("|") or line.endswith(("\\", "  "))):
            continue
        lines[i] = line + "  "
    return "\n".join(lines)


def with_copy_links(markdown: str) -> str:
    counter = iter(range(10**9))
    return _FENCE.sub(lambda m: f"[Copy code](copy:{next(counter)})\n\n{m.group(0)}", markdown)


class MarkdownView(QTextBrowser):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._clicked)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Minimum)
        self.setFrameShape(QTextBrowser.NoFrame)
        self.document().documentLayout().documentSizeChanged.connect(lambda _size: self.updateGeometry())
        self._markdown = ""

    @property
    def markdown(self) -> str:
        return self._markdown

    def set_markdown(self, markdown: str) -> None:
        if markdown != self._markdown:
            self._markdown = markdown
            self.setMarkdown(with_copy_links(keep_line_breaks(markdown)))
            self._shade_code()

    def set_plain(self, text: str) -> None:
        """Show `text` exactly as written (line breaks, asterisks and all)."""
        if text != self._markdown:
            self._markdown = text
            self.setPlainText(text)

    def _shade_code(self) -> None:
        """QTextDocument marks fenced code blocks but draws them plain: give them a background."""
        shade = self.palette().color(QPalette.AlternateBase).darker(106)
        block = self.document().begin()
        while block.isValid():
            if block.blockFormat().hasProperty(QTextFormat.BlockCodeFence):
                cursor = QTextCursor(block)
                fmt = QTextBlockFormat()
                fmt.setBackground(shade)
                cursor.mergeBlockFormat(fmt)
            block = block.next()

    def copy_code(self, index: int) -> None:
        QGuiApplication.clipboard().setText(code_blocks(self._markdown)[index])

    def _clicked(self, url: QUrl) -> None:
        if url.scheme() == "copy":
            self.copy_code(int(url.path()))

    def sizeHint(self) -> QSize:
        self.document().setTextWidth(max(100, self.viewport().width()))
        return QSize(300, int(self.document().size().height()) + 8)

    def minimumSizeHint(self) -> QSize:
        return QSize(100, self.sizeHint().height())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.updateGeometry()
