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
    sync); `import cuteforge.ops` is reported beside it, and which packages the call
    imported (none of tvm_ffi, cutlass, jinja2 belongs there).
(p) phases: the same first call in one more fresh process on that cache, the parts it
    shares with every op done first, each timed alone: the cache fingerprint (cuteforge's
    source hash), the C++ extension's load, the DSL runtime and tvm-ffi libraries
    (dlopen); then the op's call, split into the kernel's load from the cache (the cache's
    load time) and the rest (binding, config, launch plan, the CUDA module load and
    launch, sync). `import tvm_ffi` is timed after it: what a kernel's first call from
    Python (not through the C++ launch) adds.
(c) bundle: `cuteforge bundle create` (a precompile of the standard grid, `--shapes` the
    library's quick shapes added), then `cuteforge library --quick` on a fresh cache with
    CUTEFORGE_BUNDLES set to it: the compiles it still made (the saved cache counters of
    that cache, `cuteforge cache stats`), which kernels they were (`cuteforge cache ls`),
    and the kernels the bundle served. The bar: 0 compiles.
(d) bundle first call: each op's first call in two fresh processes on one more fresh
    cache, the bundle pinned: the first links the bundle's object into the cache's
    `linked/` directory, the second opens that library (docs/bundles.md); each row says
    what the call imported and whether the bundle served it.

The C++ extension (`cuteforge build-native`) is built once, in the cache this script runs
with, and copied into every fresh cache, so no measurement waits for or competes with its
background build.

Run on a GPU machine (one command, everything included; 4 to 5 minutes on an H200 host
with 16 cores, about 2 with --skip-bundle):

    python benchmarks/bench_startup.py [--out FILE] [--workers N] [--skip-bundle]

Cache entries are linked into shared libraries when written, and the warm and phases rows
load those (docs/architecture.md, "A new process's first call"); with
CUTEFORGE_LINKED_KERNELS=0 in the environment they load the objects through the DSL
instead (the results record which). The extension is built in
CUTEFORGE_CACHE_DIR; where that is unset and platformdirs is
not installed, the script sets it to the directory platformdirs would name on Linux
($XDG_CACHE_HOME/cuteforge, by default ~/.cache/cuteforge).

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
QUICK_SHAPES = "4096,16384,65536"  # N of `cuteforge library --quick`'s shapes (bench.library.QUICK_SHAPES)
RESULTS = Path(__file__).resolve().parent / "results"


# --- child: one op's first call in this fresh process ---------------------------------


def op_shape(op: str) -> dict[str, int]:
    """The shape an op is called at: M, N (and K for gemm)."""
    if op == "gemm":
        m, n, k = GEMM
        return {"M": m, "N": n, "K": k}
    return {"M": ROWS[0], "N": VOCAB if op == "cross_entropy" else ROWS[1]}


WATCHED = ("tvm_ffi", "cutlass", "jinja2", "platformdirs")  # packages a warm first call should not import


def op_inputs(op: str, dtype_name: str) -> tuple[Any, ...]:
    """The op's inputs on the GPU, made (and the CUDA context up) before any clock starts."""
    import torch

    dtype = getattr(torch, dtype_name)
    torch.cuda.init()
    shape = op_shape(op)
    if op == "gemm":
        ins: tuple[Any, ...] = (torch.randn(shape["M"], shape["K"], device="cuda", dtype=dtype),
                                torch.randn(shape["K"], shape["N"], device="cuda", dtype=dtype))
    else:
        from cuteforge.bench.library import inputs

        ins = inputs(op, shape["M"], shape["N"], dtype)
    torch.cuda.synchronize()
    return ins


def op_fn(op: str) -> Any:
    import cuteforge.ops as ops
    from cuteforge.bench.library import cuteforge_fn

    return ops.gemm if op == "gemm" else cuteforge_fn(op)


def ms(t0: float, t1: float, digits: int = 2) -> float:
    return round((t1 - t0) * 1e3, digits)


def child(op: str, dtype_name: str) -> dict[str, Any]:
    """Time `op`'s first call in this process (see the module docstring, (a) and (b))."""
    t_start = time.perf_counter()
    import torch

    ins = op_inputs(op, dtype_name)
    t0 = time.perf_counter()
    import cuteforge

    fn = op_fn(op)
    t1 = time.perf_counter()
    before = set(sys.modules)
    fn(*ins)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    imported = sorted({m.split(".")[0] for m in set(sys.modules) - before} & set(WATCHED))
    fn(*ins)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    from cuteforge.native import build

    stats = cuteforge.cache_stats()
    return {"op": op, **op_shape(op), "dtype": dtype_name, "import_ms": ms(t0, t1),
            "first_call_ms": ms(t1, t2), "second_call_ms": ms(t2, t3, 3),
            "process_to_first_result_ms": ms(t_start, t2, 1),
            "compiles": int(stats["compiles"]), "compile_ms": round(stats["compile_ms"], 1),
            "l2_loads": int(stats["l2_loads"]), "load_ms": round(stats["load_ms"], 2),
            "bundle_loads": int(stats["bundle_loads"]), "native_extension": build.built(),
            "imported_by_first_call": imported}


def child_phases(op: str, dtype_name: str) -> dict[str, Any]:
    """`op`'s first call on a warm cache taken apart (see the module docstring, (p))."""
    import ctypes

    import torch

    ins = op_inputs(op, dtype_name)
    import cuteforge
    from cuteforge import arch, cache
    from cuteforge.native import build

    fn = op_fn(op)
    import cutlass.cute as cute  # already imported by the ops' kernels: this finds the libraries only

    from cuteforge.kernel import Kernel
    from cuteforge.native import launch

    libs = runtime_libraries(cute)
    row: dict[str, Any] = {"op": op, **op_shape(op), "dtype": dtype_name}
    spent = {"kernel_get": 0.0, "launch_plan": 0.0}
    Kernel.get = timed(Kernel.get, spent, "kernel_get")  # type: ignore[method-assign]
    launch.runner = timed(launch.runner, spent, "launch_plan")
    t0 = time.perf_counter()
    cache.fingerprint(arch.target_arch())
    t1 = time.perf_counter()
    build.load()
    t2 = time.perf_counter()
    for lib in libs:
        ctypes.CDLL(lib)  # as the kernel's library loads them: its dependencies, kept loaded
    before = cuteforge.cache_stats()
    t3 = time.perf_counter()
    fn(*ins)
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    fn(*ins)
    torch.cuda.synchronize()
    t5 = time.perf_counter()
    had_tvm_ffi = "tvm_ffi" in sys.modules
    import tvm_ffi  # noqa: F401

    t6 = time.perf_counter()
    stats = {k: v - before[k] for k, v in cuteforge.cache_stats().items()}  # the two calls' own
    call = ms(t3, t4)
    row.update({"fingerprint_ms": ms(t0, t1), "native_extension_ms": ms(t1, t2), "runtime_libraries_ms": ms(t2, t3),
                "object_load_ms": round(stats["load_ms"], 2), "call_rest_ms": round(call - stats["load_ms"], 2),
                "call_ms": call, "total_ms": ms(t0, t4), "second_call_ms": ms(t4, t5, 3),
                # inside the call: the kernels' lookups (key, spec, config default, cache, load), the
                # launch plans, and everything else (binding, tuned-config lookup, the launch with
                # the CUDA module load, sync)
                "kernel_get_ms": round(spent["kernel_get"], 2), "launch_plan_ms": round(spent["launch_plan"], 2),
                "call_other_ms": round(call - spent["kernel_get"] - spent["launch_plan"], 2),
                "tvm_ffi_import_ms": None if had_tvm_ffi else ms(t5, t6), "compiles": int(stats["compiles"])})
    return row


def runtime_libraries(cute: Any) -> list[str]:
    """The DSL runtime's and tvm-ffi's shared libraries, found without importing `tvm_ffi`
    (the DSL's own `find_runtime_libraries(enable_tvm_ffi=True)` imports it, which would
    spare the call under test that import)."""
    import importlib.util

    libs = cute.runtime.find_runtime_libraries(enable_tvm_ffi=False)
    spec = importlib.util.find_spec("tvm_ffi")
    for base in (spec.submodule_search_locations or []) if spec is not None else []:
        lib = os.path.join(base, "lib", "libtvm_ffi.so")
        if os.path.isfile(lib):
            libs.append(lib)
            break
    return libs


def timed(fn: Any, spent: dict[str, float], name: str) -> Any:
    """`fn`, adding the milliseconds each call takes to ``spent[name]``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += (time.perf_counter() - t0) * 1e3

    return wrapper


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


def child_row(op: str, dtype: str, cache: Path, phases: bool = False, env: dict[str, str] | None = None) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", op, "--dtype", dtype]
    out, _ = run(cmd + (["--phases"] if phases else []), cache, env)
    return json.loads(out.strip().splitlines()[-1])


def bundle_first_calls(ops: list[str], dtype: str, base: Path, native: Path | None, pin: dict[str, str]) -> dict[str, Any]:
    """(d): per op, the first call of a process served by the bundle, linking (first
    process) and opening the linked library (second)."""
    rows = []
    for op in ops:
        cache = fresh_cache(base, f"bundle-call-{op}", native)
        linking, opening = (child_row(op, dtype, cache, env=pin) for _ in range(2))
        rows.append({"op": op, "first_process": linking, "second_process": opening})
    return {"rows": rows,
            "first_call_ms_median": {k: statistics.median(r[k]["first_call_ms"] for r in rows)
                                     for k in ("first_process", "second_process")}}


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


PHASES = ("fingerprint_ms", "native_extension_ms", "runtime_libraries_ms", "object_load_ms", "call_rest_ms")


def phases_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """(p): per phase its median over the ops, and the phase that costs most."""
    med = {k: round(statistics.median(r[k] for r in rows), 2) for k in (*PHASES, "total_ms")}
    imports = [r["tvm_ffi_import_ms"] for r in rows if r.get("tvm_ffi_import_ms") is not None]
    return {"rows": rows, "median": med, "largest": max(PHASES, key=lambda k: med[k]),
            "tvm_ffi_import_ms_median": round(statistics.median(imports), 2) if imports else None}


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


def default_cache_dir() -> str | None:
    """Set CUTEFORGE_CACHE_DIR where it is unset and platformdirs (which names the default
    cache) is not installed: to the directory platformdirs names on Linux. Returns what it
    set, or None."""
    if os.environ.get("CUTEFORGE_CACHE_DIR"):
        return None
    try:
        import platformdirs  # noqa: F401
    except ImportError:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        os.environ["CUTEFORGE_CACHE_DIR"] = os.path.join(base, "cuteforge")
        print(f"CUTEFORGE_CACHE_DIR unset and platformdirs absent: using {os.environ['CUTEFORGE_CACHE_DIR']}", flush=True)
        return os.environ["CUTEFORGE_CACHE_DIR"]
    return None


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
    p.add_argument("--phases", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps((child_phases if args.phases else child)(args.child, args.dtype)))
        return 0
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        p.error(f"unknown op(s) {unknown}; known: {', '.join(OPS)}")

    import torch

    from cuteforge.bench.report import results_header, write_results
    from cuteforge.cache.kernel_cache import linked_kernels

    if not torch.cuda.is_available():
        p.error("a CUDA GPU is needed (every part times first calls of kernels)")
    t_all = time.perf_counter()
    seed_cache = default_cache_dir()
    # the children inherit CUTEFORGE_LINKED_KERNELS: unless "0", the warm rows load the
    # entries' linked libraries
    result: dict[str, Any] = {**results_header(), "dtype": args.dtype, "linked_kernels": linked_kernels()}
    if seed_cache is not None:
        result["cache_dir_set_to"] = seed_cache
    path = Path(args.out or RESULTS / f"{gpu_slug(result['gpu'])}-startup.json")
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="cuteforge-startup-"))
    base.mkdir(parents=True, exist_ok=True)

    def section(name: str, value: dict[str, Any]) -> None:
        """Keep a finished section: printed, and in the results file at once (a run cut short
        keeps what it measured)."""
        result[name] = value
        print(json.dumps({name: value}, indent=1), flush=True)
        write_results(path, result, check=False)

    try:
        native = native_dir()
        result["native_extension"] = native is not None
        caches = {op: fresh_cache(base, f"ops-{op}", native) for op in ops}
        section("cold", cold_summary([child_row(op, args.dtype, caches[op]) for op in ops]))
        section("warm", warm_summary([child_row(op, args.dtype, caches[op]) for op in ops]))
        section("phases", phases_summary([child_row(op, args.dtype, caches[op], phases=True) for op in ops]))
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
            section("bundle", {**bundle_summary(made, create_s, library_s, stats, listed),
                               "create_command": f"cuteforge bundle create OUT --workers {args.workers} --shapes {QUICK_SHAPES}"})
            section("bundle_first_call", bundle_first_calls(ops, args.dtype, base, native, pin))
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    result["seconds"] = round(time.perf_counter() - t_all, 1)
    write_results(path, result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
