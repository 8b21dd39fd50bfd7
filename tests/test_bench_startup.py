"""benchmarks/bench_startup.py's logic on the CPU: its command line, the fresh caches it makes,
its summaries and the results file it writes (what `cuteforge bench --from` loads). The timed
parts themselves need a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import benchmark_scripts
import pytest

from cuteforge import trust
from cuteforge.bench import report

SCRIPT = benchmark_scripts.path("bench_startup")
pytestmark = pytest.mark.skipif(not SCRIPT.is_file(), reason="benchmarks/ is not part of an installed package")


def _bench() -> ModuleType:
    return benchmark_scripts.load("bench_startup")


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
    phases = b.phases_summary([_phases("sum", 1.0, 9.0, 30.0)])
    result = {**report.results_header("python benchmarks/bench_startup.py"), "dtype": "bfloat16", "cold": cold,
              "warm": warm, "phases": phases, "bundle": bundle}
    (r,) = report.load_results([report.write_results(tmp_path / "h200-startup.json", result)])
    assert set(report.sections(r)) >= {"cold", "warm", "phases", "bundle"}


def _phases(op: str, load: float, rest: float, ffi: float | None) -> dict[str, Any]:
    return {"op": op, "M": 4096, "N": 4096, "dtype": "bfloat16", "fingerprint_ms": 0.5, "native_extension_ms": 3.0, "runtime_libraries_ms": 2.0,
            "object_load_ms": load, "call_rest_ms": rest, "call_ms": load + rest, "total_ms": 5.5 + load + rest,
            "second_call_ms": 0.05, "tvm_ffi_import_ms": ffi, "compiles": 0}


def test_phases_summary_names_the_largest_phase() -> None:
    s = _bench().phases_summary([_phases("sum", 1.0, 9.0, 30.0), _phases("softmax", 2.0, 12.0, None),
                                 _phases("gemm", 40.0, 4.0, 34.0)])
    assert s["median"]["object_load_ms"] == 2.0 and s["median"]["call_rest_ms"] == 9.0
    assert s["median"]["total_ms"] == 5.5 + 2.0 + 12.0  # the median op's own total
    assert s["largest"] == "call_rest_ms" and s["tvm_ffi_import_ms_median"] == 32.0


def test_phases_child_runs_with_cpu_stand_ins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The phases child end to end, with the op, its inputs and the GPU sync stood in for: it
    times each phase, attributes the call's launch plans, and its row is what the summary reads."""
    import torch

    from cuteforge.kernel import Kernel
    from cuteforge.native import build, launch

    b = _bench()
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(Kernel, "get", Kernel.get)  # the child wraps these two: restored after the test
    monkeypatch.setattr(launch, "runner", launch.runner)
    monkeypatch.setattr(build, "load", lambda wait=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(b, "op_inputs", lambda op, dtype: (torch.ones(4),))

    def op(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)  # the first call's own work
        assert launch.runner("stand-in", object(), x.device, 1, [], [], []) is None  # no TVM-FFI function: no plan
        return x + 1

    monkeypatch.setattr(b, "op_fn", lambda name: op)
    from cuteforge import STATS

    monkeypatch.setattr(STATS, "compiles", STATS.compiles + 3)  # this process's earlier work is not the call's
    monkeypatch.setattr(STATS, "load_ms", STATS.load_ms + 500.0)
    row = b.child_phases("sum", "float32")
    assert set(b.PHASES) <= set(row) and row["compiles"] == 0 and row["kernel_get_ms"] == 0.0
    assert row["call_ms"] >= 20.0 and row["call_other_ms"] >= 20.0 and row["launch_plan_ms"] < row["call_ms"]
    assert row["object_load_ms"] == 0.0 and row["call_rest_ms"] == row["call_ms"]
    assert row["total_ms"] >= row["call_ms"] and b.phases_summary([row])["median"]["call_rest_ms"] == row["call_rest_ms"]


def test_runtime_libraries_found_without_importing_tvm_ffi() -> None:
    """The phases child loads these before the call it times: importing tvm_ffi to find them
    would take that import out of the call."""
    code = (
        "import importlib.util, os, sys\n"
        f"spec = importlib.util.spec_from_file_location('b', {str(SCRIPT)!r})\n"
        "b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)\n"
        "import cutlass.cute as cute\n"
        "libs = b.runtime_libraries(cute)\n"
        "print(sorted(os.path.basename(p) for p in libs if os.path.isfile(p)), 'tvm_ffi' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["['libcute_dsl_runtime.so',", "'libtvm_ffi.so']", "False"], out.stdout


def test_cache_dir_named_where_platformdirs_is_absent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    b = _bench()
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path / "mine"))
    assert b.default_cache_dir() is None  # a set directory is kept
    monkeypatch.delenv("CUTEFORGE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setitem(sys.modules, "platformdirs", None)  # not installed: importing it raises
    assert b.default_cache_dir() == str(tmp_path / "xdg" / "cuteforge")
    assert os.environ["CUTEFORGE_CACHE_DIR"] == str(tmp_path / "xdg" / "cuteforge")


def test_last_json_skips_leading_lines() -> None:
    assert _bench().last_json('note: building\n{"dir": "/x", "built": true}\n') == {"dir": "/x", "built": True}


def test_bundle_first_calls_runs_two_pinned_processes_per_op(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bench = _bench()
    seen: list[tuple[str, Path, Any]] = []

    def fake_row(op: str, dtype: str, cache: Path, phases: bool = False, env: Any = None) -> dict[str, Any]:
        seen.append((op, cache, env))
        return {"first_call_ms": 30.0 if sum(s[1] == cache for s in seen) == 1 else 5.0}

    monkeypatch.setattr(bench, "child_row", fake_row)
    pin = {"CUTEFORGE_BUNDLES": "/b#sha256=00"}
    out = bench.bundle_first_calls(["sum", "gemm"], "bfloat16", tmp_path, None, pin)
    assert [(op, env) for op, _, env in seen] == [("sum", pin), ("sum", pin), ("gemm", pin), ("gemm", pin)]
    assert seen[0][1] == seen[1][1] != seen[2][1]  # one fresh cache per op, shared by its two processes
    assert out["first_call_ms_median"] == {"first_process": 30.0, "second_process": 5.0}
