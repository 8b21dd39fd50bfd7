"""benchmarks/bench_startup.py's logic on the CPU: its command line, the fresh caches it makes,
its summaries and the results file it writes (what `cuteforge bench --from` loads). The timed
parts themselves need a GPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cuteforge import report, trust

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_startup.py"
pytestmark = pytest.mark.skipif(not SCRIPT.is_file(), reason="benchmarks/ is not part of an installed package")


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_startup", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(op: str, first: float, compile_ms: float, compiles: int) -> dict[str, Any]:
    return {"op": op, "M": 4096, "N": 4096, "dtype": "bfloat16", "import_ms": 900.0, "first_call_ms": first,
            "second_call_ms": 0.05, "compiles": compiles, "compile_ms": compile_ms, "l2_loads": 1 - compiles,
            "load_ms": 2.0, "bundle_loads": 0, "native_extension": True}


def test_help_and_no_gpu() -> None:
    ran = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and "--skip-bundle" in ran.stdout and "--workers" in ran.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), "--ops", "sum,matmul"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "matmul" in bad.stderr


def test_fresh_cache_is_private_and_holds_the_extension(tmp_path: Path) -> None:
    b = _bench()
    built = tmp_path / "seed" / "native" / "ffi_backward-abc"
    built.mkdir(parents=True)
    (built / "ext.so").write_bytes(b"\x7fELF")
    fresh = b.fresh_cache(tmp_path, "ops-sum", built)
    assert (fresh / "native" / "ffi_backward-abc" / "ext.so").read_bytes() == b"\x7fELF"
    assert trust.check_root(fresh) == fresh.resolve()  # a cache cuteforge trusts: private, ours
    assert not any((b.fresh_cache(tmp_path, "bare", None)).iterdir())


def test_summaries_and_results_file(tmp_path: Path) -> None:
    b = _bench()
    cold = b.cold_summary([_row("sum", 1500.0, 1200.0, 1), _row("softmax", 2500.0, 2000.0, 1), _row("gemm", 9000.0, 8000.0, 1)])
    assert [r["overhead_ms"] for r in cold["rows"]] == [300.0, 500.0, 1000.0]
    assert cold["first_call_ms_median"] == 2500.0 and cold["compile_ms_total"] == 11200.0
    warm = b.warm_summary([_row("sum", 8.0, 0, 0), _row("softmax", 30.0, 0, 0), _row("gemm", 12.0, 0, 0)])
    assert warm["first_call_ms_median"] == 12.0 and warm["bar_met"] and warm["slowest"] == "softmax"
    assert not b.warm_summary([_row("sum", 21.0, 0, 0)])["bar_met"]
    listed = [{"kernel": "norm_bwd", "key": "k1"}, {"kernel": None, "key": None}, {"kernel": "norm_bwd", "key": "k1"}]
    bundle = b.bundle_summary({"objects": 300, "bytes": 1 << 20, "sha256": "ab"}, 40.0, 90.0,
                              {"cumulative": {"compiles": 1, "bundle_loads": 120}}, listed)
    assert bundle["compiles"] == 1 and not bundle["bar_met"] and bundle["compiled_kernels"] == ["k1"]
    assert b.gpu_slug("NVIDIA H200") == "h200"
    result = {**report.results_header("python benchmarks/bench_startup.py"), "dtype": "bfloat16", "cold": cold,
              "warm": warm, "bundle": bundle}
    (r,) = report.load_results([report.write_results(tmp_path / "h200-startup.json", result)])
    assert set(report.sections(r)) >= {"cold", "warm", "bundle"}


def test_last_json_skips_leading_lines() -> None:
    assert _bench().last_json('note: building\n{"dir": "/x", "built": true}\n') == {"dir": "/x", "built": True}
