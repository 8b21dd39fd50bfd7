"""The same GEMMs under the two timers cuteforge uses: `timing.bench` (benchmarks: L2
flushed before each call, median of the calls) and the autotuner's `GraphTimer`
(back-to-back launches replayed from a CUDA graph). cuBLAS, the cooperative 128x256 c2x1
stream-K tile and the pingpong 128x128 c1x2 tile, plain and with bias + gelu (cuBLAS:
addmm, then eager gelu), 3 interleaved rounds, median ms and ratios to cuBLAS per timer.

    python benchmarks/bench_gemm_timers.py [--shapes 8192x8192x8192,4096x4096x4096] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cuteforge.autotune import GraphTimer
from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.kernels.gemm.sm90.config import GemmConfig, fit_swizzle
from cuteforge.ops.gemm import gemm
from cuteforge.timing import events as timing


def one_shape(m: int, n: int, k: int, rounds: int = 3) -> dict[str, Any]:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    coop = fit_swizzle(GemmConfig(stream_k=True), m, n)
    coop_f = fit_swizzle(GemmConfig(stream_k=True, epi_n=64), m, n)
    pp = fit_swizzle(GemmConfig(tile_n=128, pingpong=True, cluster_m=1, cluster_n=2), m, n)
    fns = {
        "cublas": lambda: a @ b,
        "coop": lambda: gemm(a, b, config=coop),
        "pp_c12": lambda: gemm(a, b, config=pp),
        "cublas+gelu": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
        "coop_gelu": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=coop_f),
        "pp_c12_gelu": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=pp),
    }
    graph = GraphTimer()
    samples: dict[str, dict[str, list[float]]] = {name: {"flush": [], "graph": []} for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name]["flush"].append(timing.bench(fn, warmup_ms=10, rep_ms=60))
            samples[name]["graph"].append(statistics.median(graph(name, lambda *_, fn=fn: fn(), [()]) for _ in range(5)))
    ms = {name: {t: round(statistics.median(v), 4) for t, v in by.items()} for name, by in samples.items()}
    ratios = {}
    for t in ("flush", "graph"):
        ratios[t] = {name: round(ms["cublas"][t] / ms[name][t], 3) for name in ("coop", "pp_c12")}
        ratios[t].update({name: round(ms["cublas+gelu"][t] / ms[name][t], 3) for name in ("coop_gelu", "pp_c12_gelu")})
    return {"shape": f"{m}x{n}x{k}", "ms": ms, "vs_cublas": ratios}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="8192x8192x8192,4096x4096x4096,2048x8192x28672")
    p.add_argument("--out")
    args = p.parse_args()
    gpu = torch.cuda.get_device_name()
    rows = []
    for s in args.shapes.split(","):
        m, n, k = (int(v) for v in s.split("x"))
        rows.append(one_shape(m, n, k))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out or f"benchmarks/results/{gpu.lower().replace('nvidia ', '').split()[0]}-gemm-timers.json")
    write_results(out, {**results_header(), "rows": rows})
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
