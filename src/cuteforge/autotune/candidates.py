"""Candidate configs: where they come from, validation, and compiling them (no GPU).

`candidates()` takes `configs=` or the kernel's own list, an optional prune hook, and
drops every config that fails validation against the problem and the target's device
limits, before anything compiles. `iter_ready()` compiles the rest (in GPU-blind worker
processes when there are several) and yields each as soon as it can be loaded, which is
what lets the tuner time one candidate while the others still compile.
`precompile_candidates()` is the compile-only mode: every valid candidate, no GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .. import arch as arch_mod
from ..cache import STATS
from ..kernel import REGISTRY, CompileSpec, Kernel
from .pool import CompileJob, CompilePool, cached_object, default_workers, disk_cache_usable

log = logging.getLogger("cuteforge")

Validator = Callable[[CompileSpec, Any], None]
VALIDATORS: dict[str, Validator] = {}


def register_validator(kernel_name: str, fn: Validator) -> None:
    """`fn(spec, config)` raises ValueError when `config` cannot run `spec`'s problem."""
    VALIDATORS[kernel_name] = fn


def validate_config(kernel: Kernel, spec: CompileSpec, config: Any) -> None:
    """Raise ValueError/AssertionError if `config` is invalid for `spec` on its target.

    The kernel's own `validate=` hook, else one registered with `register_validator`; a
    kernel with neither gets no pre-check (a bad config then fails its compile, and only
    that candidate is dropped)."""
    fn = kernel.validate_config or VALIDATORS.get(kernel.name)
    if fn is not None:
        fn(spec, config)


def resolve_kernel(kernel: Kernel | str) -> Kernel:
    """A kernel, or the registered kernel of that name (a kernel registers when the module
    defining it is imported: the library's with `cuteforge.ops` or `cuteforge.kernels`)."""
    if isinstance(kernel, Kernel):
        return kernel
    if kernel not in REGISTRY:
        raise KeyError(f"unknown kernel {kernel!r} (is the module that defines it imported?); known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[kernel]


def norm_params(params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None) -> tuple[tuple[str, Any], ...]:
    """Sorted (name, value) pairs: the form `Kernel.launcher` keys compiles with."""
    if not params:
        return ()
    items = params.items() if isinstance(params, Mapping) else params
    return tuple(sorted(items))


def candidates(
    kernel: Kernel, spec: CompileSpec, configs: Sequence[Any] | None = None, prune: Callable[[CompileSpec, list[Any]], list[Any]] | None = None
) -> tuple[list[Any], dict[Any, str]]:
    """(valid candidates, {invalid config: reason}), duplicates removed, order kept."""
    if configs is None:
        configs = kernel.configs(spec) if kernel.configs is not None else None
        if not configs:
            configs = [spec.config]
    configs = list(dict.fromkeys(configs))
    if prune is not None:
        configs = list(prune(spec, configs))
    valid, invalid = [], {}
    for c in configs:
        try:
            validate_config(kernel, spec, c)
        except (ValueError, AssertionError) as e:
            invalid[c] = f"invalid: {e}"
            log.info("cuteforge autotune: %s: dropped %r before compiling: %s", kernel.name, c, e)
            continue
        valid.append(c)
    return valid, invalid


Item = tuple[Any, tuple[tuple[str, Any], ...], Any]  # (BoundKey, params, config)


def iter_ready(kernel: Kernel, items: Sequence[Item], arch: str, workers: int | None = None) -> Iterator[tuple[Item, Any, str, float, str | None]]:
    """Yield (item, function or None, status, ms, error) as each item becomes loadable.

    An item is (key, params, config). Status: 'loaded' (it was in the L2 cache),
    'compiled' (by a worker or here) or 'failed'. Items missing from L2 compile in a
    worker pool when there are two or more of them and `workers != 0`; else here.
    """
    specs = {it: kernel.spec(it[0], it[1], it[2], arch=arch) for it in items}
    todo = []
    for it in items:
        if cached_object(kernel, specs[it]) is None:
            todo.append(it)
            continue
        fn, ms, err, compiled = _load_timed(kernel, specs[it])
        yield it, fn, "failed" if fn is None else "compiled" if compiled else "loaded", ms, err
    if len(todo) >= 2 and workers != 0 and disk_cache_usable():
        jobs = {CompileJob.of(kernel, key, params, c, arch): (key, params, c) for key, params, c in todo}
        with CompilePool(min(workers or default_workers(), len(todo)), arch) as pool:
            for out in pool.as_completed(jobs):
                it = jobs[out.job]
                if not out.ok:
                    yield it, None, "failed", out.ms, f"compile failed: {out.error}"
                    continue
                fn, _, err, _ = _load_timed(kernel, specs[it])
                yield it, fn, out.status if fn is not None else "failed", out.ms, err
        return
    for it in todo:
        fn, ms, err, compiled = _load_timed(kernel, specs[it])
        yield it, fn, "failed" if fn is None else "compiled" if compiled else "loaded", ms, err


def _load_timed(kernel: Kernel, spec: CompileSpec) -> tuple[Any, float, str | None, bool]:
    """Through the cache: a load when a worker (or anyone) compiled it, else a compile.
    Returns (function or None, ms, error, whether this process compiled)."""
    t0, before = time.perf_counter(), STATS.compiles
    try:
        fn = kernel.compile(spec)
    except Exception as e:
        return None, (time.perf_counter() - t0) * 1e3, f"compile failed: {type(e).__name__}: {str(e)[:800]}", STATS.compiles > before
    return fn, (time.perf_counter() - t0) * 1e3, None, STATS.compiles > before



def precompile_candidates(kernel: Kernel | str, key: Any, params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
                          **options: Any) -> list[dict[str, Any]]:
    """Compile (or load) every valid candidate for one problem; no GPU needed. One row per
    candidate: config, status ('compiled' | 'loaded' | 'failed' | 'invalid'), ms, error.
    ``options``: those of `precompile_problems` (configs, workers, arch, prune, on_step)."""
    return precompile_problems(kernel, [(key, params)], **options)


def precompile_problems(
    kernel: Kernel | str,
    problems: Sequence[tuple[Any, ...]],  # (key, params) or (key, params, configs)
    *,
    configs: Sequence[Any] | None = None,
    workers: int | None = None,
    arch: str | None = None,
    prune: Callable[[CompileSpec, list[Any]], list[Any]] | None = None,
    on_step: Callable[[str, Any, str], None] | None = None,
) -> list[dict[str, Any]]:
    """`precompile_candidates` for several (key, params) problems through one worker pool.
    A problem may carry its own configs as a third element (None: `configs`). Rows also
    carry 'problem' (the index into `problems`)."""
    k = resolve_kernel(kernel)
    arch = arch or arch_mod.target_arch()
    rows: dict[Any, dict[str, Any]] = {}
    order: list[Any] = []
    index: dict[Item, int] = {}  # item -> the first problem that asked for it
    for i, (key, params, *own) in enumerate(problems):
        params_t = norm_params(params)
        cfgs = own[0] if own and own[0] is not None else configs
        cands, invalid = candidates(k, k.spec(key, params_t, None, arch=arch), cfgs, prune)
        for c, e in invalid.items():
            rows[(i, c)] = {"problem": i, "config": repr(c), "status": "invalid", "ms": 0.0, "error": e}
            order.append((i, c))
        for c in cands:
            index.setdefault((key, params_t, c), i)
            order.append((i, c))
    for it, _fn, status, ms, err in iter_ready(k, list(index), arch, workers):
        row = {"config": repr(it[2]), "status": status, "ms": round(ms, 1), "error": err}
        for i, (key, params, *_own) in enumerate(problems):  # a duplicate problem shares the row
            if key == it[0] and norm_params(params) == it[1]:
                rows[(i, it[2])] = {"problem": i, **row}
        if on_step is not None:
            on_step("compiled", it[2], status)
    return [rows[o] for o in order if o in rows]
