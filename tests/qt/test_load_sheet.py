"""The loading sheet: live budget bars and verdict, one-click fixes, staged progress, Cancel, errors."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from conftest import Recorder
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog

from engine.model.load_progress import LoadCancelled, LoadProgress
from engine.model.model_footprint import footprint_for
from engine.gguf.shapes import shape_config

from app.model_loader import ModelLoader
from app.ui.load_sheet import LoadSheet, find_mmproj


@pytest.fixture
def loader():
    made = ModelLoader()
    yield made
    made.shutdown()


@pytest.fixture
def sheet(qtbot, rig, loader):
    """The sheet on three CMP cards, showing the demo model once it has been inspected."""
    made = LoadSheet(list(rig.read().cards), loader)
    qtbot.addWidget(made)
    qtbot.waitUntil(lambda: made.inspected is not None, timeout=60_000)
    return made


def show_27b(sheet: LoadSheet) -> None:
    """The 27B shape with all three cards ticked by the user (the sheet alone ticks the fewest that fit)."""
    sheet.show_model(replace(sheet.inspected, footprint=footprint_for(shape_config("27b"))))
    for i in range(sheet.card_list.count()):
        sheet.card_list.item(i).setCheckState(Qt.Checked)


def free_bytes(sheet: LoadSheet) -> list[int]:
    return [bar.card.free for bar in sheet.bars.bars]


def test_slider_and_kv_bits_change_the_bars_and_the_verdict(sheet):
    show_27b(sheet)
    assert sheet.context_slider.maximum() * 1024 == 262144
    sheet.context_slider.setValue(8)  # 8K tokens
    assert sheet.context == 8192 and sheet.current.fits
    small = free_bytes(sheet)
    assert len(small) == 3 and all(f > 0 for f in small)
    assert "fits" in sheet.verdict.text() and sheet.load_button.isEnabled()
    sheet.context_slider.setValue(sheet.context_slider.maximum())
    big = free_bytes(sheet)
    assert all(b < s for b, s in zip(big, small))  # more context, more KV on every card
    assert not sheet.current.fits and "short" in sheet.verdict.text()
    assert not sheet.load_button.isEnabled() and sheet.anyway_button.isVisibleTo(sheet)
    assert any("won't fit" in label.text() for label in sheet.bars.labels)
    sheet.v_bits.setCurrentIndex(sheet.v_bits.findData(3))
    assert sheet.kv_name == "k16v3" and not sheet.current.fits  # it would fit, but the CUDA backend cannot run it
    assert "no k16v3 KV kernels" in sheet.verdict.text() and not sheet.load_button.isEnabled()
    assert all(f > b for f, b in zip(free_bytes(sheet), big))  # the bars still price it
    sheet.k_bits.setCurrentIndex(sheet.k_bits.findData(8))
    assert sheet.kv_name == "k8v3" and sheet.current.fits  # 3-bit values make it fit


def test_typed_layers_per_card_move_the_bars_and_reach_the_load_request(sheet):
    show_27b(sheet)
    sheet.context_spin.setValue(8192)
    assert sheet.request().split is None  # empty: the planner's split
    sheet.split_edit.setText("20, 22, 22")
    assert [len(bar.card.layers) for bar in sheet.bars.bars] == [20, 22, 22] and sheet.current.fits
    assert sheet.request().split == (20, 22, 22)
    sheet.split_edit.setText("30,34")
    assert not sheet.current.fits and "3 are chosen" in sheet.verdict.text() and not sheet.load_button.isEnabled()
    sheet.split_edit.setText("a,b")
    assert not sheet.current.fits and "64 in all" in sheet.verdict.text()
    sheet.split_edit.clear()
    assert sheet.current.fits


def test_a_fix_button_applies_a_fix_that_fits(sheet):
    show_27b(sheet)
    sheet.context_spin.setValue(262144)
    assert not sheet.current.fits
    fixes = [sheet.fix_row.itemAt(i).widget() for i in range(sheet.fix_row.count())]
    labels = [b.text() for b in fixes]
    assert any(label.startswith("use k") for label in labels) and any("context" in label for label in labels)
    next(b for b in fixes if "context" in b.text()).click()
    assert sheet.current.fits and sheet.context < 262144


def test_unchecking_a_card_moves_its_layers_to_the_others_and_fit_max_finds_the_longest_context(sheet):
    show_27b(sheet)
    sheet.context_spin.setValue(4096)
    assert [bar.card.name for bar in sheet.bars.bars] == ["card 0", "card 1", "card 2"]
    sheet.card_list.item(1).setCheckState(Qt.Unchecked)
    assert [bar.card.name for bar in sheet.bars.bars] == ["card 0", "card 2"]
    assert sum(len(bar.card.layers) for bar in sheet.bars.bars) == 64
    sheet.fit_button.click()
    longest = sheet.context
    assert sheet.current.fits
    sheet.context_spin.setValue(longest + 1024)
    assert not sheet.current.fits


def test_the_demo_model_loads_with_progress_and_the_sheet_closes(qtbot, sheet, loader):
    assert "demo model" in sheet.model_label.text()
    reports, loaded = Recorder(loader.progress), Recorder(loader.loaded)
    sheet.backend.setCurrentText("reference")
    sheet.load_button.click()
    qtbot.waitUntil(lambda: bool(loaded.calls), timeout=60_000)
    engine = loaded.calls[0][0]
    try:
        assert sheet.result() == QDialog.DialogCode.Accepted
        row = sheet.rows[0]
        assert row.bar.value() == 1000 and "ready" in row.detail.text()
        last = reports.calls[-1][0]
        assert last.stage == "ready" and last.done_bytes == last.total_bytes > 0
        assert len(reports.calls) > 2  # per-tensor byte counts, not just start and end
    finally:
        engine.close()


def test_cancel_stops_the_load_and_frees_what_it_held(qtbot, sheet, loader, monkeypatch):
    """A slow fake backend opener reports progress until the callback raises LoadCancelled."""
    released = threading.Event()

    def slow_open(name, loaded, context=None, progress=None, slots=1, **placement):
        try:
            for done in range(1000):
                progress(LoadProgress(0, "uploading weights", done << 20, 1000 << 20, 0.01 * (done + 1)))
                threading.Event().wait(0.01)
        except LoadCancelled:
            released.set()
            raise
        raise AssertionError("the load was never cancelled")

    monkeypatch.setattr("app.model_loader.open_backend", slow_open)
    sheet.load_button.click()
    qtbot.waitUntil(lambda: 0 in sheet.rows and "MB/s" in sheet.rows[0].detail.text(), timeout=30_000)
    assert "uploading weights" in sheet.rows[0].detail.text() and "ETA" in sheet.rows[0].detail.text()
    assert sheet.cancel_button.text() == "Cancel loading"
    cancelled = Recorder(loader.cancelled)
    sheet.cancel_button.click()
    qtbot.waitUntil(lambda: bool(cancelled.calls), timeout=30_000)
    assert released.is_set()
    qtbot.waitUntil(lambda: "cancelled" in sheet.stage_label.text())
    assert not sheet.loading and sheet.load_button.isEnabled() and sheet.cancel_button.text() == "Close"


def test_a_failed_load_shows_the_engine_error_text(qtbot, sheet, loader):
    sheet.backend.setCurrentText("cuda")  # no GPU here: the engine refuses with its reason
    failed = Recorder(loader.failed)
    sheet.load_button.click()
    qtbot.waitUntil(lambda: bool(failed.calls), timeout=60_000)
    assert "CUDA backend cannot run here" in failed.calls[0][0]
    qtbot.waitUntil(lambda: sheet.error_text.isVisibleTo(sheet))
    assert sheet.error_text.toPlainText() == failed.calls[0][0]


def test_a_broken_file_shows_the_validator_message(qtbot, sheet, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 16)
    sheet.choose(bad)
    qtbot.waitUntil(lambda: sheet.inspected is None and "broken.gguf" in sheet.model_label.text(), timeout=30_000)
    assert not sheet.load_button.isEnabled()


def test_mmproj_next_to_the_model_is_found(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"")
    assert find_mmproj(tmp_path / "model.gguf") is None
    (tmp_path / "mmproj-model-f16.gguf").write_bytes(b"")
    assert find_mmproj(tmp_path / "model.gguf").name == "mmproj-model-f16.gguf"
