"""The loading sheet's honest defaults (issue 27, findings 3, 4 and 10): fixes only in formats the backend
runs, the fewest cards that fit with the reason, system RAM priced on a CPU-only machine, a small
model's whole trained context, a sheet that keeps its width, file names instead of "Hf", and a
per-model profile restored."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from engine.model.kv_formats import CUDA_KERNEL_FORMATS
from engine.model.model_footprint import footprint_for
from engine.gguf.shapes import shape_config

from app.model_loader import ModelLoader
from app.model_profiles import ModelProfile, ModelProfiles
from app.ui.load_sheet import LoadSheet

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "fixture-q8_0.gguf"


@pytest.fixture
def loader():
    made = ModelLoader()
    yield made
    made.shutdown()


def open_sheet(qtbot, cards, loader, path=None, profiles=None) -> LoadSheet:
    sheet = LoadSheet(cards, loader, profiles=profiles)
    qtbot.addWidget(sheet)
    qtbot.waitUntil(lambda: sheet.inspected is not None, timeout=60_000)
    if path is not None:
        sheet.choose(path)
        qtbot.waitUntil(lambda: sheet.inspected is not None and sheet.inspected.path == path, timeout=60_000)
    return sheet


def shape(sheet: LoadSheet, size: str) -> None:
    sheet.show_model(replace(sheet.inspected, footprint=footprint_for(shape_config(size))))


def test_one_click_fixes_offer_only_kv_formats_the_cuda_backend_runs(qtbot, rig, loader):
    sheet = open_sheet(qtbot, list(rig.read().cards), loader)
    shape(sheet, "27b")
    for i in range(3):
        sheet.card_list.item(i).setCheckState(Qt.Checked)
    sheet.context_spin.setValue(262144)
    sheet.set_kv("f16")
    assert not sheet.current.fits
    kv_fixes = [f.kv for f in sheet.current.fixes if f.kv]
    assert kv_fixes and all(kv in CUDA_KERNEL_FORMATS for kv in kv_fixes)
    assert kv_fixes[0] == "k8v8"  # not k16v8, which would fit but has no CUDA kernels
    sheet.apply_fix(sheet.current.fixes[0])
    assert sheet.kv_name == "k8v8" and sheet.current.fits and "fits" in sheet.verdict.text()
    sheet.set_kv("k16v8")  # typed by hand: priced, but never called a fit
    assert not sheet.current.fits and "no k16v8 KV kernels" in sheet.verdict.text()
    sheet.backend.setCurrentText("reference")  # the reference codes every pair
    assert sheet.current.fits


def test_a_9b_defaults_to_one_card_of_three_with_the_reason(qtbot, rig, loader):
    sheet = open_sheet(qtbot, list(rig.read().cards), loader)
    shape(sheet, "9b")
    assert sheet.chosen_cards() == [0] and sheet.current.fits
    assert "1 card" in sheet.card_reason.text() and "no PCIe hops" in sheet.card_reason.text()
    assert sheet.request().cards == (0,)
    shape(sheet, "27b")  # a model that needs two cards at 32K gets two, the least loaded ones
    assert sheet.chosen_cards() == [0, 2] and "2 cards" in sheet.card_reason.text()


def test_a_cpu_only_machine_prices_weights_and_kv_against_system_ram(qtbot, loader):
    sheet = open_sheet(qtbot, [], loader)
    result = sheet.current
    assert len(result.cards) == 1 and result.cards[0].name == "system RAM" and result.fits
    bar = result.cards[0]
    assert bar.weights == sheet.inspected.host_weight_bytes > 0 and bar.kv > 0
    assert "system RAM" in sheet.verdict.text() and "no card chosen" in sheet.verdict.text()
    assert "available" in sheet.verdict.text()


def test_a_small_models_trained_context_is_its_minimum_and_default(qtbot, loader):
    sheet = open_sheet(qtbot, [], loader)
    small = replace(sheet.inspected.footprint.config, context_length=512)
    sheet.show_model(replace(sheet.inspected, footprint=replace(sheet.inspected.footprint, config=small)))
    assert sheet.context_spin.minimum() <= 512 and sheet.context_spin.maximum() == 512 and sheet.context == 512


def test_the_sheet_keeps_its_width_when_the_kv_label_changes(qtbot, rig, loader):
    sheet = open_sheet(qtbot, list(rig.read().cards), loader)
    sheet.show()
    widths = set()
    for kv in ("f16", "k8v3", "k3v3", "k16v4", "k8v8"):
        sheet.set_kv(kv)
        qtbot.wait(10)
        widths.add((sheet.minimumSizeHint().width(), sheet.width()))
    assert len(widths) == 1


def test_a_fixture_model_is_named_by_its_file(qtbot, loader):
    sheet = open_sheet(qtbot, [], loader, path=FIXTURE)
    assert sheet.inspected.name == "fixture-q8_0"
    assert "<b>fixture-q8_0</b>" in sheet.model_label.text() and "Hf" not in sheet.model_label.text()


def test_the_sheet_restores_a_models_profile(qtbot, rig, loader, qsettings):
    profiles = ModelProfiles(qsettings)
    profiles.put(str(FIXTURE), ModelProfile("reference", (1, 2), (2, 2), 8192, "k8v4"))
    sheet = open_sheet(qtbot, list(rig.read().cards), loader, path=FIXTURE, profiles=profiles)
    assert sheet.chosen_cards() == [1, 2] and sheet.split == (2, 2) and sheet.context == 8192
    assert sheet.kv_name == "k8v4" and sheet.backend.currentText() == "reference"
    request = sheet.request()
    assert (request.cards, request.split, request.context, request.kv_format) == ((1, 2), (2, 2), 8192, "k8v4")


def test_a_slower_inspection_of_an_earlier_choice_does_not_replace_the_latest(qtbot, loader):
    sheet = open_sheet(qtbot, [], loader, path=FIXTURE)
    demo = replace(sheet.inspected, path=None, name="demo")
    sheet._inspected(demo)  # the demo model's inspection, started first, arriving last
    assert sheet.inspected.path == FIXTURE and sheet.inspected.name == "fixture-q8_0"
