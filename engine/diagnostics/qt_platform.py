"""The doctor's desktop check: can Qt's xcb platform plugin load, i.e. does every library it links resolve?

On Debian/Ubuntu under X, PySide6's wheel brings Qt but not the system's xcb helper libraries; a missing
one aborts `rigllm gui` at start with a hint that names another library (libxcb-cursor0, often present)
rather than the missing ones (libxcb-icccm4, libxcb-keysyms1 on a stock Debian 12). So this check asks
the dynamic linker about PySide6's `libqxcb.so` with `ldd` (every library it and its dependencies need,
transitively) and turns each missing one into the Debian/Ubuntu package that ships it. engine/ never
imports Qt: PySide6 is located with importlib without importing it, and ldd runs in a subprocess.

A missing library is a warning, not an error: a headless rig (`rigllm serve`) never loads the plugin.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from engine.diagnostics.findings import WARNING, Check

XCB_PLUGIN = Path("Qt", "plugins", "platforms", "libqxcb.so")
LDD_SECONDS = 30
_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found\s*$")

# The shared libraries PySide6 6.11's libqxcb.so links (ldd, transitively), and the Debian/Ubuntu package
# of each, every name checked with `apt-cache policy` on Debian 12 (Ubuntu 24.04 renamed a few to a
# `t64` suffix; apt selects those when asked for the old name).
SONAME_PACKAGES: dict[str, str] = {
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb-xinerama.so.0": "libxcb-xinerama0",
    "libxcb.so.1": "libxcb1",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
    "libXau.so.6": "libxau6",
    "libXdmcp.so.6": "libxdmcp6",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libGLX.so.0": "libglx0",
    "libGLdispatch.so.0": "libglvnd0",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libdbus-1.so.3": "libdbus-1-3",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
    "libpng16.so.16": "libpng16-16",
    "libexpat.so.1": "libexpat1",
    "libz.so.1": "zlib1g",
    "libzstd.so.1": "libzstd1",
    "libbrotlidec.so.1": "libbrotli1",
    "libbrotlicommon.so.1": "libbrotli1",
}


def pyside6_dir() -> Path | None:
    """PySide6's package folder, found without importing it (engine/ must not load Qt); None if absent."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def run_ldd(library: Path) -> str:
    """`ldd library`'s output; RuntimeError with its message when ldd itself fails."""
    result = subprocess.run(["ldd", str(library)], capture_output=True, text=True, timeout=LDD_SECONDS, check=False)
    if result.returncode != 0 and "=>" not in result.stdout:
        raise RuntimeError(f"ldd {library} failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


def missing_libraries(ldd_output: str) -> list[str]:
    """The sonames ldd reports as `not found`, each once, in the order ldd lists them."""
    missing: list[str] = []
    for line in ldd_output.splitlines():
        match = _NOT_FOUND.match(line)
        if match and match.group(1) not in missing:
            missing.append(match.group(1))
    return missing


def apt_install_line(missing: list[str]) -> tuple[str | None, list[str]]:
    """The `apt-get install` command for the known packages, and the sonames no package is known for."""
    packages = sorted({SONAME_PACKAGES[name] for name in missing if name in SONAME_PACKAGES})
    unknown = [name for name in missing if name not in SONAME_PACKAGES]
    return (f"sudo apt-get install {' '.join(packages)}" if packages else None), unknown


def desktop_check(pyside: Callable[[], Path | None] = pyside6_dir, ldd: Callable[[Path], str] = run_ldd) -> Check:
    """Whether `rigllm gui` can open under X: PySide6 present and every library of its xcb plugin found."""
    if not sys.platform.startswith("linux"):
        return Check("desktop", f"not checked on {sys.platform} (the xcb check is for Linux)")
    folder = pyside()
    if folder is None:
        return Check("desktop", "the desktop app is not installed (pip install -e \".[app]\"); rigllm serve needs none")
    plugin = folder / XCB_PLUGIN
    data: dict = {"plugin": str(plugin), "missing": [], "packages": []}
    if not plugin.is_file():
        check = Check("desktop", f"PySide6 has no xcb platform plugin ({plugin})", data=data)
        check.problem(WARNING, f"{plugin} is missing, so the desktop app cannot open under X",
                      "reinstall PySide6: pip install --force-reinstall -e \".[app]\"")
        return check
    if shutil.which("ldd") is None and ldd is run_ldd:
        return Check("desktop", "not checked: no ldd on PATH (Debian/Ubuntu: apt-get install libc-bin)", data=data)
    missing = missing_libraries(ldd(plugin))
    command, unknown = apt_install_line(missing)
    data.update(missing=missing, packages=command.split()[3:] if command else [], command=command)
    if not missing:
        return Check("desktop", "Qt's xcb platform plugin finds all its libraries", data=data)
    check = Check("desktop", f"Qt's xcb platform plugin lacks {len(missing)} system "
                  f"librar{'y' if len(missing) == 1 else 'ies'}: {', '.join(missing)}", data=data)
    if command:
        check.problem(WARNING, f"rigllm gui cannot open under X: {', '.join(n for n in missing if n not in unknown)} "
                      "not found", command)
    if unknown:
        check.problem(WARNING, f"rigllm gui cannot open under X: {', '.join(unknown)} not found",
                      "install the package that ships each (Debian/Ubuntu: apt-file search NAME)")
    return check
