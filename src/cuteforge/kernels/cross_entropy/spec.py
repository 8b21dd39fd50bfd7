"""Cross-entropy as cuteforge kernels: signatures, configs, standard specializations.

N (classes) is static like the row reduction's: the row loop is resolved at compile
time. M and the logits row stride are dynamic. The thread layout is the row reduction's
heuristic shape (``config.ce_config``, no cluster). ``ignore_index`` is a compile-time
parameter of every kernel (it is almost always -100).

Three kernels: ``cross_entropy_fwd`` (per-row loss and lse), ``cross_entropy_fwd_reduce``
(mean or sum of the losses in the same launch, optionally lse and the count the mean's
backward needs; parameters ``lse`` and ``mean``), ``cross_entropy_bwd``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ...arch import limits_for
from ...kernel import CompileSpec, kernel
from ...signature import FLOAT_DTYPES, BoundKey, Signature, TensorArg
from ..reduce import config as row_cfg
from . import config as ce_cfg

# vocabulary sizes of common models (Llama 2, GPT-2, Llama 3, Qwen 2): what `precompile` builds
STANDARD_N = (32000, 50257, 128256, 151936)

FWD_SIGNATURE = Signature(
    TensorArg("logits", ("M", "N")),
    TensorArg("target", ("M",), dtypes=(torch.int64,)),
    TensorArg("loss", ("M",), dtypes=(torch.float32,)),
    TensorArg("lse", ("M",), dtypes=(torch.float32,)),
    static=("N",),
)

BWD_SIGNATURE = Signature(
    TensorArg("logits", ("M", "N")),
    TensorArg("target", ("M",), dtypes=(torch.int64,)),
    TensorArg("lse", ("M",), dtypes=(torch.float32,)),
    TensorArg("dloss", ("M",), dtypes=(torch.float32,)),
    TensorArg("dlogits", ("M", "N"), dtype_like="logits"),
    static=("N",),
)


# out (1,) in logits' dtype or fp32 (the loss is summed in fp32 and rounded once to it); lse (L,): L = M + 1 with the parameter lse=True (lse per row,
# then the count of non-ignored rows), else any length (not touched); work: the
# (device, stream) workspace, at least config.work_words(grid) int32 words with the first
# config.WORK_ZERO zero (ops/cross_entropy.py keeps it so).
REDUCE_SIGNATURE = Signature(
    TensorArg("logits", ("M", "N")),
    TensorArg("target", ("M",), dtypes=(torch.int64,)),
    TensorArg("out", ("ONE",)),
    TensorArg("lse", ("L",), dtypes=(torch.float32,)),
    TensorArg("work", ("W",), dtypes=(torch.int32,)),
    static=("N", "ONE"),
)


def config_for(n: int, dtype_bits: int, backward: bool = False) -> Any:
    return ce_cfg.ce_config(n, dtype_bits, backward)


def _candidates(spec: CompileSpec, backward: bool) -> list[Any]:
    """The heuristic, one-row CTAs of 128 / 256 / 512 threads with 4 or 8 vectors in
    flight (those that fit the row), then the row reduction's candidates (none with a
    cluster)."""
    n, bits = spec.static("N"), spec.bits("logits")
    out = [ce_cfg.ce_config(n, bits, backward)]
    nv = -(-n // (128 // bits))
    shapes = [row_cfg.RowReduceConfig(t, t, u) for t, u in ((512, 4), (256, 4), (512, 8), (128, 4)) if nv // t >= u]
    for c in shapes + [c for c in row_cfg.candidate_configs(n, bits) if c.cluster_n == 1]:
        if c not in out:
            out.append(c)
    return out[:8]


def _validate(spec: CompileSpec, config: Any) -> None:
    """The kernels' `validate=` hook: the autotuner's check before compiling a candidate."""
    if config.cluster_n != 1:
        raise ValueError("cross-entropy kernels do not split rows over clusters (cluster_n must be 1)")
    config.validate(spec.static("N"), spec.bits("logits"), limits_for(spec.arch))


def _validate_reduce(spec: CompileSpec, config: Any) -> None:
    _validate(spec, config)
    if spec.static("ONE") != 1:
        raise ValueError(f"cross_entropy_fwd_reduce: 'out' must have 1 element, got {spec.static('ONE')}")


def _vec(spec: CompileSpec, *args: str) -> int:
    return min(spec.vec(a) for a in args)


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _specs(with_grad: bool, ns: Iterable[int] = STANDARD_N) -> Iterable[tuple[BoundKey, dict[str, Any]]]:
    """Keyed as the ops bind contiguous (M, n) logits, the target and fresh outputs."""
    target, f32 = _meta(1, dtype=torch.int64), _meta(1)
    for dt in FLOAT_DTYPES:
        for n in ns:
            logits = _meta(1, n, dtype=dt)
            if with_grad:
                yield BWD_SIGNATURE.fresh_key((logits, target, f32, f32, logits)), {"ignore_index": -100}
            else:
                yield FWD_SIGNATURE.fresh_key((logits, target, f32, f32)), {"ignore_index": -100}


def _ce_kernel(name: str, signature: Signature, specializations: Any, validate: Any = _validate,
               backward: bool = False) -> Any:
    """`@kernel` for one of the cross-entropy kernels: the configs are the direction's
    (`ce_config` and `_candidates`)."""
    return kernel(
        name=name,
        signature=signature,
        archs=("sm_80+",),
        default_config=lambda s: config_for(s.static("N"), s.bits("logits"), backward),
        configs=lambda s: _candidates(s, backward),
        specializations=specializations,
        validate=validate,
    )


@_ce_kernel("cross_entropy_fwd", FWD_SIGNATURE, lambda ns=STANDARD_N: _specs(False, ns))
def cross_entropy_fwd(spec: CompileSpec) -> Any:
    from .device import make_ce_fwd

    return make_ce_fwd(
        spec.dtype("logits"), spec.static("N"), spec.vec("logits"), spec.config, spec.param("ignore_index")
    )


def _reduce_specs(ns: Iterable[int] = STANDARD_N) -> Iterable[tuple[BoundKey, dict[str, Any]]]:
    """mean, with lse (what a training step's `ops.cross_entropy(logits, target)` runs) and
    without (a no-grad call: evaluation), the loss in logits' dtype (torch's) and in fp32
    (`cuteforge.nn`'s causal-LM loss, as transformers reports it); for the fp32 loss also
    the sum with lse (that loss with transformers' `num_items_in_batch`). Other sums
    compile on first use."""
    target, lse, work = _meta(1, dtype=torch.int64), _meta(1), _meta(1, dtype=torch.int32)
    for with_lse in (True, False):
        for dt in FLOAT_DTYPES:
            for out_dt in dict.fromkeys((dt, torch.float32)):
                for n in ns:
                    key = REDUCE_SIGNATURE.fresh_key((_meta(1, n, dtype=dt), target, _meta(1, dtype=out_dt), lse, work))
                    yield key, {"ignore_index": -100, "lse": with_lse, "mean": True}
                    if with_lse and out_dt != dt:
                        yield key, {"ignore_index": -100, "lse": True, "mean": False}


@_ce_kernel("cross_entropy_fwd_reduce", REDUCE_SIGNATURE, _reduce_specs, _validate_reduce)
def cross_entropy_fwd_reduce(spec: CompileSpec) -> Any:
    from .device import make_ce_fwd_reduce

    _validate_reduce(spec, spec.config)
    return make_ce_fwd_reduce(
        spec.dtype("logits"), spec.static("N"), spec.vec("logits"), spec.config, spec.param("ignore_index"),
        bool(spec.param("mean")), bool(spec.param("lse")), spec.dtype("out"),
    )


@_ce_kernel("cross_entropy_bwd", BWD_SIGNATURE, lambda ns=STANDARD_N: _specs(True, ns), backward=True)
def cross_entropy_bwd(spec: CompileSpec) -> Any:
    from .device import make_ce_bwd

    return make_ce_bwd(
        spec.dtype("logits"), spec.static("N"), _vec(spec, "logits", "dlogits"), spec.config, spec.param("ignore_index")
    )
