"""Every committed results file loads with the loader of `cuteforge bench --from`, and the
index of benchmarks/results/ lists exactly the files that are there."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cuteforge.bench import report

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
FILES = sorted(RESULTS.glob("*.json"))


@pytest.mark.skipif(not RESULTS.is_dir(), reason="benchmarks/ is not part of an installed package")
@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_results_file_loads(path: Path) -> None:
    (r,) = report.load_results([path])
    assert r["_date"] != "date not recorded", f"{path.name}: no 'date' key"
    assert report.families(r) or report.sections(r)


@pytest.mark.skipif(not RESULTS.is_dir(), reason="benchmarks/ is not part of an installed package")
def test_index_lists_every_file() -> None:
    index = (RESULTS / "INDEX.md").read_text()
    listed = set(re.findall(r"^\| ([\w.-]+\.(?:json|png)) \|", index, re.M))
    present = {p.name for p in RESULTS.iterdir() if p.suffix in (".json", ".png")}
    assert listed == present, f"not in INDEX.md: {sorted(present - listed)}; listed but missing: {sorted(listed - present)}"


def test_writer_output_loads(tmp_path: Path) -> None:
    """What the writers write (`results_header` + rows, `write_results`) is what the loader reads."""
    result = {**report.results_header("python benchmarks/bench_x.py"), "copy_GBps": 3000.0,
              "rows": [{"op": "sum", "M": 4096, "N": 4096, "dtype": "float32", "cuteforge_GBps": 2900.0}]}
    path = report.write_results(tmp_path / "r.json", result)
    (r,) = report.load_results([path])
    assert r["_date"] == result["date"] and report.family_names([r]) == ["sum"]
    assert json.loads(path.read_text())["command"] == "python benchmarks/bench_x.py"


def test_write_results_rejects_a_bad_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lacks 'dtype'"):
        report.write_results(tmp_path / "r.json", {"command": "x", "gpu": "g", "copy_GBps": 1.0,
                                                   "rows": [{"M": 1, "N": 2, "a_GBps": 1.0}]})
    assert not (tmp_path / "r.json").exists()
