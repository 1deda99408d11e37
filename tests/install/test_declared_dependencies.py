"""Every third-party import in engine/ and app/ comes from a distribution the right extra installs.

A module's eager imports (at module level, outside `try: ... except ImportError` and `if TYPE_CHECKING`)
must be provided by the extra its users install: app/ by `app`, engine/ by the base dependencies, the
few modules in MODULE_EXTRA by the extra named there. Lazy imports (inside functions, or guarded) must
come from some extra. "Provided" means the distribution, or any of its dependencies, as installed here
(fastapi brings starlette and pydantic). This is how httpx, imported by app/rig_client.py but then only
in the dev extra, would have been caught; the tests' own imports must come from `dev`.
tests/install/import_every_module.py checks the same on a real `[app]` install in CI.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import sys
import tomllib
from functools import lru_cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
_PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = _PYPROJECT["project"]
# the extras live in [tool.rigllm.optional-dependencies] (setup.py hands them to setuptools)
EXTRAS: dict[str, list[str]] = _PYPROJECT["tool"]["rigllm"]["optional-dependencies"]
BASE = ""  # the name this test gives the base dependencies

# module -> the extra whose install its eager imports need, where that is not its package's default.
MODULE_EXTRA: dict[str, str] = {
    "engine/fixtures/torch_model.py": "dev",  # the trained fixtures' torch model: `python -m engine.fixtures.train`
    "engine/bench_peer/serve_streams.py": "dev",  # the serve benchmark drives `rigllm serve` with the openai client
    "engine/bench_peer/stream_timing.py": "dev",  # its timed streams are openai client calls
}
# imports that no extra provides, and why that is right.
NOT_FROM_AN_EXTRA: dict[str, str] = {
    "llama_cpp": "llama-cpp-python is built from source in CI's peer stage (README: tests/peer), never from a wheel",
}
# import name -> its distribution, for distributions an extra declares that are not installed here.
NOT_INSTALLED_HERE: dict[str, str] = {"pycuda": "pycuda"}


def _guards_import_error(node: ast.Try) -> bool:
    names = {"ImportError", "ModuleNotFoundError"}
    for handler in node.handlers:
        caught = handler.type
        parts = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        if caught is None or any(isinstance(p, ast.Name) and p.id in names for p in parts):
            return True
    return False


def third_party_imports(source: str) -> tuple[set[str], set[str]]:
    """(eager, lazy) top-level names of third-party modules imported by `source`."""
    eager: set[str] = set()
    lazy: set[str] = set()

    def visit(node: ast.AST, is_lazy: bool) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return  # type-only imports never run
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if node.level == 0 and node.module else []
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("engine", "app", "__future__"):
                    (lazy if is_lazy else eager).add(top)
        for child in ast.iter_child_nodes(node):
            inner = is_lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(node, ast.Try) and child in node.body and _guards_import_error(node):
                inner = True
            visit(child, inner)

    visit(ast.parse(source), False)
    return eager, lazy


def _requirements(extra: str) -> list[Requirement]:
    """rigllm's requirements for `extra` (BASE: none), with `rigllm[x]` self-references expanded."""
    out = [Requirement(r) for r in PROJECT["dependencies"]]
    pending = [extra] if extra != BASE else []
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in EXTRAS[name]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "rigllm":
                pending += sorted(req.extras)
            else:
                out.append(req)
    return out


@lru_cache(maxsize=None)
def provided(extra: str) -> frozenset[str]:
    """Canonical names of every distribution an install of `extra` brings, following installed metadata."""
    found: set[str] = set()
    pending = [(r.name, frozenset(r.extras)) for r in _requirements(extra)]
    while pending:
        name, extras = pending.pop()
        key = canonicalize_name(name)
        if key in found:
            continue
        found.add(key)
        try:
            requires = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue  # not installed here: its own dependencies stay unknown
        for text in requires:
            req = Requirement(text)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                pending.append((req.name, frozenset(req.extras)))
    return frozenset(found)


@lru_cache(maxsize=1)
def _installed_modules() -> dict[str, list[str]]:
    return md.packages_distributions()


def distributions_of(import_name: str) -> set[str]:
    dists = _installed_modules().get(import_name) or [NOT_INSTALLED_HERE.get(import_name, "")]
    if dists == [""]:
        pytest.fail(f"no installed distribution provides the module {import_name!r}: add it to an extra "
                    "(and install it here) or to NOT_INSTALLED_HERE")
    return {canonicalize_name(d) for d in dists}


def modules() -> list[Path]:
    return sorted(p for package in ("engine", "app") for p in (REPO / package).rglob("*.py"))


def test_every_eager_import_is_provided_by_its_modules_extra():
    extras = {name: provided(name) for name in (BASE, "app", "dev")}
    missing = []
    for path in modules():
        rel = path.relative_to(REPO).as_posix()
        extra = MODULE_EXTRA.get(rel, "app" if rel.startswith("app/") else BASE)
        eager, _lazy = third_party_imports(path.read_text(encoding="utf-8"))
        for name in sorted(eager - set(NOT_FROM_AN_EXTRA)):
            if not distributions_of(name) & extras[extra]:
                missing.append(f"{rel} imports {name} at module level, but the {extra or 'base'} install lacks it")
    assert not missing, "\n".join(missing)


def test_every_lazy_import_is_provided_by_some_extra():
    everything = set().union(*(provided(e) for e in [BASE, *EXTRAS]))
    missing = []
    for path in modules():
        _eager, lazy = third_party_imports(path.read_text(encoding="utf-8"))
        for name in sorted(lazy - set(NOT_FROM_AN_EXTRA)):
            if not distributions_of(name) & everything:
                missing.append(f"{path.relative_to(REPO)} imports {name}, which no extra provides")
    assert not missing, "\n".join(missing)


def test_every_test_import_is_provided_by_the_dev_extra():
    """The README's test command installs `[dev,kernels]`: the tests may import nothing else (but llama_cpp)."""
    tests = sorted((REPO / "tests").rglob("*.py"))
    # the tests' own helpers, and the pycuda build recipe the recipe tests load from packaging/pycuda-wheel
    recipe = {p.stem for p in (REPO / "packaging" / "pycuda-wheel").glob("*.py")}
    local = {p.stem for p in tests} | recipe | {"tests", "engine", "app"}
    dev = provided("dev") | provided("kernels")
    missing = []
    for path in tests:
        eager, lazy = third_party_imports(path.read_text(encoding="utf-8"))
        for name in sorted((eager | lazy) - local - set(NOT_FROM_AN_EXTRA)):
            if not distributions_of(name) & dev:
                missing.append(f"{path.relative_to(REPO)} imports {name}, which the dev extra lacks")
    assert not missing, "\n".join(missing)


def test_the_import_reader_tells_eager_from_lazy():
    source = """
import numpy
from typing import TYPE_CHECKING
from engine.errors import RigllmError
if TYPE_CHECKING:
    import torch
try:
    import pycuda
except ImportError:
    pass
class A:
    import httpx
def f():
    from safetensors.torch import save_file
"""
    assert third_party_imports(source) == ({"numpy", "httpx"}, {"pycuda", "safetensors"})


def test_an_app_module_importing_a_dev_only_package_is_caught():
    """The check has teeth: httpx would be missing from `app` if the app extra did not declare it."""
    app_without_httpx = provided("app") - {"httpx"}
    assert "httpx" in provided("dev") and not distributions_of("httpx") & app_without_httpx


def test_the_exception_tables_name_real_things():
    names = {p.relative_to(REPO).as_posix() for p in modules()}
    assert set(MODULE_EXTRA) <= names and set(MODULE_EXTRA.values()) <= set(EXTRAS)
    lazy_anywhere = set().union(*(third_party_imports(p.read_text(encoding="utf-8"))[1] for p in modules()))
    assert set(NOT_FROM_AN_EXTRA) <= lazy_anywhere
