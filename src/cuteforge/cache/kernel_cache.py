"""`KernelCache`: the load paths of a compile key (the disk entry, then the kernel bundles,
then a compile under the key's lock, written back), warm-up sealing and compile logging."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from .. import compiler, runtime_libraries, trust
from .key import Entry, entry_parts, key_hash
from .store import STATS, _unwritable, artifacts_dir, disk_enabled, lock_timeout, private_root

log = logging.getLogger("cuteforge")



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



def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()



@dataclass(frozen=True)
class _Codec:
    """How an entry's payload is written and read back. `fresh(kernel, result, written)` is
    the value a fresh compile returns (`written`: the entry that now holds it, or None)."""

    export: Callable[[compiler.CompileResult, str], None]
    load: Callable[[Path], Any]
    fresh: Callable[[str, compiler.CompileResult, Path | None], Any]
    from_bytes: Callable[[bytes], Any]  # a bundle's checked object
    # (object path, library path): the exported object linked into a shared library, and
    # its loader; a process's first load of a cached kernel then skips the DSL's JIT linker
    link: Callable[[str, str], None] | None = None
    load_linked: Callable[[Path], Any] | None = None



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
    from .. import bundle

    return compiler.load_object(str(bundle.private_copy(data)))



_FUNCTIONS = _Codec(lambda r, path: compiler.export_object(r.compiled, path), lambda p: compiler.load_object(str(p)), _fresh_function,
                    _load_bundled, compiler.link_shared, lambda p: compiler.load_shared(str(p)))



_BYTES = _Codec(_write_bytes, lambda p: p.read_bytes(), lambda kernel, r, written: r.compiled, lambda data: data)



def linked_kernels() -> bool:
    """Whether entries are linked into shared libraries when written and loaded from them
    (on by default; ``CUTEFORGE_LINKED_KERNELS=0`` turns it off: entries then load through
    the DSL's JIT linker, tens of ms more on a process's first call of each)."""
    return os.environ.get("CUTEFORGE_LINKED_KERNELS", "1") != "0"


_link_noted: set[str] = set()


def _write_library(lib: Path, obj: str, link: Callable[[str, str], None]) -> None:
    """`obj` linked into `lib`, which appears whole and private (the linker makes its
    output per the umask: a library loads only when private)."""

    def linked(tmp: str) -> None:
        link(obj, tmp)
        os.chmod(tmp, 0o700)

    trust.atomic_write_with(lib, linked)


def _note_link_failure(e: Exception) -> None:
    """One log line per process for entries written without a library: a debug line where
    the machine has no C compiler, a warning where a link failed."""
    kind = "no-compiler" if compiler.linker() is None else "failed"
    if kind in _link_noted:
        return
    _link_noted.add(kind)
    msg = ("cuteforge: cached kernels are not linked into shared libraries (%s: %s); they load through the DSL's "
           "JIT linker, tens of ms more on a process's first call of each")
    (log.debug if kind == "no-compiler" else log.warning)(msg, type(e).__name__, str(e)[:300])


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

    def get_bytes(self, **request: Any) -> bytes:
        """As `get` (the same keyword arguments), for a compile whose `CompileResult.compiled`
        is the object's bytes, returned as they are (another runtime loads them: cuteforge.jax)."""
        return self._get(**request, codec=_BYTES)

    def _get(self, kernel: str, key_repr: str, arch: str, compile_fn: Callable[[bool], compiler.CompileResult],
             extra_fingerprint: str = "", source_path: str | None = None, codec: _Codec = _FUNCTIONS) -> Any:
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
        from .. import bundle

        if not bundle.layers():
            return None
        t0 = time.perf_counter()
        fp, kernel_dir = entry_parts(kernel, arch, extra_fingerprint)
        found = bundle.find_object(fp, kernel_dir, key_hash(key_repr), key_repr, arch)
        if found is None:
            return None
        source, data = found
        try:
            value = KernelCache._bundled_linked(data, codec)
            if value is None:
                value = codec.from_bytes(data)
        except Exception as e:  # an object the loader rejects: compile instead
            trust.warn_once(f"bundle-load:{source}:{kernel}:{key_hash(key_repr)}", f"cuteforge: kernel bundle {source}: "
                            f"{kernel}'s object did not load ({type(e).__name__}: {str(e)[:200]}); compiling instead", stacklevel=5)
            return None
        STATS.bundle_loads += 1
        STATS.load_ms += (time.perf_counter() - t0) * 1e3
        return value

    @staticmethod
    def _bundled_linked(data: bytes, codec: _Codec) -> Any:
        """A bundle's (checked) object through a shared library linked from it into the
        private cache once, `<root>/linked/<object sha256>-<runtime>.so`, so that neither
        this process nor a later one imports the DSL to load it (a bundle stays read-only:
        it ships objects, each machine links its own). `<runtime>` names the libraries it
        links and the link recipe (`compiler.LINK_RECIPE`); beside it `<name>.sha256`, the
        library's own sha256, checked before every load. None where it cannot be (linking
        off, no private root, no linker, runtime libraries not found without the DSL, a
        failed link: logged once; a library that does not match or load is removed, to be
        linked again): the object then loads through the DSL."""
        deps = runtime_libraries.kernel_dependencies()
        root = private_root() if disk_enabled() else None
        if codec.link is None or codec.load_linked is None or not linked_kernels() or deps is None or root is None:
            return None
        try:
            runtime = hashlib.sha256("|".join([compiler.LINK_RECIPE, *deps]).encode()).hexdigest()[:16]
            lib = trust.private_dir(root, "linked") / f"{_sha256(data)}-{runtime}.so"
            stamp = lib.with_name(lib.name + ".sha256")  # the library's own sha256, written after it
            if not (os.path.lexists(lib) and os.path.lexists(stamp)):
                from .. import bundle

                _write_library(lib, str(bundle.private_copy(data)), codec.link)
                trust.atomic_write(stamp, _sha256(trust.read_bytes(lib)))
        except Exception as e:  # the object loads instead
            _note_link_failure(e)
            return None
        try:
            # checked like a cache entry's library: a damaged file is never loaded
            if _sha256(trust.read_bytes(lib)) != trust.read_bytes(stamp).decode().strip():
                raise ValueError("it does not match its sha256")
            return codec.load_linked(lib)
        except Exception as e:
            log.debug("cuteforge: %s did not load (%s: %s); removed, loading the object", lib, type(e).__name__, e)
            for f in (lib, stamp):
                with contextlib.suppress(OSError):
                    f.unlink()
            return None

    def _in_memory(self, kernel: str, key_repr: str, compile_fn: Callable[[bool], compiler.CompileResult],
                   source_path: str | None, codec: _Codec) -> Any:
        return codec.fresh(kernel, self._compile(kernel, key_repr, compile_fn, None, source_path, stacklevel=6), None)

    @staticmethod
    def _write(entry: Entry, kernel: str, key_repr: str, arch: str, result: compiler.CompileResult, codec: _Codec) -> None:
        """The library (where it links), the metadata naming its sha256, then the object;
        each appears whole. A process killed in between leaves metadata without an object
        (a miss) or beside an older object whose sha256 it does not match (damaged:
        recompiled)."""

        def fill(staged: str) -> None:
            codec.export(result, staged)
            meta: dict[str, Any] = {"kernel": kernel, "key": key_repr, "sha256": _sha256(Path(staged).read_bytes()), "arch": arch,
                                    "created": time.time()}
            linked = KernelCache._link(entry, staged, codec)
            if linked is not None:
                meta["lib_sha256"] = linked
            trust.atomic_write(entry.meta, json.dumps(meta, indent=1))

        trust.atomic_write_with(entry.obj, fill)

    @staticmethod
    def _link(entry: Entry, staged: str, codec: _Codec) -> str | None:
        """The staged object linked into the entry's shared library (written whole before
        the metadata that names its sha256); its sha256, or None where it cannot be linked
        (no C compiler, a failed link; logged once): the entry then loads through the DSL."""
        if codec.link is None or not linked_kernels():
            return None
        try:
            _write_library(entry.lib, staged, codec.link)
            return _sha256(trust.read_bytes(entry.lib))
        except Exception as e:  # the object alone is a complete entry
            _note_link_failure(e)
            return None

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
            # the object is the entry (bundles copy it): damaged, the entry is, library or not
            if _sha256(trust.read_bytes(entry.obj)) != meta.get("sha256"):
                return None, "object does not match its recorded sha256 (truncated or altered)"
            value = self._load_linked(entry, meta, codec)
            if value is None:
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

    @staticmethod
    def _load_linked(entry: Entry, meta: dict[str, Any], codec: _Codec) -> Any:
        """The entry's shared library loaded, when the metadata names one and it matches its
        sha256; else None, and the object loads instead (a library that is missing, damaged
        or does not open, say after the DSL's runtime moved, is only a slower load)."""
        expected = meta.get("lib_sha256")
        if (codec.load_linked is None or not linked_kernels() or not isinstance(expected, str)
                or not os.path.lexists(entry.lib)):
            return None
        try:
            if _sha256(trust.read_bytes(entry.lib)) != expected:
                return None
            return codec.load_linked(entry.lib)
        except Exception as e:  # any failure falls back to the object
            log.debug("cuteforge: %s did not load (%s: %s); loading the object", entry.lib, type(e).__name__, e)
            return None

    def _quarantine(self, root: Path, entry: Entry, reason: str) -> None:
        stamp = f"{int(time.time() * 1e3)}-{os.getpid()}"
        try:
            qdir = trust.private_dir(root, "quarantine")
            for p in (entry.obj, entry.meta, entry.lib):
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



DEFAULT_CACHE = KernelCache()
