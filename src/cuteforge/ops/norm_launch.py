"""The norm kernels' launchers behind `cuteforge.ops.rms_norm` / `layer_norm`: argument
checks, the forward's config (a stored tuning result, the small-M early-weight variant, or
the heuristic), the backward's persistent groups (`bwd_groups`), and `_forward` /
`_backward` (the custom ops' bodies), each compiled launch memoized per layout."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from .. import checks
from ..arch import max_active_clusters
from ..kernels.norm import config as norm_config
from ..kernels.norm.spec import norm_bwd, norm_fwd
from ..kernels.reduce.config import ColReduceConfig
from ..kernels.reduce.spec import col_reduce
from ..signature import dtype_name
from .layout import as_rows
from .memo import remember

MAX_N = 262144
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_PLANS: dict[tuple[Any, ...], Any] = {}
_SMS: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def _max_clusters(device: torch.device, c: int) -> int | None:
    """Clusters of c CTAs (one per SM) the device runs at once, None if that cannot be asked."""
    return max_active_clusters(device.index if device.index is not None else torch.cuda.current_device(), c)


def bwd_groups(device: torch.device, cfg: Any, m: int) -> int:
    """Q, the persistent backward's CTA groups for m rows: sm_count x ctas_per_sm /
    cluster_n, at most the number of row blocks; for a cluster-staged config also
    at most the clusters the device runs at once (x ctas_per_sm): a group that does not
    fit would run as a second wave after the others, doubling the time. A ``row_grid``
    config (the kernel without partials) runs one CTA per row block instead."""
    if cfg.row_grid:
        return max(1, -(-m // cfg.rows_per_cta))
    q = max(1, min(-(-m // cfg.rows_per_cta), _sm_count(device) * cfg.ctas_per_sm // cfg.cluster_n))
    if cfg.cluster_n > 1 and cfg.stages:
        cap = _max_clusters(device, cfg.cluster_n)
        if cap:
            q = max(1, min(q, cap * cfg.ctas_per_sm))
    return q


# --------------------------------------------------------------------------- checks


def _check(where: str, x: Any, weight: Any, bias: Any, residual: Any, eps: Any, device: bool = True) -> None:
    """Clear errors naming the argument; nothing is launched on bad input."""
    checks.tensor(where, "x", x, _DTYPES)
    if x.dim() < 1:
        raise ValueError(f"{where}: argument 'x' must have at least 1 dim, got a scalar")
    n = x.shape[-1]
    if not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: argument 'x' must have a last dim in [1, {MAX_N}], got shape {tuple(x.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        checks.tensor(where, name, t)
        checks.same_device(where, name, t, "x", x)
        if t.dtype not in (x.dtype, torch.float32):
            raise TypeError(f"{where}: argument '{name}' has dtype {dtype_name(t.dtype)}; it must be x's dtype "
                            f"({dtype_name(x.dtype)}) or float32")
        if tuple(t.shape) != (n,):
            raise ValueError(f"{where}: argument '{name}' must have shape ({n},) (x's last dim), got {tuple(t.shape)}")
    if bias is not None:
        checks.same_dtype(where, "bias", bias, "weight", weight)
    if residual is not None:
        checks.matches(where, "residual", residual, "x", x)
    checks.real(where, "eps", eps)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{where}: argument 'eps' must be finite and >= 0, got {eps}")
    if device:
        checks.on_cuda(where, "x", x)


def _vec_of(w: torch.Tensor) -> torch.Tensor:
    return w if w.stride(0) == 1 else w.contiguous()


# --------------------------------------------------------------------------- forward


def _small_m_config(kind: str, x2: torch.Tensor) -> Any:
    """For M rows that fit in one wave of the default register forward (every CTA runs at
    most one row block), the same config with weight and bias loaded beside x
    (``early_weight``): nothing overlaps the row's latency there, and the weight's load
    after the reduction was a second DRAM round trip. H200, kernel alone (docs/kernels/norm.md):
    fp32 N = 256, M = 1: 6.91 -> 4.74 us (torch 6.40); M = 128: 7.20 -> 5.66 us (torch
    6.27). At M = 32768 it is level or worse (bf16 N = 256: 14.8 -> 15.5 us), so large M
    keeps the heuristic. None where the heuristic's config stands."""
    m, n = x2.shape
    bits = x2.element_size() * 8
    cfg = norm_config.default_config(n, bits, kind=kind)
    if cfg.stages or cfg.cp_async or cfg.early_weight or cfg.cluster_n != 1:
        return None
    if m > cfg.rows_per_cta * cfg.ctas_per_sm * _sm_count(x2.device):
        return None
    early = replace(cfg, early_weight=True)
    try:
        early.validate(n, bits)
    except ValueError:
        return None
    return early


def _fwd_plan(kind: str, x2: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, r2: torch.Tensor | None, eps: float,
              config: Any = None) -> Callable[..., Any] | None:
    # the registered ops reach here without the public op's checks (torch.ops.cuteforge.*)
    _check(f"cuteforge.ops.{kind}_norm", x2, w, b, r2, eps, device=False)
    m, n = x2.shape
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x2.device)
    tensors = (x2, w, w if b is None else b, x2 if r2 is None else r2, y, y, rstd, rstd)
    key = norm_fwd.signature.bind(tensors, f"cuteforge.ops.{kind}_norm")
    if m == 0:
        return None
    params = (("eps", float(eps)), ("has_bias", b is not None), ("has_residual", r2 is not None), ("kind", kind))
    return norm_fwd.get(key, params, config or _tuned_fwd(key, params, x2) or _small_m_config(kind, x2))


def _tuned_fwd(key: Any, params: tuple[tuple[str, Any], ...], x2: torch.Tensor) -> Any:
    """A stored tuning result for this forward (`cuteforge tune norm_fwd`), or None (then
    the heuristic). `lookup` has checked it against the kernel's validate hook."""
    from ..autotune import lookup  # slow path only

    cfg = lookup(norm_fwd, key, params, {"M": x2.shape[0]})
    return cfg if isinstance(cfg, norm_config.NormConfig) else None


def _forward(kind: str, x2: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, r2: torch.Tensor | None, eps: float,
             config: Any = None):
    """(y, residual_out or None, mean or None, rstd) for 2-D x; the custom ops' body.
    ``config`` (tests, benchmarks) overrides the heuristic."""
    x2 = as_rows(x2)
    r2 = None if r2 is None else as_rows(r2)
    w = _vec_of(w)
    b = None if b is None else _vec_of(b)
    memo = ("f", kind, eps, x2.dtype, x2.shape, x2.stride(), x2.data_ptr() & 15, x2.get_device(),
            w.dtype, w.data_ptr() & 15, None if b is None else b.data_ptr() & 15,
            None if r2 is None else (r2.stride(), r2.data_ptr() & 15), config)
    try:
        launch = _PLANS[memo]
    except KeyError:
        launch = remember(_PLANS, memo, _fwd_plan(kind, x2, w, b, r2, eps, config))
    m, n = x2.shape
    # new_empty with int arguments: the cheapest allocation call on the host
    y = x2.new_empty(m, n)
    rstd = x2.new_empty(m, dtype=torch.float32)
    mean = x2.new_empty(m, dtype=torch.float32) if kind == "layer" else None
    ro = x2.new_empty(m, n) if r2 is not None else None
    if launch is not None:
        launch(x2, w, w if b is None else b, x2 if r2 is None else r2, y, y if ro is None else ro,
               rstd if mean is None else mean, rstd)
    return y, ro, mean, rstd


# --------------------------------------------------------------------------- backward


def _bwd_kernel(kind: str, xs: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, mean: torch.Tensor | None,
                rstd: torch.Tensor, dsum: torch.Tensor | None, has_bias: bool, config: Any = None,
                need_dw: bool = True) -> tuple[int, Any, Any]:
    """(Q, the compiled backward, the compiled column sum of its partials or None) for
    (M, N) rows, M > 0: Q is the dweight partials' rows. ``need_dw=False``: the kernel
    that writes no partials (Q then only sizes its grid) and no column sum."""
    m, n = xs.shape
    cfg = config or norm_config.default_bwd_config(n, xs.element_size() * 8, need_dw, kind)
    if cfg.row_grid and need_dw:
        raise ValueError(f"config {cfg}: row_grid is for the backward without dweight / dbias partials")
    q = bwd_groups(xs.device, cfg, m)
    probe = torch.empty((q, n), dtype=torch.float32, device=xs.device)
    st = rstd if mean is None else mean
    dx = torch.empty((m, n), dtype=xs.dtype, device=xs.device)
    key = norm_bwd.signature.bind((xs, w, dy, dy if dsum is None else dsum, st, rstd, dx, probe, probe),
                                  f"cuteforge.ops.{kind}_norm backward")
    params = (("has_bias", has_bias), ("has_dsum", dsum is not None), ("kind", kind))
    if not need_dw:  # named only when False: the keys of the kernels that write partials stay as they were
        params = tuple(sorted(params + (("has_dw", False),)))  # sorted, as Kernel.launcher keys its parameters
    return q, norm_bwd.get(key, params, cfg), (_partials_sum(2 if has_bias else 1, q, n, w) if need_dw else None)


def _partials_sum(r: int, q: int, n: int, w: torch.Tensor) -> Any:
    """The column kernel (`ops.sum`'s) that sums the backward's (R, Q, N) fp32 partials
    over Q into (R, N) in the weight's dtype (R = 2: dweight and dbias): one launch where
    torch took a sum and a cast, each a dispatch on a host-bound backward. Its default
    config (no cluster: Q is at most a few hundred rows) for every shape, so the kernel
    `cuteforge precompile` builds per weight dtype serves them all."""
    parts = torch.empty((r, q, n), dtype=torch.float32, device=w.device)
    out = torch.empty((r, n), dtype=w.dtype, device=w.device)
    key = col_reduce.signature.bind((parts, out))
    return col_reduce.get(key, (("op", "sum"),), ColReduceConfig())


def _backward(kind: str, dy: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, mean: torch.Tensor | None,
              rstd: torch.Tensor, dsum: torch.Tensor | None, has_bias: bool, config: Any = None,
              need_dw: bool = True):
    """(dx, dweight, dbias or None); xs is the normalised input (x + residual if fused).
    ``need_dw=False`` (eager autograd when weight and bias need no gradient) skips the
    column sum of the partials and returns None for both."""
    dx, sums = _backward_sums(kind, dy, xs, w, mean, rstd, dsum, has_bias, config, need_dw)
    if sums is None or not has_bias:
        return dx, sums, None
    return dx, sums[0], sums[1]


def _backward_sums(kind: str, dy: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, mean: torch.Tensor | None,
                   rstd: torch.Tensor, dsum: torch.Tensor | None, has_bias: bool, config: Any = None,
                   need_dw: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dx, dweight (N,) or, with ``has_bias``, dweight and dbias as the rows of one (2, N)
    tensor; None without ``need_dw``): `_backward`'s body, and the registered backward's,
    whose returns may not share memory."""
    m, n = xs.shape
    xs = as_rows(xs)  # the saved x of a forward on a column-major view has last stride != 1
    dy = as_rows(dy.to(xs.dtype))
    dsum = None if dsum is None else as_rows(dsum.to(xs.dtype))
    w = _vec_of(w)
    dx = xs.new_empty(m, n)
    if m == 0:
        return dx, (w.new_zeros(2, n) if has_bias else w.new_zeros(n)) if need_dw else None
    memo = ("b", kind, has_bias, xs.dtype, xs.shape, xs.stride(), xs.data_ptr() & 15, xs.get_device(),
            w.dtype, w.data_ptr() & 15, dy.stride(), dy.data_ptr() & 15,
            None if dsum is None else (dsum.stride(), dsum.data_ptr() & 15),
            rstd.data_ptr() & 15, None if mean is None else mean.data_ptr() & 15, config)
    plan = _PLANS.get(memo)
    if plan is None:
        plan = remember(_PLANS, memo, _bwd_kernel(kind, xs, w, dy, mean, rstd, dsum, has_bias, config))
    q, launch, column_sum = plan
    parts = xs.new_empty(2 if has_bias else 1, q, n, dtype=torch.float32)
    launch(xs, w, dy, dy if dsum is None else dsum, rstd if mean is None else mean, rstd, dx, parts[0], parts[-1])
    if not need_dw:
        return dx, None
    sums = w.new_empty(2, n) if has_bias else w.new_empty(n)
    column_sum(parts, sums.view(-1, n))
    return dx, sums
