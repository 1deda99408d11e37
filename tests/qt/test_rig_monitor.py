"""Rig monitor: tiles from a fake NVML source, the no-GPU state, debounced alerts, history, polling thread."""

from __future__ import annotations

from dataclasses import replace

from conftest import Recorder
from PySide6.QtCore import QPoint, Qt

from engine.telemetry import NO_GPU, FakeSource, NvmlSource, RigSnapshot, cmp_100_210

from app.alerts import AlertRule, AlertState
from app.monitor_service import MonitorService
from app.ui.rig_monitor import RigMonitor


def test_tiles_show_every_card_in_bus_order_with_na_for_missing_metrics(qtbot, rig):
    monitor = RigMonitor()
    qtbot.addWidget(monitor)
    rig.set_card(1, hbm_temperature_c=None, power_w=None)
    monitor.set_model((0, 2))
    monitor.set_speed(21.5)
    monitor.show_snapshot(rig.read())
    assert sorted(monitor.tiles) == [0, 1, 2] and not monitor.empty.isVisibleTo(monitor)
    first, second = monitor.tiles[0].numbers.text(), monitor.tiles[1].numbers.text()
    for text in ("Gen1 x1", "16.00 GiB", "SM 1380 MHz", "passive / chassis", "°C", "250 W"):
        assert text in first
    assert "HBM temp</td><td>&nbsp;<b>n/a" in second and "n/a / 250 W" in second
    assert "21.5" in first and "tokens/s</td><td>&nbsp;<b>idle" in second  # card 1 does not hold the model
    assert "3 card(s)" in monitor.summary.text() and "tokens/J" in monitor.summary.text()
    assert "CMP 100-210" in monitor.tiles[2].title.text() and "00000000:05:00.0" in monitor.tiles[2].title.text()


def test_no_gpu_is_stated_plainly(qtbot):
    monitor = RigMonitor()
    qtbot.addWidget(monitor)
    source = NvmlSource()  # this machine has no NVIDIA driver
    snap = source.read()
    source.close()
    monitor.show_snapshot(snap)
    assert "No NVIDIA GPU found" in monitor.empty.text() and monitor.tiles == {}
    monitor.show_snapshot(RigSnapshot((), 0.0, NO_GPU))
    assert "CPU reference backend" in monitor.empty.text()


def test_alerts_fire_after_three_hot_readings_and_clear_after_three_cool_ones(qtbot, rig):
    monitor = RigMonitor()
    qtbot.addWidget(monitor)
    fired = []
    monitor.alert.connect(fired.append)
    rig.set_card(2, temperature_c=91)
    for _ in range(2):
        monitor.show_snapshot(rig.read())
    assert fired == [] and not monitor.tiles[2].alerts.text()
    monitor.show_snapshot(rig.read())
    assert fired == ["card 2: core temperature 91 over 85"]
    assert "core temperature" in monitor.tiles[2].alerts.text() and not monitor.tiles[0].alerts.text()
    rig.set_card(2, temperature_c=60)
    monitor.show_snapshot(rig.read())
    rig.set_card(2, temperature_c=91)  # one hot reading in between restarts the count
    monitor.show_snapshot(rig.read())
    rig.set_card(2, temperature_c=60)
    for _ in range(3):
        monitor.show_snapshot(rig.read())
    assert not monitor.tiles[2].alerts.text() and len(fired) == 1


def test_alert_state_skips_metrics_a_card_does_not_report():
    state = AlertState((AlertRule("hbm_temperature_c", 50, "HBM temperature", samples=1),))
    assert state.feed((replace(cmp_100_210(0), hbm_temperature_c=None),)) == []
    assert state.feed((cmp_100_210(0),)) == ["card 0: HBM temperature 60 over 50"]


def test_sparkline_keeps_a_minute_and_a_click_opens_the_longer_history(qtbot, rig):
    monitor = RigMonitor()
    qtbot.addWidget(monitor)
    for _ in range(75):
        monitor.show_snapshot(rig.read())
    tile = monitor.tiles[0]
    assert len(tile.history["utilization_percent"]) == 75
    assert len(tile.curves["utilization_percent"].getData()[1]) == 60
    opened = Recorder(tile.clicked)
    qtbot.mouseClick(tile, Qt.LeftButton, pos=QPoint(5, 5))
    assert opened.calls == [(0,)]
    history = monitor.open_history(0)
    assert history.isVisible()
    history.close()


def test_service_polls_on_its_own_thread_and_closes_the_source(qtbot):
    source = FakeSource([cmp_100_210(0)])
    service = MonitorService(source, interval_ms=20)
    snaps = Recorder(service.snapshot)
    qtbot.waitUntil(lambda: len(snaps.calls) >= 3, timeout=10_000)
    service.shutdown()
    assert source.closed and snaps.calls[0][0].cards[0].name == "NVIDIA CMP 100-210"
