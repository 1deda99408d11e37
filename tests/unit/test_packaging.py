"""Packaging: the desktop entry, its installer, the icons, and (opt-in) the PyInstaller bundle's smoke test.

The bundle test builds `packaging/pyinstaller/rigllm.spec` and starts the result offscreen with
`gui --smoke-test`. It takes minutes, so it runs only with RIGLLM_PACKAGING_TEST=1 (packaging/README.md:
run before each release).
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
LINUX = ROOT / "packaging" / "linux"
DESKTOP_FILE = LINUX / "rigllm.desktop"
MIME_FILE = LINUX / "rigllm-gguf.xml"
SPEC = ROOT / "packaging" / "pyinstaller" / "rigllm.spec"
MIME_NS = "{http://www.freedesktop.org/standards/shared-mime-info}"


def _load_make_icons():
    # packaging/ is no Python package (the name would shadow PyPI's `packaging`), so load the script by path.
    spec = importlib.util.spec_from_file_location("rigllm_make_icons", ROOT / "packaging" / "make_icons.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


make_icons = _load_make_icons()


def _desktop_entry(path: Path) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # keys are case-sensitive in desktop files
    parser.read_string(path.read_text())
    return dict(parser["Desktop Entry"])


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="desktop-file-utils not installed")
def test_desktop_file_passes_desktop_file_validate():
    result = subprocess.run(["desktop-file-validate", str(DESKTOP_FILE)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_desktop_entry_launches_the_gui_under_the_apps_window_class():
    entry = _desktop_entry(DESKTOP_FILE)
    assert entry["Type"] == "Application" and entry["Terminal"] == "false"
    assert entry["Exec"] == "rigllm gui %f" and entry["TryExec"] == "rigllm"
    # One id everywhere: the file's basename, the icon name and the window class (app: setDesktopFileName).
    assert entry["Icon"] == entry["StartupWMClass"] == DESKTOP_FILE.stem == "rigllm"


def test_desktop_entry_mime_types_are_defined_by_the_shipped_mime_package():
    declared = {m for m in _desktop_entry(DESKTOP_FILE)["MimeType"].split(";") if m}
    types = ET.parse(MIME_FILE).getroot().findall(f"{MIME_NS}mime-type")
    defined = {t.get("type") for t in types}
    assert declared == defined == {"application/x-gguf"}
    globs = {g.get("pattern") for t in types for g in t.findall(f"{MIME_NS}glob")}
    magic = {m.get("value") for t in types for m in t.iter(f"{MIME_NS}match")}
    assert globs == {"*.gguf"} and magic == {"GGUF"}


def test_committed_icons_have_every_size_and_match_the_generator():
    icons = ROOT / "resources" / "icons"
    for size in make_icons.PNG_SIZES:
        path = make_icons.png_path(icons, size)
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size == (size, size) and image.mode == "RGBA", path
            fresh = make_icons.render_png(size)
            # Pillow versions may round a pixel differently; a changed drawing moves whole shapes.
            worst = np.abs(np.asarray(image, np.int16) - np.asarray(fresh, np.int16)).max()
            assert worst <= 8, f"{path} is stale: run python packaging/make_icons.py"
    assert make_icons.svg_path(icons).read_text() == make_icons.svg_text()
    svg = ET.parse(make_icons.svg_path(icons)).getroot()
    assert svg.get("viewBox") == "0 0 256 256"
    with Image.open(make_icons.ico_path(icons)) as ico:
        assert ico.info["sizes"] == {(s, s) for s in make_icons.ICO_SIZES}


def _run_script(name: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(LINUX / name), *args], env=env, capture_output=True, text=True, timeout=60)


def test_install_script_writes_an_absolute_exec_and_uninstall_removes_it(tmp_path):
    home = tmp_path / "home dir"  # a space, as in many real home folders
    exe = tmp_path / "my apps" / "rigllm"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_DATA_HOME": str(home / "share"),
           "XDG_CONFIG_HOME": str(home / "config")}
    data = home / "share"

    installed = _run_script("install-desktop-entry.sh", env, "--exec", str(exe))
    assert installed.returncode == 0, installed.stderr
    entry = _desktop_entry(data / "applications" / "rigllm.desktop")
    assert entry["Exec"] == f'"{exe}" gui %f' and entry["TryExec"] == str(exe)
    assert entry["StartupWMClass"] == "rigllm"
    for size in make_icons.PNG_SIZES:
        assert (data / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "rigllm.png").is_file()
    assert (data / "icons" / "hicolor" / "scalable" / "apps" / "rigllm.svg").is_file()
    assert (data / "mime" / "packages" / "rigllm-gguf.xml").is_file()

    removed = _run_script("uninstall-desktop-entry.sh", env)
    assert removed.returncode == 0, removed.stderr
    assert not (data / "applications" / "rigllm.desktop").exists()
    assert not list((data / "icons").rglob("rigllm.*"))
    assert not (data / "mime" / "packages" / "rigllm-gguf.xml").exists()


def test_install_script_refuses_an_executable_that_does_not_exist(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "share")}
    result = _run_script("install-desktop-entry.sh", env, "--exec", str(tmp_path / "nothing"))
    assert result.returncode == 1 and "not an executable" in result.stderr
    assert not (tmp_path / "share" / "applications").exists()


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(os.environ.get("RIGLLM_PACKAGING_TEST") != "1",
                    reason="builds the PyInstaller bundle (minutes): set RIGLLM_PACKAGING_TEST=1")
def test_bundle_builds_and_passes_its_smoke_test(tmp_path):
    pytest.importorskip("PyInstaller")
    dist, work = tmp_path / "dist", tmp_path / "work"
    build = subprocess.run([sys.executable, "-m", "PyInstaller", "--noconfirm", "--distpath", str(dist),
                            "--workpath", str(work), str(SPEC)], cwd=ROOT, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    exe = dist / "rigllm" / "rigllm"
    assert (dist / "rigllm" / "install-desktop-entry.sh").is_file()
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "RIGLLM_DATA_DIR": str(tmp_path / "data")}
    listed = subprocess.run([str(exe), "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "gui" in listed.stdout, listed.stderr  # the entry-point command came along
    smoke = subprocess.run([str(exe), "gui", "--smoke-test"], env=env, capture_output=True, text=True, timeout=600)
    assert smoke.returncode == 0 and "smoke test: complete" in smoke.stdout, smoke.stdout + smoke.stderr
