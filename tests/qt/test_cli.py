"""`rigllm gui` is registered through the entry point hook with the app's own arguments."""

import argparse
from pathlib import Path

from conftest import destroy_in_gui_thread

from app.cli import register
from app.main import run


def test_register_adds_the_gui_command():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["gui", "model.gguf", "--smoke-test"])
    assert args.func is run and args.model == Path("model.gguf") and args.smoke_test
    assert parser.parse_args(["gui"]).model is None


def test_start_without_a_model_picks_the_demo_on_a_machine_without_gpu(qtbot, store, qsettings):
    from engine.telemetry import NO_GPU, FakeSource

    from app.ui.main_window import MainWindow

    win = MainWindow(store, qsettings, FakeSource([], error=NO_GPU), poll_ms=50)
    win.start(None)
    qtbot.waitUntil(lambda: win.engine is not None, timeout=120_000)
    assert win.engine.info.backend == "reference" and "gibberish" in win.engine.info.label
    assert "No NVIDIA GPU found" in win.rig.empty.text()
    win.close()
    destroy_in_gui_thread(win)


def test_start_without_a_model_opens_the_loading_sheet_when_there_are_cards(qtbot, store, qsettings, rig):
    from PySide6.QtWidgets import QApplication

    from app.ui.load_sheet import LoadSheet
    from app.ui.main_window import MainWindow

    win = MainWindow(store, qsettings, rig, poll_ms=50)
    win.start(None)
    qtbot.waitUntil(lambda: any(isinstance(w, LoadSheet) and w.isVisible() for w in QApplication.topLevelWidgets()))
    assert win.engine is None
    win.close()
    destroy_in_gui_thread(win)
