"""Import every module of engine/ and app/ in the current interpreter and report the ones that fail.

CI runs this right after the README's `pip install -e ".[app]"` and before the dev install, so a module
whose third-party import no `[app]` install provides fails CI (the way `httpx` once crashed `rigllm gui`
on a fresh machine). Run from the repository root: `python tests/install/import_every_module.py`.
Modules that cannot import on such an install by design are listed in NOT_IMPORTABLE_WITH_APP with why.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "app")

# module -> why an `[app]` install cannot import it (every other module of engine/ and app/ must import).
NOT_IMPORTABLE_WITH_APP: dict[str, str] = {
    "app.__main__": "the `python -m app` entry point: importing it starts the desktop app",
    "engine.fixtures.torch_model": "the trained fixtures' torch model (nn.Module subclasses): needs torch and "
                                   "transformers from the dev extra; only `python -m engine.fixtures.train` uses it",
    "engine.bench_peer.serve_streams": "the serve benchmark drives `rigllm serve` through the official openai "
                                       "client (dev extra), as the issue's users do",
    "engine.bench_peer.stream_timing": "its timed streams are openai client calls (dev extra); only "
                                       "serve_streams uses it",
}


def every_module() -> list[str]:
    """Dotted names of all modules and packages under PACKAGES, found on disk (not by importing them)."""
    names: list[str] = []
    for package in PACKAGES:
        names.append(package)
        for info in pkgutil.walk_packages([str(REPO / package)], prefix=f"{package}."):
            names.append(info.name)
    return sorted(names)


def import_failures(names: list[str]) -> dict[str, str]:
    """module -> the last line of its import error, for every listed module that fails to import."""
    failures: dict[str, str] = {}
    for name in names:
        if name in NOT_IMPORTABLE_WITH_APP:
            continue
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - a SystemExit at import time is a failure too
            failures[name] = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return failures


def main() -> int:
    sys.path.insert(0, str(REPO))
    names = every_module()
    unknown = sorted(set(NOT_IMPORTABLE_WITH_APP) - set(names))
    if unknown:
        print(f"NOT_IMPORTABLE_WITH_APP names modules that do not exist: {', '.join(unknown)}")
        return 1
    failures = import_failures(names)
    for name, error in failures.items():
        print(f"FAILED {name}: {error}")
    imported = len(names) - len(NOT_IMPORTABLE_WITH_APP) - len(failures)
    print(f"imported {imported} of {len(names)} modules of {', '.join(PACKAGES)}; "
          f"{len(NOT_IMPORTABLE_WITH_APP)} excepted, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
