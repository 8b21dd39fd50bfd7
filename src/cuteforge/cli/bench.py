"""`cuteforge bench` (ops against torch, or a report on recorded results) and
`cuteforge library` (the library against torch on a GPU, an AOT build without one)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import _console
from .precompile import _print_precompile, cmd_precompile


def cmd_library(args: argparse.Namespace) -> dict[str, Any]:
    """The main job: on a GPU, the library against torch; without one, an AOT build."""
    from .. import arch

    if arch.compile_only():
        return {"mode": "precompile", **cmd_precompile(args)}
    from ..bench.library import OPS, QUICK_SHAPES
    from ..bench.report import run_bench

    # Every op (and backward) at the three bar shapes; --quick leaves out torch.compile.
    shapes = ",".join(f"{m}x{n}" for m, n in QUICK_SHAPES)
    return {"mode": "bench", **run_bench(OPS, shapes, quick=args.quick, compiled=not args.quick, progress=not args.json)}


def _print_library(r: dict[str, Any]) -> None:
    if r["mode"] == "precompile":
        print("No GPU here: compiling the kernel library ahead of time.")
        _print_precompile(r)
        return
    from ..bench.report import print_tables

    print_tables([r])
    _print_bench_summary(r)


def _print_bench_summary(r: dict[str, Any]) -> None:
    """One line per family: where cuteforge was fastest, its median % of copy."""
    from rich.table import Table

    from ..bench.report import family_names, table_rows

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
    from ..bench import report

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
