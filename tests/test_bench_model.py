"""benchmarks/bench_model.py's logic on the CPU: the GPU busy time of its profiles and the
plot it redraws from a results file. The timed parts need a GPU (and transformers)."""

from __future__ import annotations

import json
from pathlib import Path

import benchmark_scripts
import pytest

SCRIPT = benchmark_scripts.path("bench_model")
pytestmark = pytest.mark.skipif(not SCRIPT.is_file(), reason="benchmarks/ is not part of an installed package")


def _bench():
    return benchmark_scripts.load("bench_model")


def test_busy_time_counts_overlaps_once_and_gaps_never() -> None:
    busy_ms = _bench().busy_ms
    # µs: [0, 1000) and [500, 1500) overlap (1.5 ms busy), a 500 µs gap, then [2000, 2500)
    assert busy_ms([(2000.0, 2500.0), (0.0, 1000.0), (500.0, 1500.0)]) == (2.0, 2.5)
    assert busy_ms([(0.0, 1000.0), (100.0, 200.0)]) == (1.0, 1.0)  # nested
    assert busy_ms([]) == (0.0, 0.0)


def test_plot_from_a_results_file(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    bench = _bench()
    step = {"ms": 10.0, "host_ms": 4.0, "peak_MB": 1.0}
    profile = {"stock eager": [{"kernel": "(all)", "ms": 9.0, "calls": 3, "gpu_busy_ms": 8.5, "gpu_span_ms": 9.5}],
               "patched eager": [{"kernel": "(all)", "ms": 7.0, "calls": 3}]}  # a file from before gpu_busy_ms
    row = {"size": "small", "hidden_size": 1024, "num_hidden_layers": 4,
           "train": {"stock eager": step, "patched eager": {**step, "ms": 8.0}, "speedup eager": 1.25},
           "infer": {"stock eager": step, "patched eager": step}, "profile_train": profile,
           "gpu_clocks": {"train": {"sm_mhz_median": 1545.0, "power_w_median": 690.0, "power_limit_w": 700.0,
                                    "samples": 30},
                          "infer": {"error": "nvidia-smi not found"}}}
    results = tmp_path / "h200-model.json"
    results.write_text(json.dumps({"command": "x", "models": [row]}))
    bench._plot(json.loads(results.read_text())["models"], results.with_suffix(".png"))
    assert results.with_suffix(".png").stat().st_size > 1000
