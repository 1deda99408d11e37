"""The doctor tells "pycuda missing" from "pycuda installed, NVIDIA driver missing" (a recipe-built pycuda
installs without a driver but its extension links the driver's libcuda.so.1)."""

from __future__ import annotations

import sys

import pytest

from engine.cuda import driver
from engine.diagnostics.gpu_checks import DRIVER_FIX
from engine.diagnostics.pycuda_check import BUILD_NOTE, pycuda_check

NO_LIBCUDA = "libcuda.so.1: cannot open shared object file: No such file or directory"


def test_import_failures_are_told_apart():
    missing = ModuleNotFoundError("No module named 'pycuda'", name="pycuda")
    assert driver._pycuda_import_failure(missing).startswith("pycuda is not installed")
    no_driver = driver._pycuda_import_failure(ImportError(NO_LIBCUDA))
    assert no_driver.startswith(driver.NO_DRIVER) and "libcuda.so.1" in no_driver
    dependency = ModuleNotFoundError("No module named 'pytools'", name="pytools")
    assert driver._pycuda_import_failure(dependency) == "pycuda is installed but does not load: No module named 'pytools'"


@pytest.fixture
def pycuda_without_driver(tmp_path, monkeypatch):
    """A pycuda package whose driver module fails as a recipe-built one does on a machine with no driver."""
    package = tmp_path / "pycuda"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "driver.py").write_text(f"raise ImportError({NO_LIBCUDA!r})\n")
    (package / BUILD_NOTE).write_text("built by rigllm packaging/pycuda-wheel without a CUDA toolkit\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "pycuda" or m.startswith("pycuda.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m == "pycuda" or m.startswith("pycuda.")]:
        del sys.modules[name]


def test_doctor_reports_the_missing_driver_not_a_missing_pycuda(pycuda_without_driver):
    check = pycuda_check(have_gpu=False)
    assert check.data["installed"] and check.data["driver_missing"] and check.data["built_by_rigllm"]
    assert "no NVIDIA driver" in check.summary and "not installed" not in check.summary
    assert check.details == ["built by rigllm packaging/pycuda-wheel without a CUDA toolkit"]
    assert check.problems == []  # no card either: the cards check carries that finding


def test_with_cards_the_fix_is_the_driver(pycuda_without_driver):
    check = pycuda_check(have_gpu=True)
    assert [(p.what, p.fix) for p in check.problems] == [
        ("pycuda (version unknown) is installed but the NVIDIA driver is missing", DRIVER_FIX)]


def test_a_bundles_ctypes_error_still_reads_as_no_driver(monkeypatch):
    """PyInstaller's ctypes wraps the loader's error ("Failed to load dynlib/dll ..."), keeping it as the cause."""
    from engine.diagnostics import cuda_driver

    def frozen_cdll(name):
        try:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        except OSError as cause:
            raise OSError(f"Failed to load dynlib/dll {name!r}. Most likely this dynlib/dll was not found "
                          "when the application was frozen.") from cause

    monkeypatch.setattr(cuda_driver.ctypes, "CDLL", frozen_cdll)
    assert cuda_driver.probe_driver().error == "libcuda.so.1 not found (no NVIDIA driver installed)"
