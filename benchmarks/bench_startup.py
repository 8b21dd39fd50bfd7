"""Start-up cost: what a process pays before its first kernel runs, cold, warm and from a bundle.

Every measurement runs in a fresh Python process (this script with `--child OP`) on a fresh
kernel cache directory, so nothing is warm that a new process would not find warm:

(a) cold: the first ever call of each library op (ops.sum, softmax, rms_norm, layer_norm,
    cross_entropy, gemm) on an empty cache: the call's wall time (inputs made and the CUDA
    context up before the clock starts; the GPU synchronized after the call) against the
    compile time the kernel cache reports for it (`cuteforge.cache_stats()`: compiles,
    compile_ms); the rest is the call's own overhead (key, config, DSL runtime, load, launch).
(b) warm: a new process's first call of the same op on the cache (a) filled: the kernel
    is on disk. The bar: the median over the ops <= 20 ms, everything in the call included
    (binding, cache lookup, object load, the DSL runtime's first use, launch plan, launch,
    sync); `import cuteforge.ops` is reported beside it.
(c) bundle: `cuteforge bundle create` (a precompile of the standard grid, `--shapes` the
    library's quick shapes added), then `cuteforge library --quick` on a fresh cache with
    CUTEFORGE_BUNDLES set to it: the compiles it still made (the saved cache counters of
    that cache, `cuteforge cache stats`), which kernels they were (`cuteforge cache ls`),
    and the kernels the bundle served. The bar: 0 compiles.

The C++ extension (`cuteforge build-native`) is built once, in the cache this script runs
with, and copied into every fresh cache, so no measurement waits for or competes with its
background build.

Run on a GPU machine (one command, everything included; 4 to 5 minutes on an H200 host
with 16 cores):

    python benchmarks/bench_startup.py [--out FILE] [--workers N] [--skip-bundle]

Writes benchmarks/results/<gpu>-startup.json (the schema of every results file:
`cuteforge bench --from` reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OPS = ("sum", "softmax", "rms_norm", "layer_norm", "cross_entropy", "gemm")
ROWS = (4096, 4096)  # M x N of the row ops
VOCAB = 32000  # cross-entropy's N (a vocabulary of the standard grid)
GEMM = (4096, 4096, 4096)  # M x N x K
WARM_BAR_MS = 20.0
QUICK_SHAPES = "4096,16384,65536"  # N of `cuteforge library --quick`'s shapes (library_bench.QUICK_SHAPES)
RESULTS = Path(__file__).resolve().parent / "results"


# --- child: one op's first call in this fresh process ---------------------------------


def op_shape(op: str) -> dict[str, int]:
    """The shape an op is called at: M, N (and K for gemm)."""
    if op == "gemm":
        m, n, k = GEMM
        return {"M": m, "N": n, "K": k}
    return {"M": ROWS[0], "N": VOCAB if op == "cross_entropy" else ROWS[1]}


def child(op: str, dtype_name: str) -> dict[str, Any]:
    """Time `op`'s first call in this process (see the module docstring, (a) and (b))."""
    t_start = time.perf_counter()
    import torch

    dtype = getattr(torch, dtype_name)
    torch.cuda.init()
    shape = op_shape(op)
    if op == "gemm":
        ins: tuple[Any, ...] = (torch.randn(shape["M"], shape["K"], device="cuda", dtype=dtype),
                                torch.randn(shape["K"], shape["N"], device="cuda", dtype=dtype))
    else:
        from cuteforge.library_bench import inputs

        ins = inputs(op, shape["M"], shape["N"], dtype)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    import cuteforge
    import cuteforge.ops as ops
    from cuteforge.library_bench import cuteforge_fn

    fn = ops.gemm if op == "gemm" else cuteforge_fn(op)
    t1 = time.perf_counter()
    fn(*ins)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    fn(*ins)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    from cuteforge.native import build

    stats = cuteforge.cache_stats()
    return {"op": op, **shape, "dtype": dtype_name, "import_ms": round((t1 - t0) * 1e3, 2),
            "first_call_ms": round((t2 - t1) * 1e3, 2), "second_call_ms": round((t3 - t2) * 1e3, 3),
            "process_to_first_result_ms": round((t2 - t_start) * 1e3, 1),
            "compiles": int(stats["compiles"]), "compile_ms": round(stats["compile_ms"], 1),
            "l2_loads": int(stats["l2_loads"]), "load_ms": round(stats["load_ms"], 2),
            "bundle_loads": int(stats["bundle_loads"]), "native_extension": build.built()}


# --- parent: fresh processes, fresh caches ---------------------------------------------


def fresh_cache(parent: Path, name: str, native: Path | None) -> Path:
    """A new private cache directory, holding a copy of the built C++ extension."""
    d = parent / name
    d.mkdir(mode=0o700)
    if native is not None:
        (d / "native").mkdir(mode=0o700)
        shutil.copytree(native, d / "native" / native.name)
    return d


def run(cmd: list[str], cache: Path | None, env: dict[str, str] | None = None, timeout: float = 900) -> tuple[str, float]:
    """stdout of `cmd` (raises with its stderr when it fails) and its wall seconds."""
    e = {k: v for k, v in os.environ.items() if k != "CUTEFORGE_BUNDLES"}  # only the bundle (c) names
    e.update(env or {})
    if cache is not None:
        e["CUTEFORGE_CACHE_DIR"] = str(cache)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout, time.perf_counter() - t0


def cuteforge_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "cuteforge", *args]


def last_json(stdout: str) -> Any:
    """The JSON document a command printed (after any other lines)."""
    start = stdout.find("{")
    if start < 0:
        raise ValueError(f"no JSON in: {stdout[-500:]}")
    return json.loads(stdout[start:])


def child_row(op: str, dtype: str, cache: Path) -> dict[str, Any]:
    out, _ = run([sys.executable, str(Path(__file__).resolve()), "--child", op, "--dtype", dtype], cache)
    return json.loads(out.strip().splitlines()[-1])


def cold_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """(a): per op the call's wall time, the compile time inside it and the rest."""
    for r in rows:
        r["overhead_ms"] = round(r["first_call_ms"] - r["compile_ms"], 1)
    return {"rows": rows, "first_call_ms_median": round(statistics.median(r["first_call_ms"] for r in rows), 1),
            "compile_ms_total": round(sum(r["compile_ms"] for r in rows), 1),
            "overhead_ms_median": round(statistics.median(r["overhead_ms"] for r in rows), 1)}


def warm_summary(rows: list[dict[str, Any]], bar_ms: float = WARM_BAR_MS) -> dict[str, Any]:
    """(b): the median first call over the ops against the bar; a warm call compiles nothing."""
    med = statistics.median(r["first_call_ms"] for r in rows)
    return {"rows": rows, "first_call_ms_median": round(med, 2), "bar_ms": bar_ms, "bar_met": med <= bar_ms,
            "import_ms_median": round(statistics.median(r["import_ms"] for r in rows), 1),
            "compiles": sum(r["compiles"] for r in rows),
            "slowest": max(rows, key=lambda r: r["first_call_ms"])["op"]}


def bundle_summary(made: dict[str, Any], create_s: float, library_s: float, stats: dict[str, Any],
                   compiled: list[dict[str, Any]]) -> dict[str, Any]:
    """(c): the bundle, and what `library --quick` still compiled with it."""
    cum = stats.get("cumulative") or {}
    return {"objects": made.get("objects"), "bytes": made.get("bytes"), "sha256": made.get("sha256"),
            "create_s": round(create_s, 1), "library_quick_s": round(library_s, 1),
            "compiles": int(cum.get("compiles", 0)), "bundle_loads": int(cum.get("bundle_loads", 0)),
            "bar_met": int(cum.get("compiles", 0)) == 0,
            "compiled_kernels": sorted({str(e.get("key") or e["kernel"]) for e in compiled if e.get("kernel")})}


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200': the results file's prefix, as the other benchmarks name it."""
    return name.lower().replace("nvidia ", "").replace(" ", "-")


def native_dir() -> Path | None:
    """The C++ extension's build directory in the cache this script runs with (built now if
    it is not), or None when it cannot be built."""
    out, _ = run(cuteforge_cmd("build-native", "--json"), None)
    r = last_json(out)
    return Path(r["dir"]) if r.get("built") else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="GPU needed for every part; see the module docstring for what each measures.")
    p.add_argument("--out", help="results file (default: benchmarks/results/<gpu>-startup.json)")
    p.add_argument("--dtype", default="bfloat16", help="the ops' dtype (default bfloat16)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="bundle create's compile processes "
                   "(default: the CPU count)")
    p.add_argument("--skip-bundle", action="store_true", help="leave out (c)")
    p.add_argument("--keep", metavar="DIR", help="build the caches and the bundle under DIR and keep them")
    p.add_argument("--child", metavar="OP", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.dtype)))
        return 0
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        p.error(f"unknown op(s) {unknown}; known: {', '.join(OPS)}")

    import torch

    from cuteforge.report import results_header, write_results

    if not torch.cuda.is_available():
        p.error("a CUDA GPU is needed (every part times first calls of kernels)")
    t_all = time.perf_counter()
    result: dict[str, Any] = {**results_header(), "dtype": args.dtype}
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="cuteforge-startup-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        native = native_dir()
        result["native_extension"] = native is not None
        caches = {op: fresh_cache(base, f"ops-{op}", native) for op in ops}
        cold = [child_row(op, args.dtype, caches[op]) for op in ops]
        result["cold"] = cold_summary(cold)
        print(json.dumps({"cold": result["cold"]}, indent=1), flush=True)
        warm = [child_row(op, args.dtype, caches[op]) for op in ops]
        result["warm"] = warm_summary(warm)
        print(json.dumps({"warm": result["warm"]}, indent=1), flush=True)
        if not args.skip_bundle:
            bundle_out = base / "bundle"
            out, create_s = run(cuteforge_cmd("bundle", "create", str(bundle_out), "--workers", str(args.workers),
                                              "--shapes", QUICK_SHAPES, "--json"), fresh_cache(base, "bundle-build", native))
            made = last_json(out)
            lib_cache = fresh_cache(base, "library", native)
            pin = {"CUTEFORGE_BUNDLES": f"{bundle_out}#sha256={made['sha256']}"}
            _, library_s = run(cuteforge_cmd("library", "--quick", "--json"), lib_cache, pin)
            stats = last_json(run(cuteforge_cmd("cache", "stats", "--json"), lib_cache)[0])
            listed = json.loads(run(cuteforge_cmd("cache", "ls", "--json"), lib_cache)[0])
            result["bundle"] = {**bundle_summary(made, create_s, library_s, stats, listed),
                                "create_command": f"cuteforge bundle create OUT --workers {args.workers} --shapes {QUICK_SHAPES}"}
            print(json.dumps({"bundle": result["bundle"]}, indent=1), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    result["seconds"] = round(time.perf_counter() - t_all, 1)
    path = Path(args.out or RESULTS / f"{gpu_slug(result['gpu'])}-startup.json")
    write_results(path, result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
