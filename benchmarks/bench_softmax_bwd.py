"""Long-row softmax / log_softmax backward: the default config (16-bit N >= 32768: path
"mbar", else "regs", device.py), the v1 `regs` heuristic where it differs (the default
earlier), and every `mbar` candidate (kernels/softmax/chunked.make_softmax_chunked_bwd,
config.longrow_bwd_candidates), one process, one GPU.

For every mode, dtype and N: M = min(32768, 2^28 // N) rows (bench_longrow.rows_for);
y = softmax (or log_softmax) of 2 randn in fp32 rounded to the dtype, dy = randn. Each
config's kernel is launched directly on preallocated dx (no op overhead), timed with
cuteforge.timing.events.bench (L2 flushed before each call, median of CUDA events), bytes =
3*M*N*size (read dy and y, write dx), and checked against torch's own backward
(torch._softmax_backward_data / _log_softmax_backward_data) in fp64 on the same
rounded inputs: tol_ratio = max |dx - ref| / (tol max|ref| + tol |ref|), tol 1e-5 fp32,
1.6e-2 16-bit (as tests/gpu/test_softmax_gpu.py), correct when <= 1 and no NaN. All
configs compile first, in parallel worker processes.

    python benchmarks/bench_softmax_bwd.py --out $OUT/h200-softmax-bwd-mbar.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_longrow import result_header, rows_for  # noqa: E402

from cuteforge.bench.report import write_results  # noqa: E402
from cuteforge.timing import events as timing  # noqa: E402

NS = [32768, 65536, 131072, 262144]
DTYPES = ["bfloat16", "float32"]
MODES = ["softmax_bwd", "log_softmax_bwd"]
TOL = {"bfloat16": 1.6e-2, "float16": 1.6e-2, "float32": 1e-5}


def _key(n: int, dtype: torch.dtype):
    from cuteforge.signature import BoundKey, dtype_name, vector_width

    vec = vector_width(0, (n,), dtype.itemsize)
    return BoundKey((dtype_name(dtype),) * 3, (("N", n),), (vec,) * 3)


def plans(modes: list[str], dtypes: list[str], ns: list[int]) -> list[tuple[str, str, int, Any, bool]]:
    """(mode, dtype, n, config, is_default): the ops' default (M known), the v1 `regs`
    heuristic where the default is another path (what the default was before it), and
    every mbar candidate."""
    from cuteforge.arch import target_arch
    from cuteforge.kernels.softmax.config import heuristic_regs, longrow_bwd_candidates
    from cuteforge.kernels.softmax.spec import config_for

    arch = target_arch()
    out = []
    for mode in modes:
        for dt in dtypes:
            bits = getattr(torch, dt).itemsize * 8
            for n in ns:
                d = config_for(arch, n, bits, True, rows_for(n))
                out.append((mode, dt, n, d, True))
                regs = heuristic_regs(n, bits, True)  # rows_for(n) >= 1024: no few-rows split
                seen = {d}
                for c in [regs, *longrow_bwd_candidates(n, bits)]:
                    if c not in seen:
                        seen.add(c)
                        out.append((mode, dt, n, c, False))
    return out


def _check(dx: torch.Tensor, ref: torch.Tensor, dt: str) -> dict[str, Any]:
    nan = int(dx.isnan().sum())
    diff = (dx.double() - ref).abs_()
    tol = TOL[dt]
    ratio = float((diff / (tol * float(ref.abs().amax()) + tol * ref.abs())).amax())
    return {"max_abs_err": float(diff.amax()), "tol_ratio": round(ratio, 4), "nan": nan, "correct": nan == 0 and ratio <= 1.0}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--ns", default=",".join(map(str, NS)))
    p.add_argument("--rep-ms", type=float, default=30.0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    t0 = time.time()
    modes = [m for m in args.modes.split(",") if m]
    dtypes = [d for d in args.dtypes.split(",") if d]
    ns = [int(v) for v in args.ns.split(",") if v]
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob, compile_all
    from cuteforge.kernels.softmax.spec import softmax_bwd

    arch = target_arch()
    todo = plans(modes, dtypes, ns)
    tc = time.time()
    jobs = [CompileJob.of(softmax_bwd, _key(n, getattr(torch, dt)), (("mode", mode),), c, arch) for mode, dt, n, c, _ in todo]
    outcomes = compile_all(jobs)
    failed = {i: str(o.error)[:300] for i, o in enumerate(outcomes) if not o.ok}
    result = result_header("bench_softmax_bwd.py", arch, time.time() - tc, len(jobs), len(failed), "bytes = 3*M*N*size (read dy, y; write dx)")
    copy_bps = result["copy_GBps"] * 1e9
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["seconds"] = round(time.time() - t0, 1)
        write_results(out, result, check=False)

    save()
    groups: dict[tuple[str, str, int], list[tuple[int, Any, bool]]] = {}
    for i, (mode, dt, n, c, d) in enumerate(todo):
        groups.setdefault((mode, dt, n), []).append((i, c, d))
    for (mode, dt, n), cfgs in groups.items():
        dtype = getattr(torch, dt)
        m = rows_for(n)
        torch.cuda.empty_cache()
        torch.manual_seed(0)
        fwd = "log_softmax" if mode.startswith("log") else "softmax"
        y = getattr(torch, fwd)(2 * torch.randn(m, n, device="cuda"), dim=-1).to(dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        if fwd == "softmax":
            ref = torch._softmax_backward_data(dy.double(), y.double(), -1, torch.float64)
        else:
            ref = torch._log_softmax_backward_data(dy.double(), y.double(), -1, torch.float64)
        dx = torch.empty_like(dy)
        nbytes = 3 * dy.numel() * dy.element_size()
        shape: dict[str, Any] = {"op": mode, "dtype": dt, "M": m, "N": n, "rows": []}
        result["shapes"].append(shape)
        for i, c, d in cfgs:
            r: dict[str, Any] = {"config": repr(c), "path": c.path, "threads": c.threads, "cluster_n": c.cluster_n,
                                 "elems_per_thread": c.elems_per_thread(n), "default": d}
            if i in failed:
                r["error"] = "compile: " + failed[i]
            else:
                try:
                    fn = softmax_bwd.get(_key(n, dtype), (("mode", mode),), c)
                    dx.fill_(float("nan"))
                    fn(dy, y, dx)
                    torch.cuda.synchronize()
                    r.update(_check(dx, ref, dt))
                    ms = timing.bench(lambda fn=fn, dy=dy, y=y, dx=dx: fn(dy, y, dx), warmup_ms=5, rep_ms=args.rep_ms)
                    bps = nbytes / (ms * 1e-3)
                    r.update({"us": round(ms * 1e3, 2), "GBps": round(bps / 1e9, 1), "pct_copy": round(100 * bps / copy_bps, 1)})
                except Exception as e:
                    r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            shape["rows"].append(r)
            print(mode, dt, m, n, json.dumps(r), flush=True)
        del y, dy, ref, dx
        ok = [r for r in shape["rows"] if r.get("correct") and "GBps" in r]
        if ok:
            b = max(ok, key=lambda r: r["GBps"])
            shape["best"] = {k: b[k] for k in ("config", "GBps", "pct_copy")}
        save()

    print(f"copy {result['copy_GBps']} GB/s")
    for s in result["shapes"]:
        d = next((r for r in s["rows"] if r["default"]), {})
        rg = [r for r in s["rows"] if r.get("path") == "regs" and "GBps" in r]
        mb = [r for r in s["rows"] if r.get("path") == "mbar" and r.get("correct") and "GBps" in r]
        bm = max(mb, key=lambda r: r["GBps"]) if mb else {}
        print(f"{s['op']:16s} {s['dtype']:9s} {s['M']:6d} x {s['N']:6d}  default {d.get('pct_copy', '-')}% "
              f"({d.get('config', '')}, correct={d.get('correct')})  regs {[r['pct_copy'] for r in rg]}  "
              f"best mbar {bm.get('pct_copy', '-')}% {bm.get('config', '')}")
    bad = [(s["op"], s["dtype"], s["N"], r["config"]) for s in result["shapes"] for r in s["rows"] if not r.get("correct")]
    print("incorrect or failed:", bad)
    save()
    print("wrote", out, "in", result["seconds"], "s")


if __name__ == "__main__":
    main()
