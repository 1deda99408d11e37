"""The message composer: text plus image attachments from a button, drag-and-drop or paste.

Images are normalised with Pillow on arrival (decoded, EXIF-rotated, re-encoded as PNG), so a file
that will not decode is refused at once with its name, not later mid-generation.
"""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, ImageOps, UnidentifiedImageError
from PySide6.QtCore import QBuffer, QIODevice, QMimeData, Qt, Signal
from PySide6.QtGui import QImage, QKeyEvent, QPixmap
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QToolButton,
                               QVBoxLayout, QWidget)

from app.chat_records import Attachment

MAX_SIDE = 2048  # larger images are scaled down: no vision tower needs more, and the database stays small


class ImageRejected(ValueError):
    """The data is not an image Pillow can decode."""


def attachment_from_bytes(name: str, data: bytes) -> Attachment:
    try:
        with Image.open(io.BytesIO(data)) as img:
            img = ImageOps.exif_transpose(img)
            img.thumbnail((MAX_SIDE, MAX_SIDE))
            out = io.BytesIO()
            img.convert("RGBA" if img.mode in ("RGBA", "LA", "P") else "RGB").save(out, "PNG")
    except (UnidentifiedImageError, OSError) as err:
        raise ImageRejected(f"{name}: not an image that can be read ({err})") from None
    return Attachment(Path(name).with_suffix(".png").name, "image/png", out.getvalue())


def attachment_from_qimage(name: str, image: QImage) -> Attachment:
    buffer = QBuffer()
    buffer.open(QIODevice.WriteOnly)
    image.save(buffer, "PNG")
    return attachment_from_bytes(name, bytes(buffer.data()))


def attachments_from_mime(mime: QMimeData) -> tuple[list[Attachment], list[str]]:
    """Images in dropped or pasted data (files or raw image data), and the errors for the rest."""
    found, errors = [], []
    for url in mime.urls():
        if url.isLocalFile():
            path = Path(url.toLocalFile())
            try:
                found.append(attachment_from_bytes(path.name, path.read_bytes()))
            except (ImageRejected, OSError) as err:
                errors.append(str(err))
    if not found and mime.hasImage():
        found.append(attachment_from_qimage("pasted.png", QImage(mime.imageData())))
    return found, errors


class _TextBox(QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line; pasted images become attachments."""

    send = Signal()
    images_pasted = Signal(object)  # QMimeData

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key_Return, Qt.Key_Enter) and not event.modifiers() & Qt.ShiftModifier:
            self.send.emit()
            return
        super().keyPressEvent(event)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return source.hasImage() or source.hasUrls() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        if source.hasImage() or source.hasUrls():
            self.images_pasted.emit(source)
        else:
            super().insertFromMimeData(source)


class Composer(QWidget):
    send_requested = Signal(str, object)  # text, list[Attachment]
    stop_requested = Signal()
    error = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setAcceptDrops(True)
        self.attachments: list[Attachment] = []
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.thumbs = QHBoxLayout()
        self.thumbs.addStretch(1)
        layout.addLayout(self.thumbs)
        row = QHBoxLayout()
        self.attach_button = QPushButton("Attach image...")
        self.attach_button.clicked.connect(self._choose_files)
        self.text = _TextBox()
        self.text.setPlaceholderText("Message (Enter sends, Shift+Enter new line; drop or paste images)")
        self.text.setMaximumHeight(80)
        self.text.send.connect(self._send)
        self.text.images_pasted.connect(self.add_from_mime)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._send_or_stop)
        row.addWidget(self.attach_button)
        row.addWidget(self.text, 1)
        row.addWidget(self.send_button)
        layout.addLayout(row)
        self._generating = False
        self.keep_whitespace = False  # raw prompt mode sends the text exactly as typed
        self.images_refused = ""  # why the loaded model takes no images ("" when it does)

    def set_generating(self, generating: bool) -> None:
        """While an answer streams the Send button is a Stop button."""
        self._generating = generating
        self.send_button.setText("Stop" if generating else "Send")

    def _send_or_stop(self) -> None:
        if self._generating:
            self.stop_requested.emit()
        else:
            self._send()

    def set_images_allowed(self, allowed: bool, reason: str = "") -> None:
        """Attaching is off for a model that takes no images; the button's tooltip says why."""
        self.images_refused = "" if allowed else reason
        self.attach_button.setEnabled(allowed)
        self.attach_button.setToolTip("Attach images for the model to look at" if allowed else reason)

    def _send(self) -> None:
        typed = self.text.toPlainText()
        if self._generating or not (typed.strip() or self.attachments):
            return
        self.send_requested.emit(typed if self.keep_whitespace else typed.strip(), list(self.attachments))

    def clear(self) -> None:
        self.text.clear()
        for i in reversed(range(len(self.attachments))):
            self.remove_attachment(i)

    def add_attachment(self, attachment: Attachment) -> None:
        self.attachments.append(attachment)
        self._rebuild_thumbs()

    def remove_attachment(self, index: int) -> None:
        del self.attachments[index]
        self._rebuild_thumbs()

    def _rebuild_thumbs(self) -> None:
        while self.thumbs.count() > 1:
            item = self.thumbs.takeAt(0)
            item.widget().deleteLater()
        for i, att in enumerate(self.attachments):
            box = QWidget()
            box.setObjectName(f"thumb-{i}")
            row = QHBoxLayout(box)
            row.setContentsMargins(0, 0, 0, 0)
            image = QLabel()
            pix = QPixmap()
            pix.loadFromData(att.data)
            image.setPixmap(pix.scaled(56, 56, Qt.KeepAspectRatio, Qt.SmoothTransformation))
            image.setToolTip(att.name)
            remove = QToolButton(text="x")
            remove.setToolTip(f"Remove {att.name}")
            remove.clicked.connect(lambda _=False, index=i: self.remove_attachment(index))
            row.addWidget(image)
            row.addWidget(remove)
            self.thumbs.insertWidget(i, box)

    def add_from_mime(self, mime: QMimeData) -> None:
        if self.images_refused:
            self.error.emit(self.images_refused)
            return
        found, errors = attachments_from_mime(mime)
        for att in found:
            self.add_attachment(att)
        for message in errors:
            self.error.emit(message)

    def _choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach images", "", "Images (*.png *.jpg *.jpeg *.webp *.bmp *.gif)")
        for path in paths:
            try:
                self.add_attachment(attachment_from_bytes(Path(path).name, Path(path).read_bytes()))
            except (ImageRejected, OSError) as err:
                self.error.emit(str(err))

    def dragEnterEvent(self, event) -> None:
        if event.mimeData().hasUrls() or event.mimeData().hasImage():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:
        self.add_from_mime(event.mimeData())
        event.acceptProposedAction()
