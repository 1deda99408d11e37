"""Render the main window, the loading sheet and the rig monitor to PNGs for review.

    xvfb-run -a -s "-screen 0 1400x900x24" python packaging/screenshots.py OUTDIR

Runs against a throw-away data folder and settings file (never the user's), the generated demo model
on the CPU, and a scripted telemetry source showing three CMP 100-210 cards (card 2 running hot, so
an alert shows). The 27B and 9B sheets price the released shapes from their configs, no file needed.
Also drawn: the dark theme with an open thinking block, an image refused by the text-only demo model,
a long prompt's "processing prompt N / M tokens" phase (a real prefill, caught mid-way) and the
"Connect to rig" dialog. The keyring is the null one, so no real key is read.
"""

from __future__ import annotations

import dataclasses

import os
import sys
import tempfile
from pathlib import Path

DATA = tempfile.mkdtemp(prefix="rigllm-shots-")
os.environ["RIGLLM_DATA_DIR"] = DATA
os.environ["XDG_CONFIG_HOME"] = os.path.join(DATA, "config")
os.environ["PYTHON_KEYRING_BACKEND"] = "keyring.backends.null.Keyring"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PySide6.QtCore import QEventLoop, QMimeData, QSettings, QTimer, QUrl  # noqa: E402
from PySide6.QtGui import QColor, QImage  # noqa: E402
from PySide6.QtWidgets import QApplication, QWidget  # noqa: E402

from engine.model.load_progress import LoadProgress  # noqa: E402
from engine.model.model_footprint import footprint_for  # noqa: E402
from engine.gguf.shapes import shape_config  # noqa: E402
from engine.telemetry import FakeSource, cmp_100_210  # noqa: E402

from app.chat_records import Message  # noqa: E402
from app.chat_store import ChatStore  # noqa: E402
from app.main import chats_path  # noqa: E402
from app.ui.main_window import MainWindow  # noqa: E402

SAMPLE = [
    Message("user", "How do I read a GGUF header in Python?"),
    Message("assistant", "Use the `gguf` package:\n\n```python\nfrom gguf import GGUFReader\n\nreader = GGUFReader(\"model.gguf\")\n"
            "print(reader.fields[\"general.architecture\"])\n```\n\nEach field holds its **type** and value.",
            reasoning="The user wants the header. The gguf package has a reader class.", reasoning_seconds=1.4,
            stats={"tokens": 61, "tokens_per_second": 22.4, "ttft_seconds": 0.41}),
]


def wait(ms: int) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def wait_for(condition, timeout_ms: int = 60000) -> None:
    waited = 0
    while not condition():
        if waited > timeout_ms:
            raise SystemExit("screenshots: timed out waiting for the app")
        wait(50)
        waited += 50


def shot(widget: QWidget, out: Path, name: str, settle_ms: int = 300) -> None:
    wait(settle_ms)
    path = out / f"{name}.png"
    widget.grab().save(str(path))
    print(path)


def prompt_phase(window: MainWindow, out: Path) -> None:
    """Send a long prompt and draw the window while its prefill is part way (the phase label's own text)."""
    window.conversations.new_chat()
    window.chat.send("Summarize this log. " + "card 0 uploaded a layer; " * 150, [])
    if window.chat.stream is None:
        raise SystemExit(f"screenshots: the long prompt was not answered: {window.chat.context_label.text()}")
    label = window.chat.stream.widget.status_label
    wait_for(lambda: window.chat.stream is None or (label.text().startswith("processing prompt")
                                                     and "tokens/s" in label.text()), timeout_ms=60000)
    shot(window, out, "prompt_progress", settle_ms=0)
    wait_for(lambda: window.chat.stream is None)


def image_refusal(window: MainWindow, out: Path) -> None:
    """Drop an image on the text-only demo model: refused at once, with the reason, nothing stored."""
    picture = Path(DATA) / "photo.png"
    image = QImage(64, 48, QImage.Format_RGB32)
    image.fill(QColor("#3b6fd8"))
    image.save(str(picture))
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(picture))])
    window.conversations.new_chat()
    window.chat.composer.text.setPlainText("What is in this picture?")
    window.chat.composer.add_from_mime(mime)
    shot(window, out, "image_refused_text_only")


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    qt_app = QApplication(sys.argv[:1])  # noqa: F841 (must stay alive while windows exist)
    source = FakeSource([cmp_100_210(i, memory_used=(310 + 900 * (i == 1)) << 20) for i in range(3)])
    source.set_card(2, temperature_c=88, hbm_temperature_c=93)
    store = ChatStore(chats_path())
    cid = store.create_conversation("Reading GGUF headers")
    for m in SAMPLE:
        store.add_message(cid, m)
    # polled faster than 1 Hz so the sparklines have some history by the time of the shot
    window = MainWindow(store, QSettings(str(Path(DATA) / "settings.ini"), QSettings.IniFormat), source, poll_ms=40)
    window.show()
    window.start_default_model(None)
    wait_for(lambda: window.engine is not None)
    window.chat.send("Write a haiku about mining cards.", [])
    wait_for(lambda: window.chat.stream is None)
    window.conversations.refresh(select=cid)
    window.conversations.list.setCurrentRow(window.conversations.list.currentRow())
    window.chat.show_conversation(cid)
    shot(window, out, "main_window")
    window.conversations.list.setCurrentRow(0)
    shot(window, out, "main_window_demo_answer")
    image_refusal(window, out)
    prompt_phase(window, out)

    window.apply_settings(dataclasses.replace(window.settings, theme="dark"))
    window.conversations.refresh(select=cid)
    window.chat.show_conversation(cid)
    window.chat.widgets[1].thinking_toggle.setChecked(True)
    shot(window, out, "main_window_dark_thinking")
    dialog = window.open_connect_dialog()
    dialog.host.setText("rig.local")
    shot(dialog, out, "connect_dialog_dark")
    dialog.close()
    window.apply_settings(dataclasses.replace(window.settings, theme="system"))

    sheet = window.open_load_sheet()
    wait_for(lambda: sheet.inspected is not None)
    shot(sheet, out, "load_sheet_demo")
    big = dataclasses.replace(sheet.inspected, footprint=footprint_for(shape_config("27b")))
    sheet.show_model(big)
    sheet.model_label.setText("<b>Qwen3.5-27B shape</b> (priced from its config for this screenshot; no file)")
    sheet.context_spin.setValue(262144)
    sheet.set_kv("f16")
    shot(sheet, out, "load_sheet_27b_short")
    sheet.apply_fix(sheet.current.fixes[0])
    shot(sheet, out, "load_sheet_27b_fixed")
    sheet.progress_box.setVisible(True)
    for card, done in ((0, 9.1e9), (1, 6.2e9), (2, 2.0e9)):
        sheet._progress(LoadProgress(card, "uploading weights", int(done), int(9.6e9), done / 2.4e8))
    shot(sheet, out, "load_sheet_progress")
    sheet.progress_box.setVisible(False)
    nine = dataclasses.replace(sheet.inspected, footprint=footprint_for(shape_config("9b")))
    sheet.show_model(nine)
    sheet.model_label.setText("<b>Qwen3.5-9B shape</b> (priced from its config for this screenshot; no file)")
    shot(sheet, out, "load_sheet_9b_one_card")
    sheet.close()

    window.tabs.setCurrentWidget(window.rig)
    wait(2500)
    shot(window, out, "rig_monitor")
    history = window.rig.open_history(0)
    shot(history, out, "rig_history")
    history.close()
    window.tabs.setCurrentWidget(window.api)
    shot(window, out, "api_panel")
    hub_pages(window, out)
    window.close()
    return 0


def hub_pages(window: MainWindow, out: Path) -> None:
    """The model browser and the library against the tests' loopback Hub (tests/hub_server.py), which serves
    the trained fixture, an MoE repository and the tiny vision model as repositories (no network)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from hub_server import fixture_repos, serve, tiny_vision_files

    from app.ui import library_pages

    window.settings = dataclasses.replace(window.settings, models_dir=str(Path(DATA) / "models"))
    with serve(fixture_repos(tiny_vision_files(Path(DATA) / "vision"))) as hub:
        os.environ["HF_ENDPOINT"] = hub.endpoint
        browser = library_pages.open_model_browser(window)
        wait_for(lambda: browser.results.count() > 0)
        for repo, file in (("rigtest/Qwen3.5-Fixture-GGUF", "Qwen3.5-Fixture-Q8_0.gguf"),
                           ("rigtest/Qwen3.5-Vision-Tiny-GGUF", "Qwen3.5-Vision-Tiny-F32.gguf")):
            row = [browser.results.item(i).text().split("\n")[0] for i in range(browser.results.count())].index(repo)
            browser.results.setCurrentRow(row)
            wait_for(lambda: browser.repo is not None and browser.repo.listing.repo == repo)
            browser.select_file(file)
            browser.download()
            wait_for(lambda: "downloaded" in browser.progress_label.text())
        shot(browser, out, "model_browser_vision")
        browser.results.setCurrentRow(0)
        wait_for(lambda: browser.repo is not None and browser.repo.listing.repo == "rigtest/Qwen3.5-Fixture-GGUF")
        browser.select_file("Qwen3.5-Fixture-Q8_0.gguf")
        shot(browser, out, "model_browser")
        browser.close()
    folder = library_pages.library_of(window)
    folder.mark_used(folder.root / "rigtest/Qwen3.5-Vision-Tiny-GGUF/Qwen3.5-Vision-Tiny-F32.gguf")  # as Open does
    library = library_pages.open_model_library(window)
    library.table.selectRow(0)
    shot(library, out, "model_library")
    library.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python packaging/screenshots.py OUTDIR")
    sys.exit(main(Path(sys.argv[1])))
