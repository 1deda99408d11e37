"""The model browser and the model library pages (pytest-qt, offscreen) against the loopback Hub: search
results with MoE greyed, files with sizes and fit verdicts that follow the knobs, a download with progress
into the library, the Hub unreachable said plainly, and the library's Open (to the loading sheet) and Delete."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from hub_server import TRAINED, fixture_repos, serve

from engine.hub.library import Library
from engine.hub.session import HubAccess
from engine.model.memory_plan import cards_16gb

from app.model_hub import HubTasks
from app.ui import library_pages
from app.ui.model_browser import ModelBrowser
from app.ui.model_library import ModelLibrary

REPO = "rigtest/Qwen3.5-Fixture-GGUF"
Q8 = "Qwen3.5-Fixture-Q8_0.gguf"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with serve(fixture_repos()) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


@pytest.fixture
def browser(qtbot, hub, tmp_path):
    page = ModelBrowser(Library(tmp_path / "models"), cards_16gb(3), HubTasks(HubAccess(hub.endpoint)))
    qtbot.addWidget(page)
    page.show()
    return page


def verdict_of(page: ModelBrowser, name: str) -> str:
    for row in range(page.files.rowCount()):
        if page.files.item(row, 0).text() == name:
            return page.files.item(row, 3).text()
    raise AssertionError(f"{name} not listed")


def open_fixture_repo(qtbot, page: ModelBrowser) -> None:
    page.search()
    qtbot.waitUntil(lambda: page.results.count() == 2, timeout=20_000)
    page.results.setCurrentRow(0)
    qtbot.waitUntil(lambda: page.repo is not None, timeout=20_000)


def test_search_lists_runnable_first_and_greys_the_moe(qtbot, browser):
    open_fixture_repo(qtbot, browser)
    assert browser.results.item(0).data(Qt.UserRole) == REPO
    moe = browser.results.item(1)
    assert "MoE" in moe.text() and moe.foreground().color().name() == "#808080"
    assert "2 GGUF repositories, 1 of them Qwen3.5/3.6 dense" in browser.status.text()


def test_files_show_sizes_quants_and_verdicts_that_follow_the_knobs(qtbot, browser):
    open_fixture_repo(qtbot, browser)
    assert browser.files.rowCount() == 4
    row = [browser.files.item(r, 0).text() for r in range(4)].index(Q8)
    assert browser.files.item(row, 1).text() == "Q8_0" and browser.files.item(row, 2).text() == "1.4 MiB"
    assert verdict_of(browser, Q8) == "fits 1 card at 32K"
    assert verdict_of(browser, "Qwen3.5-Fixture-Q4_K_M.gguf").startswith("not runnable: Q4_K_M")
    browser.context_box.setCurrentIndex(3)
    assert verdict_of(browser, Q8) == "fits 1 card at 256K (beyond its trained 32K)"
    browser.select_file("Qwen3.5-Fixture-Q8_0-00001-of-00002.gguf")
    assert not browser.download_button.isEnabled()  # a split part cannot be pulled on its own
    browser.select_file(Q8)
    assert browser.download_button.isEnabled()


def test_download_with_progress_lands_in_the_library(qtbot, browser):
    open_fixture_repo(qtbot, browser)
    browser.select_file(Q8)
    with qtbot.waitSignal(browser.downloaded, timeout=30_000) as got:
        browser.download()
    path = Path(got.args[0])
    assert path.read_bytes() == (TRAINED / "fixture-q8_0.gguf").read_bytes()
    assert "downloaded Qwen3.5-Fixture-Q8_0.gguf" in browser.progress_label.text()
    assert browser.progress.value() == 1000 and not browser.cancel_button.isEnabled()
    [entry] = browser.library.entries()
    assert entry.path == path and entry.quant == "Q8_0"


def test_an_unreachable_hub_is_said_plainly(qtbot, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    page = ModelBrowser(Library(tmp_path / "models"), [], HubTasks(HubAccess(f"http://127.0.0.1:{port}")))
    qtbot.addWidget(page)
    page.search()
    qtbot.waitUntil(lambda: "unreachable" in page.status.text(), timeout=20_000)
    assert "library still open" in page.status.text()


def test_the_library_opens_a_model_in_the_loading_sheet_and_deletes(qtbot, hub, bare_window, tmp_path):
    from engine.hub.pull import pull

    models = tmp_path / "library"
    bare_window.settings = replace(bare_window.settings, models_dir=str(models))
    done = pull(REPO, Library(models), HubAccess(hub.endpoint))
    page = library_pages.open_model_library(bare_window)
    qtbot.addWidget(page)
    assert page.table.rowCount() == 1
    cells = [page.table.item(0, c).text() for c in range(5)]
    assert cells == [f"{REPO}/{Q8}", "Q8_0", "1.4 MiB", "no", "never"]
    page.table.selectRow(0)
    page.open_selected()
    assert page.table.item(0, 4).text() != "never"  # last used: now
    sheet = next(w for w in bare_window.findChildren(type(bare_window.open_load_sheet())) if w.path_edit.text())
    assert sheet.path_edit.text() == str(done.model)
    qtbot.waitUntil(lambda: sheet.inspected is not None and sheet.inspected.path == done.model, timeout=30_000)
    sheet.close()
    quiet = ModelLibrary(Library(models), confirm=False)
    qtbot.addWidget(quiet)
    quiet.table.selectRow(0)
    quiet.delete_selected()
    assert quiet.table.rowCount() == 0 and not done.model.exists()
