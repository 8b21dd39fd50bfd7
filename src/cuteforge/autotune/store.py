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

Files are written whole through `os.replace`; readers never see a partial one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from .. import arch as arch_mod
from .. import cache
from ..signature import BoundKey

SCHEMA = 1
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
    if is_dataclass(config):
        t = type(config)
        return {"type": f"{t.__module__}:{t.__qualname__}", "fields": {f.name: getattr(config, f.name) for f in fields(config)}}
    return {"type": None, "repr": repr(config)}


def config_from_json(d: Mapping[str, Any]) -> Any:
    """Rebuild a dataclass config written by `config_to_json` (None if it cannot be)."""
    import importlib

    t = d.get("type") if isinstance(d, Mapping) else None
    if not t:
        return None
    mod, _, qual = t.partition(":")
    try:
        obj: Any = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
        return obj(**d["fields"])
    except Exception:
        return None


def _inf_to_none(v: float) -> float | None:
    return None if v == float("inf") else round(float(v), 6)


class TuneStore:
    """Reads and writes tuning records. `root` defaults to `<cache_root>/autotune`."""

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

    def path(self, ident: Mapping[str, Any]) -> Path:
        h = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
        return self.root / ident["fingerprint"] / ident["kernel"] / f"{h}.json"

    def load(self, kernel: Any, problem: Problem, gpu: str | None = None, dsl: str | None = None) -> dict[str, Any] | None:
        """The stored record for this problem, or None (absent, unreadable or not ours)."""
        ident = self.identity(kernel, problem, gpu, dsl)
        p = self.path(ident)
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict) or rec.get("identity") != ident:
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
    ) -> Path:
        ident = self.identity(kernel, problem, gpu, dsl)
        p = self.path(ident)
        rec = {
            "identity": ident,
            "problem": problem.describe(),
            "best": config_repr(best),
            "best_config": config_to_json(best),
            "times_ms": {config_repr(c): _inf_to_none(t) for c, t in times_ms.items()},
            "errors": {config_repr(c): e for c, e in errors.items()},
            "created": time.time(),
            **(extra or {}),
        }
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(rec, f, indent=1)
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return p


def times_from_record(rec: Mapping[str, Any], configs: list[Any]) -> dict[Any, float] | None:
    """Stored medians for `configs`, or None when any of them was not part of the sweep."""
    stored = rec.get("times_ms", {})
    out: dict[Any, float] = {}
    for c in configs:
        r = config_repr(c)
        if r not in stored:
            return None
        out[c] = float("inf") if stored[r] is None else float(stored[r])
    return out
