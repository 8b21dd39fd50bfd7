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

from .kernel_cache import (
    _BYTES,
    _FUNCTIONS,
    DEFAULT_CACHE,
    CompileAfterWarmupError,
    KernelCache,
    _Codec,
    end_warmup,
    log,
    log_topics,
    reset_warmup,
)
from .key import (
    PACKAGE_DIR,
    Entry,
    entry_for,
    entry_parts,
    fingerprint,
    fingerprint_parts,
    key_hash,
    package_source_hash,
    source_hash,
    toolchain_versions,
)
from .store import (
    DEFAULT_LOCK_TIMEOUT_S,
    STATS,
    CacheStats,
    _private_root,
    _save_stats,
    _unwritable,
    artifacts_dir,
    cache_root,
    clear,
    cumulative_stats,
    disk_enabled,
    list_entries,
    lock_timeout,
    private_root,
)

__all__ = [
    "DEFAULT_CACHE", "DEFAULT_LOCK_TIMEOUT_S", "PACKAGE_DIR", "STATS", "CacheStats", "CompileAfterWarmupError", "Entry",
    "KernelCache", "_BYTES", "_FUNCTIONS", "_Codec", "_private_root", "_save_stats", "_unwritable", "artifacts_dir",
    "cache_root", "clear", "cumulative_stats", "disk_enabled", "end_warmup", "entry_for", "entry_parts", "fingerprint",
    "fingerprint_parts", "key_hash", "list_entries", "lock_timeout", "log", "log_topics", "package_source_hash",
    "private_root", "reset_warmup", "source_hash", "toolchain_versions",
]
