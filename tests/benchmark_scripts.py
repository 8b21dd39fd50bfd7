"""The scripts under benchmarks/ as modules, for tests of their host-side logic (the timed
parts need a GPU). benchmarks/ is not part of an installed package: tests skip without it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

DIR = Path(__file__).resolve().parent.parent / "benchmarks"


def path(name: str) -> Path:
    """benchmarks/<name>.py"""
    return DIR / f"{name}.py"


def load(name: str) -> ModuleType:
    """benchmarks/<name>.py imported as a fresh module (its command line is not run)."""
    spec = importlib.util.spec_from_file_location(name, path(name))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
