"""The on-disk store: its root (and whether it may be trusted or written), the counters
saved there at exit, artifact dumps, and listing or clearing its entries."""

from __future__ import annotations

import atexit
import json
import os
import re
import sys
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



def _text(v: Any) -> str | None:
    return v if isinstance(v, str) else None



def list_entries() -> list[dict[str, Any]]:
    """Every entry under the cache root, newest first (for `cuteforge cache ls`); damaged
    metadata is skipped, a field of the wrong type read as missing."""
    root = cache_root()
    rows = []
    for meta in root.glob("*/*/*.json"):
        try:
            m = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(m, dict):
            continue
        obj = meta.with_suffix(".o")
        try:
            size = obj.stat().st_size if obj.is_file() else 0
        except OSError:
            size = 0
        created = m.get("created")
        rows.append(
            {
                "kernel": _text(m.get("kernel")),
                "key": _text(m.get("key")),
                "arch": _text(m.get("arch")),
                "fingerprint": meta.parent.parent.name,
                "bytes": size,
                "path": str(obj),
                "created": created if trust.finite_number(created) else 0,
            }
        )
    rows.sort(key=lambda r: r["created"], reverse=True)
    return rows



# What cuteforge writes under a cache root, by name pattern: a file (None), a directory whose
# contents are not checked ("*"), or a directory whose children must fit the nested layout.
# A directory of another name or content (a home directory's src/, say) is not cuteforge's.
_Layout = list[tuple[re.Pattern[str], Any]]
_TMP = r"\..+\.tmp"  # trust.atomic_write's temporary file beside its target
_FP = re.compile(r"[0-9a-f]{16}")  # key.fingerprint


def _layout(*rows: tuple[str, Any]) -> _Layout:
    return [(re.compile(rx), sub) for rx, sub in rows]


_ENTRIES = _layout((r"[0-9a-f]{32}\.(o|json|lock|so)", None), (_TMP, None))  # key.Entry
_ROOT = _layout(
    (_FP.pattern, _layout((r"[^/]+", _ENTRIES))),  # <fingerprint>/<kernel>/<key hash>.*
    ("autotune", _layout((_FP.pattern, _layout((r"[^/]+", _layout((r"[0-9a-f]{32}\.json", None), (_TMP, None))))))),
    ("native", _layout((r"ffi_backward-[0-9a-f]{16}", "*"), (r"ffi_backward-[0-9a-f]{16}\.lock", None))),
    ("src", _layout((r"v?[0-9a-f]{64}\.(py|json)", None), (_TMP, None))),  # templates/codecache.py
    ("linked", _layout((r"[0-9a-f]{64}-[0-9a-f]{16}\.so(\.sha256)?", None), (_TMP, None))),
    ("quarantine", _layout((r"[0-9a-f]{32}\.(o|json|so)\.\d+-\d+", None))),
    ("artifacts", _layout((r"[^/]+", _layout((r"[0-9a-f]{32}\.(ptx|cubin|sass)", None), (_TMP, None))))),
    (r"stats\.json|stats\.lock|source-hash\.json", None),  # here and key.py's source-hash memo
    (r"\.(stats\.json|source-hash\.json)\..+\.tmp", None),
)


def _fits(entry: os.DirEntry[str], layout: _Layout) -> bool:
    """Whether `entry` (not followed if a link) is one of `layout`'s files or directories."""
    for rx, sub in layout:
        if not rx.fullmatch(entry.name):
            continue
        if sub is None:
            if entry.is_file(follow_symlinks=False):
                return True
        elif entry.is_dir(follow_symlinks=False):
            if sub == "*":
                return True
            try:
                with os.scandir(entry.path) as it:
                    if all(_fits(child, sub) for child in it):
                        return True
            except OSError:
                pass
    return False



def clear() -> int:
    """Delete cuteforge's own files under the cache root (its entries, tuning results, the
    C++ extension, rendered sources, linked libraries, quarantine, artifacts, stats);
    anything else there is left, and named on stderr. Returns how many object files went.
    Raises UntrustedPath for a root the cache would refuse, and ValueError, deleting
    nothing, for a root that holds only files cuteforge did not write."""
    import shutil

    root = cache_root()
    if not os.path.lexists(root):
        return 0
    real = trust.check_root(root)
    with os.scandir(real) as it:
        entries = sorted(it, key=lambda e: e.name)
    mine = {e.name: _fits(e, _ROOT) for e in entries}
    own = [e for e in entries if mine[e.name]]
    other = [e.name for e in entries if not mine[e.name]]
    if other and not own:
        raise ValueError(f"{root} does not look like a cuteforge cache (it holds {len(other)} files or directories "
                         "cuteforge did not write); deleted nothing")
    n = 0
    for e in own:
        path = Path(e.path)
        if e.is_dir(follow_symlinks=False):
            if _FP.fullmatch(e.name):
                n += sum(1 for _ in path.glob("*/*.o"))
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if other:
        shown = ", ".join(other[:8]) + (f" and {len(other) - 8} more" if len(other) > 8 else "")
        print(f"cuteforge: left {len(other)} files or directories in {root} that cuteforge did not write: {shown}",
              file=sys.stderr)
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
    return {k: v if trust.finite_number(v := stored.get(k)) else 0 for k in zero}



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
