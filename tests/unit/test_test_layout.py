"""Test modules are collected by basename (rootdir-relative imports without packages), so two files with
the same name in different test folders break collection of the whole suite: keep them unique."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_test_module_names_are_unique_across_folders():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
