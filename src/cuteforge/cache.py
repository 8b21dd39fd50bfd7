"""The persistent (L2) kernel cache: compiled objects on disk, shared by every process.

Layout: `<root>/<fingerprint>/<kernel>/<key-hash>.o` with a `.json` beside it holding the
object's sha256 and the key it was compiled for. The fingerprint covers everything that
changes generated code: cuteforge's own sources (plus a user kernel's source file), the
installed `nvidia-cutlass-dsl*` distributions, tvm-ffi, the Python minor version and the
target arch. A change gives a new directory; stale ones are left for `cache clear`.

Concurrency: readers take no lock. An entry appears only through `os.replace` of a fully
written temp file, and a reader verifies the object against the sha256 in its `.json`
before loading it, so a partial or corrupt file is never loaded. A miss takes a per-key
file lock and looks again before compiling, so N processes missing the same key compile
it once. A corrupt entry is moved to `<root>/quarantine/` with a warning and recompiled.

Loading an object runs its code, so the cache root must be private: it is created 0700,
and a root owned by another user or writable by others is refused (with a warning) in
favour of in-memory compilation.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from . import compiler

log = logging.getLogger("cuteforge")
PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass
class CacheStats:
    l1_hits: int = 0
    l2_loads: int = 0
    compiles: int = 0
    compile_ms: float = 0.0
    load_ms: float = 0.0
    quarantined: int = 0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


STATS = CacheStats()


class CompileAfterWarmupError(RuntimeError):
    """A kernel compiled after `end_warmup(strict=True)`."""


_warm = {"sealed": False, "strict": False}


def end_warmup(strict: bool = True) -> None:
    """Declare warm-up over: any later compile raises (strict) or warns.

    Serving systems call this after compiling every shape they expect, so that an
    unexpected multi-second compile on the request path is loud, not silent.
    `CUTEFORGE_STRICT=1` makes warnings raise as well.
    """
    _warm["sealed"] = True
    _warm["strict"] = strict


def reset_warmup() -> None:
    _warm["sealed"] = False
    _warm["strict"] = False


def log_topics() -> set[str]:
    """CUTEFORGE_LOG=source,artifacts,compile: what to log (and dump) on each compile."""
    return {t.strip() for t in os.environ.get("CUTEFORGE_LOG", "").split(",") if t.strip()}


def cache_root() -> Path:
    return Path(os.environ.get("CUTEFORGE_CACHE_DIR") or Path.home() / ".cache" / "cuteforge")


def disk_enabled() -> bool:
    return os.environ.get("CUTEFORGE_CACHE", "1") != "0"


@functools.cache
def source_hash(files: tuple[str, ...], base: str = "") -> str:
    """sha256 over files' names (relative to `base`) and contents, once per process."""
    h = hashlib.sha256()
    for f in files:
        h.update(os.path.relpath(f, base).encode() if base else os.path.basename(f).encode())
        h.update(Path(f).read_bytes())
    return h.hexdigest()


def package_source_hash() -> str:
    files = tuple(sorted(str(p) for p in PACKAGE_DIR.rglob("*.py")))
    return source_hash(files, str(PACKAGE_DIR))


@functools.cache
def toolchain_versions() -> tuple[tuple[str, str], ...]:
    """Every installed nvidia-cutlass-dsl* distribution (cu12 and cu13 libs differ) + tvm-ffi."""
    from importlib import metadata

    found = set()
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower().replace("_", "-")
        if name.startswith("nvidia-cutlass-dsl") or name == "apache-tvm-ffi":
            found.add((name, dist.version))
    return tuple(sorted(found))


@functools.cache
def fingerprint(arch: str) -> str:
    parts = {
        "cuteforge": package_source_hash(),
        "toolchain": toolchain_versions(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "arch": arch,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


_refused: set[str] = set()


def _private_root() -> Path | None:
    """The cache root if it is safe to load code from, else None (warned once)."""
    root = cache_root()
    try:
        if not root.exists():
            root.mkdir(parents=True, mode=0o700, exist_ok=True)
            os.chmod(root, 0o700)
        st = root.stat()
    except OSError as e:
        reason = f"cannot create it ({e})"
    else:
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            reason = f"it is owned by uid {st.st_uid}, not by this user"
        elif st.st_mode & 0o022:
            reason = f"others can write to it (mode {oct(st.st_mode & 0o777)})"
        else:
            return root
    if str(root) not in _refused:
        _refused.add(str(root))
        warnings.warn(
            f"cuteforge: not using the kernel cache at {root}: {reason}. "
            "Kernels compile in memory for this process; fix the directory or set CUTEFORGE_CACHE_DIR.",
            stacklevel=3,
        )
    return None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _atomic_write(path: Path, write: Callable[[str], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Entry:
    """Where one compile key lives on disk."""

    obj: Path
    meta: Path
    lock: Path

    @classmethod
    def at(cls, directory: Path, key_hash: str) -> Entry:
        return cls(directory / f"{key_hash}.o", directory / f"{key_hash}.json", directory / f"{key_hash}.lock")


def key_hash(key_repr: str) -> str:
    return hashlib.sha256(key_repr.encode()).hexdigest()[:32]


def entry_for(root: Path, *, kernel: str, key_repr: str, arch: str, extra_fingerprint: str = "") -> Entry:
    """Where a compile key lives: <root>/<fingerprint>/<kernel>[-<source hash>]/<key hash>.o"""
    sub = f"{kernel}-{extra_fingerprint[:8]}" if extra_fingerprint else kernel
    return Entry.at(root / fingerprint(arch) / sub, key_hash(key_repr))


@dataclass(frozen=True)
class _Codec:
    """How an entry's payload is written and read back. `fresh(kernel, result, written)` is
    the value a fresh compile returns (`written`: the entry that now holds it, or None)."""

    export: Callable[[compiler.CompileResult, str], None]
    load: Callable[[Path], Any]
    fresh: Callable[[str, compiler.CompileResult, Path | None], Any]


def _fresh_function(kernel: str, result: compiler.CompileResult, written: Path | None) -> Any:
    if result.function is not None:
        return result.function
    # Compile-only (no GPU): the DSL builds no launchable function, but the exported
    # object loads fine and proves the entry is usable.
    return compiler.load_object(str(written)) if written is not None else _not_launchable(kernel)


def _write_bytes(result: compiler.CompileResult, path: str) -> None:
    Path(path).write_bytes(result.compiled)


# TVM-FFI objects called with torch tensors; plain bytes handed to another runtime
# (cuteforge.jax gives XLA the object itself).
_FUNCTIONS = _Codec(lambda r, path: compiler.export_object(r.compiled, path), lambda p: compiler.load_object(str(p)), _fresh_function)
_BYTES = _Codec(_write_bytes, lambda p: p.read_bytes(), lambda kernel, r, written: r.compiled)


class KernelCache:
    """Gets a callable for a compile key: from disk if any process compiled it, else compiles.

    `compile_fn()` returns a `compiler.CompileResult`; `label` names the kernel in logs.
    """

    def get(
        self,
        *,
        kernel: str,
        key_repr: str,
        arch: str,
        compile_fn: Callable[[bool], compiler.CompileResult],
        extra_fingerprint: str = "",
        source_path: str | None = None,
    ) -> Callable[..., Any]:
        return self._get(kernel, key_repr, arch, compile_fn, extra_fingerprint, source_path, _FUNCTIONS)

    def get_bytes(
        self,
        *,
        kernel: str,
        key_repr: str,
        arch: str,
        compile_fn: Callable[[bool], compiler.CompileResult],
        extra_fingerprint: str = "",
        source_path: str | None = None,
    ) -> bytes:
        """As `get`, for a compile whose `CompileResult.compiled` is the object's bytes,
        returned as they are (another runtime loads them: cuteforge.jax)."""
        return self._get(kernel, key_repr, arch, compile_fn, extra_fingerprint, source_path, _BYTES)

    def _get(self, kernel: str, key_repr: str, arch: str, compile_fn: Callable[[bool], compiler.CompileResult],
             extra_fingerprint: str, source_path: str | None, codec: _Codec) -> Any:
        root = _private_root() if disk_enabled() else None
        if root is None:
            return codec.fresh(kernel, self._compile(kernel, key_repr, compile_fn, None, source_path), None)
        entry = entry_for(root, kernel=kernel, key_repr=key_repr, arch=arch, extra_fingerprint=extra_fingerprint)
        entry.obj.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        value, problem = self._load(entry, codec)
        if value is not None:
            return value
        with FileLock(str(entry.lock)):
            # Another process may have compiled it while we waited for the lock.
            value, problem = self._load(entry, codec)
            if value is not None:
                return value
            if problem is not None:
                self._quarantine(root, entry, problem)
            result = self._compile(kernel, key_repr, compile_fn, entry, source_path)
            staged = str(entry.obj) + ".new"
            try:
                codec.export(result, staged)
                meta = {"kernel": kernel, "key": key_repr, "sha256": _sha256(Path(staged)), "arch": arch, "created": time.time()}
                _atomic_write(entry.meta, lambda p: Path(p).write_text(json.dumps(meta, indent=1)))
                os.replace(staged, entry.obj)
            except Exception as e:  # a full disk must not break the call
                Path(staged).unlink(missing_ok=True)
                warnings.warn(f"cuteforge: could not write cache entry {entry.obj}: {e}", stacklevel=3)
                return codec.fresh(kernel, result, None)
            return codec.fresh(kernel, result, entry.obj)

    def _load(self, entry: Entry, codec: _Codec = _FUNCTIONS) -> tuple[Any, str | None]:
        """(value, None) on success; (None, reason) if the entry is corrupt; (None, None) if absent."""
        if not entry.obj.exists():
            return None, None
        t0 = time.perf_counter()
        try:
            meta = json.loads(entry.meta.read_text())
            if _sha256(entry.obj) != meta["sha256"]:
                return None, "object does not match its recorded sha256 (truncated or altered)"
            value = codec.load(entry.obj)
        except FileNotFoundError:
            return None, "its metadata file is missing"
        except Exception as e:  # corrupt JSON, an object the loader rejects, ...
            return None, f"{type(e).__name__}: {str(e)[:200]}"
        STATS.l2_loads += 1
        STATS.load_ms += (time.perf_counter() - t0) * 1e3
        return value, None

    def _quarantine(self, root: Path, entry: Entry, reason: str) -> None:
        qdir = root / "quarantine"
        qdir.mkdir(exist_ok=True, mode=0o700)
        stamp = f"{int(time.time() * 1e3)}-{os.getpid()}"
        for p in (entry.obj, entry.meta):
            if p.exists():
                os.replace(p, qdir / f"{p.name}.{stamp}")
        STATS.quarantined += 1
        warnings.warn(f"cuteforge: cache entry {entry.obj} is corrupt ({reason}); quarantined it and recompiling", stacklevel=5)

    def _compile(
        self,
        kernel: str,
        key_repr: str,
        compile_fn: Callable[[bool], compiler.CompileResult],
        entry: Entry | None,
        source_path: str | None,
    ) -> compiler.CompileResult:
        if _warm["sealed"]:
            msg = f"cuteforge: kernel {kernel!r} compiled after warm-up, key {key_repr}"
            if _warm["strict"] or os.environ.get("CUTEFORGE_STRICT") == "1":
                raise CompileAfterWarmupError(msg)
            warnings.warn(msg, stacklevel=5)
        topics = log_topics()
        t0 = time.perf_counter()
        result = compile_fn("artifacts" in topics)
        ms = (time.perf_counter() - t0) * 1e3
        STATS.compiles += 1
        STATS.compile_ms += ms
        if topics:
            where = f" -> {entry.obj}" if entry else " (in memory)"
            log.warning("cuteforge: compiled %s in %.0f ms%s\n  key: %s", kernel, ms, where, key_repr)
            if "source" in topics and source_path:
                log.warning("cuteforge: %s source: %s", kernel, source_path)
            if "artifacts" in topics:
                self._dump_artifacts(kernel, key_repr, result)
        return result

    def _dump_artifacts(self, kernel: str, key_repr: str, result: compiler.CompileResult) -> None:
        out = artifacts_dir() / kernel
        out.mkdir(parents=True, exist_ok=True)
        stem = out / key_hash(key_repr)
        if result.ptx:
            stem.with_suffix(".ptx").write_text(result.ptx)
        if result.cubin:
            stem.with_suffix(".cubin").write_bytes(result.cubin)
            try:
                stem.with_suffix(".sass").write_text(compiler.disassemble(str(stem.with_suffix(".cubin"))))
            except RuntimeError as e:
                log.warning("cuteforge: %s", e)
        log.warning("cuteforge: %s artifacts: %s.{ptx,cubin,sass}", kernel, stem)


def _not_launchable(kernel: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        raise RuntimeError(f"kernel {kernel!r} was compiled in compile-only mode (no GPU for its target); it cannot launch here")

    return call


def artifacts_dir() -> Path:
    return cache_root() / "artifacts"


def list_entries() -> list[dict[str, Any]]:
    """Every entry under the cache root, newest first (for `cuteforge cache ls`)."""
    root = cache_root()
    rows = []
    for meta in root.glob("*/*/*.json"):
        try:
            m = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        obj = meta.with_suffix(".o")
        rows.append(
            {
                "kernel": m.get("kernel"),
                "key": m.get("key"),
                "arch": m.get("arch"),
                "fingerprint": meta.parent.parent.name,
                "bytes": obj.stat().st_size if obj.exists() else 0,
                "path": str(obj),
                "created": m.get("created"),
            }
        )
    rows.sort(key=lambda r: r["created"] or 0, reverse=True)
    return rows


def clear() -> int:
    """Delete every cache entry; returns how many object files went."""
    import shutil

    root = cache_root()
    n = len(list(root.glob("*/*/*.o"))) if root.exists() else 0
    if root.exists():
        for child in root.iterdir():
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            elif child.name != "stats.json":
                child.unlink(missing_ok=True)
        (root / "stats.json").unlink(missing_ok=True)
    return n


def cumulative_stats() -> dict[str, float]:
    """Counters summed over every process that used this cache root (saved at exit)."""
    path = cache_root() / "stats.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return CacheStats().as_dict()


@atexit.register
def _save_stats() -> None:
    mine = STATS.as_dict()
    if not any(mine.values()) or not disk_enabled():
        return
    root = cache_root()
    if not root.is_dir():
        return
    try:
        with FileLock(str(root / "stats.lock"), timeout=2):
            total = cumulative_stats()
            for k, v in mine.items():
                total[k] = total.get(k, 0) + v
            _atomic_write(root / "stats.json", lambda p: Path(p).write_text(json.dumps(total)))
    except Exception:  # stats are best effort; never fail interpreter exit
        pass


DEFAULT_CACHE = KernelCache()
