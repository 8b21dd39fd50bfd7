"""Small and sub-wave GEMMs: configs side by side with cuBLAS under two timers, and the
kernels cuBLAS picks.

A GEMM of ~10 us is timed differently by the two timers cuteforge uses, and they can
disagree on the ranking:

* `flush`: `timing.bench` (the benchmarks' timer): L2 flushed before each call, so the
  operands come from DRAM right after a write-heavy flush kernel;
* `graph`: the autotuner's `GraphTimer`: back-to-back launches from a CUDA graph over
  rotated copies of the operands (together >= 3x L2), so the operands come from DRAM too
  but with no flush traffic in between and no launch gaps.

Per shape: cuBLAS (`a @ b`), the heuristic default and every config of `--set` (each
checked against an fp32 reference first), 3 interleaved rounds, median. With
`--cublas-kernels`, also the names and times of the kernels torch.profiler sees for
cuBLAS and for cuteforge's default (back-to-back calls on one operand set: L2-warm):
the names give cuBLAS's tile, cluster and split-K choice.

    python benchmarks/bench_gemm_small.py [--shapes 1024x1024x1024,...] [--set sub|m16] [--cublas-kernels] [--out F]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import torch

from cuteforge.autotune import GraphTimer
from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.kernels.gemm.sm90.config import GemmConfig, default_config, fit_swizzle
from cuteforge.ops.gemm import gemm
from cuteforge.timing import events as timing
from cuteforge.timing.graphs import make_input_sets

G = GemmConfig
SETS: dict[str, dict[str, GemmConfig]] = {
    # sub-wave problems with M > 128: the 128x64 tile's cluster, schedule and stages
    "sub": {
        "pp128x64_c2x1": G(tile_n=64, pingpong=True),
        "pp128x64_c1x2": G(tile_n=64, pingpong=True, cluster_m=1, cluster_n=2),
        "pp128x64_c1x1": G(tile_n=64, pingpong=True, cluster_m=1, cluster_n=1),
        "pp128x64_c2x2": G(tile_n=64, pingpong=True, cluster_m=2, cluster_n=2),
        "co128x64_c2x1": G(tile_n=64),
        "co128x64_c1x2": G(tile_n=64, cluster_m=1, cluster_n=2),
        "pp128x64_c1x2_s6": G(tile_n=64, pingpong=True, cluster_m=1, cluster_n=2, stages=6),
        "pp128x64_c1x2_s4": G(tile_n=64, pingpong=True, cluster_m=1, cluster_n=2, stages=4),
        "64x128_c1x2": G(tile_m=64, tile_n=128, cluster_m=1, cluster_n=2),
        "64x128_c2x1": G(tile_m=64, tile_n=128),
        "co128x128_c1x2": G(tile_n=128, cluster_m=1, cluster_n=2),
        "co128x128_c2x1": G(tile_n=128),
    },
    # M <= 64 (decode): 64-row tiles, narrower N tiles, split-K through stream_k
    "m16": {
        "64x64_c1x2": G(tile_m=64, tile_n=64, cluster_m=1, cluster_n=2),
        "64x64_c1x1": G(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1),
        "64x32_c1x1": G(tile_m=64, tile_n=32, cluster_m=1, cluster_n=1),
        "64x32_c1x2": G(tile_m=64, tile_n=32, cluster_m=1, cluster_n=2),
        "64x16_c1x1": G(tile_m=64, tile_n=16, cluster_m=1, cluster_n=1),
        "64x64_c1x1_sk": G(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1, stream_k=True),
        "64x128_c1x1_sk": G(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, stream_k=True),
    },
}
DEFAULT_SHAPES = {
    "sub": "1024x1024x1024,2048x1024x1024,1024x2048x2048",
    "m16": "16x4096x4096,16x14336x4096,16x4096x14336,16x4096x28672,32x2048x8192,16x8192x14336,64x4096x14336",
}


def kernel_times(a: torch.Tensor, b: torch.Tensor, reps: int = 20) -> dict[str, list[tuple[str, float]]]:
    """The CUDA kernels (name, us per call) of cuBLAS and of cuteforge's default."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for name, fn in (("cublas", lambda: a @ b), ("cuteforge", lambda: gemm(a, b))):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        out[name] = [(e.key[:200], round(e.device_time_total / reps, 2)) for e in prof.key_averages() if e.device_time_total > 0]
    return out


def one_shape(m: int, n: int, k: int, configs: dict[str, GemmConfig], cublas_kernels: bool, rounds: int = 3) -> dict[str, Any]:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    ref = a.float() @ b.float()
    calls: dict[str, Any] = {"cublas": lambda x, y: x @ y, "default": lambda x, y: gemm(x, y)}
    failed = {}
    for name, c in configs.items():
        c = fit_swizzle(c, m, n)
        try:
            out = gemm(a, b, config=c)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:  # NaN fails too
                raise AssertionError(f"rel_err {err}")
        except Exception as e:  # noqa: BLE001 - record and go on with the others
            failed[name] = f"{type(e).__name__}: {str(e)[:200]}"
            continue
        calls[name] = lambda x, y, c=c: gemm(x, y, config=c)
    graph = GraphTimer()  # one per shape: its states are keyed by the contender's name
    sets = make_input_sets((a, b))
    samples: dict[str, dict[str, list[float]]] = {nm: {"flush": [], "graph": []} for nm in calls}
    for _ in range(rounds):
        for nm, fn in calls.items():
            samples[nm]["flush"].append(timing.bench(lambda fn=fn: fn(a, b), warmup_ms=5, rep_ms=40))
            samples[nm]["graph"].append(statistics.median(graph(nm, fn, sets) for _ in range(5)))
    us = {nm: {t: round(statistics.median(v) * 1e3, 2) for t, v in by.items()} for nm, by in samples.items()}
    row: dict[str, Any] = {
        "shape": f"{m}x{n}x{k}", "default": repr(default_config(m, n, k)), "input_sets": len(sets), "us": us,
        "x_cublas": {nm: {t: round(us["cublas"][t] / us[nm][t], 3) for t in ("flush", "graph")} for nm in us},
        "failed": failed,
    }
    if cublas_kernels:
        row["kernels_l2_warm"] = kernel_times(a, b)
    return row


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--set", default="sub", choices=sorted(SETS))
    p.add_argument("--shapes", help="MxNxK,... (default: per set)")
    p.add_argument("--cublas-kernels", action="store_true")
    p.add_argument("--out")
    args = p.parse_args()
    gpu = torch.cuda.get_device_name()
    rows = []
    for s in (args.shapes or DEFAULT_SHAPES[args.set]).split(","):
        m, n, k = (int(v) for v in s.split("x"))
        row = one_shape(m, n, k, SETS[args.set], args.cublas_kernels)
        rows.append(row)
        print(row["shape"], "us flush / graph, x cuBLAS flush / graph", flush=True)
        for nm in sorted(row["us"], key=lambda x: row["us"][x]["graph"]):
            u, r = row["us"][nm], row["x_cublas"][nm]
            print(f"  {nm:18s} {u['flush']:8.2f} {u['graph']:8.2f}   {r['flush']:.3f} {r['graph']:.3f}", flush=True)
    tag = gpu.lower().replace("nvidia ", "").split()[0]
    out = Path(args.out or f"benchmarks/results/{tag}-gemm-small-{args.set}.json")
    write_results(out, {**results_header(), "rows": rows})
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
