"""RMSNorm / LayerNorm as cuteforge kernels: signatures, configs, specializations.

N is static (tiling, tails and the 1/N factor are compile-time); M, every row stride
and the backward's number of persistent CTA groups Q are dynamic. eps, the norm kind
and which optional operands exist are compile-time parameters. Absent operands are
passed as stand-ins of the right shape (see fwd.py / bwd.py), so one signature per
direction covers every variant.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ...arch import limits_for
from ...kernel import CompileSpec, kernel
from ...signature import FLOAT_DTYPES, BoundKey, Signature, TensorArg
from . import config

F32 = (torch.float32,)
STANDARD_N = (1024, 2048, 4096, 5120, 8192, 16384)
MODEL_N = (2048, 4096, 5120, 8192)  # hidden sizes of common models (layer_norm's grid)

FWD_SIGNATURE = Signature(
    TensorArg("x", ("M", "N")),
    TensorArg("weight", ("N",)),
    TensorArg("bias", ("N",), dtype_like="weight"),
    TensorArg("residual", ("M", "N"), dtype_like="x"),
    TensorArg("y", ("M", "N"), dtype_like="x"),
    TensorArg("residual_out", ("M", "N"), dtype_like="x"),
    TensorArg("mean", ("M",), dtypes=F32),
    TensorArg("rstd", ("M",), dtypes=F32),
    static=("N",),
)

BWD_SIGNATURE = Signature(
    TensorArg("x", ("M", "N")),
    TensorArg("weight", ("N",)),
    TensorArg("dy", ("M", "N"), dtype_like="x"),
    TensorArg("dsum", ("M", "N"), dtype_like="x"),
    TensorArg("mean", ("M",), dtypes=F32),
    TensorArg("rstd", ("M",), dtypes=F32),
    TensorArg("dx", ("M", "N"), dtype_like="x"),
    TensorArg("dweight_partial", ("Q", "N"), dtypes=F32),
    TensorArg("dbias_partial", ("Q", "N"), dtypes=F32),
    static=("N",),
)

_FWD_ROWS = ("x", "weight", "bias", "residual", "y", "residual_out")
_BWD_ROWS = ("x", "weight", "dy", "dsum", "dx")


def _vec(spec: CompileSpec, names: tuple[str, ...]) -> int:
    """One element count per vector access for every row operand: the smallest
    alignment, and no access wider than 16 bytes for the widest dtype."""
    widest = max(spec.bits(a) for a in names)
    return min(min(spec.vec(a) for a in names), 128 // widest)


def _validate(spec: CompileSpec, cfg: Any, backward: bool) -> None:
    """The kernels' `validate=` hook: the autotuner's check before compiling a candidate."""
    cfg.validate(spec.static("N"), spec.bits("x"), limits_for(spec.arch), backward)
    if cfg.row_grid and spec.param("has_dw", True):
        raise ValueError("row_grid is for the backward without partials (has_dw=False): the partials' Q rows "
                         "would be one per row block")


def _configs(spec: CompileSpec, backward: bool) -> list[Any]:
    n, bits = spec.static("N"), spec.bits("x")
    if backward:  # the backward's candidates around the heuristic, after this kernel's own default
        base = _default_config(spec, True)
        near = config.row_grid_candidates(base, n, bits) if base.row_grid else []  # the frozen kernel's
        rest = [c for c in config.candidate_configs(n, bits, True, spec.param("kind")) if c != base]
        return ([base] + near + rest)[:8]
    # the forward's defaults differ by kind and, at long rows, by the residual
    return config.candidate_configs(n, bits, False, spec.param("kind"),
                                    bool(spec.param("has_residual")))  # filtered by `validate`


def _specializations(ns: Iterable[int] | None = None) -> Iterable[tuple[BoundKey, dict[str, Any]]]:
    """rms_norm forward (weight in x's dtype, no bias/residual, eps=1e-6) at STANDARD_N, and
    layer_norm forward (weight and bias, eps=1e-5: nn.LayerNorm's) at the model hidden sizes
    MODEL_N; with `ns`, both kinds at those lengths (`cuteforge precompile --shapes`)."""
    layer_ns = MODEL_N if ns is None else ns
    rms_ns = STANDARD_N if ns is None else ns
    for kind, lengths, eps, bias in (("rms", rms_ns, 1e-6, False), ("layer", layer_ns, 1e-5, True)):
        for dt in FLOAT_DTYPES:
            for n in lengths:  # keyed as the op binds contiguous (M, n) rows and fresh outputs
                rows, w = torch.empty(1, n, dtype=dt, device="meta"), torch.empty(n, dtype=dt, device="meta")
                stat = torch.empty(1, device="meta")
                key = FWD_SIGNATURE.fresh_key((rows, w, w, rows, rows, rows, stat, stat))
                yield key, {"kind": kind, "eps": eps, "has_bias": bias, "has_residual": False}


def _bwd_specializations(ns: Iterable[int] | None = None) -> Iterable[tuple[BoundKey, dict[str, Any]]]:
    """The backward a training step runs (no residual), with the weight (and layer_norm's
    bias) wanting gradients and frozen (fine-tuning with frozen norms: the kernel without
    dweight partials, `has_dw` False), at the model hidden sizes MODEL_N (or `ns`): keyed as
    `ops/norm_launch.py` binds its freshly allocated operands (x, weight, dy, dy as dsum,
    statistics, dx, the dweight partials)."""
    for has_dw in (True, False):
        for kind, bias in (("rms", False), ("layer", True)):
            for dt in FLOAT_DTYPES:
                for n in MODEL_N if ns is None else ns:
                    rows, w = torch.empty(1, n, dtype=dt, device="meta"), torch.empty(n, dtype=dt, device="meta")
                    stat, part = torch.empty(1, device="meta"), torch.empty(1, n, device="meta")
                    key = BWD_SIGNATURE.fresh_key((rows, w, rows, rows, stat, stat, rows, part, part))
                    # has_dw is named only when False, as the op names it (older keys unchanged)
                    yield key, {"has_bias": bias, "has_dsum": False, "kind": kind, **({} if has_dw else {"has_dw": False})}


def _default_config(spec: CompileSpec, backward: bool) -> Any:
    n, bits = spec.static("N"), spec.bits("x")
    if backward:
        return config.default_bwd_config(n, bits, bool(spec.param("has_dw", True)), spec.param("kind"))
    return config.default_config(n, bits, False, spec.param("kind"), bool(spec.param("has_residual")))


def _norm_kernel(backward: bool) -> Any:
    """`@kernel` for norm_fwd or norm_bwd: every hook is the direction's own."""
    return kernel(
        name="norm_bwd" if backward else "norm_fwd",
        signature=BWD_SIGNATURE if backward else FWD_SIGNATURE,
        archs=("sm_90+",),
        default_config=lambda s: _default_config(s, backward),
        configs=lambda s: _configs(s, backward),
        specializations=_bwd_specializations if backward else _specializations,
        validate=lambda spec, cfg: _validate(spec, cfg, backward),
    )


@_norm_kernel(backward=False)
def norm_fwd(spec: CompileSpec) -> Any:
    from .fwd import make_norm_fwd

    return make_norm_fwd(
        spec.param("kind"), spec.dtype("x"), spec.dtype("weight"), spec.static("N"), _vec(spec, _FWD_ROWS),
        spec.config, float(spec.param("eps")), bool(spec.param("has_bias")), bool(spec.param("has_residual")),
        _aligned(spec, ("x", "residual")), _aligned(spec, ("weight", "bias")),
    )


@_norm_kernel(backward=True)
def norm_bwd(spec: CompileSpec) -> Any:
    from .bwd import make_norm_bwd

    return make_norm_bwd(
        spec.param("kind"), spec.dtype("x"), spec.dtype("weight"), spec.static("N"), _vec(spec, _BWD_ROWS),
        spec.config, bool(spec.param("has_bias")), bool(spec.param("has_dsum")),
        _aligned(spec, ("x", "dy", "dsum")), _aligned(spec, ("weight",)),
        bool(spec.param("has_dw", True)),  # absent: True (the keys from before it existed)
    )


def _aligned(spec: CompileSpec, names: tuple[str, ...]) -> bool:
    """Every row (or vector) of the named operands starts 16-byte aligned: the per-argument
    vector width covers 16 bytes (what the staged kernels' bulk copies need)."""
    return all(spec.vec(a) * spec.bits(a) == 128 for a in names)

