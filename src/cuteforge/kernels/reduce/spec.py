"""Reductions as cuteforge kernels: signature policy, configs, standard specializations.

`row_reduce` (the last dim): N (the reduced extent) is static: the row loop's trip count
and the vector tail are resolved at compile time. M (rows) and the row stride are
dynamic, so one compiled kernel serves every batch size and every 2-D view of a larger
tensor.

`col_reduce` (any other dim, as an (O, R, I) view with a unit inner stride): every
extent and stride is dynamic; the config (threads across the inner dim, cluster split
of R) is picked from the shape by the op.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ...arch import limits_for, parse_arch
from ...kernel import CompileSpec, kernel
from ...signature import FLOAT_DTYPES, BoundKey, Signature, TensorArg
from . import config as cfg_mod

OPS = ("sum", "mean", "amax", "amin", "argmax")
# The N values `cuteforge precompile` builds ahead of time (powers of two seen in models).
STANDARD_N = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)

SIGNATURE = Signature(
    TensorArg("x", ("M", "N")),
    TensorArg("out", ("M",), dtypes=(*FLOAT_DTYPES, torch.int64)),
    static=("N",),
)


def out_dtype(op: str, x_dtype: torch.dtype) -> torch.dtype:
    return torch.int64 if op == "argmax" else x_dtype


def config_for(arch: str, n: int, dtype_bits: int, m: int | None) -> Any:
    """The heuristic config for an (m, n) problem. Knowing M lets few long rows split
    over a thread-block cluster, which only sm_90 and newer have."""
    return cfg_mod.default_config(n, dtype_bits, m if parse_arch(arch) >= 90 else None)


def _default_config(spec: CompileSpec) -> Any:
    return cfg_mod.default_config(spec.static("N"), spec.bits("x"))


def _configs(spec: CompileSpec) -> list[Any]:
    """Candidates for spec's N and dtype (`validate` then drops what the target cannot run:
    clusters need sm_90+)."""
    return cfg_mod.candidate_configs(spec.static("N"), spec.bits("x"))


def _specializations(ops: Iterable[str] = OPS, ns: Iterable[int] = STANDARD_N) -> Iterable[tuple[BoundKey, dict[str, Any]]]:
    """Every op (sum, mean, amax, amin, argmax) over contiguous rows of each length: a
    reduction kernel compiles in a fraction of a second, and `cuteforge library` calls all five."""
    for op in ops:
        for dt in FLOAT_DTYPES:
            out = torch.empty(1, dtype=out_dtype(op, dt), device="meta")
            for n in ns:  # keyed as the op binds contiguous (M, n) rows and its fresh output
                yield SIGNATURE.fresh_key((torch.empty(1, n, dtype=dt, device="meta"), out)), {"op": op}


def _row_validate(spec: CompileSpec, config: Any) -> None:
    """The autotuner's pre-compile check of a candidate for this spec's N, dtype, target."""
    config.validate(spec.static("N"), spec.bits("x"), limits_for(spec.arch))


@kernel(
    name="row_reduce",
    signature=SIGNATURE,
    archs=("sm_80+",),
    default_config=_default_config,
    configs=_configs,
    specializations=_specializations,
    validate=_row_validate,
)
def row_reduce(spec: CompileSpec) -> Any:
    from .row import make_row_reduce

    return make_row_reduce(
        spec.param("op"), spec.dtype("x"), spec.dtype("out"), spec.static("N"), spec.vec("x"), spec.config
    )


COL_SIGNATURE = Signature(
    TensorArg("x", ("O", "R", "I")),
    TensorArg("out", ("O", "I"), dtypes=(*FLOAT_DTYPES, torch.int64)),
)


def col_config_for(arch: str, o: int, r: int, i: int, dtype_bits: int, vec: int) -> Any:
    """The heuristic column config; the cluster split of R needs sm_90."""
    return cfg_mod.default_col_config(o, r, i, dtype_bits, vec, clusters=parse_arch(arch) >= 90)


def _col_default_config(spec: CompileSpec) -> Any:
    return cfg_mod.ColReduceConfig()


def _col_specializations() -> Iterable[tuple[BoundKey, dict[str, Any]]]:
    """The norms' backward sums of their fp32 dweight partials, (R, Q, N) -> (R, N) in each
    weight dtype (ops/norm_launch.py, default config): every extent is dynamic, so one
    kernel per dtype serves every N that is a multiple of 8."""
    parts = torch.empty(1, 1, 1024, dtype=torch.float32, device="meta")
    for dt in FLOAT_DTYPES:
        yield COL_SIGNATURE.fresh_key((parts, torch.empty(1, 1024, dtype=dt, device="meta"))), {"op": "sum"}


def _col_validate(spec: CompileSpec, config: Any) -> None:
    """The autotuner's pre-compile check of a candidate on this spec's target."""
    config.validate(spec.bits("x"), limits_for(spec.arch))


@kernel(
    name="col_reduce",
    signature=COL_SIGNATURE,
    archs=("sm_80+",),
    default_config=_col_default_config,
    specializations=_col_specializations,
    validate=_col_validate,
)
def col_reduce(spec: CompileSpec) -> Any:
    from .col import make_col_reduce

    return make_col_reduce(spec.param("op"), spec.dtype("x"), spec.dtype("out"), spec.vec("x"), spec.config)
