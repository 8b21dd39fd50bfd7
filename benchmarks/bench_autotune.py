"""The autotuner's costs: parallel compilation speed-up, and tuning a few shapes.

1. Compile: the same row_reduce candidates (ops x dtypes x N x configs), each run in a
   fresh cache directory: serially in this process, then through the worker pool with
   W = 1, 2 and os.cpu_count() workers. Pool figures are given with the pool already
   started (compilation alone) and from a cold start (process start-up included).
2. Tune (GPU only): a few shapes, each swept from an empty store, then tuned again (a
   store hit: 0 compiles, 0 timings); the tuned config's time against the heuristic
   default's.

    python benchmarks/bench_autotune.py --out results/autotune.json [--jobs 96] [--no-tune]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cuteforge import STATS, arch
from cuteforge.autotune import CompileJob, CompilePool, TuneStore, tune
from cuteforge.bench.report import results_header  # noqa: E402
from cuteforge.kernels.reduce.spec import row_reduce
from cuteforge.signature import BoundKey

OPS = ("sum", "amax", "argmax")
NS = (1024, 4096, 16384, 65536)
DTYPES = (("float32", 4), ("bfloat16", 8))
TUNE_SHAPES = [(32768, 4096), (16384, 16384), (4096, 65536), (32768, 256)]


def candidate_jobs(target: str, limit: int) -> list[CompileJob]:
    jobs = []
    for op in OPS:
        for dt, vec in DTYPES:
            odt, ovec = ("int64", 2) if op == "argmax" else (dt, vec)
            for n in NS:
                key = BoundKey((dt, odt), (("N", n),), (vec, ovec))
                params = (("op", op),)
                spec = row_reduce.spec(key, params, arch=target)
                jobs += [CompileJob.of(row_reduce, key, params, c, target) for c in row_reduce.configs(spec)]
    return jobs[:limit]


def _with_cache(jobs: list[CompileJob], cache: str) -> list[CompileJob]:
    return [CompileJob(j.kernel, j.module, j.key, j.params, j.config, j.arch, cache) for j in jobs]


def bench_compile(target: str, limit: int, workers: list[int]) -> dict[str, Any]:
    jobs = candidate_jobs(target, limit)
    out: dict[str, Any] = {"jobs": len(jobs), "arch": target, "cpu_count": os.cpu_count()}
    saved = os.environ.get("CUTEFORGE_CACHE_DIR")
    with tempfile.TemporaryDirectory() as d:
        os.environ["CUTEFORGE_CACHE_DIR"] = str(Path(d) / "serial")
        before = STATS.compiles
        t0 = time.perf_counter()
        for j in jobs:
            row_reduce.compile(row_reduce.spec(j.key, j.params, j.config, arch=target))
        out["serial_s"] = round(time.perf_counter() - t0, 2)
        out["serial_compiles"] = STATS.compiles - before
        print(f"serial, in process: {len(jobs)} candidates in {out['serial_s']} s", flush=True)
        for w in workers:
            row: dict[str, Any] = {"workers": w}
            for phase in ("warm", "cold"):
                cache = str(Path(d) / f"w{w}-{phase}")
                wjobs = _with_cache(jobs, cache)
                t0 = time.perf_counter()
                with CompilePool(w, target) as pool:
                    if phase == "warm":
                        pool.warm()
                        row["startup_s"] = round(time.perf_counter() - t0, 2)
                        t0 = time.perf_counter()
                    res = pool.map(wjobs)
                    elapsed = time.perf_counter() - t0
                bad = [r.error for r in res if not r.ok]
                assert not bad, bad[:3]
                assert all(r.compiled for r in res)
                row[f"{phase}_s"] = round(elapsed, 2)
                row[f"{phase}_speedup"] = round(out["serial_s"] / elapsed, 2)
            out.setdefault("pool", []).append(row)
            print(f"W={w}: {row}", flush=True)
        if saved is None:
            os.environ.pop("CUTEFORGE_CACHE_DIR", None)
        else:
            os.environ["CUTEFORGE_CACHE_DIR"] = saved
    return out


def _events_ms(timing: Any, fn: Any, x: torch.Tensor, out: torch.Tensor) -> float:
    return timing.bench(lambda: fn(x, out))


def bench_tune(dtypes: list[torch.dtype]) -> list[dict[str, Any]]:
    from cuteforge.timing import events as timing

    rows = []
    with tempfile.TemporaryDirectory() as d:
        st = TuneStore(d)
        for dtype in dtypes:
            for m, n in TUNE_SHAPES:
                x = torch.randn(m, n, device="cuda", dtype=dtype)
                out = torch.empty(m, device="cuda", dtype=dtype)
                ref = lambda x, out: x.float().sum(-1)  # noqa: E731
                first = tune(row_reduce, (x, out), {"op": "sum"}, reference=ref, store=st, force=True)
                t0 = time.perf_counter()
                again = tune(row_reduce, (x, out), {"op": "sum"}, reference=ref, store=st)
                again_s = time.perf_counter() - t0
                key = row_reduce.signature.bind((x, out))
                default = row_reduce.spec(key, (("op", "sum"),)).config
                ms = {c: _events_ms(timing, row_reduce.get(key, (("op", "sum"),), c), x, out) for c in {default, first.best_config}}
                nbytes = x.numel() * x.element_size()
                rows.append({
                    "shape": f"{m}x{n}", "dtype": str(dtype).removeprefix("torch."),
                    "candidates": len(first.times_ms), "failed": sum(t == float("inf") for t in first.times_ms.values()),
                    "best": repr(first.best_config), "best_ms_graph": round(first.best_ms, 5),
                    "runner_up": None if first.runner_up is None else [repr(first.runner_up[0]), round(first.runner_up[1], 5)],
                    "times_ms": {repr(c): round(t, 5) for c, t in first.times_ms.items()},
                    "sweep_s": round(first.wall_s, 2), "sweep_compiles": first.compiles, "sweep_timings": first.timings, "timer": first.mode,
                    "second_s": round(again_s, 4), "second_source": again.source, "second_timings": again.timings, "second_compiles": again.compiles,
                    "default": repr(default), "default_ms_events": round(ms[default], 5), "tuned_ms_events": round(ms[first.best_config], 5),
                    "tuned_GBps": round(nbytes / (ms[first.best_config] * 1e-3) / 1e9, 1),
                    "speedup_vs_default": round(ms[default] / ms[first.best_config], 3),
                })
                print(json.dumps(rows[-1]), flush=True)
                del x, out
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--jobs", type=int, default=96, help="candidates to compile (default 96)")
    p.add_argument("--workers", default="", help="comma-separated worker counts (default: 1,2,cpu_count)")
    p.add_argument("--no-tune", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()
    target = arch.target_arch()
    workers = [int(w) for w in args.workers.split(",") if w] or sorted({1, 2, os.cpu_count() or 1})
    result: dict[str, Any] = {
        **results_header(),
        "target_arch": target,
        "cpu_count": os.cpu_count(),
    }
    if not args.no_compile:
        result["compile"] = bench_compile(target, args.jobs, workers)
    if not args.no_tune and not arch.compile_only():
        result["tune"] = bench_tune([torch.float32, torch.bfloat16])
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
