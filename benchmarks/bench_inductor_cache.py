"""A second process compiling the same model: torch.compile(mode="max-autotune") with and
without `cuteforge.inductor.enable()`, warm caches both.

    python benchmarks/bench_inductor_cache.py --out $OUT/h200-inductor-cache.json [--d 1024 --shape 8x2048]

Each contender (stock, cuteforge) gets its own fresh Inductor cache directory
(TORCHINDUCTOR_CACHE_DIR, which holds the FX graph, autotuning and Triton caches), its own
Python bytecode cache (PYTHONPYCACHEPREFIX) and, for cuteforge, its own fresh kernel cache
(CUTEFORGE_CACHE_DIR). Every measurement is a fresh
Python process (this script with `--child`) that builds bench_inductor.py's transformer
block (no grad), then times `torch.compile` and the first call up to its result (GPU
synchronized): `compile_s`. The first process of each contender fills its caches (cold);
the later ones, interleaved stock / cuteforge, find them warm. The bar: the median warm
`compile_s` with cuteforge <= 1.2x stock's. Each row also carries Inductor's FX graph
cache counters (hit / miss / bypass) of that process, which say whether the warm compile
was served from the cache. GEMM backends are limited to ATEN,TRITON, as in bench_inductor.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONTENDERS = ("stock", "cuteforge")


def child(contender: str, d: int, batch: int, seq: int) -> dict[str, Any]:
    """One process's compile of the block: its compile seconds and cache counters."""
    import torch
    from bench_inductor import Block
    from torch._dynamo.utils import counters
    from torch._inductor import config

    torch.manual_seed(0)
    model = Block(d, max(1, d // 128), 4 * d).to("cuda", torch.bfloat16).eval()
    x = torch.randn(batch, seq, d, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if contender == "cuteforge":
        import cuteforge.inductor as ci

        assert ci.enable(), "cuteforge.inductor.enable() refused on this torch"
    compiled = torch.compile(model, mode="max-autotune")
    with torch.no_grad(), config.patch(max_autotune_gemm_backends="ATEN,TRITON"):
        y = compiled(x)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        err = (y.float() - model(x).float()).abs().max().item()
    fx = {k.removeprefix("fxgraph_cache_"): v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
    return {"contender": contender, "compile_s": round(seconds, 3), "fxgraph_cache": fx, "max_err": err}


def _run_child(contender: str, args: argparse.Namespace, caches: Path) -> dict[str, Any]:
    # the Python bytecode cache too, written even where PYTHONDONTWRITEBYTECODE is set or
    # site-packages is read-only: else every process compiles torch's sources again (8 s
    # of one warm process on an H200 host)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
           "TORCHINDUCTOR_CACHE_DIR": str(caches / contender / "inductor"),
           "CUTEFORGE_CACHE_DIR": str(caches / contender / "cuteforge"),
           "PYTHONPYCACHEPREFIX": str(caches / contender / "pycache")}
    cmd = [sys.executable, __file__, "--child", contender, "--d", str(args.d), "--shape", args.shape]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{contender} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["process_s"] = round(wall, 3)
    return row


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--d", type=int, default=1024, help="model width")
    p.add_argument("--shape", default="8x2048", help="batch x sequence")
    p.add_argument("--warm", type=int, default=3, help="warm processes per contender")
    p.add_argument("--timeout", type=int, default=400, help="seconds a child process may take")
    p.add_argument("--out")
    p.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = p.parse_args()
    batch, seq = (int(v) for v in args.shape.split("x"))
    if args.child:
        print(json.dumps(child(args.child, args.d, batch, seq)))
        return 0

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cf-inductor-cache-") as tmp:
        caches = Path(tmp)
        for contender in CONTENDERS:
            (caches / contender / "cuteforge").mkdir(parents=True, mode=0o700)
        for i in range(1 + args.warm):
            for contender in CONTENDERS:
                row = {"process": i, "cache": "cold" if i == 0 else "warm", **_run_child(contender, args, caches)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    warm = {c: statistics.median(r["compile_s"] for r in rows if r["contender"] == c and r["cache"] == "warm")
            for c in CONTENDERS}
    ratio = warm["cuteforge"] / warm["stock"]
    summary = {"warm_compile_s_stock": warm["stock"], "warm_compile_s_cuteforge": warm["cuteforge"],
               "cuteforge_over_stock": round(ratio, 3), "bar": 1.2, "bar_met": ratio <= 1.2,
               "warm_fx_bypasses": sum(r["fxgraph_cache"].get("bypass", 0) for r in rows if r["cache"] == "warm")}
    print(json.dumps(summary), flush=True)
    if args.out:
        from cuteforge.bench.report import results_header, write_results

        write_results(args.out, {**results_header(), "model": {"d": args.d, "batch": batch, "seq": seq},
                                 "summary": summary, "processes": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
