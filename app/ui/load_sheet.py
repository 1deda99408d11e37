"""The "Load model" sheet: file, cards, context and KV format with a live per-card budget, then
staged per-card progress with a Cancel that frees the cards, and the engine's own error on failure.

Inspecting a file (validation + footprint) runs on a short-lived thread, loading on the loader's
QThread; the sheet only reacts to their signals. For a remote rig the file is a path on the rig, the
rig inspects it (`GET /admin/inspect`) and the remote loader loads it there; the cards, the planner
and the budget shown are the same code as for a local load.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (QComboBox, QDialog, QFileDialog, QGridLayout, QGroupBox, QHBoxLayout, QInputDialog,
                               QLabel, QLineEdit, QListWidget, QListWidgetItem, QPlainTextEdit, QProgressBar, QPushButton,
                               QSizePolicy, QSlider, QSpinBox, QVBoxLayout, QWidget)

from engine.backends import BACKEND_CHOICES
from engine.model.kv_formats import CODECS_BY_BITS, kv_format, kv_format_for_bits
from engine.model.load_progress import LoadProgress
from engine.model.memory_plan import format_bytes
from engine.model.model_footprint import Footprint, footprint_of
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.vision.mmproj_pairing import paired_vision_config
from engine.telemetry import CardSample
from engine.vision.device_footprint import with_tower

from app.budget import (CONTEXT_STEP, Budget, Fix, budget, cpu_budget, fewest_cards, max_context, profile_of,
                        read_host_memory)
from app.model_loader import LoadRequest, ModelLoader
from app.model_profiles import ModelProfiles
from app.remote_loader import RemoteModelLoader
from app.rig_client import RigLink
from app.theme import set_style, span
from app.ui.budget_bars import BudgetBars, legend

DEFAULT_CONTEXT = 32768
MB = 1_000_000


def find_mmproj(model: Path) -> Path | None:
    """A vision projector next to the model (llama.cpp's naming: `mmproj*.gguf`)."""
    found = sorted(model.parent.glob("mmproj*.gguf"))
    return found[0] if found else None


@dataclass(frozen=True)
class Inspected:
    path: PurePath | None  # None: the generated demo model; on a rig, a path on the rig
    name: str
    footprint: Footprint
    vision: str  # what the sheet says about a vision projector
    host_weight_bytes: int = 0  # the weights as the CPU reference backend holds them (fp32); 0: not known (a rig's)


def inspect_local(path: PurePath | None) -> Inspected:
    loaded = load_model(path or ensure_demo_model())
    mmproj = find_mmproj(loaded.path) if path else None
    tower = paired_vision_config(loaded.path, loaded.config.d_model) if path else None
    # a file is named by its file name, as everywhere else in the app (a converter's `general.name` can be a
    # folder's, e.g. "Hf"); the generated demo model by the name that says what it is
    name = loaded.path.stem if path else loaded.file.fields.get("general.name", loaded.path.stem)
    fp32 = 4 * sum(t.n_elements for t in loaded.file.tensors.values())
    return Inspected(path, name, with_tower(footprint_of(loaded), tower), mmproj.name if mmproj else "none found", fp32)


def rig_inspector(link: RigLink) -> Callable[[PurePath | None], Inspected]:
    """Inspection by the rig itself: the file stays there, only its footprint comes over."""

    def inspect(path: PurePath | None) -> Inspected:
        client = link.client()
        try:
            _where, name, footprint = client.inspect(None if path is None else str(path))
        finally:
            client.close()
        return Inspected(path, name, footprint, f"not checked (the file is on rig {link.name})")

    return inspect


class _Inspector(QObject):
    """Validates a file and prices it off the GUI thread."""

    done = Signal(object)  # Inspected
    failed = Signal(object, str)  # the path inspected, the message

    def __init__(self, inspect: Callable[[PurePath | None], Inspected]):
        super().__init__()
        self._inspect = inspect

    def inspect(self, path: PurePath | None) -> None:
        def work() -> None:
            try:
                self.done.emit(self._inspect(path))
            except Exception as err:  # the sheet shows the validator's (or the rig's) message
                self.failed.emit(path, str(err))

        threading.Thread(target=work, name="rigllm-inspect", daemon=True).start()


class _ProgressRow:
    """One card's load progress: stage, bytes, speed and ETA as the engine measured them."""

    def __init__(self, grid: QGridLayout, row: int, name: str):
        self.name = QLabel(name)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.detail = QLabel()
        grid.addWidget(self.name, row, 0)
        grid.addWidget(self.bar, row, 1)
        grid.addWidget(self.detail, row, 2)

    def update(self, p: LoadProgress) -> None:
        self.bar.setValue(int(1000 * p.done_bytes / max(p.total_bytes, 1)))
        speed = f" · {p.bytes_per_second / MB:.1f} MB/s" if p.bytes_per_second > 0 else ""
        eta = f" · ETA {p.eta_seconds:.0f} s" if p.eta_seconds and p.done_bytes < p.total_bytes else ""
        self.detail.setText(f"{p.stage} · {p.done_bytes / MB:.0f}/{p.total_bytes / MB:.0f} MB{speed}{eta}")


class LoadSheet(QDialog):
    """Closes itself when the model is loaded; the main window takes the engine from the loader.

    With `rig` set, the model is chosen, inspected and loaded on that rig, and `cards` are the rig's.
    """

    def __init__(self, cards: list[CardSample], loader: ModelLoader | RemoteModelLoader, gpu_note: str | None = None,
                 parent: QWidget | None = None, rig: RigLink | None = None, profiles: ModelProfiles | None = None):
        super().__init__(parent)
        self.profiles = profiles
        self.cards_by_user = False  # the user ticked cards (or a profile did): no more automatic choice
        self.setWindowTitle("Load model" if rig is None else f"Load model on rig {rig.name}")
        self.cards = cards
        self.loader = loader
        self.rig = rig
        self.inspected: Inspected | None = None
        self.current: Budget | None = None
        self.rows: dict[int, _ProgressRow] = {}
        self._inspector = _Inspector(inspect_local if rig is None else rig_inspector(rig))
        self._chosen: PurePath | None = None  # the file the latest choice asked for
        self._inspector.done.connect(self._inspected)
        self._inspector.failed.connect(self._inspect_failed)
        layout = QVBoxLayout(self)

        file_row = QHBoxLayout()
        self.path_edit = QLineEdit(placeholderText="the generated demo model (random weights)")
        self.path_edit.setReadOnly(True)
        browse = QPushButton("Choose GGUF..." if rig is None else "GGUF path on the rig...")
        browse.clicked.connect(self._browse)
        demo = QPushButton("Demo model")
        demo.clicked.connect(lambda: self.choose(None))
        file_row.addWidget(QLabel("Model:"))
        file_row.addWidget(self.path_edit, 1)
        file_row.addWidget(browse)
        file_row.addWidget(demo)
        layout.addLayout(file_row)
        self.model_label = QLabel("reading the model...")
        self.model_label.setWordWrap(True)
        layout.addWidget(self.model_label)

        columns = QHBoxLayout()
        knobs = QGroupBox("Settings")
        form = QVBoxLayout(knobs)
        form.addWidget(QLabel("Backend:"))
        self.backend = QComboBox()
        self.backend.addItems(BACKEND_CHOICES)
        self.backend.currentIndexChanged.connect(lambda _i: self.recompute())
        form.addWidget(self.backend)
        form.addWidget(QLabel("Cards (PCI bus order):"))
        self.card_list = QListWidget()
        for card in cards:
            item = QListWidgetItem(f"card {card.index} · {card.name.removeprefix('NVIDIA ')} · "
                                   f"{format_bytes(card.memory_free)} free")
            item.setToolTip(f"{card.name}\nPCI {card.pci_bus_id}\n{card.uuid}\n"
                            f"{format_bytes(card.memory_used)} used by other processes")
            item.setFlags(item.flags() | Qt.ItemIsUserCheckable)
            item.setCheckState(Qt.Checked)
            self.card_list.addItem(item)
        self.card_list.itemChanged.connect(self._cards_ticked)
        form.addWidget(self.card_list)
        self.card_reason = QLabel()
        self.card_reason.setWordWrap(True)
        self.card_reason.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        set_style(self.card_reason, "muted")
        form.addWidget(self.card_reason)
        if not cards:
            note = QLabel(gpu_note or "no NVIDIA GPU found")
            note.setWordWrap(True)
            form.addWidget(note)
            self.card_list.setVisible(False)
        form.addWidget(QLabel("Context length (tokens):"))
        ctx_row = QHBoxLayout()
        self.context_slider = QSlider(Qt.Horizontal)
        self.context_slider.setMinimum(1)
        self.context_spin = QSpinBox(minimum=CONTEXT_STEP, singleStep=CONTEXT_STEP)
        self.context_spin.setMaximum(CONTEXT_STEP)
        self.context_slider.valueChanged.connect(lambda v: self.context_spin.setValue(v * CONTEXT_STEP))
        self.context_spin.valueChanged.connect(self._context_changed)
        self.fit_button = QPushButton("Fit max")
        self.fit_button.setToolTip("The longest context that fits the chosen cards")
        self.fit_button.clicked.connect(self.fit_max)
        ctx_row.addWidget(self.context_slider, 1)
        ctx_row.addWidget(self.context_spin)
        ctx_row.addWidget(self.fit_button)
        form.addLayout(ctx_row)
        form.addWidget(QLabel("KV cache bits (keys / values):"))
        kv_row = QHBoxLayout()
        self.k_bits, self.v_bits = QComboBox(), QComboBox()
        for label, box in (("K", self.k_bits), ("V", self.v_bits)):
            for bits in CODECS_BY_BITS:
                box.addItem(f"{bits}-bit", bits)
            box.currentIndexChanged.connect(lambda _i: self._setting_changed())
            kv_row.addWidget(QLabel(label))
            kv_row.addWidget(box)
        self.kv_hint = QLabel()
        self.kv_hint.setWordWrap(True)
        self.kv_hint.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # its text never widens the sheet
        set_style(self.kv_hint, "muted")
        kv_row.addWidget(self.kv_hint, 1)
        form.addLayout(kv_row)
        form.addWidget(QLabel("Layers per card:"))
        self.split_edit = QLineEdit(placeholderText="automatic (by free memory and layer cost)")
        self.split_edit.setToolTip("Layer counts for the checked cards in order, e.g. 22,22,20; the bars check it")
        self.split_edit.textChanged.connect(lambda _t: self.recompute())
        form.addWidget(self.split_edit)
        form.addStretch(1)
        columns.addWidget(knobs, 3)

        right = QGroupBox("Memory per card")
        budget_box = QVBoxLayout(right)
        self.bars = BudgetBars()
        budget_box.addWidget(self.bars)
        budget_box.addWidget(legend())
        self.verdict = QLabel()
        self.verdict.setWordWrap(True)
        budget_box.addWidget(self.verdict)
        self.fix_row = QHBoxLayout()
        budget_box.addLayout(self.fix_row)
        self.notes = QLabel()
        self.notes.setWordWrap(True)
        set_style(self.notes, "muted")
        budget_box.addWidget(self.notes)
        budget_box.addStretch(1)
        columns.addWidget(right, 4)
        layout.addLayout(columns, 1)

        self.progress_box = QGroupBox("Loading")
        self.progress_grid = QGridLayout(self.progress_box)
        self.stage_label = QLabel()
        self.progress_grid.addWidget(self.stage_label, 0, 0, 1, 3)
        self.progress_box.setVisible(False)
        layout.addWidget(self.progress_box)
        self.error_text = QPlainTextEdit()
        self.error_text.setReadOnly(True)
        self.error_text.setMaximumHeight(90)
        self.error_text.setVisible(False)
        layout.addWidget(self.error_text)

        buttons = QHBoxLayout()
        buttons.addStretch(1)
        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
        self.load_button.clicked.connect(lambda: self.start_load(anyway=False))
        self.anyway_button = QPushButton("Load anyway")
        self.anyway_button.setToolTip("The plan says it does not fit: loading may fail with out-of-memory")
        self.anyway_button.clicked.connect(lambda: self.start_load(anyway=True))
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        for b in (self.load_button, self.anyway_button, self.cancel_button):
            buttons.addWidget(b)
        layout.addLayout(buttons)

        loader.stage.connect(self._stage)
        loader.progress.connect(self._progress)
        loader.loaded.connect(self._loaded)
        loader.failed.connect(self._failed)
        loader.cancelled.connect(self._cancelled)
        self.loading = False
        self.resize(980, 620)
        self.choose(None)

    # model choice

    def _browse(self) -> None:
        if self.rig is not None:  # the rig's disk is not browsable from here: its path is typed
            path, ok = QInputDialog.getText(self, "Model on the rig", f"Path of a GGUF file on rig {self.rig.name}:")
            if ok and path.strip():
                self.choose(PurePosixPath(path.strip()))
            return
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", "", "GGUF models (*.gguf)")
        if path:
            self.choose(Path(path))

    def choose(self, path: PurePath | None) -> None:
        self.path_edit.setText("" if path is None else str(path))
        self.model_label.setText("reading the model...")
        self.load_button.setEnabled(False)
        self._chosen = path
        self._inspector.inspect(path)

    def _inspected(self, result: Inspected) -> None:
        if result.path == self._chosen:  # a slower inspection of an earlier choice must not replace this one
            self.show_model(result)

    def show_model(self, result: Inspected) -> None:
        """Price `result` on the cards (the inspector calls it; the screenshot script passes a 27B shape)."""
        self.inspected = result
        cfg = result.footprint.config
        demo = " · demo model, random weights: output is gibberish" if result.path is None else ""
        where = f" · on rig {self.rig.name}" if self.rig is not None else ""
        self.model_label.setText(
            f"<b>{result.name}</b>{demo}{where} · {cfg.n_layers} layers · "
            f"file {format_bytes(result.footprint.file_bytes)} · trained context {cfg.context_length} · "
            f"vision projector: {result.vision}")
        steps = max(1, cfg.context_length // CONTEXT_STEP)
        longest = cfg.context_length if cfg.context_length < CONTEXT_STEP else steps * CONTEXT_STEP
        self.context_slider.setMaximum(steps)
        self.context_spin.blockSignals(True)
        self.context_spin.setRange(min(CONTEXT_STEP, longest), longest)  # a small model's whole trained length
        self.context_spin.setValue(min(DEFAULT_CONTEXT, longest))
        self.context_spin.blockSignals(False)
        self._context_changed(self.context_spin.value())
        if not self._restore_profile(result):
            self.cards_by_user = False
            self._pick_cards()
        self.recompute()

    def _restore_profile(self, result: Inspected) -> bool:
        """Set the sheet as this model was last loaded (its profile); False when it has none."""
        profile = self.profiles.get(str(result.path)) if self.profiles is not None and result.path else None
        if profile is None:
            return False
        self.backend.setCurrentText(profile.backend)
        if profile.context:
            self.context_spin.setValue(min(profile.context, self.context_spin.maximum()))
        self.set_kv(profile.kv_format)
        if all(0 <= i < len(self.cards) for i in profile.cards):
            self._check_cards(list(profile.cards))
            self.card_reason.setText("as this model was last loaded")
            self.cards_by_user = True
        self.split_edit.setText(",".join(map(str, profile.split)) if profile.split else "")
        return True

    def _check_cards(self, chosen: list[int]) -> None:
        self.card_list.blockSignals(True)
        for i in range(self.card_list.count()):
            self.card_list.item(i).setCheckState(Qt.Checked if i in chosen else Qt.Unchecked)
        self.card_list.blockSignals(False)

    def _pick_cards(self) -> None:
        """Tick the fewest cards that hold the model at the chosen context and KV, and say why."""
        if self.inspected is None or not self.cards or self.cards_by_user:
            return
        chosen, reason = fewest_cards(self.inspected.footprint, self.cards, self.context, self.kv_name)
        self._check_cards(chosen)
        self.card_reason.setText(reason)

    def _cards_ticked(self, _item) -> None:
        self.cards_by_user = True
        self.card_reason.setText("")
        self.recompute()

    def _setting_changed(self) -> None:
        self._pick_cards()
        self.recompute()

    def _inspect_failed(self, path: PurePath | None, message: str) -> None:
        if path != self._chosen:
            return
        self.inspected = None
        self.model_label.setText(span(message, "error"))
        self.load_button.setEnabled(False)
        self.anyway_button.setEnabled(False)

    # budget

    def chosen_cards(self) -> list[int]:
        return [i for i in range(self.card_list.count()) if self.card_list.item(i).checkState() == Qt.Checked]

    @property
    def context(self) -> int:
        return self.context_spin.value()

    @property
    def split(self) -> tuple[int, ...] | None:
        """The typed layer counts; None when the field is empty (automatic). Text that is not a list of
        whole numbers counts as a split of no cards, which the budget reports."""
        text = self.split_edit.text().strip()
        if not text:
            return None
        try:
            return tuple(int(part) for part in text.replace(" ", ",").split(",") if part)
        except ValueError:
            return ()

    @property
    def kv_name(self) -> str:
        return kv_format_for_bits(self.k_bits.currentData(), self.v_bits.currentData()).name

    def set_kv(self, name: str) -> None:
        fmt = kv_format(name)
        self.k_bits.blockSignals(True)
        self.k_bits.setCurrentIndex(self.k_bits.findData(fmt.k.bits))
        self.k_bits.blockSignals(False)
        self.v_bits.setCurrentIndex(self.v_bits.findData(fmt.v.bits))
        self.recompute()

    def _context_changed(self, value: int) -> None:
        self.context_slider.blockSignals(True)
        self.context_slider.setValue(value // CONTEXT_STEP)
        self.context_slider.blockSignals(False)
        self._setting_changed()

    def priced_backend(self) -> str:
        """The backend that will run the model: the CUDA one on chosen cards unless the reference is picked."""
        return "reference" if self.backend.currentText() == "reference" or not self.chosen_cards() else "cuda"

    def recompute(self) -> None:
        if self.inspected is None:
            return
        if not self.chosen_cards() and self.inspected.host_weight_bytes:
            result = cpu_budget(self.inspected.footprint, self.inspected.host_weight_bytes, read_host_memory(),
                                self.context, self.kv_name)
        else:
            result = budget(self.inspected.footprint, self.cards, self.chosen_cards(), self.context, self.kv_name,
                            self.split, self.priced_backend())
        self.current = result
        self.kv_hint.setText(kv_format(self.kv_name).description)
        self.bars.show_cards(result.cards)
        self.verdict.setText(span(result.summary, "ok" if result.fits else "error", bold=True))
        while self.fix_row.count():
            self.fix_row.takeAt(0).widget().deleteLater()
        for fix in result.fixes:
            button = QPushButton(fix.label)
            button.clicked.connect(lambda _=False, f=fix: self.apply_fix(f))
            self.fix_row.addWidget(button)
        notes = list(result.plan.notes) if result.plan else []
        self.notes.setText("\n".join(notes))
        self.load_button.setEnabled(result.fits and not self.loading)
        self.anyway_button.setVisible(not result.fits)
        self.anyway_button.setEnabled(bool(result.cards) and not self.loading)

    def apply_fix(self, fix: Fix) -> None:
        if fix.kv is not None:
            self.set_kv(fix.kv)
        if fix.context is not None:
            self.context_spin.setValue(fix.context)
        if fix.add_card is not None:
            self.card_list.item(fix.add_card).setCheckState(Qt.Checked)  # the user's choice from here on

    def fit_max(self) -> None:
        if self.inspected is None:
            return
        chosen = [profile_of(self.cards[i]) for i in self.chosen_cards()]
        limit = self.context_spin.maximum()
        longest = max_context(self.inspected.footprint, chosen, self.kv_name, limit, self.split) if chosen else limit
        if longest:
            self.context_spin.setValue(longest)

    # loading

    def start_load(self, anyway: bool) -> None:
        if self.inspected is None or self.loading or (not anyway and not (self.current and self.current.fits)):
            return
        self.loading = True
        self.error_text.setVisible(False)
        for row in self.rows.values():
            for w in (row.name, row.bar, row.detail):
                w.deleteLater()
        self.rows = {}
        self.progress_box.setVisible(True)
        self.load_button.setEnabled(False)
        self.anyway_button.setEnabled(False)
        self.cancel_button.setText("Cancel loading")
        self.loader.load(self.request())

    def request(self) -> LoadRequest:
        assert self.inspected is not None
        return LoadRequest(self.inspected.path, self.backend.currentText(), self.context, self.kv_name,
                           tuple(self.chosen_cards()), self.split)

    def cancel(self) -> None:
        if self.loading:
            self.stage_label.setText("cancelling: freeing the cards...")
            self.loader.cancel()
        else:
            self.reject()

    def _stage(self, text: str) -> None:
        self.stage_label.setText(text)

    def _progress(self, p: LoadProgress) -> None:
        if p.card not in self.rows:
            self.rows[p.card] = _ProgressRow(self.progress_grid, len(self.rows) + 1, self._where(p.card))
        self.rows[p.card].update(p)
        self.stage_label.setText(f"{self._where(p.card)}: {p.stage}")

    def _where(self, card: int) -> str:
        return f"card {card}" if self.chosen_cards() else "CPU (reference backend)"

    def _finish_loading(self) -> None:
        self.loading = False
        self.cancel_button.setText("Close")
        self.recompute()

    def done(self, result: int) -> None:
        if self.loading:  # closing the sheet mid-load cancels the load
            self.loader.cancel()
        for signal, slot in ((self.loader.stage, self._stage), (self.loader.progress, self._progress),
                             (self.loader.loaded, self._loaded), (self.loader.failed, self._failed),
                             (self.loader.cancelled, self._cancelled)):
            signal.disconnect(slot)
        super().done(result)

    def _loaded(self, _engine: object) -> None:
        self._finish_loading()
        self.stage_label.setText("ready")
        self.accept()

    def _failed(self, message: str) -> None:
        self._finish_loading()
        self.stage_label.setText("the load failed")
        self.error_text.setPlainText(message)
        self.error_text.setVisible(True)

    def _cancelled(self) -> None:
        self._finish_loading()
        self.stage_label.setText("cancelled: the cards were freed")
