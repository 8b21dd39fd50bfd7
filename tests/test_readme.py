"""The README is for users: short, with a performance table that matches the results files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_readme_is_short_and_has_the_setup_commands() -> None:
    text = README.read_text()
    assert len(text.encode()) <= 12 * 1024
    assert "bash scripts/setup.sh && .venv/bin/cuteforge library" in text
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -q" in text


@pytest.mark.skipif(not (ROOT / "benchmarks" / "results").is_dir(), reason="no benchmarks/ next to the tests")
def test_performance_table_matches_the_results_files() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "perf_table.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
