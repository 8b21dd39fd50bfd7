"""The `cuteforge` command (also `python -m cuteforge`).

Every subcommand prints for people by default and JSON with `--json`, shows progress on
stderr (a bar on a terminal, plain lines otherwise), and ends a failure with one line on
stderr and exit code 2, never a traceback. A closed pipe (`cuteforge cache ls | head -1`)
ends the command quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import shutil
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EXIT_USAGE = 2


class CliError(Exception):
    """A failure to report as one line with exit code 2."""


def _set_arch(arch: str | None) -> None:
    if arch:
        from .arch import parse_arch

        parse_arch(arch)
        os.environ["CUTEFORGE_ARCH"] = arch
        os.environ["CUTE_DSL_ARCH"] = arch


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    from . import __version__

    out: dict[str, str | None] = {"cuteforge": __version__}
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def cmd_info(args: argparse.Namespace) -> dict[str, Any]:
    from . import arch, cache

    gpu = arch.gpu_info()
    return {
        "gpu": None if gpu is None else {"name": gpu.name, "sm": f"sm_{gpu.sm}", "sm_count": gpu.sm_count},
        "gpu_text": "no GPU" if gpu is None else f"{gpu.name} (SM {gpu.sm // 10}.{gpu.sm % 10}, {gpu.sm_count} SMs)",
        "versions": _versions(),
        "cache_dir": str(cache.cache_root()),
        "disk_cache": cache.disk_enabled(),
        "target_arch": arch.target_arch(),
        "compile_only": arch.compile_only(),
    }


def _print_info(r: dict[str, Any]) -> None:
    v = r["versions"]
    print(f"cuteforge      {v['cuteforge']}")
    print(f"GPU            {r['gpu_text']}")
    print(f"target arch    {r['target_arch']}{'  (compile only)' if r['compile_only'] else ''}")
    print(f"CuTe DSL       nvidia-cutlass-dsl {v['nvidia-cutlass-dsl']}, apache-tvm-ffi {v['apache-tvm-ffi']}")
    print(f"torch          {v['torch']}")
    print(f"kernel cache   {r['cache_dir']}{'' if r['disk_cache'] else '  (disabled: CUTEFORGE_CACHE=0)'}")


class Progress:
    """Progress on stderr: a rich bar on a terminal, plain lines otherwise (a log, CI)."""

    def __init__(self, title: str, total: int, enabled: bool = True) -> None:
        self.title, self.total, self.done, self.enabled = title, total, 0, enabled
        self.tty = sys.stderr.isatty()
        self._bar: Any = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Progress:
        if self.enabled and self.tty:
            from rich.console import Console
            from rich.progress import Progress as RichProgress

            self._bar = self._stack.enter_context(RichProgress(console=Console(stderr=True), transient=True))
            self._task = self._bar.add_task(self.title, total=self.total)
        elif self.enabled:
            print(f"{self.title}: {self.total} to do", file=sys.stderr, flush=True)
        return self

    def advance(self, what: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=f"{self.title}: {what}")
        elif self.enabled:
            print(f"[{self.done}/{self.total}] {what}", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def note(text: str) -> None:
    """A progress note on stderr (what a long step is doing)."""
    print(text, file=sys.stderr, flush=True)


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def cmd_cache(args: argparse.Namespace) -> Any:
    from . import cache

    if args.action == "clear" and not args.yes:
        entries = cache.list_entries()
        what = (f"{len(entries)} compiled kernels ({_mib(sum(e['bytes'] for e in entries))}) and the stored "
                f"tuning results under {cache.cache_root()}")
        if not sys.stdin.isatty():
            raise CliError(f"cache clear deletes {what}; pass --yes to confirm (no terminal to ask on)")
        answer = input(f"Delete {what}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            return {"removed": 0, "cache_dir": str(cache.cache_root()), "cancelled": True}
    if args.action == "stats":
        entries = cache.list_entries()
        return {
            "cache_dir": str(cache.cache_root()),
            "entries": len(entries),
            "bytes": sum(e["bytes"] for e in entries),
            "kernels": sorted({e["kernel"] for e in entries if e["kernel"]}),
            "cumulative": cache.cumulative_stats(),
        }
    if args.action == "ls":
        return cache.list_entries()
    removed = cache.clear()
    return {"removed": removed, "cache_dir": str(cache.cache_root())}


def _print_cache(r: Any) -> None:
    if isinstance(r, list):  # ls
        for e in r:
            print(f"{e.get('kernel') or '?':28s} {e.get('arch') or '?':8s} {e.get('bytes', 0):>9d}  {e.get('key') or ''}")
        return
    if "entries" in r:  # stats
        print(f"cache dir      {r['cache_dir']}")
        print(f"entries        {r['entries']} ({_mib(r['bytes'])})")
        print(f"kernels        {', '.join(r['kernels']) or '-'}")
        for k, v in (r.get("cumulative") or {}).items():
            print(f"{k:14s} {round(v, 1) if isinstance(v, float) else v}")
        return
    if r.get("cancelled"):
        print("nothing deleted")
    else:
        print(f"removed {r['removed']} entries from {r['cache_dir']}")


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


def precompile_specs(kernels: list[str] | None = None) -> list[tuple[Any, Any]]:
    """(kernel, spec) for every standard specialization of the library's kernels (or of `kernels`)."""
    from . import kernels as families
    from .arch import target_arch
    from .kernel import REGISTRY

    families.load_all()
    names = kernels or sorted(REGISTRY)
    for n in names:
        if n not in REGISTRY:
            raise CliError(f"unknown kernel {n!r}; known: {', '.join(sorted(REGISTRY))}")
    arch = target_arch()
    return [(REGISTRY[n], REGISTRY[n].spec(key, tuple(sorted(params.items())), arch=arch))
            for n in names if REGISTRY[n].specializations for key, params in REGISTRY[n].specializations()]


def precompile(kernels: list[str] | None = None, progress: bool = True, workers: int = 1,
               specs: list[tuple[Any, Any]] | None = None) -> list[dict[str, Any]]:
    """Compile (or load) every standard specialization of the library's kernels; with
    `workers` > 1 in that many compile processes (`autotune.pool`) writing the disk cache."""
    from .arch import target_arch
    from .autotune import pool
    from .cache import STATS

    jobs = precompile_specs(kernels) if specs is None else specs
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
    from .autotune.pool import default_workers

    if getattr(args, "workers", None):
        return max(1, args.workers)
    if os.environ.get("CUTEFORGE_COMPILE_WORKERS") or args.command in ("library", "bundle"):
        return default_workers()
    return 1


def cmd_precompile(args: argparse.Namespace) -> dict[str, Any] | None:
    from .arch import target_arch
    from .cache import cache_root, fingerprint

    if getattr(args, "distributed", False) or getattr(args, "bundle", None):
        return _precompile_distributed(args)
    if not args.kernel:  # the whole library: the C++ extension too, built in the background meanwhile
        from .native import build

        build.load()
    rows = precompile(args.kernel or None, workers=_workers(args))
    out = {
        "arch": target_arch(),
        "cache_dir": str(cache_root() / fingerprint(target_arch())),
        "kernels": rows,
        "compiled": sum(r["status"] == "compiled" for r in rows),
        "loaded": sum(r["status"] == "loaded" for r in rows),
        "total_ms": round(sum(r["ms"] for r in rows), 1),
    }
    if not args.kernel:  # the whole library: the C++ extension too (cuteforge/native: launch, autograd node)
        from .native import build

        out["native_autograd"] = build_native()
    return out


def build_native() -> dict[str, Any]:
    """Build (or load) the C++ extension in the foreground; what `build-native` reports."""
    from .native import build

    t0 = time.perf_counter()
    if not build.built():
        note("building the C++ extension (once per machine; one to two minutes the first time) ...")
    built = build.load(wait=True) is not None
    note(f"C++ extension {'ready' if built else 'not built'} ({time.perf_counter() - t0:.1f} s)")
    return {"built": built, "dir": str(build.build_dir()), "s": round(time.perf_counter() - t0, 1)}


def cmd_build_native(args: argparse.Namespace) -> dict[str, Any]:
    from .native import build

    if not build.enabled():
        raise CliError("the C++ extension is turned off (CUTEFORGE_NATIVE_AUTOGRAD=0)")
    r = build_native()
    if not r["built"]:
        raise CliError("the C++ extension could not be built (see the warning above); eager calls use the Python paths")
    return r


def _precompile_distributed(args: argparse.Namespace) -> dict[str, Any] | None:
    """`precompile --distributed --bundle OUT` (cuteforge.distributed); None on ranks other than 0."""
    from . import distributed

    if not (args.distributed and args.bundle):
        raise CliError("--distributed and --bundle OUT go together (run it under torchrun)")
    if Path(args.bundle).expanduser().exists() and not args.force:
        raise CliError(f"{args.bundle} exists (pass --force to replace it)")
    r = distributed.precompile(args.kernel or None, args.bundle, workers=_workers(args), force=args.force)
    if r is None:
        return None
    rows = r["kernels"]
    return {**r, "cache_dir": args.bundle, "compiled": sum(x["status"] == "compiled" for x in rows),
            "loaded": sum(x["status"] == "loaded" for x in rows), "total_ms": round(sum(x["ms"] for x in rows), 1)}


def _print_build_native(r: dict[str, Any]) -> None:
    print(f"C++ extension (forward launch, autograd node, dispatcher kernels) ready in {r['dir']} ({r['s']:.1f} s)")


def cmd_bundle(args: argparse.Namespace) -> dict[str, Any]:
    from . import bundle
    from .arch import target_arch

    if args.action == "create":
        if args.from_cache:
            return {"action": "create", **bundle.create_from_cache(args.path, [target_arch()], force=args.force)}
        rows = precompile(args.kernel or None, workers=_workers(args))
        made = bundle.create_from_cache(args.path, [target_arch()], objects=[r["entry"] for r in rows], force=args.force)
        return {"action": "create", **made, "compiled": sum(r["status"] == "compiled" for r in rows),
                "loaded": sum(r["status"] == "loaded" for r in rows)}
    if args.action == "verify":
        result = bundle.verify(args.path, args.sha256)
        if not result["ok"]:
            raise CliError(f"kernel bundle {args.path}: {len(result['bad'])} files do not match the manifest: "
                           + ", ".join(result["bad"][:5]))
        return {"action": "verify", **result}
    return {"action": "ls", **bundle.describe(args.path)}


def _print_bundle(r: dict[str, Any]) -> None:
    if r["action"] == "create":
        extra = f" ({r['compiled']} compiled, {r['loaded']} from the cache)" if "compiled" in r else ""
        print(f"wrote {r['path']}: {r['objects']} kernels, {r['tuning']} tuning records, {_mib(r['bytes'])}{extra}")
        print(f"manifest sha256 {r['sha256']}  (pin it: cuteforge.use_bundle(path, sha256=...) or CUTEFORGE_BUNDLES=path#sha256=...)")
        return
    print(f"bundle         {r['path']}")
    print(f"sha256         {r['sha256']}")
    for fid, f in r["fingerprints"].items():
        here = {True: "  (matches this installation)", False: "  (another installation: skipped here)"}.get(f.get("matches_here"), "")
        print(f"fingerprint    {fid}: {f.get('arch')}, cuteforge {f.get('cuteforge_version')}, python {f.get('python')}{here}")
    if r["action"] == "verify":
        print(f"verified       {r['objects']} kernels, {r['tuning']} tuning records: every file matches the manifest")
        return
    for o in r["objects"]:
        print(f"{o.get('kernel') or '?':28s} {o.get('arch') or '?':8s} {o.get('key') or ''}")
    print(f"{len(r['objects'])} kernels, {len(r['tuning'])} tuning records")


def _family(kernel: str) -> str:
    """A kernel's family for summaries: gemm_sm90_tn_col -> gemm, norm_fwd -> norm."""
    for fam in ("gemm", "norm", "softmax", "cross_entropy", "row_reduce", "col_reduce"):
        if kernel.startswith(fam):
            return fam
    return kernel.split("_")[0]


def _console() -> Any:
    from rich.console import Console

    # off a terminal rich would assume 80 columns and cut names: use the real width or a wide one
    return Console(width=None if sys.stdout.isatty() else max(shutil.get_terminal_size((160, 24)).columns, 160))


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


def cmd_library(args: argparse.Namespace) -> dict[str, Any]:
    """The main job: on a GPU, the library against torch; without one, an AOT build."""
    from . import arch

    if arch.compile_only():
        return {"mode": "precompile", **cmd_precompile(args)}
    from .library_bench import OPS, QUICK_SHAPES
    from .report import run_bench

    # Every op (and backward) at the three bar shapes; --quick leaves out torch.compile.
    shapes = ",".join(f"{m}x{n}" for m, n in QUICK_SHAPES)
    return {"mode": "bench", **run_bench(OPS, shapes, quick=args.quick, compiled=not args.quick, progress=not args.json)}


def _print_library(r: dict[str, Any]) -> None:
    if r["mode"] == "precompile":
        print("No GPU here: compiling the kernel library ahead of time.")
        _print_precompile(r)
        return
    from .report import print_tables

    print_tables([r])
    _print_bench_summary(r)


def _print_bench_summary(r: dict[str, Any]) -> None:
    """One line per family: where cuteforge was fastest, its median % of copy."""
    from rich.table import Table

    from .report import family_names, table_rows

    t = Table(title="summary per family")
    for col in ("family", "rows", "cuteforge fastest", "cuteforge median % of ref", "slowest vs best"):
        t.add_column(col, justify="left" if col == "family" else "right")
    for fam in family_names([r]):
        rows = table_rows([r], fam)
        mine = [row for row in rows if "cuteforge" in row["values"]]
        pcts = sorted(row["pct"]["cuteforge"] for row in mine if row["pct"].get("cuteforge") is not None)
        worst = min((row["values"]["cuteforge"] / max(row["values"].values()) for row in mine), default=None)
        t.add_row(fam, str(len(rows)), f"{sum(row['best'] == 'cuteforge' for row in mine)}/{len(mine)}",
                  f"{pcts[len(pcts) // 2]:.1f}" if pcts else "-", f"{worst:.2f}x" if worst is not None else "-")
    _console().print(t)


def cmd_bench(args: argparse.Namespace) -> int:
    from . import report

    to_file = None if args.json == "-" else args.json
    results = report.bench_main(args.ops, args.shapes, args.dtype, args.from_, to_file, args.plot, args.report, quick=args.quick)
    if args.json == "-":
        print(json.dumps(results if args.from_ else results[0], indent=1, default=str))
        return 0
    report.print_tables(results)
    for what, path in (("results", to_file), ("plots", args.plot), ("report", args.report)):
        if path:
            print(f"wrote {what}: {path}")
    return 0


def _find_kernel(name: str) -> Any:
    """A library kernel by name, or a user kernel as `module:kernel` / `path/to/file.py:kernel`."""
    from . import kernels as families
    from .kernel import REGISTRY, Kernel

    if ":" not in name:
        families.load_all()
        return REGISTRY.get(name)
    mod_name, _, attr = name.rpartition(":")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            spec = importlib.util.spec_from_file_location(Path(mod_name).stem, mod_name)
            if spec is None or spec.loader is None:
                raise CliError(f"cannot load {mod_name!r}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(mod_name)
    except (ImportError, FileNotFoundError) as e:
        raise CliError(f"cannot import {mod_name!r}: {e}") from None
    k = getattr(module, attr, None)
    if not isinstance(k, Kernel):
        raise CliError(f"{mod_name}:{attr} is not a @cuteforge.kernel (got {type(k).__name__})")
    return k


def _device_files(fn: Any, home: str, seen: set[int] | None = None, out: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Source files of the device code a builder reaches: the functions in its closures and
    the module-level functions it names, kept where they live in cuteforge's kernels or in
    the builder's own module (`home`)."""
    seen = set() if seen is None else seen
    out = {} if out is None else out
    if id(fn) in seen or not isinstance(fn, types.FunctionType):
        return out
    seen.add(id(fn))
    code = fn.__code__
    if hasattr(fn, "_decorator_kind") or code.co_filename != inspect.getsourcefile(fn):
        out.setdefault(code.co_filename, set()).add(fn.__qualname__)
    for cell in fn.__closure__ or ():
        with contextlib.suppress(ValueError):
            _device_files(cell.cell_contents, home, seen, out)

    def names(co: types.CodeType) -> Iterator[str]:
        yield from co.co_names
        for c in co.co_consts:
            if isinstance(c, types.CodeType):
                yield from names(c)

    for n in names(code):
        v = fn.__globals__.get(n)
        if isinstance(v, types.FunctionType) and (v.__module__ or "").startswith(("cuteforge.kernels", home)):
            out.setdefault(v.__code__.co_filename, set()).add(v.__qualname__)
            _device_files(v, home, seen, out)
    return out


def _specializations(k: Any, args: argparse.Namespace) -> list[tuple[Any, dict[str, Any]]]:
    """The specializations `show` can compile: --tensors (with --param) make one; otherwise
    the kernel's standard ones."""
    if args.tensors:
        import torch

        from .signature import torch_dtype

        tensors = []
        for item in args.tensors.split(";"):
            dt, _, shape = item.strip().partition("[")
            try:
                dims = [int(d) for d in shape.rstrip("]").split(",") if d.strip()]
                tensors.append(torch.empty(dims, dtype=torch_dtype(dt.strip()), device="meta"))
            except (ValueError, KeyError, TypeError):
                raise CliError(f"--tensors: {item!r} is not DTYPE[D0,D1,...], e.g. float32[4096,1024]") from None
        return [(k.signature.fresh_key(tensors), _params(args.param))]
    specs = [(key, {**params, **_params(args.param)}) for key, params in (k.specializations() if k.specializations else [])]
    return specs


def cmd_show(args: argparse.Namespace) -> int:
    """A kernel's signature, specializations and cache entries; its device code; the PTX or
    SASS of one specialization (--spec picks it, --tensors describes a new one)."""
    from . import compiler
    from .cache import list_entries
    from .kernel import REGISTRY

    k = _find_kernel(args.kernel)
    if k is None:
        from .templates.show import show_generated  # template kernels: their generated sources

        if show_generated(args.kernel, source=args.source, ptx=args.ptx, sass=args.sass):
            return 0
        raise CliError(f"unknown kernel {args.kernel!r}; known: {', '.join(sorted(REGISTRY))} "
                       "(a kernel of your own: module:kernel or path/to/file.py:kernel)")
    specs = _specializations(k, args)
    if args.source:
        files: dict[str, set[str]] = {}
        if specs:
            key, params = specs[min(args.spec, len(specs) - 1)]
            _device_files(k.builder(k.spec(key, k.key_params(sorted(params.items())))), k.builder.__module__, out=files)
        else:
            _device_files(k.builder, k.builder.__module__, out=files)
        dsl_dir = os.path.dirname(os.path.dirname(importlib.util.find_spec("cutlass").origin or ""))
        shown = [f for f in files if not f.startswith(dsl_dir) and os.path.exists(f)] or [k.source_path]
        for f in shown:
            print(f"# ===== {f} ({', '.join(sorted(files.get(f, ()))) or 'builder'})")
            print(Path(f).read_text())
        return 0
    if args.ptx or args.sass:
        if not specs:
            raise CliError(f"kernel {k.name!r} declares no standard specializations: describe one with "
                           "--tensors 'float32[4096,1024];...' (and --param NAME=VALUE)")
        if not 0 <= args.spec < len(specs):
            raise CliError(f"--spec {args.spec}: kernel {k.name!r} has specializations 0..{len(specs) - 1} (see `cuteforge show {args.kernel}`)")
        key, params = specs[args.spec]
        spec = k.spec(key, k.key_params(sorted(params.items())))
        compiler.prepare_dsl(spec.arch)
        result = compiler.compile_jit(k.builder(spec), k.signature.fake_args(key), spec.arch, keep_artifacts=True)
        print(f"# {k.name} {spec.key_repr()}")
        print((result.ptx or "") if args.ptx else compiler.sass(result.cubin or b""))
        return 0
    info: dict[str, Any] = {
        "kernel": k.name,
        "archs": list(k.archs),
        "source": k.source_path,
        "signature": [
            {"name": a.name, "dims": list(a.dims), "dtypes": [str(d).removeprefix("torch.") for d in a.dtypes], "leading": a.leading}
            for a in k.signature.args
        ],
        "static": list(k.signature.static),
        "specializations": [],
        "cached_entries": sum(e["kernel"] == k.name for e in list_entries()),
    }
    for i, (key, params) in enumerate(specs):
        spec = k.spec(key, k.key_params(sorted(params.items())))
        info["specializations"].append({"index": i, "key": spec.key_repr(), "config": repr(spec.config)})
        if i == 0:
            info["candidates"] = [repr(c) for c in (k.configs(spec) if k.configs else [])]
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"kernel         {info['kernel']}  (archs {', '.join(info['archs'])})")
    print(f"source         {info['source']}")
    for a in info["signature"]:
        print(f"  {a['name']:12s} dims ({', '.join(a['dims'])})  dtypes {', '.join(a['dtypes'])}")
    print(f"static dims    {', '.join(info['static']) or '-'}")
    print(f"cache entries  {info['cached_entries']}")
    print(f"specializations ({len(specs)}; --spec N picks one for --ptx / --sass):")
    for sp in info["specializations"]:
        print(f"  [{sp['index']}] {sp['key']}")
    if info.get("candidates"):
        print(f"configs tried for [0] ({len(info['candidates'])}):")
        for c in info["candidates"]:
            print(f"  {c}")
    return 0


def _number(text: str) -> Any:
    """'4' -> 4, '3.0' / '1e-5' -> float, anything else stays text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _params(items: list[str] | None) -> dict[str, Any]:
    """--param NAME=VALUE pairs: integers as int, anything else as text."""
    out: dict[str, Any] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--param {item!r}: expected NAME=VALUE, e.g. act=gelu")
        out[name.strip()] = _number(value.strip())
    return out


def cmd_tune(args: argparse.Namespace) -> int:
    from .tune_cli import print_tune, tune_main

    result = tune_main(
        args.kernel, args.shapes, args.dtype, args.workers, args.compile_only, args.arch,
        gpus=args.gpus, params=_params(args.param), force=args.force, progress=not args.json and sys.stderr.isatty(),
        verbose=not args.json,
    )
    if args.json:
        print(json.dumps({"command": "cuteforge " + " ".join(sys.argv[1:]), **result}, indent=1, default=str))
    else:
        print_tune(result)
    return 0


def cmd_viz(args: argparse.Namespace) -> int:
    from . import viz

    return viz.main_viz(args.kind, args.spec, args.output, args.format, args.crop)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="cuteforge", description="Compile-once CuTe DSL kernels for PyTorch.")
    p.add_argument("--version", action="version", version=f"cuteforge {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("info", help="GPU, DSL version, cache dir, target arch")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("cache", help="inspect or clear the persistent kernel cache")
    s.add_argument("action", choices=("stats", "ls", "clear"))
    s.add_argument("--yes", "-y", action="store_true", help="clear: do not ask")
    s.add_argument("--json", action="store_true")

    for name, help_ in (
        ("precompile", "compile every library kernel's standard specializations (no GPU needed)"),
        ("library", "main job: benchmark the library against torch (GPU) or precompile it (no GPU)"),
    ):
        s = sub.add_parser(name, help=help_)
        s.add_argument("--arch", help="target, e.g. sm_90a (default: this GPU's, else sm_90a)")
        s.add_argument("--kernel", action="append", help="only this kernel (repeatable)")
        s.add_argument("--json", action="store_true")
        s.add_argument("--workers", type=int, metavar="N", help="compile processes (default: 1 for precompile, "
                       "the CPU count for library; CUTEFORGE_COMPILE_WORKERS)")
        if name == "library":
            s.add_argument("--quick", action="store_true", help="fewer shapes")
        else:
            s.add_argument("--distributed", action="store_true", help="under torchrun: split the specializations "
                           "over the ranks, gather the objects to rank 0, which writes the --bundle")
            s.add_argument("--bundle", metavar="OUT", help="with --distributed: the bundle directory rank 0 writes")
            s.add_argument("--force", action="store_true", help="with --distributed: replace an existing bundle")

    s = sub.add_parser("build-native", help="build the C++ extension now (calls otherwise build it in the background)")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("bundle", help="kernel bundles: compiled kernels and tuning records to ship to other machines")
    s.add_argument("action", choices=("create", "ls", "verify"))
    s.add_argument("path", help="the bundle directory (create: where to write it)")
    s.add_argument("--from-cache", action="store_true", help="create: pack what the kernel cache holds for the target "
                   "instead of precompiling the library's standard specializations")
    s.add_argument("--arch", help="create: target, e.g. sm_90a (default: this GPU's, else sm_90a)")
    s.add_argument("--kernel", action="append", help="create: only this kernel (repeatable)")
    s.add_argument("--workers", type=int, metavar="N", help="create: compile processes (default: the CPU count)")
    s.add_argument("--force", action="store_true", help="create: replace an existing bundle")
    s.add_argument("--sha256", metavar="HEX", help="verify: the manifest must hash to this")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("bench", help="benchmark ops against torch (GPU), or report on recorded results (--from)")
    s.add_argument("ops", nargs="*", help="ops to measure (default: sum): sum, mean, amax, amin, argmax, softmax, log_softmax, rms_norm, layer_norm, cross_entropy")
    s.add_argument("--shapes", help="comma-separated MxN (default: the standard set)")
    s.add_argument("--dtype", default="float32,bfloat16", help="comma-separated dtypes")
    s.add_argument("--quick", action="store_true", help="fewer shapes, no torch.compile")
    s.add_argument("--from", dest="from_", action="append", metavar="RESULTS.json",
                   help="report on recorded results instead of measuring (repeatable; no GPU needed)")
    s.add_argument("--json", metavar="FILE", help="write the measured results to FILE ('-': stdout)")
    s.add_argument("--plot", metavar="DIR", help="write one PNG per op family into DIR")
    s.add_argument("--report", metavar="FILE.html", help="write one self-contained HTML page with all plots and tables")

    s = sub.add_parser("show", help="a kernel's signature, specializations and cache entries; its device code, PTX or SASS")
    s.add_argument("kernel", help="a library kernel, or your own as module:kernel or path/to/file.py:kernel")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--source", action="store_true", help="print the kernel's device code")
    g.add_argument("--ptx", action="store_true", help="compile one specialization, print its PTX")
    g.add_argument("--sass", action="store_true", help="same, SASS (needs nvdisasm or cuobjdump)")
    s.add_argument("--spec", type=int, default=0, metavar="N", help="which specialization (listed by `show K`; default 0)")
    s.add_argument("--tensors", metavar="'DTYPE[D,...];...'", help="describe a specialization by its tensors, e.g. 'float32[1000];float32[1000]'")
    s.add_argument("--param", action="append", metavar="NAME=VALUE", help="a kernel parameter (repeatable)")
    s.add_argument("--arch", help="target, e.g. sm_90a")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("tune", help="autotune a kernel for shapes (or compile every candidate, no GPU)")
    s.add_argument("kernel", help="row_reduce, softmax_fwd, softmax_bwd, norm_fwd, cross_entropy_fwd, "
                   "cross_entropy_bwd, gemm_sm90_{tn,nt,nn,tt}[_col]")
    s.add_argument("--shapes", required=True, help="comma-separated MxN (GEMMs: MxNxK), e.g. 32768x4096,4096x65536")
    s.add_argument("--dtype", default="float32")
    s.add_argument("--workers", type=int, help="compile processes (default: CPU count)")
    s.add_argument("--compile-only", action="store_true", help="compile every valid candidate; no GPU needed")
    s.add_argument("--arch", help="target, e.g. sm_90a")
    s.add_argument("--gpus", help="'all' or N: one timing process per GPU")
    s.add_argument("--force", action="store_true", help="re-tune even if a stored result exists")
    s.add_argument("--param", action="append", metavar="NAME=VALUE",
                   help="a problem parameter (repeatable), e.g. op=amax (row_reduce), mode=log_softmax "
                   "(softmax_*), kind=layer (norm_fwd), ignore_index=-1 (cross_entropy_*), act=gelu (gemm_sm90_*)")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("viz", help="render a CuTe layout or thread-value layout to SVG/PNG")
    s.add_argument("kind", choices=("layout", "tv", "mma"))
    s.add_argument("spec", nargs="+", help='layout text, e.g. "(4,8):(8,1)"; for tv: THR VAL; '
                   "for mma: PRESET [A|B|C] [MxNxK atoms], e.g. sm80_16x8x16 C 2x2x1")
    s.add_argument("-o", "--output", help="write .svg or .png here (default: SVG on stdout)")
    s.add_argument("--format", choices=("auto", "svg", "png"), default="auto")
    s.add_argument("--crop", metavar="M0:M1,N0:N1", help="draw only these rows and columns (zoom into a large layout)")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `cuteforge cache ls | head -1`: the reader is gone, end quietly
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("cuteforge: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "arch", None):
            _set_arch(args.arch)
        if args.command == "viz":
            return cmd_viz(args)
        if args.command == "tune":
            return cmd_tune(args)
        if args.command == "show":
            return cmd_show(args)
        if args.command == "bench":
            return cmd_bench(args)
        handler, printer = {
            "info": (cmd_info, _print_info),
            "cache": (cmd_cache, _print_cache),
            "precompile": (cmd_precompile, _print_precompile),
            "library": (cmd_library, _print_library),
            "bundle": (cmd_bundle, _print_bundle),
            "build-native": (cmd_build_native, _print_build_native),
        }[args.command]
        result = handler(args)
        if result is None:  # a rank other than 0 of a distributed run: rank 0 reports
            return 0
    except BrokenPipeError:
        raise
    except (CliError, ValueError, TypeError, KeyError, RuntimeError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"cuteforge {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    if args.json or printer is None:
        print(json.dumps(result, indent=1, default=str))
    else:
        printer(result)
    return 0
