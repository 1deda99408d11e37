"""rigllm doctor: the real probes on this machine (no GPU) and every diagnosis against made-up probes."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from engine.commands import doctor
from engine.cuda.toolkit import find_toolchains
from engine.diagnostics import run_doctor
from engine.diagnostics.cuda_driver import CudaDevice, DriverProbe, probe_driver
from engine.diagnostics.findings import ERROR, WARNING, Check, guarded, render_text
from engine.diagnostics.gpu_checks import cards_check, driver_check, merge_cards
from engine.diagnostics.host_checks import disk_check, ram_check
from engine.diagnostics.kernel_checks import kernel_check
from engine.diagnostics.nvml import NvmlCard, NvmlProbe
from engine.diagnostics.pci import PciCard, nvidia_cards
from engine.fixtures.demo_model import ensure_demo_model

GIB = 1 << 30
NO_NVML = NvmlProbe(None, (), "NVML unavailable: NVML Shared Library Not Found")
HAVE_NVRTC = bool(find_toolchains())


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    doctor.register(parser.add_subparsers())
    args = parser.parse_args(["doctor", *argv])
    return args.func(args)


def cmp_device(index: int, bus: str) -> CudaDevice:
    return CudaDevice(index, "NVIDIA CMP 100-210", (7, 0), 16 * GIB, bus)


def cmp_pci(bus: str, width: int = 1, max_width: int = 1, driver: str | None = "nvidia") -> PciCard:
    return PciCard(bus, "0x1dbe", driver, 1, width, 1, max_width)


def severities(check: Check) -> list[tuple[str, str]]:
    return [(p.severity, p.what) for p in check.problems]


def test_doctor_on_a_machine_without_gpu_reports_it_and_still_checks_the_rest(capsys):
    if probe_driver().version is not None:
        pytest.skip("this machine has an NVIDIA driver")
    status = run_cli("--json", "--model", str(ensure_demo_model()), "--read-mib", "4")
    report = json.loads(capsys.readouterr().out)
    assert status == 1 and report["ok"] is False
    names = [c["name"] for c in report["checks"]]
    assert names == ["driver", "cards", "NVRTC", "pycuda", "host RAM", "desktop", "disk"]
    assert any("no NVIDIA GPU" in p["what"] for p in report["problems"])
    assert not any("probe failed" in p["what"] for p in report["problems"])
    disk = report["checks"][-1]["data"]
    assert disk["read_bytes"] > 0 and disk["mb_per_s"] > 0
    if HAVE_NVRTC:
        build = report["checks"][2]["data"]["builds"][0]
        assert build["target"] == "compute_70" and build["ok"]
    status = run_cli()
    text = capsys.readouterr().out
    assert status == 1 and "cards" in text and "fix: " in text


def test_a_gen1_x1_cmp_rig_is_healthy_and_listed_in_bus_order(monkeypatch):
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    driver = DriverProbe((12, 9), (cmp_device(0, "0000:03:00.0"), cmp_device(1, "0000:05:00.0")), None)
    nvml = NvmlProbe("580.95.05", (NvmlCard("0000:05:00.0", "NVIDIA CMP 100-210", 16 * GIB, 300 << 20, 1, 1, 1, 1),), None)
    pci = [cmp_pci("0000:03:00.0"), cmp_pci("0000:05:00.0")]
    check = cards_check(driver, nvml, pci)
    assert check.problems == []
    assert check.details[0].startswith("card 0  0000:03:00.0  cuda:0  NVIDIA CMP 100-210  sm_70  16.00 GiB")
    assert "PCIe Gen1 x1 (max Gen1 x1), ~250 MB/s" in check.details[0]
    assert "300.0 MiB in use" in check.details[1]
    assert driver_check(driver, nvml, pci).summary == "NVIDIA 580.95.05, CUDA 12.9"


def test_card_problems_each_come_with_a_fix(monkeypatch):
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    devices = (cmp_device(0, "0000:05:00.0"), CudaDevice(1, "GeForce GTX 1080", (6, 1), 8 * GIB, "0000:03:00.0"))
    pci = [cmp_pci("0000:03:00.0", 16, 16), cmp_pci("0000:05:00.0", 4, 16), cmp_pci("0000:09:00.0", driver=None),
           cmp_pci("0000:0a:00.0")]  # 0a: the nvidia module drives it, but it is hidden from us (container)
    check = cards_check(DriverProbe((12, 9), devices, None), NO_NVML, pci)
    found = severities(check)
    assert (ERROR, "card 0 (GeForce GTX 1080) is sm_61; rigllm's kernels need sm_70 (Volta) or newer") in found
    assert (WARNING, "card 1 link runs x4 of its x16") in found
    assert any(s == WARNING and "different order" in w for s, w in found)
    assert (WARNING, "the NVIDIA driver did not take the card(s) at 0000:09:00.0") in found
    assert [line.split()[2] for line in check.details[:2]] == ["0000:03:00.0", "0000:05:00.0"]
    assert check.details[2].endswith("not visible to CUDA/NVML here: 0000:09:00.0, 0000:0a:00.0")
    assert all(p.fix for p in check.problems)


def test_cards_without_a_usable_driver():
    pci = [cmp_pci("0000:03:00.0", driver=None)]
    driver = DriverProbe(None, (), "libcuda.so.1 not found")
    check = driver_check(driver, NO_NVML, pci)
    assert check.summary.startswith("not usable") and check.problems[0].severity == ERROR
    assert "bound to: none" in check.problems[0].what
    assert [c.bus_id for c in merge_cards(driver, NO_NVML, pci)] == ["0000:03:00.0"]
    old = driver_check(DriverProbe((11, 4), (), None), NO_NVML, [])
    assert old.problems[0].severity == ERROR and "CUDA 12" in old.problems[0].what


def test_sysfs_cards_with_their_links(tmp_path):
    def device(name: str, vendor: str, cls: str, speed: str, width: str, driver: str | None) -> None:
        d = tmp_path / name
        d.mkdir()
        for key, value in (("vendor", vendor), ("class", cls), ("device", "0x1dbe"), ("current_link_speed", speed),
                           ("max_link_speed", "2.5 GT/s PCIe"), ("current_link_width", width), ("max_link_width", "1")):
            (d / key).write_text(value + "\n")
        if driver:
            (tmp_path / driver).mkdir(exist_ok=True)
            os.symlink(tmp_path / driver, d / "driver")

    device("0000:05:00.0", "0x10de", "0x030200", "2.5 GT/s PCIe", "1", "nvidia")
    device("0000:05:00.1", "0x10de", "0x040300", "2.5 GT/s PCIe", "1", None)  # the card's audio function
    device("0000:00:02.0", "0x8086", "0x030000", "8.0 GT/s PCIe", "16", "i915")
    assert nvidia_cards(tmp_path) == [PciCard("0000:05:00.0", "0x1dbe", "nvidia", 1, 1, 1, 1)]
    assert nvidia_cards(tmp_path / "missing") == []


def test_a_probe_that_raises_becomes_a_finding():
    def broken() -> Check:
        raise RuntimeError("GPU has fallen off the bus")

    check = guarded("cards", broken)
    assert check.problems[0].severity == ERROR and "GPU has fallen off the bus" in check.problems[0].what
    assert "fix: report this output" in render_text([check])


def test_missing_driver_library_is_reported_not_raised():
    probe = probe_driver("libcuda-that-does-not-exist.so")
    assert probe.version is None and probe.devices == () and "not found" in probe.error


@pytest.mark.skipif(not HAVE_NVRTC, reason="no NVRTC on this machine (install rigllm[kernels])")
def test_kernel_check_builds_for_each_card_architecture():
    check = kernel_check([70, 90, 70])
    assert [b["target"] for b in check.data["builds"]] == ["sm_70", "sm_90"]
    assert all(b["ok"] for b in check.data["builds"]) and check.problems == []


def test_kernel_check_without_any_nvrtc(monkeypatch):
    monkeypatch.setattr("engine.diagnostics.kernel_checks.find_toolchains", lambda: [])
    monkeypatch.setattr("engine.diagnostics.kernel_checks._prebuilt_modules", lambda arch: 0)
    assert severities(kernel_check([]))[0][0] == WARNING
    problems = severities(kernel_check([70]))
    assert problems[0][0] == ERROR and "no NVRTC here targets sm_70" in problems[0][1]


def test_ram_and_a_broken_model_file(tmp_path):
    assert ram_check().data["total"] > 0
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    check = disk_check(bad)
    assert check.problems[0].severity == ERROR and "not a GGUF file" in check.problems[0].what
    missing = disk_check(tmp_path / "missing.gguf")
    assert "no such file" in missing.problems[0].what


def test_run_doctor_never_raises_when_every_probe_breaks(monkeypatch):
    def boom(*_a, **_k):
        raise OSError("simulated")

    for name in ("probe_driver", "probe_nvml", "nvidia_cards", "ram_check", "kernel_check", "pycuda_check",
                 "desktop_check"):
        monkeypatch.setattr(f"engine.diagnostics.{name}", boom)
    checks = run_doctor()
    assert [c.name for c in checks] == ["driver", "cards", "NVRTC", "pycuda", "host RAM", "desktop"]
    assert sum("probe failed" in p.what for c in checks for p in c.problems) == 4
