"""Opening the model browser and the model library from the main window (its Model menu): the models folder
and the Hub proxy come from the settings, the cards from the latest rig reading, and a model opened from
the library goes to the loading sheet."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt

from engine.hub.library import Library
from engine.hub.session import use_proxy

from app.budget import profile_of
from app.ui.model_browser import ModelBrowser
from app.ui.model_library import ModelLibrary

if TYPE_CHECKING:
    from app.ui.main_window import MainWindow


def library_of(window: "MainWindow") -> Library:
    return Library(Path(window.settings.models_dir).expanduser())


def open_model_library(window: "MainWindow") -> ModelLibrary:
    page = ModelLibrary(library_of(window), window)
    page.setAttribute(Qt.WA_DeleteOnClose)
    page.open_model.connect(lambda path: window.open_load_sheet().choose(path))
    page.browse.connect(lambda: open_model_browser(window))
    page.folder_chosen.connect(lambda folder: window.apply_settings(replace(window.settings, models_dir=str(folder))))
    page.show()
    return page


def open_model_browser(window: "MainWindow", search: bool = True) -> ModelBrowser:
    use_proxy(window.settings.hub_proxy)
    cards = [profile_of(c) for c in window.snapshot.cards] if window.snapshot else []
    page = ModelBrowser(library_of(window), cards, parent=window)
    page.setAttribute(Qt.WA_DeleteOnClose)
    page.downloaded.connect(lambda path: window.notify(f"downloaded {Path(path).name}: open it from Model › Model library"))
    page.show()
    if search:
        page.search()
    return page
