"""`cuteforge tune KERNEL --shapes MxN,... --dtype D [--workers N] [--compile-only --arch A]`.

`tune_main` is the command's body (the `cuteforge` parser calls it); it returns a dict
that the command prints as JSON or as a table. On a GPU it tunes every shape (results
land in the store, so a second run is instant); with `compile_only` it only compiles
every valid candidate for every shape, through one worker pool, without a GPU (to warm
the caches of a CI runner or an image) and reports each as compiled | loaded | failed.

A kernel is tunable from the command line once it has a *problem factory*: a function
`(shape, dtype, params) -> ProblemInputs` registered with `register_problem` (the row
reduction's is below).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .candidates import precompile_problems, resolve_kernel
from .tuner import tune


@dataclass
class ProblemInputs:
    key: Any  # BoundKey of the call
    params: dict[str, Any]
    dims: dict[str, int]  # dynamic extents
    make_tensors: Callable[[], tuple[Any, ...]]  # on the GPU (only called when timing)
    reference: Callable[..., Any] | None = None


ProblemFactory = Callable[[tuple[int, ...], str, dict[str, Any]], ProblemInputs]
PROBLEMS: dict[str, ProblemFactory] = {}


def register_problem(kernel_name: str, factory: ProblemFactory) -> None:
    PROBLEMS[kernel_name] = factory


def _row_reduce_problem(shape: tuple[int, ...], dtype: str, params: dict[str, Any]) -> ProblemInputs:
    import torch

    from ..kernels.reduce.spec import out_dtype
    from ..signature import BoundKey, dtype_name, torch_dtype, vector_width

    if len(shape) != 2:
        raise ValueError(f"row_reduce takes shapes MxN, got {'x'.join(map(str, shape))}")
    m, n = shape
    op = params.setdefault("op", "sum")
    dt = torch_dtype(dtype)
    odt = out_dtype(op, dt)
    # Keys of fresh contiguous tensors: (allocations are 256-byte aligned).
    key = BoundKey((dtype_name(dt), dtype_name(odt)), (("N", n),), (vector_width(256, (n,), dt.itemsize), vector_width(256, (), odt.itemsize)))

    def make() -> tuple[Any, ...]:
        x = torch.randn(m, n, device="cuda", dtype=dt)
        return x, torch.empty(m, device="cuda", dtype=odt)

    def reference(x: Any, out: Any) -> Any:
        return {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin, "argmax": torch.argmax}[op](x.float(), dim=-1)

    return ProblemInputs(key, params, {"M": m}, make, reference)


register_problem("row_reduce", _row_reduce_problem)


def parse_shapes(shapes: list[str] | str) -> list[tuple[int, ...]]:
    """'32768x4096,4096x65536' (or a list of such) -> [(32768, 4096), (4096, 65536)]."""
    items = shapes.split(",") if isinstance(shapes, str) else [s for part in shapes for s in part.split(",")]
    out = []
    for s in items:
        s = s.strip().lower()
        if not s:
            continue
        try:
            dims = tuple(int(d) for d in s.split("x"))
        except ValueError:
            raise ValueError(f"bad shape {s!r}: expected integers joined by 'x', e.g. 32768x4096") from None
        if any(d <= 0 for d in dims):
            raise ValueError(f"bad shape {s!r}: extents must be positive")
        out.append(dims)
    if not out:
        raise ValueError("no shapes given (e.g. --shapes 32768x4096,4096x65536)")
    return out


def tune_main(
    kernel: str,
    shapes: list[str] | str,
    dtype: str = "float32",
    workers: int | None = None,
    compile_only: bool = False,
    arch: str | None = None,
    *,
    params: dict[str, Any] | None = None,
    force: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Tune (or with `compile_only`, compile every candidate of) `kernel` for `shapes`."""
    if arch:
        from ..arch import parse_arch

        parse_arch(arch)
        os.environ["CUTEFORGE_ARCH"] = arch
        os.environ["CUTE_DSL_ARCH"] = arch
    from .. import arch as arch_mod

    k = resolve_kernel(kernel)
    if k.name not in PROBLEMS:
        raise ValueError(f"kernel {k.name!r} has no problem factory for the command line; known: {', '.join(sorted(PROBLEMS))}")
    target = arch_mod.target_arch()
    parsed = parse_shapes(shapes)
    problems = [PROBLEMS[k.name](s, dtype, dict(params or {})) for s in parsed]
    t0 = time.perf_counter()
    if not compile_only and arch_mod.compile_only():
        raise RuntimeError(f"no GPU of the target arch {target} here: tuning needs one (use --compile-only to only compile)")
    with _Bar(progress) as bar:
        if compile_only:
            from .candidates import candidates

            n = sum(len(candidates(k, k.spec(p.key, tuple(sorted(p.params.items())), None, arch=target))[0]) for p in problems)
            bar.start(f"compile {k.name} for {target}", n)
            rows = precompile_problems(k, [(p.key, p.params) for p in problems], workers=workers, arch=target, on_step=lambda *a: bar.advance())
            out_shapes = [{"shape": "x".join(map(str, s)), "candidates": [r for r in rows if r["problem"] == i]} for i, s in enumerate(parsed)]
            counts = {st: sum(r["status"] == st for r in rows) for st in ("compiled", "loaded", "failed", "invalid")}
            return {"mode": "compile-only", "kernel": k.name, "arch": target, "dtype": dtype, "shapes": out_shapes, **counts,
                    "wall_s": round(time.perf_counter() - t0, 2)}
        results = []
        for s, p in zip(parsed, problems):
            label = f"tune {k.name} {'x'.join(map(str, s))} {dtype}"
            bar.start(label, None)
            tensors = p.make_tensors()
            res = tune(k, tensors, p.params, reference=p.reference, workers=workers, force=force, dims=p.dims,
                       on_step=lambda stage, c, d, label=label: bar.note(f"{label}: {stage} {d}"))
            results.append({
                "shape": "x".join(map(str, s)),
                "problem": res.problem.describe(),
                "source": res.source,
                "best": repr(res.best_config),
                "best_ms": None if res.best_config not in res.times_ms else round(res.best_ms, 5),
                "runner_up": None if res.runner_up is None else {"config": repr(res.runner_up[0]), "ms": round(res.runner_up[1], 5)},
                "times_ms": {repr(c): (None if t == float("inf") else round(t, 5)) for c, t in res.times_ms.items()},
                "errors": {repr(c): e for c, e in res.errors.items()},
                "compiles": res.compiles,
                "timings": res.timings,
                "timer": res.mode,
                "wall_s": round(res.wall_s, 3),
                "record": res.path,
            })
            del tensors
    return {"mode": "tune", "kernel": k.name, "arch": target, "gpu": arch_mod.gpu_info().name, "dtype": dtype,  # type: ignore[union-attr]
            "shapes": results, "wall_s": round(time.perf_counter() - t0, 2)}


class _Bar:
    """A rich progress bar on stderr (disabled when `enabled` is false or stderr is not a tty)."""

    def __init__(self, enabled: bool) -> None:
        import sys

        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._p = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           console=Console(stderr=True), transient=True, disable=not (enabled and sys.stderr.isatty()))
        self._task: Any = None

    def __enter__(self) -> _Bar:
        self._p.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._p.__exit__(*exc)

    def start(self, description: str, total: int | None) -> None:
        if self._task is not None:
            self._p.update(self._task, visible=False)
        self._task = self._p.add_task(description, total=total)

    def advance(self) -> None:
        self._p.advance(self._task)

    def note(self, description: str) -> None:
        self._p.update(self._task, description=description[:100])


def print_tune(r: dict[str, Any]) -> None:
    """Human output for `tune_main`'s result."""
    from rich.console import Console
    from rich.table import Table

    con = Console()
    if r["mode"] == "compile-only":
        t = Table(title=f"{r['kernel']} candidates compiled for {r['arch']} ({r['dtype']})")
        for col in ("shape", "config", "status", "ms"):
            t.add_column(col, justify="right" if col == "ms" else "left")
        for s in r["shapes"]:
            for c in s["candidates"]:
                t.add_row(s["shape"], c["config"], c["status"] + (f" ({c['error'][:60]})" if c["error"] else ""), f"{c['ms']:.0f}")
        con.print(t)
        print(f"{r['compiled']} compiled, {r['loaded']} loaded, {r['failed']} failed, {r['invalid']} invalid in {r['wall_s']} s")
        return
    t = Table(title=f"{r['kernel']} tuned on {r['gpu']} ({r['dtype']})")
    for col in ("shape", "source", "best", "ms", "runner-up ms", "compiles", "s"):
        t.add_column(col)
    for s in r["shapes"]:
        ru = s["runner_up"]
        t.add_row(s["shape"], s["source"], s["best"], f"{s['best_ms']}", "-" if ru is None else f"{ru['ms']}", str(s["compiles"]), f"{s['wall_s']:.1f}")
    con.print(t)
