"""The autotuner on a GPU: it picks the measured-fastest config, reproducibly, times with
CUDA graphs over L2-cold inputs, rejects wrong answers, and a second tune is a store hit."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from cuteforge import STATS
from cuteforge.autotune import GraphTimer, TuneStore, make_input_sets, tune
from cuteforge.kernels.reduce.row import RowReduceConfig as C
from cuteforge.kernels.reduce.spec import row_reduce
from cuteforge.timing import events as timing
from cuteforge.tune_cli import tune_main

pytestmark = pytest.mark.gpu

# Clearly different for (32768, 4096) fp32: one warp per CTA and one 16-byte load per
# thread in flight (slow), one 1024-thread CTA per row, and the heuristic's 256 / unroll 4.
CONFIGS = [C(32, 32, 1), C(1024, 1024, 1), C(256, 256, 4)]
SUM = {"op": "sum"}


def _problem(m: int = 32768, n: int = 4096, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    return x, torch.empty(m, device="cuda", dtype=dtype)


def _ref(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return x.float().sum(-1)


def _independent_ms(x: torch.Tensor, out: torch.Tensor) -> dict:
    """Each config timed apart from the tuner: CUDA events with an L2 flush (timing.bench)."""
    key = row_reduce.signature.bind((x, out))
    return {c: timing.bench(lambda fn=row_reduce.get(key, (("op", "sum"),), c): fn(x, out), rep_ms=200) for c in CONFIGS}


def test_picks_the_measured_fastest_and_is_reproducible(tmp_path: Path) -> None:
    x, out = _problem()
    first = tune(row_reduce, (x, out), SUM, configs=CONFIGS, reference=_ref, store=TuneStore(tmp_path / "a"))
    assert first.source == "sweep" and first.mode == "graph" and not first.errors, first.errors
    assert all(0 < t < 100 for t in first.times_ms.values()), first.times_ms
    ind = _independent_ms(x, out)
    fastest = min(ind, key=ind.get)
    msg = f"tuner {first.times_ms}, independent {ind}"
    # The tuner's choice is the independently fastest, or within 5% of it.
    assert ind[first.best_config] <= 1.05 * ind[fastest], msg
    # (On the H200 the slowest config measured > 1.1x the fastest; on an H100 only ~1.08x,
    # so no spread is asserted: the pick must still be within 5 % of the fastest.)
    # Reproducible: a fresh sweep (new store) picks the same config whenever the
    # runner-up is not within noise (5%) of the winner.
    second = tune(row_reduce, (x, out), SUM, configs=CONFIGS, reference=_ref, store=TuneStore(tmp_path / "b"))
    ru = first.runner_up
    if ru is not None and ru[1] > 1.05 * first.best_ms:
        assert second.best_config == first.best_config, f"{msg}; repeat {second.times_ms}"
    else:
        assert second.best_config in (first.best_config, ru[0] if ru else None), f"{msg}; repeat {second.times_ms}"
    print(f"\ntuned {first.problem.describe()}: {first.summary()}\nindependent (events, L2 flushed): " + ", ".join(f"{c}: {t:.4f} ms" for c, t in ind.items()))


def test_second_tune_hits_the_store(tmp_path: Path) -> None:
    x, out = _problem()
    st = TuneStore(tmp_path)
    first = tune(row_reduce, (x, out), SUM, configs=CONFIGS, reference=_ref, store=st)
    assert first.source == "sweep" and first.timings > 0
    compiles = STATS.compiles
    t0 = time.perf_counter()
    again = tune(row_reduce, (x, out), SUM, configs=CONFIGS, reference=_ref, store=st)
    wall = time.perf_counter() - t0
    assert again.source == "cache" and again.timings == 0 and again.compiles == 0 and STATS.compiles == compiles
    assert again.best_config == first.best_config and wall < 1.0, wall
    # Another M in the same power-of-two bucket is the same problem.
    x2, out2 = _problem(m=30000)
    assert tune(row_reduce, (x2, out2), SUM, configs=CONFIGS, store=st).source == "cache"


def test_wrong_answers_score_inf(tmp_path: Path) -> None:
    x, out = _problem(m=4096)
    res = tune(row_reduce, (x, out), SUM, configs=CONFIGS[1:], reference=lambda x, out: x.float().sum(-1) + 1.0, store=TuneStore(tmp_path))
    assert all(t == float("inf") for t in res.times_ms.values())
    assert all("wrong result" in e for e in res.errors.values()), res.errors
    assert res.best_config == row_reduce.spec(row_reduce.signature.bind((x, out)), (("op", "sum"),)).config


def test_every_library_candidate_tunes(tmp_path: Path) -> None:
    """The kernel's own candidate list (compiled in workers) for bf16 and a long row."""
    x, out = _problem(m=2048, n=65536, dtype=torch.bfloat16)
    res = tune(row_reduce, (x, out), SUM, reference=_ref, store=TuneStore(tmp_path), workers=4)
    assert len(res.times_ms) >= 2 and not any(t == float("inf") for t in res.times_ms.values()), res.errors
    out.zero_()
    row_reduce.get(row_reduce.signature.bind((x, out)), (("op", "sum"),), res.best_config)(x, out)
    torch.testing.assert_close(out, _ref(x, out).to(out.dtype), rtol=2e-2, atol=2e-2)


def test_input_rotation_spans_three_l2s() -> None:
    x, out = _problem(m=1024, n=4096)  # 16 MiB: smaller than L2
    sets = make_input_sets((x, out))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert len(sets) >= 2 and sum(s[0].numel() * 4 + s[1].numel() * 4 for s in sets) >= 3 * l2
    assert all(s[0].stride() == x.stride() and torch.equal(s[0], x) for s in sets)
    big = make_input_sets(_problem())  # 512 MiB: used alone
    assert len(big) == 1


def test_graph_timer_agrees_with_events() -> None:
    x, out = _problem()
    fn = row_reduce.get(row_reduce.signature.bind((x, out)), (("op", "sum"),), CONFIGS[2])
    timer = GraphTimer()
    sets = make_input_sets((x, out))
    g = sorted(timer(CONFIGS[2], fn, sets) for _ in range(10))[5]
    assert timer.mode == "graph"
    ev = timing.bench(lambda: fn(x, out))
    assert 0.7 * ev < g < 1.3 * ev, (g, ev)


def test_tune_main_on_the_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path))
    r = tune_main("row_reduce", "32768x4096,4096x65536", "float32", workers=None, progress=False)
    assert r["mode"] == "tune" and [s["source"] for s in r["shapes"]] == ["sweep", "sweep"]
    assert all(s["best_ms"] and s["best_ms"] > 0 for s in r["shapes"])
    again = tune_main("row_reduce", "32768x4096,4096x65536", "float32", progress=False)
    assert [s["source"] for s in again["shapes"]] == ["cache", "cache"] and all(s["timings"] == 0 for s in again["shapes"])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tune_main_fans_out_over_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path))
    shapes = "32768x4096,16384x16384,4096x65536,32768x1024"
    r = tune_main("row_reduce", shapes, "float32", gpus="all", progress=False)
    assert r["gpus"] == torch.cuda.device_count() and [s["shape"] for s in r["shapes"]] == shapes.split(",")
    assert {s["gpu_index"] for s in r["shapes"]} == set(range(min(r["gpus"], 4)))
    assert all(s["source"] == "sweep" and s["best_ms"] and s["compiles"] == 0 for s in r["shapes"])  # compiled up front
    again = tune_main("row_reduce", shapes, "float32", progress=False)  # one GPU, same store
    assert all(s["source"] == "cache" for s in again["shapes"])


def test_gemm_tune_main_winner_is_what_ops_gemm_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cuteforge tune gemm_sm90_tn_col --param act=gelu`: every candidate (the heuristic's,
    stream-K splits of this sub-wave problem through the shared workspace, pingpong)
    matches the fp32 reference and is timed; ops.gemm then runs the stored winner without
    consulting the heuristic."""
    import importlib

    import torch.nn.functional as F

    from cuteforge.autotune import lookup
    from cuteforge.kernels.gemm.sm90.config import GemmConfig

    gemm_mod = importlib.import_module("cuteforge.ops.gemm")  # the package attribute is the function
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path))
    r = tune_main("gemm_sm90_tn_col", "1000x1000x1000", "bfloat16", params={"act": "gelu"}, progress=False)
    s = r["shapes"][0]
    assert s["source"] == "sweep" and not s["errors"], s["errors"]
    assert len(s["times_ms"]) >= 10 and all(t is not None and t > 0 for t in s["times_ms"].values()), s["times_ms"]
    assert any("stream_k=True" in c for c in s["times_ms"]) and any("pingpong=True" in c for c in s["times_ms"])

    torch.manual_seed(0)
    a = torch.randn(1000, 1000, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1000, 1000, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(1000, device="cuda", dtype=torch.bfloat16)
    launch = importlib.import_module("cuteforge.ops.gemm_launch")
    kern = launch.gemm_kernel(True, True, ("col",))
    stored = lookup(kern, kern.signature.bind((a.unsqueeze(0), w.t().unsqueeze(0), a.unsqueeze(0), torch.zeros(4, dtype=torch.int32, device="cuda"), bias)),
                    {"sms": torch.cuda.get_device_properties(0).multi_processor_count, "epilogue": gemm_mod.GemmEpilogue.preset("gelu", bias="col").key},
                    {"M": 1000, "N": 1000, "K": 1000})
    assert isinstance(stored, GemmConfig) and repr(stored) == s["best"]

    def no_heuristic(*args: object, **kw: object) -> None:
        raise AssertionError("ops.gemm fell back to the heuristic despite a stored tuning result")

    monkeypatch.setattr(launch, "default_config", no_heuristic)
    gemm_mod._PLANS.clear()
    got = gemm_mod.gemm(a, w.t(), bias=bias, epilogue="gelu")
    ref = F.gelu(a.float() @ w.float().t() + bias.float(), approximate="tanh")
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)
