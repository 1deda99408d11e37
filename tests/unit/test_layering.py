"""The import rules of the code (issue 23), read from the source: every package imports only downward.

All imports count, lazy ones inside functions too; only `if TYPE_CHECKING:` blocks are left out (they
never run). The order is `LAYERS`, bottom first: a module may import its own package and the layers
below it, never a layer above or a package in the same layer. Beside the order: engine never imports
Qt or the app; pycuda is imported only by engine/cuda/driver.py; in app/ only the API toggle and the
remote-rig client files import engine.server (the local chat drives engine.generation.serving).
The checker is tested on small synthetic trees first, so a rule that stopped catching anything fails.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAYERS: tuple[tuple[str, ...], ...] = (  # bottom first; a package may import only the layers before its own
    ("engine.errors", "engine.paths", "engine.telemetry"),
    ("engine.api_keys",),  # the API key's stored places, read by `rigllm serve` and the app alike
    ("engine.gguf",),
    ("engine.model",),  # model-level facts: KV formats, special tokens, footprint, memory plan, load progress
    ("engine.reference",),
    ("engine.sparse", "engine.vision"),
    ("engine.generation", "engine.hub"),  # serving machinery (no HTTP); engine.hub: the Hugging Face Hub client
    ("engine.fixtures",),
    ("engine.cuda",),
    ("engine.backends", "engine.diagnostics"),  # engine.backends: the composition root that knows every backend
    ("engine.server", "engine.bench_kv", "engine.bench_peer"),
    ("engine.commands",),
    ("engine.cli",),
    ("app",),
)
QT_PACKAGES = ("PySide6", "pyqtgraph", "shiboken6")
PYCUDA_HOME = "engine/cuda/driver.py"


@dataclass(frozen=True)
class Edge:
    path: str  # the importing file, relative to the root
    line: int
    source: str  # the importing module
    target: str  # the imported module (or module.name for `from module import name`)


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside an `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) body."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
            if name == "TYPE_CHECKING":
                skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def imports_of(path: Path, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """(imported module, line) for each import in the file, relative ones resolved against `module`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skipped = _type_checking_nodes(tree)
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                stem = f"{base}.{node.module}" if node.module else base
            else:
                stem = node.module or ""
            for alias in node.names:  # `from engine import cuda` names a package, not only an attribute
                yield f"{stem}.{alias.name}", node.lineno


def edges_of(root: Path, tops: tuple[str, ...] = ("engine", "app")) -> list[Edge]:
    found = []
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            module = module_name(rel)
            for target, line in imports_of(path, module, path.name == "__init__.py"):
                found.append(Edge(rel.as_posix(), line, module, target))
    return found


def package_of(module: str, packages: tuple[str, ...]) -> str | None:
    """The longest of `packages` that `module` is or lies in; None for third-party modules."""
    best = None
    for p in packages:
        if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best)):
            best = p
    return best


def layer_violations(edges: list[Edge], layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Imports that go up or sideways in `layers`, and engine/app modules that have no layer."""
    rank = {p: i for i, layer in enumerate(layers) for p in layer}
    packages = tuple(rank)
    bad = []
    for e in edges:
        src = package_of(e.source, packages)
        if src is None:
            bad.append(f"{e.path}: module {e.source} is in no layer (add its package to LAYERS)")
            continue
        top = e.target.split(".")[0]
        dst = package_of(e.target, packages)
        if dst is None and top in ("engine", "app") and e.target.count(".") == 1:
            dst = e.target  # `from engine import x` where x is a module of no layer
        if dst is None or dst == src:
            continue
        if dst not in rank:
            bad.append(f"{e.path}:{e.line} imports {e.target}, which is in no layer")
        elif rank[dst] >= rank[src]:
            where = "the same layer" if rank[dst] == rank[src] else "a higher layer"
            bad.append(f"{e.path}:{e.line} {src} imports {e.target} ({where})")
    return sorted(set(bad))


def package_cycles(edges: list[Edge], packages: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Each cycle of the package graph once (as its members in order, the first repeated at the end)."""
    graph: dict[str, set[str]] = {p: set() for p in packages}
    for e in edges:
        src, dst = package_of(e.source, packages), package_of(e.target, packages)
        if src and dst and src != dst:
            graph[src].add(dst)
    cycles, seen = [], set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycle = path[path.index(nxt):]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    cycles.append((*cycle, nxt))
            else:
                walk(nxt, path + [nxt])

    for p in packages:
        walk(p, [p])
    return cycles


def other_rule_violations(edges: list[Edge]) -> list[str]:
    """Qt and the app stay out of engine/, pycuda stays in its driver, and app/ reaches engine.server only
    from the API toggle (api_server.py) and the remote-rig clients (rig_client.py, remote_*.py, not in ui/)."""
    bad = []
    for e in edges:
        top = e.target.split(".")[0]
        in_engine = e.path.startswith("engine/")
        if in_engine and top in (*QT_PACKAGES, "app"):
            bad.append(f"{e.path}:{e.line} engine imports {e.target}")
        if top == "pycuda" and e.path != PYCUDA_HOME:
            bad.append(f"{e.path}:{e.line} imports pycuda outside {PYCUDA_HOME}")
        if e.path.startswith("app/") and (e.target == "engine.server" or e.target.startswith("engine.server.")):
            name = Path(e.path).name
            client = "/ui/" not in e.path and (name in ("api_server.py", "rig_client.py") or name.startswith("remote_"))
            if not client:
                bad.append(f"{e.path}:{e.line} app imports {e.target} (only the API toggle and remote-rig clients may)")
    return sorted(set(bad))


# ---- the checker on synthetic trees ----------------------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for top in ("engine", "app"):
        (tmp_path / top).mkdir(exist_ok=True)
    return tmp_path


def test_checker_catches_an_upward_import_even_a_lazy_one(tmp_path):
    root = _tree(tmp_path, {
        "engine/gguf/reader.py": "def f():\n    from engine.generation.sampler import Sampler\n",
        "engine/generation/sampler.py": "from engine.gguf.reader import f\n",
    })
    bad = layer_violations(edges_of(root))
    assert bad == ["engine/gguf/reader.py:2 engine.gguf imports engine.generation.sampler.Sampler (a higher layer)"]


def test_checker_ignores_type_checking_blocks_but_not_their_else(tmp_path):
    root = _tree(tmp_path, {
        "engine/gguf/reader.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from engine.cuda.driver import CudaCard\nelse:\n    import engine.cuda\n"),
    })
    assert layer_violations(edges_of(root)) == ["engine/gguf/reader.py:5 engine.gguf imports engine.cuda (a higher layer)"]


def test_checker_resolves_relative_imports_and_package_imports(tmp_path):
    root = _tree(tmp_path, {
        "engine/reference/__init__.py": "",
        "engine/reference/model.py": "from ..generation import slots\n",
        "engine/vision/tower.py": "from engine import sparse\n",
    })
    bad = layer_violations(edges_of(root))
    assert bad == ["engine/reference/model.py:1 engine.reference imports engine.generation.slots (a higher layer)",
                   "engine/vision/tower.py:1 engine.vision imports engine.sparse (the same layer)"]


def test_checker_refuses_modules_and_packages_without_a_layer(tmp_path):
    root = _tree(tmp_path, {"engine/newpkg/thing.py": "", "engine/gguf/reader.py": "from engine import newpkg\n"})
    bad = layer_violations(edges_of(root))
    assert "engine/gguf/reader.py:1 imports engine.newpkg, which is in no layer" in bad
    root = _tree(tmp_path, {"engine/newpkg/thing.py": "import numpy\n"})
    assert "engine/newpkg/thing.py: module engine.newpkg.thing is in no layer (add its package to LAYERS)" in (
        layer_violations(edges_of(root)))


def test_checker_finds_each_package_cycle_once(tmp_path):
    root = _tree(tmp_path, {
        "engine/a/x.py": "import engine.b.y\n",
        "engine/b/y.py": "import engine.c.z\n",
        "engine/c/z.py": "from engine.a.x import thing\n",
        "engine/d/w.py": "import engine.a.x\n",
    })
    cycles = package_cycles(edges_of(root), ("engine.a", "engine.b", "engine.c", "engine.d"))
    assert cycles == [("engine.a", "engine.b", "engine.c", "engine.a")]


def test_checker_catches_qt_pycuda_and_server_imports_where_they_do_not_belong(tmp_path):
    root = _tree(tmp_path, {
        "engine/generation/view.py": "def show():\n    from PySide6.QtWidgets import QLabel\n",
        "engine/cuda/forward.py": "import pycuda.driver\n",
        "engine/cuda/driver.py": "import pycuda.driver\n",
        "app/chat_engine.py": "from engine.server.app import create_app\n",
        "app/api_server.py": "from engine.server.app import create_app\n",
        "app/remote_engine.py": "import engine.server.wire\n",
        "app/ui/remote_panel.py": "import engine.server.wire\n",
        "app/gpu.py": "import pycuda\n",
    })
    assert other_rule_violations(edges_of(root)) == [
        "app/chat_engine.py:1 app imports engine.server.app.create_app (only the API toggle and remote-rig clients may)",
        "app/gpu.py:1 imports pycuda outside engine/cuda/driver.py",
        "app/ui/remote_panel.py:1 app imports engine.server.wire (only the API toggle and remote-rig clients may)",
        "engine/cuda/forward.py:1 imports pycuda outside engine/cuda/driver.py",
        "engine/generation/view.py:2 engine imports PySide6.QtWidgets.QLabel",
    ]


# ---- the rules on this repository ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def repo_edges() -> list[Edge]:
    return edges_of(ROOT)


def test_every_package_imports_only_downward(repo_edges):
    assert layer_violations(repo_edges) == []


def test_there_are_no_package_cycles(repo_edges):
    packages = tuple(p for layer in LAYERS for p in layer)
    assert package_cycles(repo_edges, packages) == []


def test_qt_pycuda_and_the_server_stay_where_they_belong(repo_edges):
    assert other_rule_violations(repo_edges) == []


def test_every_engine_package_has_a_layer():
    ranked = {p for layer in LAYERS for p in layer}
    present = {f"engine.{p.stem if p.is_file() else p.name}" for p in (ROOT / "engine").iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert present - ranked == set()


def test_the_local_chat_and_the_window_load_no_web_framework():
    """The app's chat drives engine.generation.serving directly: importing it (or the main window, whose API
    toggle loads the server only when switched on) must not import FastAPI or uvicorn."""
    probe = ("import sys, app.chat_engine, app.model_loader, app.ui.main_window; "
             "print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette') if m in sys.modules))")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
