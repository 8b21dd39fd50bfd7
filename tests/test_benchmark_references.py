"""Every cuteforge name a benchmark script uses exists: the scripts reach into private
launch helpers (to time a kernel apart from its op), and those move as the ops change.
A benchmark only runs on a GPU, so without this a moved name shows up as a crash in the
middle of a GPU run."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from benchmark_scripts import DIR

SCRIPTS = sorted(DIR.glob("*.py")) if DIR.is_dir() else []


def _resolves(module: str, name: str) -> bool:
    mod = importlib.import_module(module)
    if hasattr(mod, name):
        return True
    try:
        importlib.import_module(f"{module}.{name}")
        return True
    except ImportError:
        return False


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """alias -> module for `alias = importlib.import_module("cuteforge...")` with a literal name."""
    out = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "import_module" and node.value.args
                and isinstance(node.value.args[0], ast.Constant) and isinstance(node.value.args[0].value, str)
                and node.value.args[0].value.startswith("cuteforge")):
            out[node.targets[0].id] = node.value.args[0].value
    return out


def missing_references(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cuteforge"):
            missing += [f"from {node.module} import {a.name}" for a in node.names if not _resolves(node.module, a.name)]
    aliases = _module_aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            module = aliases[node.value.id]
            if not _resolves(module, node.attr):
                missing.append(f"{module}.{node.attr}")
    return sorted(set(missing))


@pytest.mark.skipif(not SCRIPTS, reason="benchmarks/ is not in this tree")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_names_exist(script: Path) -> None:
    assert missing_references(script) == []


def test_a_moved_name_is_reported(tmp_path: Path) -> None:
    script = tmp_path / "bench_x.py"
    script.write_text(
        "import importlib\n"
        "from cuteforge.ops.cross_entropy_launch import _fwd, _no_such_helper\n"
        'ce = importlib.import_module("cuteforge.ops.cross_entropy")\n'
        "ce._work(0, 1)\n"
        "ce._fwd(1, 2, 3)\n"
    )
    assert missing_references(script) == [
        "cuteforge.ops.cross_entropy._fwd",
        "from cuteforge.ops.cross_entropy_launch import _no_such_helper",
    ]
