"""The on-disk store: its root (and whether it may be trusted or written), the counters
saved there at exit, artifact dumps, and listing or clearing its entries."""

from __future__ import annotations

import atexit
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from .. import trust


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
