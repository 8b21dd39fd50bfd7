"""Tuning results on disk: one JSON file per (kernel, problem, GPU, toolchain).

Layout: `<cache_root>/autotune/<fingerprint>/<kernel>/<problem-hash>.json`. The
fingerprint is the kernel cache's (cuteforge sources, the nvidia-cutlass-dsl
distributions, tvm-ffi, Python, target arch), so editing a kernel, or any cuteforge
source, starts from scratch, exactly as the compiled objects do. The problem hash covers
the kernel's name (plus its source file's hash for a kernel outside the package), the
BoundKey (dtypes, static dims, alignment), the parameters, the *bucketed* dynamic extents
(M=30000 and M=32768 share a result when M is bucketed to a power of two), the GPU's name
and the DSL version. The full identity is written into the file and checked on read, so
a hash collision can never return another problem's answer.

Files are written whole through `os.replace`; readers never see a partial one. Every
path goes through `trust.py`: under a refused root records are neither read nor written.
A record names its config's class, rebuilt only from the classes registered in
`config_types.py` (a name read from a file is never imported). A result that cannot be
written is kept for the process (`TuneStore.load` finds it) and reported in a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import arch as arch_mod
from .. import bundle, cache, config_types, trust
from ..signature import BoundKey

SCHEMA = 1
log = logging.getLogger("cuteforge")
Bucket = Callable[[Mapping[str, int]], Mapping[str, int]]


def pow2_bucket(dims: Mapping[str, int]) -> dict[str, int]:
    """Default bucketing of dynamic extents: the next power of two (0 stays 0)."""
    return {d: 0 if v <= 0 else 1 << (int(v) - 1).bit_length() for d, v in dims.items()}


@dataclass(frozen=True)
class Problem:
    """What a tuning result is for: kernel, target, compile key, parameters, dims."""

    kernel: str
    arch: str
    key: BoundKey
    params: tuple[tuple[str, Any], ...]
    dims: tuple[tuple[str, int], ...]  # dynamic extents, already bucketed

    def describe(self) -> str:
        parts = [self.kernel, *(f"{v}" for _, v in self.params), "/".join(self.key.dtypes)]
        parts += [f"{d}={v}" for d, v in self.key.static] + [f"{d}~{v}" for d, v in self.dims]
        return " ".join(parts) + f" [{self.arch}]"


def make_problem(
    kernel: Any,
    key: BoundKey,
    params: tuple[tuple[str, Any], ...],
    dims: Mapping[str, int],
    arch: str,
    bucket: Bucket | None = None,
) -> Problem:
    """A Problem with dynamic dims bucketed by `bucket`, the kernel's own `tune_bucket`
    if it has one, else to powers of two."""
    fn = bucket or getattr(kernel, "tune_bucket", None) or pow2_bucket
    bucketed = dict(fn(dict(dims)))
    return Problem(kernel.name, arch, key, tuple(params), tuple(sorted((d, int(v)) for d, v in bucketed.items())))


def gpu_name() -> str:
    info = arch_mod.gpu_info()
    return info.name if info is not None else "no-gpu"


def dsl_version() -> str:
    return dict(cache.toolchain_versions()).get("nvidia-cutlass-dsl", "unknown")


def config_repr(config: Any) -> str:
    """The stable text a config is stored under (frozen dataclasses: their repr)."""
    return repr(config)


def config_to_json(config: Any) -> dict[str, Any]:
    return config_types.to_json(config)


def _note_kernel_configs(kernel: Any, problem: Problem) -> None:
    """Let the kernel hand over its configs for `problem`, registering their classes."""
    try:
        spec = kernel.spec(problem.key, problem.params, None, arch=problem.arch)
        if getattr(kernel, "configs", None) is not None:
            kernel.configs(spec)
    except Exception:  # a kernel that cannot describe the problem registers nothing
        pass


def config_from_json(d: Any, kernel: Any = None, problem: Problem | None = None) -> Any:
    """The config a stored `config_to_json` dict describes, or None. Its class must be
    registered (`config_types`); with `kernel` and `problem`, the kernel's configs for
    the problem register theirs first. A record naming anything else is ignored with a
    warning."""
    if not isinstance(d, Mapping) or not d.get("type"):
        return None
    if kernel is not None and problem is not None and config_types.known(str(d["type"])) is None:
        _note_kernel_configs(kernel, problem)
    try:
        return config_types.from_json(d)
    except ValueError as e:
        trust.warn_once(f"config:{str(d.get('type'))[:200]}", f"cuteforge autotune: ignoring a stored config: {e}")
        return None


def _inf_to_none(v: float) -> float | None:
    return None if v == float("inf") else round(float(v), 6)


def _time(v: Any) -> bool:
    """A stored time: None (the config failed) or a finite number."""
    return v is None or trust.finite_number(v)


def _valid_record(rec: Any, ident: Mapping[str, Any]) -> bool:
    """A record of this problem whose times are numbers (or None) by config text."""
    if not isinstance(rec, dict) or rec.get("identity") != ident:
        return False
    times = rec.get("times_ms", {})
    if not isinstance(times, dict) or not all(isinstance(k, str) and _time(v) for k, v in times.items()):
        return False
    return isinstance(rec.get("best_config", {}), dict) and isinstance(rec.get("errors", {}), dict)


class TuneStore:
    """Reads and writes tuning records. `root` defaults to `<cache_root>/autotune`."""

    _kept: dict[str, dict[str, Any]] = {}  # records that could not be written, for this process
    _kept_lock = threading.Lock()

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self._root = Path(root) if root is not None else None

    @property
    def root(self) -> Path:
        return self._root if self._root is not None else cache.cache_root() / "autotune"

    def identity(self, kernel: Any, problem: Problem, gpu: str | None = None, dsl: str | None = None) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "fingerprint": cache.fingerprint(problem.arch),
            "kernel": problem.kernel,
            "kernel_source": kernel.source_fingerprint()[:16] if hasattr(kernel, "source_fingerprint") else "",
            "arch": problem.arch,
            "key": repr(problem.key),
            "params": repr(problem.params),
            "dims": repr(problem.dims),
            "gpu": gpu if gpu is not None else gpu_name(),
            "dsl": dsl if dsl is not None else dsl_version(),
        }

    @staticmethod
    def _name(ident: Mapping[str, Any]) -> str:
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32] + ".json"

    def path(self, ident: Mapping[str, Any]) -> Path:
        return self.root / ident["fingerprint"] / ident["kernel"] / self._name(ident)

    def _dir(self, ident: Mapping[str, Any], create: bool) -> Path:
        """The record's directory, checked (and created with `create`); raises OSError when
        refused or absent."""
        if self._root is not None:
            return trust.private_dir(self._root, ident["fingerprint"], ident["kernel"], create=create)
        root = cache.private_root()
        if root is None:
            raise trust.UntrustedPath(f"the cache root {cache.cache_root()} is refused")
        return trust.private_dir(root, "autotune", ident["fingerprint"], ident["kernel"], create=create)

    def load(self, kernel: Any, problem: Problem, gpu: str | None = None, dsl: str | None = None) -> dict[str, Any] | None:
        """The stored record for this problem, or None (absent, unreadable, refused or not ours)."""
        ident = self.identity(kernel, problem, gpu, dsl)
        kept = self._kept.get(str(self.path(ident)))
        if kept is not None:
            return dict(kept)
        try:
            p = self._dir(ident, create=False) / self._name(ident)
            rec = json.loads(trust.read_bytes(p))
        except (OSError, ValueError):
            found = bundle.find_record(ident["fingerprint"], ident["kernel"], self._name(ident)) if self._root is None else None
            if found is None:  # neither here nor in a kernel bundle (bundle.py)
                return None
            p, rec = found
        if not _valid_record(rec, ident):
            return None
        rec["path"] = str(p)
        return rec

    def save(
        self,
        kernel: Any,
        problem: Problem,
        times_ms: Mapping[Any, float],
        errors: Mapping[Any, str],
        best: Any,
        *,
        gpu: str | None = None,
        dsl: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Path | None:
        """Write the record; None when it cannot be written (a refused root, a read-only or
        full disk): then it is kept for this process and reported in a warning."""
        ident = self.identity(kernel, problem, gpu, dsl)
        rec = {
            "identity": ident,
            "problem": problem.describe(),
            "best": config_repr(best),
            "best_config": config_to_json(best),
            "times_ms": {config_repr(c): _inf_to_none(t) for c, t in times_ms.items()},
            "errors": {config_repr(c): str(e) for c, e in errors.items()},
            "created": time.time(),
            **(extra or {}),
        }
        try:
            p = self._dir(ident, create=True) / self._name(ident)
            trust.atomic_write(p, json.dumps(rec, indent=1, default=repr))
        except Exception as e:  # a finished sweep must survive a store it cannot write
            with self._kept_lock:
                self._kept[str(self.path(ident))] = {**rec, "path": None}
            trust.warn_once(f"tune-store:{self.root}", f"cuteforge autotune: could not store tuning results in {self.root} "
                            f"({type(e).__name__}: {e}); they are kept for this process only", stacklevel=3)
            times = "\n".join(f"  {'failed' if t is None else f'{t:.4f} ms'}  {c}" for c, t in rec["times_ms"].items())
            log.warning("cuteforge autotune: %s: not stored; best %s\n%s", rec["problem"], rec["best"], times)
            return None
        with self._kept_lock:
            self._kept.pop(str(self.path(ident)), None)
        return p

    def put(self, data: bytes) -> Path | None:
        """Store a record another process wrote (its bytes, as its store wrote them) under the
        name its identity gives; None when this store cannot be written (a warning says why).
        ValueError for bytes that are no tuning record."""
        try:
            rec = json.loads(data)
            ident = rec["identity"]
            ok = isinstance(ident, dict) and _valid_record(rec, ident) and ident.get("schema") == SCHEMA
        except (ValueError, KeyError, TypeError, OverflowError):
            ok = False
        if not ok:
            raise ValueError("not a tuning record of this cuteforge")
        try:
            p = self._dir(ident, create=True) / self._name(ident)
            trust.atomic_write(p, data)
        except Exception as e:  # noqa: BLE001 - reported, as `save` reports it
            trust.warn_once(f"tune-store:{self.root}", f"cuteforge autotune: could not store tuning results in {self.root} "
                            f"({type(e).__name__}: {e})", stacklevel=3)
            return None
        return p


def times_from_record(rec: Mapping[str, Any], configs: list[Any]) -> dict[Any, float] | None:
    """Stored medians for `configs`, or None when any of them was not part of the sweep."""
    stored = rec.get("times_ms", {})
    if not isinstance(stored, Mapping):
        return None
    out: dict[Any, float] = {}
    for c in configs:
        r = config_repr(c)
        if r not in stored:
            return None
        t = stored[r]
        if not _time(t):
            return None
        out[c] = float("inf") if t is None else float(t)
    return out
