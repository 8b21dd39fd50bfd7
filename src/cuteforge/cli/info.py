"""`cuteforge info` (GPU, versions, cache dir, target arch) and `cuteforge cache`
(stats, ls, clear of the persistent kernel cache)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import CliError, _mib


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    from .. import __version__

    out: dict[str, str | None] = {"cuteforge": __version__}
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def cmd_info(args: argparse.Namespace) -> dict[str, Any]:
    from .. import arch, cache

    gpu = arch.gpu_info()
    return {
        "gpu": None if gpu is None else {"name": gpu.name, "sm": f"sm_{gpu.sm}", "sm_count": gpu.sm_count},
        "gpu_text": "no GPU" if gpu is None else f"{gpu.name} (SM {gpu.sm // 10}.{gpu.sm % 10}, {gpu.sm_count} SMs)",
        "versions": _versions(),
        "cache_dir": str(cache.cache_root()),
        "disk_cache": cache.disk_enabled(),
        "target_arch": arch.target_arch(),
        "compile_only": arch.compile_only(),
    }


def _print_info(r: dict[str, Any]) -> None:
    v = r["versions"]
    print(f"cuteforge      {v['cuteforge']}")
    print(f"GPU            {r['gpu_text']}")
    print(f"target arch    {r['target_arch']}{'  (compile only)' if r['compile_only'] else ''}")
    print(f"CuTe DSL       nvidia-cutlass-dsl {v['nvidia-cutlass-dsl']}, apache-tvm-ffi {v['apache-tvm-ffi']}")
    print(f"torch          {v['torch']}")
    print(f"kernel cache   {r['cache_dir']}{'' if r['disk_cache'] else '  (disabled: CUTEFORGE_CACHE=0)'}")


def cmd_cache(args: argparse.Namespace) -> Any:
    from .. import cache

    if args.action == "clear" and not args.yes:
        entries = cache.list_entries()
        what = (f"{len(entries)} compiled kernels ({_mib(sum(e['bytes'] for e in entries))}) and the stored "
                f"tuning results under {cache.cache_root()}")
        if not sys.stdin.isatty():
            raise CliError(f"cache clear deletes {what}; pass --yes to confirm (no terminal to ask on)")
        answer = input(f"Delete {what}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            return {"removed": 0, "cache_dir": str(cache.cache_root()), "cancelled": True}
    if args.action == "stats":
        entries = cache.list_entries()
        return {
            "cache_dir": str(cache.cache_root()),
            "entries": len(entries),
            "bytes": sum(e["bytes"] for e in entries),
            "kernels": sorted({e["kernel"] for e in entries if e["kernel"]}),
            "cumulative": cache.cumulative_stats(),
        }
    if args.action == "ls":
        return cache.list_entries()
    removed = cache.clear()
    return {"removed": removed, "cache_dir": str(cache.cache_root())}


def _print_cache(r: Any) -> None:
    if isinstance(r, list):  # ls
        for e in r:
            print(f"{e.get('kernel') or '?':28s} {e.get('arch') or '?':8s} {e.get('bytes', 0):>9d}  {e.get('key') or ''}")
        return
    if "entries" in r:  # stats
        print(f"cache dir      {r['cache_dir']}")
        print(f"entries        {r['entries']} ({_mib(r['bytes'])})")
        print(f"kernels        {', '.join(r['kernels']) or '-'}")
        for k, v in (r.get("cumulative") or {}).items():
            print(f"{k:14s} {round(v, 1) if isinstance(v, float) else v}")
        return
    if r.get("cancelled"):
        print("nothing deleted")
    else:
        print(f"removed {r['removed']} entries from {r['cache_dir']}")
