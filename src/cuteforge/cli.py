"""The `cuteforge` command (also `python -m cuteforge`).

Every subcommand ends a failure with one line on stderr and exit code 2, never a
traceback; reporting subcommands take `--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
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

    out: dict[str, str | None] = {}
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
    print(f"GPU            {r['gpu_text']}")
    print(f"target arch    {r['target_arch']}{'  (compile only)' if r['compile_only'] else ''}")
    print(f"CuTe DSL       nvidia-cutlass-dsl {v['nvidia-cutlass-dsl']}, apache-tvm-ffi {v['apache-tvm-ffi']}")
    print(f"torch          {v['torch']}")
    print(f"kernel cache   {r['cache_dir']}{'' if r['disk_cache'] else '  (disabled: CUTEFORGE_CACHE=0)'}")


def cmd_cache(args: argparse.Namespace) -> Any:
    from . import cache

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


def precompile(kernels: list[str] | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """Compile (or load) every standard specialization of the library's kernels."""
    from . import kernels as families
    from .arch import target_arch
    from .cache import STATS
    from .kernel import REGISTRY

    families.load_all()
    names = kernels or sorted(REGISTRY)
    for n in names:
        if n not in REGISTRY:
            raise CliError(f"unknown kernel {n!r}; known: {', '.join(sorted(REGISTRY))}")
    jobs = [(REGISTRY[n], key, params) for n in names if REGISTRY[n].specializations for key, params in REGISTRY[n].specializations()]
    arch = target_arch()
    rows = []
    from rich.progress import Progress

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task(f"precompile for {arch}", total=len(jobs))
        for k, key, params in jobs:
            spec = k.spec(key, tuple(sorted(params.items())), arch=arch)
            before = STATS.compiles
            t0 = time.perf_counter()
            k.compile(spec)
            ms = (time.perf_counter() - t0) * 1e3
            rows.append(
                {
                    "kernel": k.name,
                    "params": dict(spec.params),
                    "dtypes": list(key.dtypes),
                    "static": dict(key.static),
                    "config": repr(spec.config),
                    "status": "compiled" if STATS.compiles > before else "loaded",
                    "ms": round(ms, 1),
                }
            )
            bar.advance(task)
    return rows


def cmd_precompile(args: argparse.Namespace) -> dict[str, Any]:
    from .arch import target_arch
    from .cache import cache_root, fingerprint

    rows = precompile(args.kernel or None, progress=not args.json and sys.stderr.isatty())
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

        t0 = time.perf_counter()
        built = build.load() is not None
        out["native_autograd"] = {"built": built, "dir": str(build.build_dir()), "s": round(time.perf_counter() - t0, 1)}
    return out


def _print_precompile(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"precompiled for {r['arch']}")
    for col in ("kernel", "params", "dtypes", "static", "status", "ms"):
        t.add_column(col, justify="right" if col == "ms" else "left")
    for row in r["kernels"]:
        t.add_row(row["kernel"], json.dumps(row["params"]), "/".join(row["dtypes"]), json.dumps(row["static"]), row["status"], f"{row['ms']:.0f}")
    Console().print(t)
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


def cmd_show(args: argparse.Namespace) -> int:
    """A kernel's signature, source and cache entries; --ptx/--sass compile one specialization."""
    from pathlib import Path

    from . import compiler
    from . import kernels as families
    from .cache import list_entries
    from .kernel import REGISTRY

    families.load_all()
    k = REGISTRY.get(args.kernel)
    if k is None:
        from .templates.show import show_generated  # template kernels: their generated sources

        if show_generated(args.kernel, source=args.source, ptx=args.ptx, sass=args.sass):
            return 0
        raise CliError(f"unknown kernel {args.kernel!r}; known: {', '.join(sorted(REGISTRY))}")
    if args.source:
        print(f"# {k.source_path}")
        print(Path(k.source_path).read_text())
        return 0
    specs = list(k.specializations()) if k.specializations else []
    if args.ptx or args.sass:
        if not specs:
            raise CliError(f"kernel {k.name!r} declares no standard specializations to compile")
        key, params = specs[0]
        spec = k.spec(key, tuple(sorted(params.items())))
        result = compiler.compile_jit(k.builder(spec), k.signature.fake_args(key), spec.arch, keep_artifacts=True)
        print(f"# {k.name} {spec.key_repr()}")
        print((result.ptx or "") if args.ptx else compiler.sass(result.cubin or b""))
        return 0
    info = {
        "kernel": k.name,
        "archs": list(k.archs),
        "source": k.source_path,
        "signature": [
            {"name": a.name, "dims": list(a.dims), "dtypes": [str(d).removeprefix("torch.") for d in a.dtypes], "leading": a.leading}
            for a in k.signature.args
        ],
        "static": list(k.signature.static),
        "standard_specializations": len(specs),
        "cached_entries": sum(e["kernel"] == k.name for e in list_entries()),
    }
    if specs:
        spec = k.spec(specs[0][0], tuple(sorted(specs[0][1].items())))
        info["example_key"] = spec.key_repr()
        info["example_candidates"] = [repr(c) for c in (k.configs(spec) if k.configs else [])]
    print(json.dumps(info, indent=1))
    return 0


def _params(items: list[str] | None) -> dict[str, Any]:
    """--param NAME=VALUE pairs: integers as int, anything else as text."""
    out: dict[str, Any] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--param {item!r}: expected NAME=VALUE, e.g. act=gelu")
        out[name.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
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

    return viz.main_viz(args.kind, args.spec, args.output, args.format)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cuteforge", description="Compile-once CuTe DSL kernels for PyTorch.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("info", help="GPU, DSL version, cache dir, target arch")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("cache", help="inspect or clear the persistent kernel cache")
    s.add_argument("action", choices=("stats", "ls", "clear"))
    s.add_argument("--json", action="store_true")

    for name, help_ in (
        ("precompile", "compile every library kernel's standard specializations (no GPU needed)"),
        ("library", "main job: benchmark the library against torch (GPU) or precompile it (no GPU)"),
    ):
        s = sub.add_parser(name, help=help_)
        s.add_argument("--arch", help="target, e.g. sm_90a (default: this GPU's, else sm_90a)")
        s.add_argument("--kernel", action="append", help="only this kernel (repeatable)")
        s.add_argument("--json", action="store_true")
        if name == "library":
            s.add_argument("--quick", action="store_true", help="fewer shapes")

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

    s = sub.add_parser("show", help="a kernel's signature and cache entries; its source, PTX or SASS")
    s.add_argument("kernel")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--source", action="store_true", help="print the kernel's source file")
    g.add_argument("--ptx", action="store_true", help="compile one standard specialization, print its PTX")
    g.add_argument("--sass", action="store_true", help="same, SASS (needs nvdisasm or cuobjdump)")
    s.add_argument("--arch", help="target, e.g. sm_90a")

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
    return p


def main(argv: list[str] | None = None) -> int:
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
            "cache": (cmd_cache, None),
            "precompile": (cmd_precompile, _print_precompile),
            "library": (cmd_library, _print_library),
        }[args.command]
        result = handler(args)
    except (CliError, ValueError, TypeError, KeyError, RuntimeError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"cuteforge {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    if args.json or printer is None:
        print(json.dumps(result, indent=1, default=str))
    else:
        printer(result)
    return 0
