"""The persistent (L2) kernel cache: compiled objects on disk, shared by every process.

Layout: `<root>/<fingerprint>/<kernel>/<key-hash>.o` with a `.json` beside it holding the
object's sha256 and the key it was compiled for. The fingerprint covers everything that
changes generated code: cuteforge's own sources (plus a user kernel's source file), the
installed `nvidia-cutlass-dsl*` distributions, tvm-ffi, the Python minor version and the
target arch. A change gives a new directory; stale ones are left for `cache clear`.

Concurrency: readers take no lock. An entry appears only through `os.replace` of a fully
written temp file, and a reader verifies the object against the sha256 and the key in its
`.json` before loading it, so a partial, corrupt or misplaced file is never loaded. A miss
takes a per-key file lock and looks again before compiling, so N processes missing the
same key compile it once. A waiter gives up after `lock_timeout()` (a stopped holder) and
compiles in memory without writing. A corrupt entry, or one that is a link or not this
user's own, is moved to `<root>/quarantine/` with a warning and recompiled.

Loading an object runs its code, so every path goes through `trust.py`: a refused root
(another user's, or writable by others) means in-memory compilation with one warning per
process. A cache that cannot be written (read-only, full, out of inodes) never breaks a
call either: it compiles in memory, again with one warning per process.

Kernel bundles (`bundle.py`: `use_bundle`, CUTEFORGE_BUNDLES) are read-only layers below
this cache: a miss here is looked up in them, each object checked against its bundle's
manifest before it loads, and only a miss in every layer compiles.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from . import compiler, trust

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
    bundle_loads: int = 0  # objects served by a kernel bundle (bundle.py)

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
    """CUTEFORGE_CACHE_DIR, else the user cache directory (platformdirs: on Linux
    $XDG_CACHE_HOME/cuteforge, by default ~/.cache/cuteforge)."""
    if os.environ.get("CUTEFORGE_CACHE_DIR"):
        return Path(os.environ["CUTEFORGE_CACHE_DIR"])
    import platformdirs

    return Path(platformdirs.user_cache_dir("cuteforge", appauthor=False))


def disk_enabled() -> bool:
    return os.environ.get("CUTEFORGE_CACHE", "1") != "0"


DEFAULT_LOCK_TIMEOUT_S = 30.0


def lock_timeout() -> float:
    """CUTEFORGE_LOCK_TIMEOUT (seconds, default 30): how long a process waits for another
    that compiles the same key before compiling it in memory itself."""
    try:
        return max(0.0, float(os.environ.get("CUTEFORGE_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT_S)))
    except ValueError:
        return DEFAULT_LOCK_TIMEOUT_S


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


def fingerprint_parts(arch: str) -> dict[str, Any]:
    """What the fingerprint covers: cuteforge's sources, the DSL and tvm-ffi, Python, the arch."""
    return {
        "cuteforge": package_source_hash(),
        "toolchain": toolchain_versions(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "arch": arch,
    }


@functools.cache
def fingerprint(arch: str) -> str:
    return hashlib.sha256(json.dumps(fingerprint_parts(arch), sort_keys=True).encode()).hexdigest()[:16]


def private_root() -> Path | None:
    """The cache root if it may be trusted (`trust.check_root`), else None after one
    warning per process saying why and how to fix it."""
    root = cache_root()
    try:
        return trust.check_root(root)
    except OSError as e:
        trust.warn_once(
            f"root:{root}",
            f"cuteforge: not using the kernel cache at {root}: {e}. For this process kernels compile in "
            "memory, the C++ extension builds in a private temporary directory, tuning results are "
            f"neither read nor stored and templates render into a private temporary directory; {trust.FIX}.",
            stacklevel=4,
        )
        return None


_private_root = private_root  # the name the compile pool asks


def _unwritable(root: Path, e: BaseException) -> None:
    trust.warn_once(
        f"unwritable:{root}",
        f"cuteforge: the kernel cache at {root} cannot be used ({type(e).__name__}: {e}); kernels that "
        "miss it compile in memory for this process (make it writable, free space, or set CUTEFORGE_CACHE_DIR)",
        stacklevel=5,
    )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


def entry_parts(kernel: str, arch: str, extra_fingerprint: str = "") -> tuple[str, str]:
    """The directories of a kernel's entries below the root: fingerprint, kernel[-source hash]."""
    return fingerprint(arch), f"{kernel}-{extra_fingerprint[:8]}" if extra_fingerprint else kernel


def entry_for(root: Path, *, kernel: str, key_repr: str, arch: str, extra_fingerprint: str = "") -> Entry:
    """Where a compile key lives: <root>/<fingerprint>/<kernel>[-<source hash>]/<key hash>.o"""
    return Entry.at(root.joinpath(*entry_parts(kernel, arch, extra_fingerprint)), key_hash(key_repr))


@dataclass(frozen=True)
class _Codec:
    """How an entry's payload is written and read back. `fresh(kernel, result, written)` is
    the value a fresh compile returns (`written`: the entry that now holds it, or None)."""

    export: Callable[[compiler.CompileResult, str], None]
    load: Callable[[Path], Any]
    fresh: Callable[[str, compiler.CompileResult, Path | None], Any]
    from_bytes: Callable[[bytes], Any]  # a bundle's checked object


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
def _load_bundled(data: bytes) -> Any:
    from . import bundle

    return compiler.load_object(str(bundle.private_copy(data)))


_FUNCTIONS = _Codec(lambda r, path: compiler.export_object(r.compiled, path), lambda p: compiler.load_object(str(p)), _fresh_function,
                    _load_bundled)
_BYTES = _Codec(_write_bytes, lambda p: p.read_bytes(), lambda kernel, r, written: r.compiled, lambda data: data)


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
        bundled = functools.partial(self._bundled, kernel, key_repr, arch, extra_fingerprint, codec)
        root = private_root() if disk_enabled() else None
        if root is None:
            value = bundled()
            return value if value is not None else self._in_memory(kernel, key_repr, compile_fn, source_path, codec)
        try:
            entry = Entry.at(trust.private_dir(root, *entry_parts(kernel, arch, extra_fingerprint)), key_hash(key_repr))
        except OSError as e:  # a refused component, or a directory that cannot be made
            _unwritable(root, e)
            value = bundled()
            return value if value is not None else self._in_memory(kernel, key_repr, compile_fn, source_path, codec)
        value, problem = self._load(entry, key_repr, codec)
        if value is not None:
            return value
        value = bundled()  # a read-only layer: served from the bundle, not copied into the cache
        if value is not None:
            return value
        lock = FileLock(str(entry.lock), timeout=lock_timeout(), mode=0o600)
        try:
            lock.acquire()
        except Timeout:
            # a stopped or hung holder: compile without writing, so one entry has one writer
            trust.warn_once(f"lock:{entry.lock}", f"cuteforge: waited {lock_timeout():.0f} s for another process "
                            f"compiling {kernel} (lock {entry.lock}); compiling it in memory (CUTEFORGE_LOCK_TIMEOUT)", stacklevel=4)
            return self._in_memory(kernel, key_repr, compile_fn, source_path, codec)
        except OSError as e:
            _unwritable(root, e)
            return self._in_memory(kernel, key_repr, compile_fn, source_path, codec)
        try:
            # Another process may have compiled it while we waited for the lock.
            value, problem = self._load(entry, key_repr, codec)
            if value is not None:
                return value
            if problem is not None:
                self._quarantine(root, entry, problem)
            result = self._compile(kernel, key_repr, compile_fn, entry, source_path)
            try:
                self._write(entry, kernel, key_repr, arch, result, codec)
            except Exception as e:  # a full or read-only disk must not break the call
                _unwritable(root, e)
                return codec.fresh(kernel, result, None)
            return codec.fresh(kernel, result, entry.obj)
        finally:
            try:
                lock.release()
            except OSError:
                pass

    @staticmethod
    def _bundled(kernel: str, key_repr: str, arch: str, extra_fingerprint: str, codec: _Codec) -> Any:
        """The object for this key from the first kernel bundle holding it (checked against
        its manifest), or None."""
        from . import bundle

        if not bundle.layers():
            return None
        t0 = time.perf_counter()
        fp, kernel_dir = entry_parts(kernel, arch, extra_fingerprint)
        found = bundle.find_object(fp, kernel_dir, key_hash(key_repr), key_repr, arch)
        if found is None:
            return None
        source, data = found
        try:
            value = codec.from_bytes(data)
        except Exception as e:  # an object the loader rejects: compile instead
            trust.warn_once(f"bundle-load:{source}:{kernel}:{key_hash(key_repr)}", f"cuteforge: kernel bundle {source}: "
                            f"{kernel}'s object did not load ({type(e).__name__}: {str(e)[:200]}); compiling instead", stacklevel=5)
            return None
        STATS.bundle_loads += 1
        STATS.load_ms += (time.perf_counter() - t0) * 1e3
        return value

    def _in_memory(self, kernel: str, key_repr: str, compile_fn: Callable[[bool], compiler.CompileResult],
                   source_path: str | None, codec: _Codec) -> Any:
        return codec.fresh(kernel, self._compile(kernel, key_repr, compile_fn, None, source_path, stacklevel=6), None)

    @staticmethod
    def _write(entry: Entry, kernel: str, key_repr: str, arch: str, result: compiler.CompileResult, codec: _Codec) -> None:
        """The metadata, then the object; each appears whole. A process killed in between
        leaves metadata without an object (a miss) or beside an older object whose sha256
        it does not match (damaged: recompiled)."""

        def fill(staged: str) -> None:
            codec.export(result, staged)
            meta = {"kernel": kernel, "key": key_repr, "sha256": _sha256(Path(staged).read_bytes()), "arch": arch, "created": time.time()}
            trust.atomic_write(entry.meta, json.dumps(meta, indent=1))

        trust.atomic_write_with(entry.obj, fill)

    def _load(self, entry: Entry, key_repr: str, codec: _Codec = _FUNCTIONS) -> tuple[Any, str | None]:
        """(value, None) on success; (None, reason) if the entry is damaged or not to be
        trusted; (None, None) if absent."""
        if not os.path.lexists(entry.obj):
            return None, None
        t0 = time.perf_counter()
        try:
            meta = json.loads(trust.read_bytes(entry.meta))
            if not isinstance(meta, dict):
                return None, "its metadata is not a JSON object"
            if meta.get("key") != key_repr:
                return None, "it was written for another key"
            if _sha256(trust.read_bytes(entry.obj)) != meta.get("sha256"):
                return None, "object does not match its recorded sha256 (truncated or altered)"
            value = codec.load(entry.obj)
        except FileNotFoundError:
            return None, "its metadata file is missing"
        except trust.UntrustedPath as e:
            return None, str(e)
        except Exception as e:  # corrupt JSON, an object the loader rejects, ...
            return None, f"{type(e).__name__}: {str(e)[:200]}"
        STATS.l2_loads += 1
        STATS.load_ms += (time.perf_counter() - t0) * 1e3
        return value, None

    def _quarantine(self, root: Path, entry: Entry, reason: str) -> None:
        stamp = f"{int(time.time() * 1e3)}-{os.getpid()}"
        try:
            qdir = trust.private_dir(root, "quarantine")
            for p in (entry.obj, entry.meta):
                if os.path.lexists(p):
                    os.replace(p, qdir / f"{p.name}.{stamp}")
        except OSError as e:  # the rewrite below replaces the damaged files anyway
            _unwritable(root, e)
        STATS.quarantined += 1
        warnings.warn(f"cuteforge: cache entry {entry.obj} is corrupt ({reason}); quarantined it and recompiling", stacklevel=5)

    def _compile(
        self,
        kernel: str,
        key_repr: str,
        compile_fn: Callable[[bool], compiler.CompileResult],
        entry: Entry | None,
        source_path: str | None,
        stacklevel: int = 5,
    ) -> compiler.CompileResult:
        if _warm["sealed"]:
            msg = f"cuteforge: kernel {kernel!r} compiled after warm-up, key {key_repr}"
            if _warm["strict"] or os.environ.get("CUTEFORGE_STRICT") == "1":
                raise CompileAfterWarmupError(msg)
            warnings.warn(msg, stacklevel=stacklevel)
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
        try:
            stem = artifacts_dir(kernel) / key_hash(key_repr)
            if result.ptx:
                trust.atomic_write(stem.with_suffix(".ptx"), result.ptx)
            if result.cubin:
                trust.atomic_write(stem.with_suffix(".cubin"), result.cubin)
                try:
                    trust.atomic_write(stem.with_suffix(".sass"), compiler.disassemble(str(stem.with_suffix(".cubin"))))
                except RuntimeError as e:
                    log.warning("cuteforge: %s", e)
        except OSError as e:  # a dump is a debugging aid: it never breaks the compile
            log.warning("cuteforge: could not write %s's artifacts: %s", kernel, e)
            return
        log.warning("cuteforge: %s artifacts: %s.{ptx,cubin,sass}", kernel, stem)


def _not_launchable(kernel: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        raise RuntimeError(f"kernel {kernel!r} was compiled in compile-only mode (no GPU for its target); it cannot launch here")

    return call


def artifacts_dir(kernel: str | None = None) -> Path:
    """Where artifact dumps go: `<root>/artifacts[/<kernel>]`, or a private temporary
    directory when the root is refused."""
    parts = ("artifacts",) if kernel is None else ("artifacts", kernel)
    root = private_root()
    if root is not None:
        try:
            return trust.private_dir(root, *parts)
        except OSError as e:
            _unwritable(root, e)
    return trust.private_dir(trust.process_temp_dir("artifacts"), *parts[1:])


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


def _read_stats(root: Path) -> dict[str, float]:
    zero = CacheStats().as_dict()
    try:
        stored = json.loads(trust.read_bytes(root / "stats.json"))
    except (OSError, ValueError):
        return zero
    if not isinstance(stored, dict):
        return zero
    # a damaged file counts as zero, field by field
    ok = (int, float)
    return {k: v if isinstance(v := stored.get(k), ok) and not isinstance(v, bool) and math.isfinite(v) else 0 for k in zero}


def cumulative_stats() -> dict[str, float]:
    """Counters summed over every process that used this cache root (saved at exit)."""
    try:
        return _read_stats(trust.check_root(cache_root()))
    except OSError:
        return CacheStats().as_dict()


@atexit.register
def _save_stats() -> None:
    mine = STATS.as_dict()
    if not any(mine.values()) or not disk_enabled() or not os.path.isdir(cache_root()):
        return
    try:
        root = trust.check_root(cache_root())
        with FileLock(str(root / "stats.lock"), timeout=2, mode=0o600):
            total = _read_stats(root)
            for k, v in mine.items():
                total[k] = total.get(k, 0) + v
            trust.atomic_write(root / "stats.json", json.dumps(total))
    except Exception:  # stats are best effort, and a refused root gets none
        pass


DEFAULT_CACHE = KernelCache()
