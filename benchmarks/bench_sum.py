"""Row sum: cuteforge vs torch.sum vs torch.compile, same run, same inputs.

Writes benchmarks/results/<gpu>-sum.json (or --out) with the command that produced it:
  - bandwidth (GB/s, % of device copy) per shape and dtype;
  - host time of a cached call on a 1024-element input (median of 10k calls) against
    torch.sum and torch.mul;
  - each candidate config's bandwidth at the bar shapes (what the default should be);
  - cold compile vs L2 load time of the same kernels in a fresh process.

Run on a GPU machine:  python benchmarks/bench_sum.py [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import cuteforge.ops as ops
from cuteforge.bench.library import measure_shapes
from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.kernels.reduce.spec import row_reduce
from cuteforge.timing import events as timing

BAR_SHAPES = [(32768, 4096), (16384, 16384), (4096, 65536)]
EXTRA_SHAPES = [(32768, 256), (32768, 1024), (65536, 2048), (1024, 262144), (8, 262144), (1, 4096)]


def host_overhead() -> dict[str, float]:
    x = torch.randn(1, 1024, device="cuda")
    y = torch.randn(1024, device="cuda")
    return {
        "cuteforge_sum_us": round(timing.host_us(lambda: ops.sum(x)), 2),
        "torch_sum_us": round(timing.host_us(lambda: torch.sum(x, dim=-1)), 2),
        "torch_mul_us": round(timing.host_us(lambda: torch.mul(y, y)), 2),
    }


def config_sweep(shapes: list[tuple[int, int]], dtype: torch.dtype, copy_bps: float) -> list[dict]:
    rows = []
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        out = torch.empty(m, device="cuda", dtype=dtype)
        key = row_reduce.signature.bind((x, out))
        spec = row_reduce.spec(key, (("op", "sum"),))
        ref = x.double().sum(-1)
        for cfg in row_reduce.configs(spec):
            try:
                fn = row_reduce.get(key, (("op", "sum"),), cfg)
                fn(x, out)
                # the sum rounded to the output dtype: bf16 / fp16 keep 8 / 11 bits
                rtol = {torch.float32: 1e-3, torch.float16: 2e-3}.get(dtype, 8e-3)
                ok = bool(torch.allclose(out.double(), ref, rtol=rtol, atol=1e-2 * n**0.5))
                ms = timing.bench(lambda fn=fn, x=x, out=out: fn(x, out))
                gbps = (x.numel() * x.element_size() + m * out.element_size()) / (ms * 1e-3)
                rows.append({"M": m, "N": n, "dtype": str(dtype)[6:], "config": repr(cfg), "default": cfg == spec.config,
                             "correct": ok, "us": round(ms * 1e3, 2), "GBps": round(gbps / 1e9, 1), "pct_copy": round(100 * gbps / copy_bps, 1)})
            except Exception as e:  # a failing config is a finding, not a crash
                rows.append({"M": m, "N": n, "config": repr(cfg), "error": f"{type(e).__name__}: {str(e)[:300]}"})
        del x, out
    return rows


def cold_vs_warm() -> dict:
    """Compile kernels in a fresh process on an empty cache dir, then load them in another.

    Per-kernel figures time each first call of a new N on its own (compile or load, plus
    the launch); the warm median excludes nothing: the DSL runtime is imported up front.
    """
    code = (
        "import time, json, statistics, torch, cuteforge, cuteforge.ops as ops;"
        "import cutlass.cute;"
        "xs=[torch.randn(64,n,device='cuda') for n in (1000,3000,4096,5000,16384,20000,65536,70000)];"
        "ts=[];\n"
        "for x in xs:\n"
        " t=time.perf_counter(); ops.sum(x); torch.cuda.synchronize(); ts.append((time.perf_counter()-t)*1e3)\n"
        "s=cuteforge.cache_stats(); print(json.dumps({'ms': ts, **s}))"
    )
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, CUTEFORGE_CACHE_DIR=d)
        out = {}
        for phase in ("cold", "warm"):
            r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            out[phase] = json.loads(r.stdout.strip().splitlines()[-1])
    import statistics

    return {
        "kernels": len(out["cold"]["ms"]),
        "cold_first_call_ms_median": round(statistics.median(out["cold"]["ms"]), 2),
        "warm_first_call_ms_median": round(statistics.median(out["warm"]["ms"]), 2),
        "warm_first_call_ms": [round(v, 2) for v in out["warm"]["ms"]],
        "cold": {k: out["cold"][k] for k in ("compiles", "l2_loads", "compile_ms")},
        "warm": {k: out["warm"][k] for k in ("compiles", "l2_loads", "load_ms")},
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out")
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--sweep-dtypes", default="float32",
                   help="comma-separated dtypes whose candidate configs the sweep times (float32, bfloat16, float16)")
    p.add_argument("--skip-cache", action="store_true", help="leave out the cold / warm compile-cache timing")
    p.add_argument("--flush", choices=timing.FLUSH_MODES, default="zero",
                   help="L2 flush before each timed call (cuteforge.timing.FLUSH_MODES)")
    args = p.parse_args()
    timing.set_flush_mode(args.flush)
    gpu = torch.cuda.get_device_name()
    t0 = time.time()
    copy_bps = timing.copy_bandwidth()
    result = {
        **results_header(),
        "copy_GBps": round(copy_bps / 1e9, 1),
        "flush": args.flush,
        "host_overhead": host_overhead(),
    }
    shapes = BAR_SHAPES + ([] if args.quick else EXTRA_SHAPES)
    result["sum"] = []
    for dtype in (torch.float32, torch.bfloat16):
        result["sum"] += measure_shapes("sum", shapes, dtype, copy_bps, compiled=True)
    if not args.skip_sweep:
        result["config_sweep"] = []
        for name in args.sweep_dtypes.split(","):
            result["config_sweep"] += config_sweep(BAR_SHAPES + [(8, 262144), (256, 65536)], getattr(torch, name), copy_bps)
    if not args.skip_cache:
        result["compile_cache"] = cold_vs_warm()
    result["seconds"] = round(time.time() - t0, 1)
    name = gpu.lower().replace("nvidia ", "").replace(" ", "-")
    out = Path(args.out or Path(__file__).parent / "results" / f"{name}-sum.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_results(out, result)
    print(json.dumps({k: result.get(k) for k in ("gpu", "copy_GBps", "host_overhead", "compile_cache")}, indent=1))
    for r in result["sum"]:
        print(f"{r['dtype']:9s} {r['M']:6d} x {r['N']:6d}  ok={r['correct']}  cuteforge {r['cuteforge_GBps']:7.0f} GB/s "
              f"({r['cuteforge_pct_copy']:5.1f}%)  torch {r['torch_GBps']:7.0f}  compile {r['torch.compile_GBps']:7.0f}")
    for r in result.get("config_sweep", []):
        print("sweep", r)
    print("wrote", out)


if __name__ == "__main__":
    main()
