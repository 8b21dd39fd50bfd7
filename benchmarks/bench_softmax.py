"""Softmax / log_softmax, forward and backward: cuteforge vs torch eager vs torch.compile
vs quack, one process, same inputs, bf16 and fp32.

Bandwidth counts the bytes each kernel must move (forward: read x, write y; backward:
read y and dy, write dx) and is compared with a device-to-device copy measured in the
same run (cuteforge.timing.events.copy_bandwidth). Times are medians of L2-flushed CUDA-event
timings (cuteforge.timing.events.bench). quack is timed through its kernels' entry points
(quack.softmax.softmax_fwd / softmax_bwd; quack has no log_softmax).

Writes benchmarks/results/<gpu>-softmax.json (or --out) with the command line, the
per-shape figures, the bar checks and (with --sweep) every candidate config's bandwidth.

Run on a GPU machine:  python benchmarks/bench_softmax.py [--quick] [--sweep] [--compile-ns 4096,16384] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

import cuteforge.ops as ops
from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.timing import events as timing

sm = importlib.import_module("cuteforge.ops.softmax")  # ops.softmax is the function

NS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
QUICK_NS = [256, 1024, 4096, 16384, 65536, 262144]
MAX_TENSOR_BYTES = 1 << 29  # rows = min(32768, what keeps one tensor <= 512 MiB)
BAR_SHAPES = [(32768, 4096), (16384, 16384), (4096, 65536)]  # the anchors' shapes


def rows_for(n: int, dtype: torch.dtype) -> int:
    return max(1, min(32768, MAX_TENSOR_BYTES // (n * dtype.itemsize)))


def _quack() -> Any:
    try:
        qs = importlib.import_module("quack.softmax")  # quack.softmax is also a function name

        return qs
    except Exception as e:  # reported in the JSON, never fatal
        print("quack unavailable:", e)
        return None


def _time(fn, nbytes: int, copy_bps: float, rep_ms: float = 50.0) -> dict[str, float]:
    try:
        ms = timing.bench(fn, warmup_ms=10, rep_ms=rep_ms)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    bps = nbytes / (ms * 1e-3)
    return {"us": round(ms * 1e3, 2), "GBps": round(bps / 1e9, 1), "pct_copy": round(100 * bps / copy_bps, 1)}


def _bwd_fns(mode: str):
    if mode == "softmax":
        return sm.softmax_backward, torch._softmax_backward_data
    return sm.log_softmax_backward, torch._log_softmax_backward_data


def _inputs(m: int, n: int, dtype: torch.dtype, mode: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    return x, dy, getattr(ops, mode)(x)


def measure(mode: str, m: int, n: int, dtype: torch.dtype, copy_bps: float, qs: Any) -> dict[str, Any]:
    """cuteforge, torch and quack at one shape (torch.compile is added later: add_compiled)."""
    x, dy, y = _inputs(m, n, dtype, mode)
    ref_fn = getattr(torch, mode)
    ours = getattr(ops, mode)
    ours_bwd, bwd_torch = _bwd_fns(mode)
    row: dict[str, Any] = {"mode": mode, "M": m, "N": n, "dtype": str(dtype).removeprefix("torch.")}
    y_ref = ref_fn(x.float(), dim=-1)
    row["max_abs_err"] = float((y.float() - y_ref).abs().amax())
    dx_ref = bwd_torch(dy.float(), y.float(), -1, torch.float32)
    row["bwd_max_abs_err"] = float((ours_bwd(dy, y).float() - dx_ref).abs().amax())
    fwd_bytes = 2 * x.numel() * x.element_size()
    bwd_bytes = 3 * x.numel() * x.element_size()
    fwd = {"cuteforge": lambda: ours(x), "torch": lambda: ref_fn(x, dim=-1)}
    bwd = {"cuteforge": lambda: ours_bwd(dy, y), "torch": lambda: bwd_torch(dy, y, -1, dtype)}
    if qs is not None and mode == "softmax":
        try:
            row["quack_max_abs_err"] = float((qs.softmax_fwd(x).float() - y_ref).abs().amax())
            row["quack_bwd_max_abs_err"] = float((qs.softmax_bwd(dy, y).float() - dx_ref).abs().amax())
            fwd["quack"] = lambda: qs.softmax_fwd(x)
            bwd["quack"] = lambda: qs.softmax_bwd(dy, y)
        except Exception as e:
            row["quack_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    for name, fn in fwd.items():
        row["fwd_" + name] = _time(fn, fwd_bytes, copy_bps)
    for name, fn in bwd.items():
        row["bwd_" + name] = _time(fn, bwd_bytes, copy_bps)
    return row


def add_compiled(row: dict[str, Any], copy_bps: float) -> None:
    """torch.compile (inductor, static shapes, fresh per shape) forward and backward."""
    mode, m, n = row["mode"], row["M"], row["N"]
    dtype = getattr(torch, row["dtype"])
    x, dy, y = _inputs(m, n, dtype, mode)
    ref_fn = getattr(torch, mode)
    _, bwd_torch = _bwd_fns(mode)
    tc = time.time()
    torch._dynamo.reset()  # dynamo's recompile limit would otherwise fall back to eager
    cf = torch.compile(lambda t: ref_fn(t, dim=-1), dynamic=False)
    cb = torch.compile(lambda g, t: bwd_torch(g, t, -1, dtype), dynamic=False)
    cf(x)
    cb(dy, y)
    torch.cuda.synchronize()
    row["torch.compile_first_calls_s"] = round(time.time() - tc, 1)
    row["fwd_torch.compile"] = _time(lambda: cf(x), 2 * x.numel() * x.element_size(), copy_bps)
    row["bwd_torch.compile"] = _time(lambda: cb(dy, y), 3 * x.numel() * x.element_size(), copy_bps)


def sweep_plans(shapes: list[tuple[str, torch.dtype, int, int]]) -> list[tuple[Any, ...]]:
    from cuteforge.kernels.softmax.spec import softmax_bwd, softmax_fwd
    from cuteforge.signature import BoundKey, dtype_name, vector_width

    plans = []
    for mode, dtype, m, n in shapes:
        bwd = mode.endswith("_bwd")
        k = softmax_bwd if bwd else softmax_fwd
        nargs = 3 if bwd else 2
        vec = vector_width(0, (n,), dtype.itemsize)
        key = BoundKey((dtype_name(dtype),) * nargs, (("N", n),), (vec,) * nargs)
        spec = k.spec(key, (("mode", mode),))
        for cfg in k.configs(spec):
            plans.append((mode, dtype, m, n, k, key, cfg))
    return plans


def config_sweep(plans: list[tuple[Any, ...]], copy_bps: float) -> list[dict[str, Any]]:
    """Every candidate config of the forward/backward kernel at a few shapes."""
    from cuteforge.arch import target_arch

    arch = target_arch()
    rows = []
    cur, ts = None, None
    for mode, dtype, m, n, k, key, cfg in plans:
        if cur != (mode, dtype, m, n):
            cur, ts = (mode, dtype, m, n), None
            torch.cuda.empty_cache()
            ts = [torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(len(key.dtypes))]
        default = cfg == sm.config_for(arch, n, dtype.itemsize * 8, mode.endswith("_bwd"), m, mode, key)
        r = {"mode": mode, "dtype": str(dtype).removeprefix("torch."), "M": m, "N": n, "config": repr(cfg), "default": default}
        try:
            fn = k.get(key, (("mode", mode),), cfg)
            r.update(_time(lambda fn=fn, ts=ts: fn(*ts), len(ts) * ts[0].numel() * ts[0].element_size(), copy_bps, rep_ms=30.0))
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(r)
        print("sweep", r, flush=True)
    return rows


def bars(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's bars, checked on this run's figures."""
    out: dict[str, list] = {"fwd_below_90pct_copy": [], "fwd_below_quack": [], "bwd_below_85pct_copy": [], "small_n_slower_than_torch": [], "errors": []}
    for r in rows:
        if r["mode"] != "softmax":
            continue
        tag = f"{r['dtype']} {r['M']}x{r['N']}"
        f, b = r.get("fwd_cuteforge", {}), r.get("bwd_cuteforge", {})
        if "pct_copy" not in f or "pct_copy" not in b:
            out["errors"].append(tag)
            continue
        if r["N"] >= 4096:
            if f["pct_copy"] < 90:
                out["fwd_below_90pct_copy"].append(f"{tag}: {f['pct_copy']}%")
            if b["pct_copy"] < 85:
                out["bwd_below_85pct_copy"].append(f"{tag}: {b['pct_copy']}%")
        q = r.get("fwd_quack", {})
        if "GBps" in q and f["GBps"] / q["GBps"] < 0.98:
            out["fwd_below_quack"].append(f"{tag}: {f['GBps'] / q['GBps']:.3f}")
        if r["N"] <= 2048:
            for d in ("fwd", "bwd"):
                t = r.get(f"{d}_torch", {})
                if "GBps" in t and r[f"{d}_cuteforge"]["GBps"] < t["GBps"]:
                    out["small_n_slower_than_torch"].append(f"{d} {tag}")
    return {**out, "all_met": not any(out.values())}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="fewer N")
    p.add_argument("--sweep", action="store_true", help="time every candidate config at every shape")
    p.add_argument("--compile-ns", default="4096,16384,65536", help="N at which to run torch.compile ('' = none, 'all')")
    p.add_argument("--out")
    args = p.parse_args()
    t0 = time.time()
    gpu = torch.cuda.get_device_name()
    ns = QUICK_NS if args.quick else NS
    dtypes = (torch.bfloat16, torch.float32)
    shapes = [(rows_for(n, dt), n, dt) for dt in dtypes for n in ns]
    problems = [(mode, dt, m, n) for m, n, dt in shapes for mode in ("softmax", "softmax_bwd", "log_softmax", "log_softmax_bwd")]
    plans = sweep_plans([(mo, dt, m, n) for m, n, dt in shapes for mo in ("softmax", "softmax_bwd")]) if args.sweep else []
    t_warm = time.time()
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob, compile_all

    arch = target_arch()
    failed = [o for o in sm.warm(problems) if not o.ok]
    failed += [o for o in compile_all([CompileJob.of(p[4], p[5], (("mode", p[0]),), p[6], arch) for p in plans]) if not o.ok]
    warm_s = time.time() - t_warm
    copy_bps = timing.copy_bandwidth()
    result: dict[str, Any] = {
        **results_header(),
        "copy_GBps": round(copy_bps / 1e9, 1),
        "parallel_compile_s": round(warm_s, 1),
        "compile_failures": [str(f.error)[:300] for f in failed][:10],
        "bytes": "fwd 2*M*N*size (read x, write y); bwd 3*M*N*size (read y, dy; write dx)",
        "timing": "cuteforge.timing.events.bench: L2 flushed before each call, median of CUDA-event times",
    }
    name = gpu.lower().replace("nvidia ", "").replace(" ", "-")
    out = Path(args.out or Path(__file__).parent / "results" / f"{name}-softmax.json")
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every step: a run cut short still leaves its figures
        result["seconds"] = round(time.time() - t0, 1)
        write_results(out, result, check=False)

    qs = _quack()
    result["quack"] = getattr(sys.modules.get("quack"), "__version__", None)
    rows: list[dict[str, Any]] = []
    result["rows"] = rows
    log_shapes = {(4096, torch.bfloat16), (16384, torch.bfloat16), (65536, torch.bfloat16), (4096, torch.float32)}
    for m, n, dt in shapes:
        for mode in ("softmax", "log_softmax"):
            if mode == "log_softmax" and (n, dt) not in log_shapes:
                continue
            try:
                r = measure(mode, m, n, dt, copy_bps, qs)
            except Exception as e:
                r = {"mode": mode, "M": m, "N": n, "dtype": str(dt).removeprefix("torch."), "error": f"{type(e).__name__}: {str(e)[:300]}"}
            rows.append(r)
            print(json.dumps(r), flush=True)
            result["bars"] = bars(rows)
            save()
    if plans:
        result["config_sweep"] = config_sweep(plans, copy_bps)
        save()
    cns = {int(v) for v in args.compile_ns.split(",") if v.strip().isdigit()} if args.compile_ns != "all" else set(ns)
    for r in rows:
        if r["N"] in cns and r["mode"] == "softmax" and "error" not in r:
            try:
                add_compiled(r, copy_bps)
            except Exception as e:
                r["torch.compile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            save()
    result["bars"] = bars(rows)
    save()
    for r in rows:
        line = f"{r['mode']:11s} {r['dtype']:8s} {r['M']:6d} x {r['N']:6d}"
        for d in ("fwd", "bwd"):
            for c in ("cuteforge", "torch", "torch.compile", "quack"):
                v = r.get(f"{d}_{c}", {})
                if "GBps" in v:
                    line += f" | {d} {c[:5]} {v['GBps']:5.0f} ({v['pct_copy']:5.1f}%)"
        print(line, r.get("error", ""))
    print(json.dumps(result["bars"], indent=1))
    print("wrote", out, "in", result["seconds"], "s")


if __name__ == "__main__":
    main()
