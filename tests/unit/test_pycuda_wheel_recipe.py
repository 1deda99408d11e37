"""The pieces of packaging/pycuda-wheel (pycuda without a CUDA toolkit) and how rigllm's gpu extra names it.

The whole build (a fresh venv, `pip install -e ".[gpu]"`, nvcc hidden) is tests/unit/test_pycuda_wheel_build.py,
which downloads and compiles for minutes and so runs only on request.
"""

from __future__ import annotations

import runpy
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "packaging" / "pycuda-wheel"
sys.path.insert(0, str(RECIPE))

import build_toolchain  # noqa: E402
import libcuda_stub  # noqa: E402
import pycuda_from_wheels  # noqa: E402

needs_cc = pytest.mark.skipif(shutil.which(build_toolchain.compiler("CC")[0]) is None, reason="no C compiler here")

FAKE_CUDA_H = """
#define CUDAAPI
typedef int CUresult;
typedef void (*CUhostFn)(void *userData);
#define cuMemAlloc cuMemAlloc_v2
CUresult CUDAAPI cuInit(unsigned int flags);
CUresult CUDAAPI cuMemAlloc(unsigned long long *dptr, unsigned long bytesize);
CUresult CUDAAPI cuLaunchHostFunc(void *stream, CUhostFn fn, void *userData);
"""


def _fake_headers(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cuda.h").write_text(FAKE_CUDA_H)
    (folder / "cudaProfiler.h").write_text("int cuProfilerStart(void);\n")
    return folder


@needs_cc
def test_stub_defines_the_names_the_header_macros_produce_under_soname_libcuda_so_1(tmp_path):
    headers = _fake_headers(tmp_path / "include")
    cc = build_toolchain.compiler("CC")
    assert libcuda_stub.driver_api_names(cc, [headers], tmp_path) == [
        "cuInit", "cuLaunchHostFunc", "cuMemAlloc_v2", "cuProfilerStart"]
    stub_dir, count = libcuda_stub.build_stub(cc, [headers], tmp_path / "stub")
    assert count == 4
    elf = (stub_dir / "libcuda.so").read_bytes()
    assert b"libcuda.so.1\x00" in elf  # the SONAME the extension will record as NEEDED
    # In a child process: once loaded, the stub would answer every later dlopen("libcuda.so.1") here.
    probe = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
             "print(lib.cuMemAlloc_v2(), hasattr(lib, 'cuMemAlloc'))")
    result = subprocess.run([sys.executable, "-c", probe, str(stub_dir / "libcuda.so")],
                            capture_output=True, text=True, check=True)
    # every stub function returns CUDA_ERROR_STUB_LIBRARY; the macro's target is the name objects reference
    assert result.stdout.split() == [str(libcuda_stub.STUB_LIBRARY_ERROR), "False"]


@needs_cc
def test_stub_refuses_headers_without_driver_api_declarations(tmp_path):
    empty = tmp_path / "include"
    empty.mkdir()
    (empty / "cuda.h").write_text("/* nothing */\n")
    (empty / "cudaProfiler.h").write_text("\n")
    with pytest.raises(RuntimeError, match="no driver API declarations"):
        libcuda_stub.driver_api_names(build_toolchain.compiler("CC"), [empty], tmp_path)


def test_a_missing_compiler_is_named_with_its_package(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/rigllm-cc")
    with pytest.raises(build_toolchain.BuildError, match="no C compiler.*build-essential"):
        build_toolchain.check_toolchain([], tmp_path)


def test_missing_python_headers_are_named_with_their_package(tmp_path, monkeypatch):
    monkeypatch.setattr(build_toolchain, "python_include_dir", lambda: tmp_path / "no-include")
    if shutil.which(build_toolchain.compiler("CC")[0]) is None or shutil.which(build_toolchain.compiler("CXX")[0]) is None:
        pytest.skip("no C/C++ compiler here")
    with pytest.raises(build_toolchain.BuildError, match="Python headers are missing.*python3-dev"):
        build_toolchain.check_toolchain([], tmp_path)


@needs_cc
def test_a_compiler_without_cuda_headers_fails_the_probe_with_its_output(tmp_path):
    if not (build_toolchain.python_include_dir() / "Python.h").is_file():
        pytest.skip("no Python headers here")
    with pytest.raises(build_toolchain.BuildError, match="cuda.h"):
        build_toolchain.check_toolchain([tmp_path], tmp_path)


def test_siteconf_names_every_option_and_no_toolkit(tmp_path):
    conf = pycuda_from_wheels.siteconf([tmp_path / "inc"], tmp_path / "stub")
    # pycuda 2026.1's setup.get_config_schema() options (aksetup reads siteconf.py last: these win over
    # ~/.aksetup-defaults.py, /etc/aksetup-defaults.py and the CUDA_ROOT derived from nvcc on PATH)
    assert sorted(conf) == sorted([
        "BOOST_COMPILER", "BOOST_INC_DIR", "BOOST_LIB_DIR", "BOOST_PYTHON_LIBNAME", "BOOST_THREAD_LIBNAME",
        "CUDADRV_LIBNAME", "CUDADRV_LIB_DIR", "CUDART_LIBNAME", "CUDART_LIB_DIR", "CUDA_ENABLE_CURAND",
        "CUDA_ENABLE_GL", "CUDA_INC_DIR", "CUDA_PRETEND_VERSION", "CUDA_ROOT", "CUDA_TRACE", "CURAND_LIBNAME",
        "CURAND_LIB_DIR", "CXXFLAGS", "LDFLAGS", "USE_SHIPPED_BOOST"])
    assert conf["CUDA_ROOT"] is None and conf["CUDADRV_LIB_DIR"] == [str(tmp_path / "stub")]
    assert conf["CUDA_INC_DIR"] == [str(tmp_path / "inc")] and conf["CUDA_ENABLE_CURAND"] is False
    pycuda_from_wheels.write_siteconf(tmp_path, [tmp_path / "inc"], tmp_path / "stub")
    values: dict = {}
    exec((tmp_path / "siteconf.py").read_text(), values)
    assert {k: values[k] for k in conf} == conf


def test_missing_header_wheels_are_named(monkeypatch):
    monkeypatch.setattr(sys, "path", ["/nonexistent"])
    with pytest.raises(build_toolchain.BuildError, match="nvidia-cuda-runtime-cu12"):
        pycuda_from_wheels.header_dirs()


def test_the_header_wheels_match_the_kernels_extra():
    """cuda.h comes from the same CUDA 12.9 runtime wheel the NVRTC build uses."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["rigllm"]["optional-dependencies"]
    assert pycuda_from_wheels.HEADER_WHEELS[0][0] in table["kernels"]


def test_the_gpu_extra_names_the_recipe_folder_by_absolute_url(monkeypatch):
    """setup.py fills in {root:uri}: pip takes a folder as a dependency only as an absolute file: URL."""
    monkeypatch.setattr(setuptools, "setup", lambda **_kw: None)
    extras = runpy.run_path(str(ROOT / "setup.py"))["extras"]()
    assert f"pycuda @ {RECIPE.as_uri()}" in extras["gpu"]
    assert (RECIPE / "pyproject.toml").is_file()
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["rigllm"]["optional-dependencies"]
    assert {k: v for k, v in extras.items() if k != "gpu"} == {k: v for k, v in table.items() if k != "gpu"}


def test_the_sdist_download_does_not_inherit_the_outer_pips_hook_variables(tmp_path, monkeypatch):
    """pip 26 runs this backend with _PYPROJECT_HOOKS_BACKEND_PATH_JSON naming the recipe folder; a nested
    pip that inherits it looks for setuptools' backend there and fails (seen on Python 3.12)."""
    seen = {}

    def fake_run(cmd, check, env):
        seen.update(cmd=cmd, env=env)

    monkeypatch.setenv("_PYPROJECT_HOOKS_BACKEND_PATH_JSON", '["/somewhere/pycuda-wheel"]')
    monkeypatch.setenv("_PYPROJECT_HOOKS_BUILD_BACKEND", "pycuda_from_wheels")
    monkeypatch.setenv("PEP517_BACKEND_PATH", "/somewhere/pycuda-wheel")
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    monkeypatch.setattr(pycuda_from_wheels.subprocess, "run", fake_run)
    pycuda_from_wheels.fetch_sdist(tmp_path / "sdist")
    assert seen["cmd"][1:4] == ["-m", "pip", "download"]
    assert not [k for k in seen["env"] if "PYPROJECT_HOOKS" in k or k.startswith("PEP517_")]
    assert seen["env"]["PIP_INDEX_URL"] == "https://mirror.example/simple"  # the user's pip settings still apply
