"""rigllm doctor's desktop check: Qt's xcb plugin's missing libraries become one apt-get line.

Made-up PySide6 folders and ldd outputs cover each case; the real check on this machine is compared
with the dynamic linker itself (loading the plugin in a child process succeeds exactly when no
library is reported missing).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.diagnostics.findings import WARNING
from engine.diagnostics.qt_platform import (SONAME_PACKAGES, XCB_PLUGIN, apt_install_line, desktop_check,
                                            missing_libraries, pyside6_dir)

# Trimmed from `ldd .../PySide6/Qt/plugins/platforms/libqxcb.so` on Debian 12 without libxcb-icccm4/-keysyms1
# (ldd lists a library once per library that needs it).
LDD_TWO_MISSING = """\
\tlinux-vdso.so.1 (0x00007ff8693a0000)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007ff869000000)
\tlibxcb-cursor.so.0 => /lib/x86_64-linux-gnu/libxcb-cursor.so.0 (0x00007ff8691e8000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-icccm.so.4 => not found
\tlibEGL.so.1 => /lib/x86_64-linux-gnu/libEGL.so.1 (0x00007ff869111000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007ff8693a2000)
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the xcb check is Linux-only")


def fake_pyside(tmp_path: Path, with_plugin: bool = True) -> Path:
    folder = tmp_path / "PySide6"
    plugin = folder / XCB_PLUGIN
    plugin.parent.mkdir(parents=True)
    if with_plugin:
        plugin.write_bytes(b"\x7fELF")
    return folder


def test_missing_libraries_are_parsed_once_each_in_ldd_order():
    assert missing_libraries(LDD_TWO_MISSING) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    assert missing_libraries("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n") == []


def test_two_missing_libraries_give_the_exact_apt_line(tmp_path):
    folder = fake_pyside(tmp_path)
    seen = []
    check = desktop_check(lambda: folder, lambda plugin: seen.append(plugin) or LDD_TWO_MISSING)
    assert seen == [folder / XCB_PLUGIN]
    assert [(p.severity, p.fix) for p in check.problems] == [
        (WARNING, "sudo apt-get install libxcb-icccm4 libxcb-keysyms1")]
    assert check.data["missing"] == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    assert check.data["packages"] == ["libxcb-icccm4", "libxcb-keysyms1"]


def test_an_unknown_library_is_named_with_how_to_find_its_package(tmp_path):
    folder = fake_pyside(tmp_path)
    ldd = "\tlibxcb-icccm.so.4 => not found\n\tlibfancy.so.9 => not found\n"
    check = desktop_check(lambda: folder, lambda plugin: ldd)
    fixes = [p.fix for p in check.problems]
    assert fixes[0] == "sudo apt-get install libxcb-icccm4"
    assert "libfancy.so.9" in check.problems[1].what and "apt-file search" in fixes[1]


def test_all_libraries_found_is_no_problem(tmp_path):
    folder = fake_pyside(tmp_path)
    check = desktop_check(lambda: folder, lambda plugin: "\tlibc.so.6 => /lib/libc.so.6 (0x1)\n")
    assert check.problems == [] and "finds all its libraries" in check.summary


def test_without_pyside6_there_is_nothing_to_fix():
    check = desktop_check(lambda: None, lambda plugin: pytest.fail("ldd must not run"))
    assert check.problems == [] and "not installed" in check.summary


def test_a_pyside6_without_the_plugin_is_a_warning(tmp_path):
    folder = fake_pyside(tmp_path, with_plugin=False)
    check = desktop_check(lambda: folder, lambda plugin: pytest.fail("ldd must not run"))
    assert [p.severity for p in check.problems] == [WARNING] and "reinstall PySide6" in check.problems[0].fix


def test_apt_line_sorts_and_merges_packages():
    line, unknown = apt_install_line(["libgthread-2.0.so.0", "libglib-2.0.so.0", "libEGL.so.1"])
    assert line == "sudo apt-get install libegl1 libglib2.0-0" and unknown == []
    assert apt_install_line([]) == (None, [])


def test_the_map_covers_the_libraries_the_issue_names():
    packages = set(SONAME_PACKAGES.values())
    assert {"libxcb-icccm4", "libxcb-keysyms1", "libxcb-cursor0", "libxkbcommon-x11-0", "libxcb-xinerama0",
            "libxcb-randr0", "libxcb-render-util0", "libxcb-image0", "libxcb-shape0", "libegl1", "libgl1",
            "libfontconfig1", "libdbus-1-3"} <= packages


def test_the_real_check_agrees_with_the_dynamic_linker():
    """This machine's PySide6: the plugin loads in a child process exactly when nothing is reported missing."""
    folder = pyside6_dir()
    if folder is None:
        pytest.skip("PySide6 is not installed")
    check = desktop_check()
    plugin = folder / XCB_PLUGIN
    load = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(plugin)!r})"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (load.returncode == 0) == (check.data["missing"] == []), (check.data, load.stderr[-500:])
    if check.data["missing"]:
        assert any(name in load.stderr for name in check.data["missing"])  # the linker names one it lacks
        assert check.problems[0].fix.startswith("sudo apt-get install ")
