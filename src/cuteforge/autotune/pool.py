"""Parallel compilation in GPU-blind worker processes; the L2 cache is the rendezvous.

`cute.compile` is not thread-safe and a compiled function cannot be pickled, so
candidates compile in *processes*, and what comes back is only a status: the worker
writes the compiled object into the persistent (L2) cache, and the parent loads it from
there (~ms). A job is a few picklable scalars: the kernel's name, the module that
registers it, its BoundKey, parameters, config and target arch.

Workers never touch CUDA. They fork from a `forkserver` (where the platform has one,
else they `spawn`; CUTEFORGE_COMPILE_START overrides): a fresh process, started once per
parent, that imports torch once and never creates a CUDA context, so a parent holding
one is safe and a worker starts in well under a second after the first. Each worker
pins `CUTEFORGE_ARCH` / `CUTE_DSL_ARCH` to the target and hides every GPU
(`CUDA_VISIBLE_DEVICES=""`) before it imports the DSL. Worker count: `workers=`, else CUTEFORGE_COMPILE_WORKERS,
else `os.cpu_count()`; processes start on demand, so a pool never runs more workers
than it has jobs.

    with CompilePool(workers=8) as pool:
        for outcome in pool.as_completed(jobs):   # time each one as soon as it is ready
            ...
    compile_all(jobs, workers=8)                   # or simply: outcomes in job order
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
import traceback
import types
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

from ..arch import target_arch
from ..signature import BoundKey


def default_workers() -> int:
    env = os.environ.get("CUTEFORGE_COMPILE_WORKERS")
    if env:
        return max(1, int(env))
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class CompileJob:
    """One candidate to compile: picklable scalars only (see the module docstring)."""

    kernel: str
    module: str  # imported by the worker so that the kernel registers
    key: BoundKey
    params: tuple[tuple[str, Any], ...]
    config: Any
    arch: str
    cache_dir: str | None = None  # the parent's cache root (it may change at run time)

    @classmethod
    def of(cls, kernel: Any, key: BoundKey, params: tuple[tuple[str, Any], ...], config: Any, arch: str) -> CompileJob:
        from ..cache import cache_root

        return cls(kernel.name, kernel.builder.__module__, key, tuple(params), config, arch, str(cache_root()))


@dataclass
class CompileOutcome:
    job: CompileJob
    ok: bool
    ms: float  # wall time of the job inside the worker
    error: str | None = None
    compiled: bool = False  # False: the worker found the object in the L2 cache already
    pid: int = 0
    started: float = 0.0  # time.time() in the worker: lets a caller see jobs overlap
    ended: float = 0.0

    @property
    def status(self) -> str:
        return "failed" if not self.ok else "compiled" if self.compiled else "loaded"


# --- worker side ----------------------------------------------------------------------


def _init_worker(arch: str) -> None:
    """Runs once per worker, before any job: pin the target, hide the GPUs, import."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["CUTEFORGE_ARCH"] = arch
    os.environ["CUTE_DSL_ARCH"] = arch
    # Pay the DSL import (~2 s) now rather than inside the first job's timing.
    import cutlass.cute  # noqa: F401


def _ping(delay: float) -> int:
    time.sleep(delay)
    return os.getpid()


def _run_job(job: CompileJob) -> CompileOutcome:
    t0, wall0 = time.perf_counter(), time.time()
    try:
        if job.arch != os.environ.get("CUTEFORGE_ARCH"):
            raise RuntimeError(f"worker is pinned to {os.environ.get('CUTEFORGE_ARCH')}, job targets {job.arch}")
        if job.cache_dir:
            os.environ["CUTEFORGE_CACHE_DIR"] = job.cache_dir
        importlib.import_module(job.module)
        from ..cache import STATS
        from ..kernel import REGISTRY

        if job.kernel not in REGISTRY:
            raise KeyError(f"importing {job.module!r} registered no kernel named {job.kernel!r}")
        k = REGISTRY[job.kernel]
        before = STATS.compiles
        k.compile(k.spec(job.key, job.params, job.config, arch=job.arch))
        compiled = STATS.compiles > before
    except Exception as e:  # reported, never raised: one bad candidate must not stop a sweep
        frames = traceback.format_exception(type(e), e, e.__traceback__)
        where = "".join(frames[-3:-1]).strip().replace("\n", " | ")[-500:]
        err = f"{type(e).__name__}: {str(e)[:1000]} [at {where}]"
        return CompileOutcome(job, False, (time.perf_counter() - t0) * 1e3, err, False, os.getpid(), wall0, time.time())
    return CompileOutcome(job, True, (time.perf_counter() - t0) * 1e3, None, compiled, os.getpid(), wall0, time.time())


# --- parent side ----------------------------------------------------------------------


def _default_start() -> str:
    import multiprocessing

    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


@contextlib.contextmanager
def _plain_main() -> Iterator[None]:
    """Hide the parent's `__main__` while workers start.

    A spawned child re-runs the parent's main script to rebuild `__main__`; jobs only
    name modules, so that is never needed, and a script that touches CUDA at import
    would break every worker. Workers start inside `submit`, so masking there suffices.
    """
    real = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if real is not None:
            sys.modules["__main__"] = real


class CompilePool:
    """A lazily started pool of GPU-blind compile workers for one target arch."""

    def __init__(self, workers: int | None = None, arch: str | None = None, start_method: str | None = None) -> None:
        self.workers = workers or default_workers()
        self.arch = arch or target_arch()
        self.start_method = start_method or os.environ.get("CUTEFORGE_COMPILE_START") or _default_start()
        self._ex: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._ex is None:
            ctx = get_context(self.start_method)
            if self.start_method == "forkserver":
                # The server imports torch once (most of a worker's start-up) and never
                # touches CUDA; the DSL is imported per worker, after the arch is pinned.
                ctx.set_forkserver_preload(["torch"])
            self._ex = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_init_worker, initargs=(self.arch,))
        return self._ex

    def submit(self, job: CompileJob) -> Future[CompileOutcome]:
        if job.arch != self.arch:
            raise ValueError(f"this pool compiles for {self.arch}, the job targets {job.arch}")
        with _plain_main():
            return self._executor().submit(_run_job, job)

    def warm(self, n: int | None = None, timeout: float = 300.0) -> int:
        """Start `n` workers (default: all) and wait until each has imported the DSL.

        Benchmarks call this to time compilation apart from process start-up.
        Returns how many distinct workers answered.
        """
        n = min(n or self.workers, self.workers)
        seen: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(seen) < n and time.monotonic() < deadline:
            with _plain_main():
                futs = [self._executor().submit(_ping, 0.2) for _ in range(n)]
            seen.update(f.result(timeout=max(1.0, deadline - time.monotonic())) for f in futs)
        return len(seen)

    def as_completed(self, jobs: Iterable[CompileJob]) -> Iterator[CompileOutcome]:
        """Submit every job at once; yield each outcome as soon as its worker finishes."""
        futures = {self.submit(j): j for j in jobs}
        for fut in as_completed(futures):
            yield _outcome(fut, futures[fut])

    def map(self, jobs: Iterable[CompileJob]) -> list[CompileOutcome]:
        jobs = list(jobs)
        futures = [self.submit(j) for j in jobs]
        return [_outcome(f, j) for f, j in zip(futures, jobs)]

    def close(self) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=True, cancel_futures=True)
            self._ex = None

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _outcome(fut: Future[CompileOutcome], job: CompileJob) -> CompileOutcome:
    try:
        return fut.result()
    except Exception as e:  # the worker died (BrokenProcessPool) or could not unpickle
        return CompileOutcome(job, False, 0.0, f"compile worker failed: {type(e).__name__}: {e}")


def compile_all(jobs: Iterable[CompileJob], workers: int | None = None, arch: str | None = None) -> list[CompileOutcome]:
    """Compile every job in worker processes; outcomes in job order. Writes the L2 cache."""
    jobs = list(jobs)
    if not jobs:
        return []
    archs = {j.arch for j in jobs}
    if len(archs) > 1:
        raise ValueError(f"compile_all takes jobs for one arch, got {sorted(archs)}")
    with CompilePool(min(workers or default_workers(), len(jobs)), arch or archs.pop()) as pool:
        return pool.map(jobs)


def disk_cache_usable() -> bool:
    """Workers hand results over through the L2 cache: without it, compile in-process."""
    from .. import cache

    return cache.disk_enabled() and cache._private_root() is not None


def cached_object(kernel: Any, spec: Any) -> Any:
    """Path of `spec`'s object in the L2 cache if it is there, else None."""
    if not disk_cache_usable():
        return None
    obj = kernel.cache_entry(spec)
    return obj if obj.exists() else None
