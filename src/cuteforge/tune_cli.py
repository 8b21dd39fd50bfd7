"""`cuteforge tune KERNEL --shapes MxN,... --dtype D [--workers N] [--compile-only --arch A]`,
or `cuteforge tune --problems FILE` for several kernels' problems in one command.

`tune_main` is the command's body (the `cuteforge` parser calls it); it returns a dict
that the command prints as JSON or as a table. On a GPU it tunes every shape (results
land in the store, so a second run is instant); with `compile_only` it only compiles
every valid candidate for every shape, through one worker pool, without a GPU (to warm
the caches of a CI runner or an image) and reports each as compiled | loaded | failed.

A kernel is tunable from the command line once its family registers a problem factory
(`autotune.problems`); this command imports every library family (`kernels.load_all`)
so that their kernels and factories are registered.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .autotune.candidates import norm_params, precompile_problems, resolve_kernel
from .autotune.measure import measurement
from .autotune.problems import ProblemFactory, ProblemInputs, parse_shapes
from .autotune.problems import problem_factory as registered_factory
from .autotune.store import gpu_name
from .autotune.tuner import tune
from .kernel import Kernel


def library_kernel(name: str) -> Kernel:
    """The kernel named `name`, with every library family registered first."""
    from . import kernels

    kernels.load_all()
    return resolve_kernel(name)


def problem_factory(kernel_name: str) -> ProblemFactory:
    """The problem factory of a kernel, with every library family registered first."""
    from . import kernels

    kernels.load_all()
    return registered_factory(kernel_name)


def tune_main(
    kernel: str,
    shapes: list[str] | str,
    dtype: str = "float32",
    workers: int | None = None,
    compile_only: bool = False,
    arch: str | None = None,
    *,
    gpus: int | str | None = None,
    params: dict[str, Any] | None = None,
    force: bool = False,
    progress: bool = True,
    verbose: bool = True,
    distributed: bool = False,
    bundle: str | None = None,
) -> dict[str, Any] | None:
    """Tune (or with `compile_only`, compile every candidate of) `kernel` for `shapes`.

    `gpus`: 'all' or a count: compile every candidate first (worker pool), then time the
    shapes in one process per GPU, shapes dealt round-robin. `verbose` shows the
    autotuner's log lines (cache hits, sweeps) on stderr for the duration of the call.
    `distributed` (under torchrun): the ranks split the shapes, one GPU a rank, and rank 0
    writes every rank's records into its tuning store, or into a bundle at `bundle`
    (`distributed.tune`); None on the other ranks.
    """
    _check_modes(compile_only, gpus, distributed, bundle)
    _set_arch(arch)
    from . import arch as arch_mod

    if distributed:
        from . import distributed as dist_mod

        with _log_to_stderr(verbose):
            return dist_mod.tune(kernel, shapes, dtype, workers, params=params, force=force, out=bundle)
    k = library_kernel(kernel)
    factory = problem_factory(k.name)
    target = arch_mod.target_arch()
    parsed = parse_shapes(shapes)
    problems = [factory(s, dtype, dict(params or {})) for s in parsed]
    t0 = time.perf_counter()
    if not compile_only and measurement().needs_gpu and arch_mod.compile_only():
        raise RuntimeError(f"no GPU of the target arch {target} here: tuning needs one (use --compile-only to only compile)")
    n_gpus = _gpu_count(gpus) if not compile_only else 1
    with _Bar(progress) as bar, _log_to_stderr(verbose):
        if compile_only or n_gpus > 1:
            from .autotune.candidates import candidates

            n = sum(len(candidates(k, k.spec(p.key, tuple(sorted(p.params.items())), None, arch=target), p.configs)[0]) for p in problems)
            bar.start(f"compile {k.name} for {target}", n)
            rows = precompile_problems(k, [(p.key, p.params, p.configs) for p in problems], workers=workers, arch=target,
                                       on_step=lambda *a: bar.advance())
            if compile_only:
                out_shapes = [{"shape": "x".join(map(str, s)), "candidates": [r for r in rows if r["problem"] == i]} for i, s in enumerate(parsed)]
                counts = {st: sum(r["status"] == st for r in rows) for st in ("compiled", "loaded", "failed", "invalid")}
                return {"mode": "compile-only", "kernel": k.name, "arch": target, "dtype": dtype, "shapes": out_shapes, **counts,
                        "wall_s": round(time.perf_counter() - t0, 2)}
            bar.start(f"tune {len(parsed)} shapes on {n_gpus} GPUs", None)
            results = _fan_out(k.name, parsed, dtype, params, force, n_gpus)
        else:
            results = []
            for s, p in zip(parsed, problems):
                label = f"tune {k.name} {'x'.join(map(str, s))} {dtype}"
                bar.start(label, None)
                results.append(tune_one(k, s, p, workers, force, lambda stage, c, d, label=label: bar.note(f"{label}: {stage} {d}")))
    return {"mode": "tune", "kernel": k.name, "arch": target, "gpu": gpu_name(), "gpus": n_gpus,
            "dtype": dtype, "shapes": results, "wall_s": round(time.perf_counter() - t0, 2)}


def load_problems(path: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """`--problems FILE`: a JSON list of {"kernel", "shapes" (e.g. "4096x4096,8192x1024" or a
    list), "dtype" (default float32), "params" (default {})}; each entry checked, errors
    naming the file and the entry."""
    import json

    try:
        with open(os.path.expanduser(path)) as f:
            raw = json.load(f)
    except OSError as e:
        raise ValueError(f"--problems {path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise ValueError(f"--problems {path}: not JSON ({e})") from None
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"--problems {path}: expected a non-empty JSON list of {{\"kernel\", \"shapes\", ...}} objects")
    groups = []
    for i, e in enumerate(raw):
        where = f"--problems {path}: entry {i}"
        if not isinstance(e, dict) or not isinstance(e.get("kernel"), str) or not e.get("shapes"):
            raise ValueError(f"{where}: needs \"kernel\" (a string) and \"shapes\", got {str(e)[:200]}")
        unknown = sorted(set(e) - {"kernel", "shapes", "dtype", "params"})
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; known: kernel, shapes, dtype, params")
        shapes = e["shapes"]
        if not (isinstance(shapes, str) or (isinstance(shapes, list) and all(isinstance(x, str) for x in shapes))):
            raise ValueError(f"{where}: \"shapes\" must be a string or a list of strings, got {shapes!r}")
        dtype, params = e.get("dtype", "float32"), e.get("params", {})
        if not isinstance(dtype, str) or not isinstance(params, dict):
            raise ValueError(f"{where}: \"dtype\" must be a string and \"params\" an object")
        parse_shapes(shapes)  # a bad shape names itself
        groups.append((e["kernel"], ",".join(shapes) if isinstance(shapes, list) else shapes, dtype, params))
    return groups


def tune_problems(path: str, workers: int | None = None, compile_only: bool = False, arch: str | None = None, *,
                  gpus: int | str | None = None, force: bool = False, progress: bool = True, verbose: bool = True,
                  distributed: bool = False, bundle: str | None = None) -> dict[str, Any] | None:
    """`cuteforge tune --problems FILE`: every entry's problems, as `tune_main` tunes one
    kernel's; under torchrun with `distributed`, all of them dealt to the ranks at once
    (`distributed.tune_groups`: one launch, one gather). One result: every row carries its
    kernel and dtype."""
    groups = load_problems(path)
    _check_modes(compile_only, gpus, distributed, bundle)
    if distributed:
        _set_arch(arch)
        from . import distributed as dist_mod

        with _log_to_stderr(verbose):
            return dist_mod.tune_groups(groups, workers, force=force, out=bundle)
    t0 = time.perf_counter()
    parts = [tune_main(kernel, shapes, dtype, workers, compile_only, arch, gpus=gpus, params=params, force=force,
                       progress=progress, verbose=verbose) for kernel, shapes, dtype, params in groups]
    rows = [{**row, "kernel": r["kernel"], "dtype": r["dtype"]} for r in parts if r is not None for row in r["shapes"]]
    kernels = list(dict.fromkeys(r["kernel"] for r in parts if r is not None))
    out: dict[str, Any] = {**parts[0], "kernel": ",".join(kernels), "kernels": kernels,
                           "dtype": ",".join(dict.fromkeys(g[2] for g in groups)), "shapes": rows,
                           "wall_s": round(time.perf_counter() - t0, 2)}
    if compile_only:
        for st in ("compiled", "loaded", "failed", "invalid"):
            out[st] = sum(r[st] for r in parts if r is not None)
    return out


def tune_one(k: Any, shape: tuple[int, ...], p: ProblemInputs, workers: int | None, force: bool, on_step: Any = None) -> dict[str, Any]:
    """Tune one problem of the command (tensors from the current `Measurement`); its result row."""
    tensors = measurement().tensors(p.make_tensors)
    res = tune(k, tensors, p.params, configs=p.configs, reference=p.reference, workers=workers, force=force, dims=p.dims,
               key=p.key, outputs=p.outputs, on_step=on_step)
    del tensors
    best_spec = k.spec(p.key, norm_params(p.params), res.best_config, arch=res.problem.arch)
    return {
        "shape": "x".join(map(str, shape)),
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
        "entry": str(k.cache_entry(best_spec)),  # where the best config's compiled object lives
    }


def _check_modes(compile_only: bool, gpus: int | str | None, distributed: bool, bundle: str | None) -> None:
    """The flags that go together, checked before any work."""
    if bundle is not None and not distributed:
        raise ValueError("--bundle OUT goes with --distributed (a single process: `cuteforge bundle create OUT --from-cache` after tuning)")
    if distributed and (compile_only or gpus is not None):
        raise ValueError("--distributed tunes one GPU a rank: it takes neither --compile-only nor --gpus")
    if bundle is not None and os.path.lexists(os.path.expanduser(bundle)):
        raise ValueError(f"{bundle} exists: remove it or name another bundle")


def _set_arch(arch: str | None) -> None:
    """`--arch`: the target of every compile in this process (checked first)."""
    if arch:
        from .arch import parse_arch

        parse_arch(arch)
        os.environ["CUTEFORGE_ARCH"] = arch
        os.environ["CUTE_DSL_ARCH"] = arch


def _gpu_count(gpus: int | str | None) -> int:
    if gpus is None:
        return 1
    import torch

    have = torch.cuda.device_count()
    n = have if str(gpus).lower() == "all" else int(gpus)
    if not 1 <= n <= have:
        raise ValueError(f"--gpus {gpus}: this machine has {have} GPU(s)")
    return n


def _gpu_main(index: int, queue: Any, kernel: str, shapes: list[tuple[int, ...]], dtype: str, params: dict[str, Any] | None, force: bool) -> None:
    """One timing process per GPU: sees only its GPU; candidates are already compiled."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    try:
        k = library_kernel(kernel)
        rows = []
        for s in shapes:
            row = tune_one(k, s, problem_factory(k.name)(s, dtype, dict(params or {})), 0, force)
            rows.append({**row, "gpu_index": index})
        queue.put((index, rows, None))
    except Exception as e:  # reported to the parent, which raises it
        queue.put((index, [], f"{type(e).__name__}: {e}"))


def _fan_out(kernel: str, shapes: list[tuple[int, ...]], dtype: str, params: dict[str, Any] | None, force: bool, n_gpus: int) -> list[dict[str, Any]]:
    import queue as queue_mod
    from multiprocessing import get_context

    from .autotune.pool import _plain_main

    ctx = get_context("spawn")  # never fork a parent that may hold a CUDA context
    results = ctx.Queue()
    procs = {}
    with _plain_main():
        for g in range(n_gpus):
            mine = shapes[g::n_gpus]
            if mine:
                procs[g] = ctx.Process(target=_gpu_main, args=(g, results, kernel, mine, dtype, params, force))
                procs[g].start()
    got: dict[int, list[dict[str, Any]]] = {}
    errors: list[str] = []
    pending, dead_polls = set(procs), dict.fromkeys(procs, 0)
    while pending:
        try:
            index, rows, err = results.get(timeout=5)
        except queue_mod.Empty:  # a process that died without a word (a crash) is a failure
            for g in list(pending):
                dead_polls[g] += not procs[g].is_alive()
                if dead_polls[g] >= 2:
                    pending.discard(g)
                    errors.append(f"GPU {g}: process exited with code {procs[g].exitcode}")
            continue
        pending.discard(index)
        got[index] = rows
        if err:
            errors.append(f"GPU {index}: {err}")
    for proc in procs.values():
        proc.join()
    if errors:
        raise RuntimeError("tuning failed on " + "; ".join(sorted(errors)))
    by_shape = {r["shape"]: r for rows in got.values() for r in rows}
    return [by_shape["x".join(map(str, s))] for s in shapes]


class _log_to_stderr:  # noqa: N801 - used as a context manager
    """Show INFO lines of the 'cuteforge' logger on stderr while active."""

    def __init__(self, enabled: bool) -> None:
        import logging

        self.enabled, self.log = enabled, logging.getLogger("cuteforge")
        self.handler = logging.StreamHandler()
        self.handler.setFormatter(logging.Formatter("%(message)s"))
        self.level = self.log.level

    def __enter__(self) -> None:
        import logging

        if self.enabled:
            self.log.addHandler(self.handler)
            if self.log.getEffectiveLevel() > logging.INFO:
                self.log.setLevel(logging.INFO)

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.log.removeHandler(self.handler)
            self.log.setLevel(self.level)


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
            label = f"{s['kernel']} {s['shape']}" if len(r.get("kernels", [])) > 1 else s["shape"]
            for c in s["candidates"]:
                t.add_row(label, c["config"], c["status"] + (f" ({c['error'][:60]})" if c["error"] else ""), f"{c['ms']:.0f}")
        con.print(t)
        print(f"{r['compiled']} compiled, {r['loaded']} loaded, {r['failed']} failed, {r['invalid']} invalid in {r['wall_s']} s")
        return
    several = len(r.get("kernels", [])) > 1
    t = Table(title=f"{r['kernel']} tuned on {r['gpu']} ({r['dtype']})")
    for col in (("kernel",) if several else ()) + ("shape", "source", "best", "ms", "runner-up ms", "compiles", "s"):
        t.add_column(col)
    for s in r["shapes"]:
        ru = s["runner_up"]
        t.add_row(*((s["kernel"],) if several else ()), s["shape"], s["source"], s["best"], f"{s['best_ms']}",
                  "-" if ru is None else f"{ru['ms']}", str(s["compiles"]), f"{s['wall_s']:.1f}")
    con.print(t)
    if "ranks" in r:  # distributed: where rank 0 put every rank's records
        b = r.get("bundle")
        where = f"bundle {b['path']} (manifest sha256 {b['sha256']})" if b else "the tuning store"
        print(f"{len(r['records'])} tuning records from {r['ranks']} ranks written into {where} in {r['wall_s']} s")
