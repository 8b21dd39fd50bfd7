"""`cuteforge precompile` (every standard specialization, in one process or a compile
pool, or split over torchrun ranks into a bundle) and `cuteforge build-native`."""

from __future__ import annotations

import argparse
import inspect
import os
import time
from pathlib import Path
from typing import Any

from .common import CliError, Progress, _console, note


def _precompile_row(k: Any, spec: Any, status: str, ms: float, error: str | None = None, pid: int | None = None) -> dict[str, Any]:
    row = {
        "kernel": k.name,
        "params": dict(spec.params),
        "dtypes": list(spec.key.dtypes),
        "static": dict(spec.key.static),
        "config": repr(spec.config),
        "status": status,
        "ms": round(ms, 1),
        "entry": str(k.cache_entry(spec)),
    }
    if error:
        row["error"] = error
    if pid:
        row["worker"] = pid
    return row


def row_lengths(shapes: str | None) -> tuple[int, ...]:
    """`--shapes` of precompile / bundle create: comma-separated row lengths N or MxN shapes
    (M does not key a row kernel: only N is kept), e.g. '5120,7168' or '4096x5120'."""
    if not shapes:
        return ()
    from ..autotune.problems import parse_shapes

    try:
        return tuple(dict.fromkeys(s[-1] for s in parse_shapes(shapes)))
    except ValueError as e:
        raise CliError(f"--shapes: {e}") from None


def _takes_lengths(fn: Any) -> bool:
    """Whether a kernel's `specializations` takes `ns` (the row families' do)."""
    try:
        return "ns" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def precompile_specs(kernels: list[str] | None = None, extra_ns: tuple[int, ...] = ()) -> list[tuple[Any, Any]]:
    """(kernel, spec) for every standard specialization of the library's kernels (or of
    `kernels`); with `extra_ns`, the row kernels' specializations at those row lengths too."""
    from .. import kernels as families
    from ..arch import target_arch
    from ..kernel import REGISTRY

    families.load_all()
    names = kernels or sorted(REGISTRY)
    for n in names:
        if n not in REGISTRY:
            raise CliError(f"unknown kernel {n!r}; known: {', '.join(sorted(REGISTRY))}")
    arch = target_arch()
    out = []
    for n in names:
        grid = REGISTRY[n].specializations
        if not grid:
            continue
        pairs = list(grid())
        if extra_ns and _takes_lengths(grid):
            pairs += list(grid(ns=extra_ns))
        seen = set()
        for key, params in pairs:
            spec = REGISTRY[n].spec(key, tuple(sorted(params.items())), arch=arch)
            if spec.key_repr() not in seen:
                seen.add(spec.key_repr())
                out.append((REGISTRY[n], spec))
    return out


def precompile(kernels: list[str] | None = None, progress: bool = True, workers: int = 1,
               specs: list[tuple[Any, Any]] | None = None, extra_ns: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """Compile (or load) every standard specialization of the library's kernels; with
    `workers` > 1 in that many compile processes (`autotune.pool`) writing the disk cache."""
    from ..arch import target_arch
    from ..autotune import pool
    from ..cache import STATS

    jobs = precompile_specs(kernels, extra_ns) if specs is None else specs
    arch = target_arch()
    rows = []
    if workers > 1 and len(jobs) > 1 and not pool.disk_cache_usable():
        note("the kernel cache cannot be used: compiling in this process")
        workers = 1
    with Progress(f"precompile for {arch}" + (f" ({workers} workers)" if workers > 1 else ""), len(jobs), enabled=progress) as bar:
        if workers > 1 and len(jobs) > 1:
            order = {id(spec): i for i, (_, spec) in enumerate(jobs)}
            by_job = {pool.CompileJob.of(k, spec.key, spec.params, spec.config, spec.arch): (k, spec) for k, spec in jobs}
            found: dict[int, dict[str, Any]] = {}
            with pool.CompilePool(min(workers, len(jobs)), arch) as compile_pool:
                for out in compile_pool.as_completed(by_job):
                    k, spec = by_job[out.job]
                    row = _precompile_row(k, spec, out.status, out.ms, out.error, out.pid)
                    found[order[id(spec)]] = row
                    bar.advance(f"{k.name} {'/'.join(spec.key.dtypes)} {row['status']} {out.ms:.0f} ms")
            rows = [found[i] for i in sorted(found)]
            failed = [r for r in rows if r["status"] == "failed"]
            if failed:
                raise CliError(f"{len(failed)} of {len(rows)} compiles failed; first: {failed[0]['kernel']}: {failed[0].get('error')}")
            return rows
        for k, spec in jobs:
            before = STATS.compiles
            t0 = time.perf_counter()
            k.compile(spec)
            ms = (time.perf_counter() - t0) * 1e3
            rows.append(_precompile_row(k, spec, "compiled" if STATS.compiles > before else "loaded", ms))
            bar.advance(f"{k.name} {'/'.join(spec.key.dtypes)} {rows[-1]['status']} {ms:.0f} ms")
    return rows


def _workers(args: argparse.Namespace) -> int:
    """--workers, else CUTEFORGE_COMPILE_WORKERS, else 1 for `precompile` and the CPU count
    for `library` and `bundle create`."""
    from ..autotune.pool import default_workers

    if getattr(args, "workers", None):
        return max(1, args.workers)
    if os.environ.get("CUTEFORGE_COMPILE_WORKERS") or args.command in ("library", "bundle"):
        return default_workers()
    return 1


def cmd_precompile(args: argparse.Namespace) -> dict[str, Any] | None:
    from ..arch import target_arch
    from ..cache import cache_root, fingerprint

    if getattr(args, "distributed", False) or getattr(args, "bundle", None):
        return _precompile_distributed(args)
    if not args.kernel:  # the whole library: the C++ extension too, built in the background meanwhile
        from ..native import build

        build.load()
    rows = precompile(args.kernel or None, workers=_workers(args), extra_ns=row_lengths(getattr(args, "shapes", None)))
    out = {
        "arch": target_arch(),
        "cache_dir": str(cache_root() / fingerprint(target_arch())),
        "kernels": rows,
        "compiled": sum(r["status"] == "compiled" for r in rows),
        "loaded": sum(r["status"] == "loaded" for r in rows),
        "total_ms": round(sum(r["ms"] for r in rows), 1),
    }
    if not args.kernel:  # the whole library: the C++ extension too (cuteforge/native: launch, autograd node)
        from ..native import build

        out["native_autograd"] = build_native()
    return out


def _precompile_distributed(args: argparse.Namespace) -> dict[str, Any] | None:
    """`precompile --distributed --bundle OUT` (cuteforge.distributed); None on ranks other than 0."""
    from .. import distributed

    if not (args.distributed and args.bundle):
        raise CliError("--distributed and --bundle OUT go together (run it under torchrun)")
    if Path(args.bundle).expanduser().exists() and not args.force:
        raise CliError(f"{args.bundle} exists (pass --force to replace it)")
    r = distributed.precompile(args.kernel or None, args.bundle, workers=_workers(args), force=args.force,
                               extra_ns=row_lengths(args.shapes))
    if r is None:
        return None
    rows = r["kernels"]
    return {**r, "cache_dir": args.bundle, "compiled": sum(x["status"] == "compiled" for x in rows),
            "loaded": sum(x["status"] == "loaded" for x in rows), "total_ms": round(sum(x["ms"] for x in rows), 1)}


def _family(kernel: str) -> str:
    """A kernel's family for summaries: gemm_sm90_tn_col -> gemm, norm_fwd -> norm."""
    for fam in ("gemm", "norm", "softmax", "cross_entropy", "row_reduce", "col_reduce"):
        if kernel.startswith(fam):
            return fam
    return kernel.split("_")[0]


def _print_precompile(r: dict[str, Any]) -> None:
    from rich.table import Table

    fams: dict[str, dict[str, Any]] = {}
    for row in r["kernels"]:
        f = fams.setdefault(_family(row["kernel"]), {"kernels": set(), "compiled": 0, "loaded": 0, "ms": 0.0})
        f["kernels"].add(row["kernel"])
        f[row["status"]] += 1
        f["ms"] += row["ms"]
    t = Table(title=f"precompiled for {r['arch']}, per family")
    for col in ("family", "kernels", "specializations", "compiled", "loaded", "seconds"):
        t.add_column(col, justify="left" if col == "family" else "right", overflow="fold")
    for name, f in sorted(fams.items()):
        t.add_row(name, str(len(f["kernels"])), str(f["compiled"] + f["loaded"]), str(f["compiled"]), str(f["loaded"]),
                  f"{f['ms'] / 1e3:.1f}")
    _console().print(t)
    if r.get("bundle"):
        b = r["bundle"]
        print(f"{r['compiled']} compiled, {r['loaded']} loaded from cache over {r['ranks']} ranks; bundle {b['path']}: "
              f"{b['objects']} objects, manifest sha256 {b['sha256']}")
        return
    print(f"{r['compiled']} compiled, {r['loaded']} loaded from cache, {r['total_ms'] / 1e3:.1f} s in all; artifacts in {r['cache_dir']}")
    node = r.get("native_autograd")
    if node:
        state = f"ready in {node['dir']}" if node["built"] else "not built (eager calls use Python launches and autograd nodes)"
        print(f"C++ extension (forward launch, autograd node): {state} ({node['s']:.1f} s)")


def build_native() -> dict[str, Any]:
    """Build (or load) the C++ extension in the foreground; what `build-native` reports."""
    from ..native import build

    t0 = time.perf_counter()
    if not build.built():
        note("building the C++ extension (once per machine; one to two minutes the first time) ...")
    built = build.load(wait=True) is not None
    note(f"C++ extension {'ready' if built else 'not built'} ({time.perf_counter() - t0:.1f} s)")
    return {"built": built, "dir": str(build.build_dir()), "s": round(time.perf_counter() - t0, 1)}


def cmd_build_native(args: argparse.Namespace) -> dict[str, Any]:
    from ..native import build

    if not build.enabled():
        raise CliError("the C++ extension is turned off (CUTEFORGE_NATIVE_AUTOGRAD=0)")
    r = build_native()
    if not r["built"]:
        raise CliError("the C++ extension could not be built (see the warning above); eager calls use the Python paths")
    return r


def _print_build_native(r: dict[str, Any]) -> None:
    print(f"C++ extension (forward launch, autograd node, dispatcher kernels) ready in {r['dir']} ({r['s']:.1f} s)")
