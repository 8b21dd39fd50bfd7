"""`cuteforge precompile --distributed --bundle OUT` under `torchrun` (or any launcher that
sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT): the standard specializations are split
over the ranks, each rank compiles its share into its own kernel cache, the compiled objects
and tuning records are gathered to rank 0, which writes one bundle. The bundle's manifest is
the one a single-process `cuteforge bundle create` of the same specializations writes.

The ranks exchange bytes only, over the gloo backend (CPU), so the same code runs on hosts
with or without GPUs and across hosts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class DistributedError(RuntimeError):
    """A distributed precompile that cannot run (no launcher environment, an unusable cache)."""


def _init() -> tuple[Any, bool]:
    """torch.distributed, initialized (gloo) unless it already was; and whether we did it."""
    try:
        import torch.distributed as dist
    except ImportError as e:  # pragma: no cover - torch without distributed support
        raise DistributedError(f"torch.distributed is not available ({e})") from None
    if dist.is_initialized():
        return dist, False
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise DistributedError(f"--distributed needs a launcher such as torchrun ({', '.join(missing)} not set)")
    if not dist.is_gloo_available():
        raise DistributedError("--distributed needs torch.distributed's gloo backend, which this torch lacks")
    dist.init_process_group(backend="gloo")
    return dist, True


def precompile(kernels: list[str] | None, out: str | os.PathLike[str], workers: int = 1,
               force: bool = False) -> dict[str, Any] | None:
    """This rank's share of the precompile; on rank 0 the bundle written at `out` and every
    rank's rows (in job order), on the other ranks None."""
    from . import bundle, cache
    from .arch import target_arch
    from .cli import precompile as compile_share
    from .cli import precompile_specs

    dist, owned = _init()
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        arch = target_arch()
        jobs = precompile_specs(kernels)
        share = list(range(rank, len(jobs), world))
        error = None
        rows: list[dict[str, Any]] = []
        objects: list[tuple[str, bytes, dict[str, Any]]] = []
        records: list[tuple[str, bytes, dict[str, Any]]] = []
        try:
            rows = compile_share(specs=[jobs[i] for i in share], workers=workers, progress=rank == 0) if share else []
            for row in rows:
                row["rank"] = rank
            root = cache.private_root()
            if root is None:
                raise DistributedError(f"rank {rank}: the kernel cache at {cache.cache_root()} cannot be used")
            fps = [cache.fingerprint(arch)]
            objects = list(bundle._cache_objects(root, fps, {str(Path(r["entry"])) for r in rows}))
            records = list(bundle._cache_records(root, fps))
            if len(objects) != len(rows):
                raise DistributedError(f"rank {rank}: {len(rows) - len(objects)} compiled objects are missing "
                                       "from its kernel cache")
        except Exception as e:  # reported by rank 0; every rank still takes part in the gather
            error = f"rank {rank}: {e}"
        part = {"rank": rank, "jobs": share, "rows": rows, "objects": objects, "records": records, "error": error}
        parts: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(part, parts, dst=0)
        failed = None
        if rank == 0:
            assert parts is not None
            errors = [p["error"] for p in parts if p["error"]]
            if errors:
                failed = "; ".join(errors)
            else:
                by_job = {i: row for p in parts for i, row in zip(p["jobs"], p["rows"])}
                all_rows = [by_job[i] for i in sorted(by_job)]
                merged_objects = {name: (name, data, entry) for p in parts for name, data, entry in p["objects"]}
                merged_records = {name: (name, data, entry) for p in parts for name, data, entry in p["records"]}
                try:
                    made = bundle.write(out, merged_objects.values(), merged_records.values(), [arch], force)
                except Exception as e:  # the other ranks wait for the outcome: never leave them hanging
                    failed = f"rank 0: writing the bundle: {e}"
        outcome = [failed]
        dist.broadcast_object_list(outcome, src=0)
        if outcome[0]:
            raise DistributedError(outcome[0])
        if rank != 0:
            return None
        return {"arch": arch, "ranks": world, "kernels": all_rows, "bundle": made}
    finally:
        if owned:
            dist.destroy_process_group()
