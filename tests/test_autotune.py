"""The autotuner on the CPU: candidates, GPU-blind parallel compilation, the result store,
CUTEFORGE_AUTOTUNE, failure scoring. Timing is a fake timer injected into `tune`; the
kernels are real and compile for sm_90a in worker processes."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from kernels_for_tests import scale_jit

import cuteforge
from cuteforge import STATS, Signature, TensorArg
from cuteforge.autotune import (
    CompileJob,
    CompilePool,
    TuneStore,
    compile_all,
    lookup,
    make_problem,
    precompile_candidates,
    register_validator,
    tune,
)
from cuteforge.autotune import store as store_mod
from cuteforge.kernel import Kernel
from cuteforge.kernels.reduce.row import RowReduceConfig as C
from cuteforge.kernels.reduce.spec import row_reduce
from cuteforge.signature import BoundKey
from cuteforge.tune_cli import parse_shapes, tune_main

ARCH = "sm_90a"
KEY = BoundKey(("float32", "float32"), (("N", 4096),), (4, 4))
SUM = (("op", "sum"),)
# Three clearly different valid configs for N=4096 fp32, and three invalid ones.
GOOD = [C(256, 256, 4), C(512, 512, 2), C(1024, 1024, 1)]
BAD = [C(48, 32, 1), C(256, 256, 4, cluster_n=16), C(256, 256, 99)]


# --- a user kernel whose compile fails for one config ---------------------------------


@dataclass(frozen=True)
class ProbeConfig:
    threads: int = 128
    fail: bool = False


@cuteforge.kernel(
    name="autotune_probe",
    signature=Signature(TensorArg("x", ("M",)), TensorArg("y", ("M",), dtype_like="x")),
    default_config=lambda spec: ProbeConfig(),
)
def probe(spec: cuteforge.CompileSpec):
    if spec.config.fail:
        raise RuntimeError("probe: this config does not compile")
    return scale_jit(spec.config.threads, 2.0)


def _probe_validate(spec, c: ProbeConfig) -> None:
    if c.threads % 32:
        raise ValueError(f"threads={c.threads} is not a multiple of 32")


register_validator("autotune_probe", _probe_validate)
PROBE_KEY = BoundKey(("float32", "float32"), (), (4, 4))


class FakeTimer:
    """ms per config from a table; counts calls; raises for configs in `broken`."""

    def __init__(self, table: dict, broken: tuple = ()) -> None:
        self.table, self.broken, self.calls = dict(table), set(broken), 0

    def __call__(self, config, fn, input_sets) -> float:
        self.calls += 1
        if config in self.broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (fake)")
        return self.table[config]


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory):
    """A module-wide kernel cache, filled once by a compile-only run with 2 workers."""
    root = tmp_path_factory.mktemp("autotune-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUTEFORGE_CACHE_DIR", str(root))
        before = STATS.compiles
        t0 = time.perf_counter()
        rows = precompile_candidates(row_reduce, KEY, SUM, configs=GOOD + BAD, workers=2, arch=ARCH)
        yield {"root": root, "rows": rows, "parent_compiles": STATS.compiles - before, "s": time.perf_counter() - t0}


def _objects(root: Path) -> list[Path]:
    return sorted(root.glob("*/row_reduce/*.o"))


def test_compile_only_workers_write_l2_then_parent_only_loads(warm) -> None:
    rows = warm["rows"]
    by_status = {s: [r for r in rows if r["status"] == s] for s in ("compiled", "loaded", "invalid", "failed")}
    assert len(by_status["compiled"]) == len(GOOD) and not by_status["failed"] and not by_status["loaded"]
    assert len(by_status["invalid"]) == len(BAD)
    assert warm["parent_compiles"] == 0  # the workers compiled; the parent only loaded
    assert len(_objects(warm["root"])) == len(GOOD)
    before = STATS.compiles
    again = precompile_candidates(row_reduce, KEY, SUM, configs=GOOD, workers=2, arch=ARCH)
    assert [r["status"] for r in again] == ["loaded"] * len(GOOD)
    assert STATS.compiles == before and len(_objects(warm["root"])) == len(GOOD)


def test_invalid_configs_never_reach_the_compiler(warm, monkeypatch: pytest.MonkeyPatch, caplog, tmp_path: Path) -> None:
    seen: list = []
    real = Kernel.compile

    def spy(self, spec):
        seen.append(spec.config)
        return real(self, spec)

    monkeypatch.setattr(Kernel, "compile", spy)
    monkeypatch.setattr(CompilePool, "submit", lambda self, job: pytest.fail(f"nothing should compile, got {job}"))
    caplog.set_level(logging.INFO, logger="cuteforge")
    timer = FakeTimer({GOOD[0]: 2.0, GOOD[1]: 1.0, GOOD[2]: 3.0})
    res = tune(row_reduce, None, SUM, key=KEY, dims={"M": 4096}, configs=GOOD + BAD, timer=timer, store=TuneStore(tmp_path))
    assert not set(seen) & set(BAD) and set(seen) == set(GOOD)
    assert set(res.times_ms) == set(GOOD) and res.best_config == GOOD[1]
    for c in BAD:
        assert res.errors[c].startswith("invalid:")
        assert any("dropped" in r.getMessage() and repr(c) in r.getMessage() for r in caplog.records)


def test_pool_speedup_two_workers(tmp_path: Path, record_property) -> None:
    """W=2 against W=1 on the same 8 candidates, each pool started before the clock."""
    jobs = []
    for n in (8192, 16384):
        key = BoundKey(("float32", "float32"), (("N", n),), (4, 4))
        spec = row_reduce.spec(key, SUM, arch=ARCH)
        jobs += [CompileJob.of(row_reduce, key, SUM, c, ARCH) for c in row_reduce.configs(spec)[:4]]
    figures, outcomes = {}, {}
    for w in (1, 2):
        cache = str(tmp_path / f"w{w}")
        wjobs = [CompileJob(j.kernel, j.module, j.key, j.params, j.config, j.arch, cache) for j in jobs]
        with CompilePool(w, ARCH) as pool:
            assert pool.warm() == w
            t0 = time.perf_counter()
            outcomes[w] = pool.map(wjobs)
            figures[w] = time.perf_counter() - t0
    assert all(o.ok and o.compiled for w in (1, 2) for o in outcomes[w])
    # Parallel for real: two worker processes, and some of their jobs overlapped in time.
    two = outcomes[2]
    assert len({o.pid for o in two}) == 2
    assert any(a.pid != b.pid and a.started < b.ended and b.started < a.ended for a in two for b in two)
    speedup = figures[1] / figures[2]
    record_property("compile_speedup_w2", round(speedup, 2))
    print(f"\ncompile {len(jobs)} candidates: W=1 {figures[1]:.2f} s, W=2 {figures[2]:.2f} s, speed-up {speedup:.2f}x (os.cpu_count()={os.cpu_count()})")
    if os.environ.get("CUTEFORGE_ASSERT_SPEEDUP") == "1":
        assert speedup > 1.3


def test_store_keying(tmp_path: Path) -> None:
    st = TuneStore(tmp_path)
    p = make_problem(row_reduce, KEY, SUM, {"M": 30000}, ARCH)
    times = {GOOD[0]: 0.3, GOOD[1]: 0.2}
    st.save(row_reduce, p, times, {}, GOOD[1], gpu="NVIDIA H200", dsl="4.8.1")
    assert st.load(row_reduce, p, gpu="NVIDIA H200", dsl="4.8.1")["best"] == repr(GOOD[1])
    # M is bucketed to a power of two: 30000 and 32768 are one problem, 40000 another.
    same = make_problem(row_reduce, KEY, SUM, {"M": 32768}, ARCH)
    assert st.load(row_reduce, same, gpu="NVIDIA H200", dsl="4.8.1") is not None
    misses = [
        (make_problem(row_reduce, KEY, SUM, {"M": 40000}, ARCH), "NVIDIA H200", "4.8.1"),
        (make_problem(row_reduce, KEY, (("op", "amax"),), {"M": 30000}, ARCH), "NVIDIA H200", "4.8.1"),
        (make_problem(row_reduce, BoundKey(("float32", "float32"), (("N", 8192),), (4, 4)), SUM, {"M": 30000}, ARCH), "NVIDIA H200", "4.8.1"),
        (make_problem(row_reduce, KEY, SUM, {"M": 30000}, "sm_100a"), "NVIDIA H200", "4.8.1"),
        (p, "NVIDIA H100 80GB HBM3", "4.8.1"),
        (p, "NVIDIA H200", "4.9.0"),
    ]
    for prob, gpu, dsl in misses:
        assert st.load(row_reduce, prob, gpu=gpu, dsl=dsl) is None, (prob, gpu, dsl)
    # A kernel-specific bucketing: exact M.
    exact = make_problem(row_reduce, KEY, SUM, {"M": 30000}, ARCH, bucket=lambda d: d)
    assert exact.dims == (("M", 30000),) and st.load(row_reduce, exact, gpu="NVIDIA H200", dsl="4.8.1") is None
    # A damaged or foreign file is a miss, never an error.
    path = Path(st.path(st.identity(row_reduce, p, "NVIDIA H200", "4.8.1")))
    path.write_text("{not json")
    assert st.load(row_reduce, p, gpu="NVIDIA H200", dsl="4.8.1") is None


def test_second_tune_hits_the_store(warm, tmp_path: Path, caplog, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.INFO, logger="cuteforge")
    st = TuneStore(tmp_path)
    timer = FakeTimer({GOOD[0]: 2.0, GOOD[1]: 1.0, GOOD[2]: 1.5})
    first = tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD, timer=timer, store=st, rounds=5)
    assert first.source == "sweep" and first.best_config == GOOD[1] and first.runner_up == (GOOD[2], 1.5)
    assert timer.calls == len(GOOD) * 6  # a warm-up sample + 5 interleaved rounds each
    sweep_logs = [r.getMessage() for r in caplog.records if "swept" in r.getMessage()]
    assert sweep_logs and "best" in sweep_logs[-1] and "runner-up" in sweep_logs[-1] and repr(GOOD[1]) in sweep_logs[-1]
    rec = json.loads(Path(first.path).read_text())
    assert rec["best"] == repr(GOOD[1]) and rec["times_ms"][repr(GOOD[0])] == 2.0
    assert rec["identity"]["dsl"] == "4.8.1" and rec["identity"]["gpu"]

    calls, compiles = timer.calls, STATS.compiles
    monkeypatch.setattr(CompilePool, "submit", lambda self, job: pytest.fail("a cache hit must not compile"))
    t0 = time.perf_counter()
    second = tune(row_reduce, None, SUM, key=KEY, dims={"M": 20000}, configs=GOOD, timer=timer, store=st)
    assert time.perf_counter() - t0 < 1.0
    assert second.source == "cache" and second.best_config == GOOD[1]
    assert second.compiles == 0 and second.timings == 0 and timer.calls == calls and STATS.compiles == compiles
    assert any("cache hit" in r.getMessage() and "runner-up" in r.getMessage() for r in caplog.records)
    # A subset of the swept configs is answered from the record too; a new config is not.
    assert tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD[::2], timer=timer, store=st).best_config == GOOD[2]
    assert timer.calls == calls
    # The dispatch-side query: the stored best (rebuilt from JSON), or None.
    assert lookup(row_reduce, KEY, SUM, {"M": 17000}, store=st) == GOOD[1]
    assert lookup(row_reduce, KEY, SUM, {"M": 70000}, store=st) is None
    # A record whose config this version's validate rejects (written by another version)
    # is not handed to the op: the op's heuristic decides instead of a failed compile.
    stale = dict(rec, best_config={**rec["best_config"], "fields": {**rec["best_config"]["fields"], "threads_per_row": 48}})
    Path(first.path).write_text(json.dumps(stale))
    assert lookup(row_reduce, KEY, SUM, {"M": 17000}, store=st) is None
    assert any("no longer validates" in r.getMessage() for r in caplog.records)
    Path(first.path).write_text(json.dumps(rec))
    monkeypatch.setenv("CUTEFORGE_AUTOTUNE", "off")
    assert lookup(row_reduce, KEY, SUM, {"M": 17000}, store=st) is None


def test_autotune_env_off_and_force(warm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = TuneStore(tmp_path)
    timer = FakeTimer({GOOD[0]: 2.0, GOOD[1]: 1.0, GOOD[2]: 3.0})
    monkeypatch.setenv("CUTEFORGE_AUTOTUNE", "off")
    off = tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD, timer=timer, store=st)
    assert off.source == "off" and timer.calls == 0 and not list(tmp_path.rglob("*.json"))
    assert off.best_config == row_reduce.spec(KEY, SUM, arch=ARCH).config  # the heuristic default

    monkeypatch.delenv("CUTEFORGE_AUTOTUNE")
    assert tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD, timer=timer, store=st).best_config == GOOD[1]
    # The GPU changed its mind: without force the record answers, with force it is re-measured.
    timer.table = {GOOD[0]: 0.5, GOOD[1]: 1.0, GOOD[2]: 3.0}
    assert tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD, timer=timer, store=st).source == "cache"
    monkeypatch.setenv("CUTEFORGE_AUTOTUNE", "force")
    forced = tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD, timer=timer, store=st)
    assert forced.source == "sweep" and forced.best_config == GOOD[0]
    monkeypatch.delenv("CUTEFORGE_AUTOTUNE")
    hit = tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD, timer=timer, store=st)
    assert hit.source == "cache" and hit.best_config == GOOD[0]
    assert tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD, timer=timer, store=st, force=True).source == "sweep"


def test_default_store_lives_under_the_cache_root(warm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "gpu_name", lambda: "Fake GPU")
    res = tune(row_reduce, None, SUM, key=KEY, dims={"M": 512}, configs=GOOD, timer=FakeTimer(dict.fromkeys(GOOD, 1.0)), force=True)
    assert Path(res.path).is_relative_to(warm["root"] / "autotune")
    assert json.loads(Path(res.path).read_text())["identity"]["gpu"] == "Fake GPU"


def test_launch_failure_scores_inf_with_reason(warm, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="cuteforge")
    timer = FakeTimer({GOOD[0]: 2.0, GOOD[1]: 1.0, GOOD[2]: 3.0}, broken=(GOOD[1],))
    res = tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD, timer=timer, store=TuneStore(tmp_path))
    assert res.times_ms[GOOD[1]] == float("inf") and "illegal memory access" in res.errors[GOOD[1]]
    assert res.best_config == GOOD[0]
    assert any("scores inf" in r.getMessage() and "illegal memory access" in r.getMessage() for r in caplog.records)
    rec = json.loads(Path(res.path).read_text())
    assert rec["times_ms"][repr(GOOD[1])] is None and "illegal" in rec["errors"][repr(GOOD[1])]


def test_compile_failure_scores_inf_in_process_and_in_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path / "cache"))
    good, bad, odd = ProbeConfig(64), ProbeConfig(128, fail=True), ProbeConfig(100)
    for workers, cfgs in ((0, [good, bad, odd]), (2, [ProbeConfig(256), bad, ProbeConfig(512)])):
        timer = FakeTimer(dict.fromkeys(cfgs, 1.0))
        timer.table[cfgs[0]] = 0.5
        res = tune(probe, None, key=PROBE_KEY, dims={"M": 1 << 20}, configs=cfgs, timer=timer, workers=workers, store=TuneStore(tmp_path / f"s{workers}"))
        assert res.times_ms[bad] == float("inf") and "compile failed" in res.errors[bad] and "does not compile" in res.errors[bad], res.errors
        assert res.best_config == cfgs[0]
        if workers == 0:
            assert res.errors[odd].startswith("invalid:") and odd not in res.times_ms
        else:
            assert res.compiles == 2  # the two good ones, in the workers


def test_compile_all_reports_worker_errors(tmp_path: Path) -> None:
    job = CompileJob("no_such_kernel", "cuteforge.kernels.reduce.spec", KEY, SUM, GOOD[0], ARCH, str(tmp_path))
    (out,) = compile_all([job], workers=1)
    assert not out.ok and "no_such_kernel" in out.error and out.status == "failed"


def test_tune_main_compile_only(warm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTEFORGE_ARCH", ARCH)
    monkeypatch.setenv("CUTE_DSL_ARCH", ARCH)
    r = tune_main("row_reduce", ["32768x4096,16x4096"], "float32", workers=2, compile_only=True, arch=ARCH, progress=False)
    assert r["mode"] == "compile-only" and [s["shape"] for s in r["shapes"]] == ["32768x4096", "16x4096"]
    cands = row_reduce.configs(row_reduce.spec(KEY, SUM, arch=ARCH))
    fresh = [c for c in cands if c not in GOOD]  # the module fixture compiled GOOD already
    assert r["failed"] == 0 and r["compiled"] == 2 * len(fresh) and r["loaded"] == 2 * (len(cands) - len(fresh))
    for s in r["shapes"]:  # one compile key serves both shapes: the rows agree
        assert [c["config"] for c in s["candidates"]] == [repr(c) for c in cands]
        assert all(c["status"] == ("compiled" if eval(c["config"], {"RowReduceConfig": C}) in fresh else "loaded") for c in s["candidates"])
    again = tune_main("row_reduce", "32768x4096,16x4096", "float32", workers=2, compile_only=True, arch=ARCH, progress=False)
    assert again["compiled"] == 0 and again["loaded"] == 2 * len(cands)


def test_parse_shapes() -> None:
    assert parse_shapes("32768x4096, 4096x65536") == [(32768, 4096), (4096, 65536)]
    assert parse_shapes(["8x16", "1x2,3x4"]) == [(8, 16), (1, 2), (3, 4)]
    for bad in ("", "8xq", "0x16"):
        with pytest.raises(ValueError):
            parse_shapes(bad)


def test_heuristic_default_kept_within_margin(warm, tmp_path: Path) -> None:
    """The kernel's default (GOOD[0] for this key) stays unless another config beats it by
    more than keep_default (2 %): the sweep and a later store hit choose alike."""
    from cuteforge.autotune.tuner import pick

    assert row_reduce.spec(KEY, SUM, arch=ARCH).config == GOOD[0]
    close = FakeTimer({GOOD[0]: 1.015, GOOD[1]: 1.0, GOOD[2]: 1.5})
    st = TuneStore(tmp_path)
    res = tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD, timer=close, store=st, rounds=3)
    assert res.best_config == GOOD[0] and res.runner_up == (GOOD[1], 1.0)
    hit = tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD, timer=close, store=st)
    assert hit.source == "cache" and hit.best_config == GOOD[0]
    fastest = tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD, timer=close, store=False, keep_default=0.0)
    assert fastest.best_config == GOOD[1]
    far = FakeTimer({GOOD[0]: 1.03, GOOD[1]: 1.0, GOOD[2]: 1.5})
    assert tune(row_reduce, None, SUM, key=KEY, dims={"M": 32768}, configs=GOOD, timer=far, store=False).best_config == GOOD[1]
    assert pick({GOOD[1]: 1.0, GOOD[2]: float("inf")}, GOOD[0]) == GOOD[1]  # the default untimed
    assert pick({GOOD[0]: float("inf"), GOOD[1]: 1.0}, GOOD[0]) == GOOD[1]  # the default failed
