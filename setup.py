"""Hands the extras of pyproject.toml's [tool.rigllm.optional-dependencies] to setuptools.

They cannot be static [project.optional-dependencies]: the `gpu` extra builds pycuda from this checkout's
packaging/pycuda-wheel (no CUDA toolkit needed), and pip accepts a local folder as a dependency only as an
absolute file: URL (pip 23.2 rejects `pycuda @ file:packaging/pycuda-wheel` with "Invalid URL given";
PEP 508 has no relative form). The table writes `{root:uri}`, as hatchling spells it, and this file puts in
the URL of the checkout it runs from.
"""

import tomllib
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def extras() -> dict[str, list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    table = config["tool"]["rigllm"]["optional-dependencies"]
    return {name: [req.replace("{root:uri}", ROOT.as_uri()) for req in reqs] for name, reqs in table.items()}


setup(extras_require=extras())
