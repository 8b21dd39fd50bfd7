"""Work split over the ranks of a `torchrun` job (or any launcher that sets RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT), gathered to rank 0.

`cuteforge precompile --distributed --bundle OUT` (`precompile`): the standard
specializations are split over the ranks, each rank compiles its share into its own kernel
cache, the compiled objects and tuning records are gathered to rank 0, which writes one
bundle. The bundle's manifest is the one a single-process `cuteforge bundle create` of the
same specializations writes.

`cuteforge tune KERNEL --shapes ... --distributed [--bundle OUT]` (`tune`), or `--problems
FILE` for several kernels (`tune_groups`): the problems are split over the ranks (rank r
takes problems r, r + world, ...), each rank tunes its share on its own GPU
(cuda:LOCAL_RANK) through the ordinary tuner, and the tuning records are gathered to
rank 0, which writes them into its tuning store, or with `--bundle OUT` into a bundle
together with each problem's winning compiled object. The records are the ones a
single-process `cuteforge tune` of the same shapes writes.

The ranks exchange bytes only, over the gloo backend (CPU), so the same code runs on hosts
with or without GPUs and across hosts."""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import bundle, cache

log = logging.getLogger("cuteforge")


class DistributedError(RuntimeError):
    """A distributed precompile or tune that cannot run (no launcher environment, an unusable
    cache, a failure on some rank)."""


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
    # ranks with a short share wait in the gather for the slowest one: a long tune or
    # precompile must not trip gloo's default of 30 minutes
    dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=_timeout_s()))
    return dist, True


def _timeout_s() -> float:
    """How long a rank waits for the others (CUTEFORGE_DISTRIBUTED_TIMEOUT, seconds; 12 hours)."""
    raw = os.environ.get("CUTEFORGE_DISTRIBUTED_TIMEOUT", "")
    try:
        value = float(raw) if raw else 12 * 3600.0
    except ValueError:
        raise DistributedError(f"CUTEFORGE_DISTRIBUTED_TIMEOUT={raw!r}: expected seconds, e.g. 3600") from None
    if not value > 0:
        raise DistributedError(f"CUTEFORGE_DISTRIBUTED_TIMEOUT={raw!r}: expected a positive number of seconds")
    return value


def _gather_and_merge(dist: Any, rank: int, world: int, part: dict[str, Any],
                      merge: Callable[[list[dict[str, Any]]], Any]) -> Any:
    """Gather every rank's `part` to rank 0, which runs `merge(parts)` unless some rank
    reported an error; every rank then learns the outcome (raising DistributedError on a
    failure anywhere), so none is left waiting. Rank 0 returns what merge returned, the
    others None."""
    parts: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(part, parts, dst=0)
    failed, result = None, None
    if rank == 0:
        assert parts is not None
        errors = [p["error"] for p in parts if p["error"]]
        if errors:
            failed = "; ".join(errors)
        else:
            try:
                result = merge(parts)
            except Exception as e:  # the other ranks wait for the outcome: never leave them hanging
                failed = f"rank 0: {type(e).__name__}: {e}"
    outcome = [failed]
    dist.broadcast_object_list(outcome, src=0)
    if outcome[0]:
        raise DistributedError(outcome[0])
    return result


def precompile(kernels: list[str] | None, out: str | os.PathLike[str], workers: int = 1,
               force: bool = False, extra_ns: tuple[int, ...] = ()) -> dict[str, Any] | None:
    """This rank's share of the precompile; on rank 0 the bundle written at `out` and every
    rank's rows (in job order), on the other ranks None."""
    from .arch import target_arch
    from .cli import precompile as compile_share
    from .cli import precompile_specs

    dist, owned = _init()
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        arch = target_arch()
        jobs = precompile_specs(kernels, extra_ns)
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
                raise DistributedError(f"the kernel cache at {cache.cache_root()} cannot be used")
            fps = [cache.fingerprint(arch)]
            objects = list(bundle._cache_objects(root, fps, bundle.entry_paths(r["entry"] for r in rows)))
            records = list(bundle._cache_records(root, fps))
            if len(objects) != len(rows):
                raise DistributedError(f"{len(rows) - len(objects)} compiled objects are missing from its kernel cache")
        except Exception as e:  # reported by rank 0; every rank still takes part in the gather
            error = f"rank {rank}: {type(e).__name__}: {e}"
        part = {"rank": rank, "jobs": share, "rows": rows, "objects": objects, "records": records, "error": error}

        def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
            by_job = {i: row for p in parts for i, row in zip(p["jobs"], p["rows"])}
            merged_objects = {name: (name, data, entry) for p in parts for name, data, entry in p["objects"]}
            merged_records = {name: (name, data, entry) for p in parts for name, data, entry in p["records"]}
            made = bundle.write(out, merged_objects.values(), merged_records.values(), [arch], force)
            return {"arch": arch, "ranks": world, "kernels": [by_job[i] for i in sorted(by_job)], "bundle": made}

        return _gather_and_merge(dist, rank, world, part, merge)
    finally:
        if owned:
            dist.destroy_process_group()


def _record_item(path: str) -> tuple[str, bytes]:
    """(bundle-relative name, bytes) of a stored tuning record, its name checked against its identity."""
    from .autotune.store import TuneStore

    data = bundle._read_file(Path(path))
    ident = json.loads(data)["identity"]
    name = TuneStore._name(ident)
    if Path(path).name != name:
        raise DistributedError(f"tuning record {path} is not named after its identity")
    return f"autotune/{ident['fingerprint']}/{ident['kernel']}/{name}", data


def _use_local_gpu() -> str | None:
    """Make cuda:LOCAL_RANK this rank's current device (one GPU a rank); its name, or None."""
    import torch

    if not torch.cuda.is_available():
        return None
    local = int(os.environ.get("LOCAL_RANK", "0"))
    n = torch.cuda.device_count()
    if local >= n:
        raise DistributedError(f"local rank {local} has no GPU of its own (this host has {n}): "
                               "run at most one rank per GPU (torchrun --nproc-per-node N)")
    torch.cuda.set_device(local)
    return f"cuda:{local}"


Group = tuple[str, Any, str, dict[str, Any]]  # (kernel, shapes, dtype, params): one `cuteforge tune` command's problems


def tune(kernel: str, shapes: list[str] | str, dtype: str = "float32", workers: int | None = None, *,
         params: dict[str, Any] | None = None, force: bool = False, out: str | os.PathLike[str] | None = None,
         replace: bool = False) -> dict[str, Any] | None:
    """This rank's share of `cuteforge tune --distributed`: on rank 0 the merged result (every
    shape's row, in the order given, with the rank that tuned it) after the records were
    written into its tuning store, or with `out` into a bundle there; on the other ranks None."""
    return tune_groups([(kernel, shapes, dtype, dict(params or {}))], workers, force=force, out=out, replace=replace)


def tune_groups(groups: list[Group], workers: int | None = None, *, force: bool = False,
                out: str | os.PathLike[str] | None = None, replace: bool = False) -> dict[str, Any] | None:
    """`tune` for several kernels' problems at once (`cuteforge tune --problems FILE
    --distributed`): every (kernel, shape) of every group, in order, dealt to the ranks
    (rank r takes problems r, r + world, ...) under one process group and one gather, so
    a problem set pays the launch once and its ranks finish together."""
    from .arch import compile_only, target_arch
    from .autotune.measure import measurement
    from .autotune.problems import parse_shapes
    from .autotune.store import TuneStore, gpu_name
    from .tune_cli import library_kernel, problem_factory, tune_one

    t0 = time.perf_counter()
    dist, owned = _init()
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        arch = target_arch()
        error = None
        rows: list[dict[str, Any]] = []
        share: list[int] = []
        objects: list[tuple[str, bytes, dict[str, Any]]] = []
        records: list[tuple[str, bytes]] = []
        device = None
        missing = 0
        names: list[str] = []
        try:
            kernels = [library_kernel(kernel) for kernel, _, _, _ in groups]  # every name checked on every rank
            names = [k.name for k in kernels]
            items = [(k, shape, dtype, params) for k, (_, shapes, dtype, params) in zip(kernels, groups)
                     for shape in parse_shapes(shapes)]
            share = list(range(rank, len(items), world))
            if workers is None:  # the host's cores shared by its ranks' compile pools
                from .autotune.pool import default_workers

                workers = max(1, default_workers() // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
            if measurement().needs_gpu:
                device = _use_local_gpu()
                if compile_only():
                    raise DistributedError(f"no GPU of the target arch {arch} here: tuning needs one")
            for i in share:
                k, shape, dtype, params = items[i]
                row = tune_one(k, shape, problem_factory(k.name)(shape, dtype, dict(params)), workers, force)
                rows.append({**row, "kernel": k.name, "dtype": dtype, "rank": rank, "device": device, "gpu": gpu_name()})
            records = [_record_item(r["record"]) for r in rows if r["record"]]
            if out is not None:  # the winners' compiled objects travel with the records
                root = cache.private_root()
                if root is None:
                    raise DistributedError(f"the kernel cache at {cache.cache_root()} cannot be used: no winner's "
                                           "compiled object to put in the bundle")
                winners = bundle.entry_paths(r["entry"] for r in rows)
                objects = list(bundle._cache_objects(root, [cache.fingerprint(arch)], winners))
                missing = len(winners) - len(objects)  # served by a bundle layer, or never compiled here
        except Exception as e:  # reported by rank 0; every rank still takes part in the gather
            error = f"rank {rank}: {type(e).__name__}: {e}"
        part = {"rank": rank, "jobs": share, "rows": rows, "objects": objects, "records": records, "error": error,
                "missing": missing}

        def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
            result = _merge_tuned(parts, arch, out, replace, TuneStore())
            result["winners_without_object"] = sum(p["missing"] for p in parts)
            if out is not None and result["winners_without_object"]:
                log.warning("cuteforge tune --distributed: %d winners' compiled objects are not in the ranks' kernel "
                            "caches (served by a bundle, or not compiled there); the bundle holds their tuning records "
                            "only", result["winners_without_object"])
            one = len(groups) == 1
            result.update(kernel=names[0] if one else ",".join(dict.fromkeys(names)), kernels=list(dict.fromkeys(names)),
                          arch=arch, dtype=groups[0][2] if one else ",".join(dict.fromkeys(g[2] for g in groups)),
                          ranks=world, gpus=world, wall_s=round(time.perf_counter() - t0, 2))
            return result

        return _gather_and_merge(dist, rank, world, part, merge)
    finally:
        if owned:
            dist.destroy_process_group()


def _merge_tuned(parts: list[dict[str, Any]], arch: str, out: str | os.PathLike[str] | None, replace: bool,
                 store: Any) -> dict[str, Any]:
    """Rank 0: every rank's rows in shape order; the records into `store`, or a bundle at `out`."""
    by_job = {i: row for p in parts for i, row in zip(p["jobs"], p["rows"])}
    rows = [by_job[i] for i in sorted(by_job)]
    here = cache.fingerprint(arch)
    records = {name: data for p in parts for name, data in p["records"]}
    foreign = sorted({name.split("/")[1] for name in records} - {here})
    if foreign:
        raise DistributedError(f"records of another installation (fingerprint {foreign[0]}, here {here}): every rank "
                               "must run the same cuteforge, CuTe DSL, tvm-ffi and Python")
    made, written = None, []
    if out is not None:
        objects = {name: (name, data, entry) for p in parts for name, data, entry in p["objects"]}
        items = [(name, data, {"file": name, "sha256": bundle._sha256(data)}) for name, data in records.items()]
        made = bundle.write(out, objects.values(), items, [arch], replace)
    else:
        for _, data in sorted(records.items()):
            saved = store.put(data)
            written.append(str(saved) if saved is not None else None)
    return {"mode": "tune", "shapes": rows, "gpu": ", ".join(sorted({str(r.get("gpu")) for r in rows})), "bundle": made,
            "records": written if out is None else sorted(records)}
