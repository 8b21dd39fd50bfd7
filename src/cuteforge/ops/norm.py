"""RMSNorm and LayerNorm over the last dim as torch ops, with autograd.

    y = cuteforge.ops.rms_norm(x, weight, eps=1e-6)
    y, s = cuteforge.ops.layer_norm(x, weight, bias, eps=1e-5, residual=r)   # s = x + r

With ``residual`` the sum is normalised and returned too (pre-norm transformer
blocks: the next residual branch adds onto it); its gradient flows back into x and
residual. x may be N-D (flattened over leading dims, a reshape that copies only when
those dims cannot be merged) or a 2-D view with a row stride (no copy).

Registered ops (what torch.compile sees): ``cuteforge::rms_norm``,
``cuteforge::layer_norm`` (forward, always on 2-D x) and ``cuteforge::rms_norm_backward``,
``cuteforge::layer_norm_backward``. Eager calls skip that boundary: a memo keyed by the
call's layout (dtypes, shapes, strides, 16-byte alignment of every operand, eps) goes
straight to the compiled launcher, and a warm no-grad call whose operands are read in
place is one C call (the op's launch table in ``cuteforge.native.launch``: outputs
allocated and the kernel launched there); with grad, the forward's outputs get the C++ autograd
node of ``cuteforge.native`` (``_autograd``), whose backward launches the backward kernel
without Python, or a plain torch.autograd.Function where that node is unavailable.
Backward dweight/dbias: the kernel writes fp32 partials (Q, N), one per persistent
CTA group, summed here by ``torch.sum`` (Q is about 132-528 rows).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ..arch import max_active_clusters
from ..kernels.norm import config as norm_config
from ..kernels.norm.spec import norm_bwd, norm_fwd
from ..native import backward as native
from ..native import build as native_build
from ..native import launch as native_launch
from ..native.backward import arg, contiguous_arg
from ..signature import dtype_name
from .layout import as_rows, require_cuda, rows_view
from .registered import define

MAX_N = 262144
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MAX_PLANS = 4096
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
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: argument 'x' must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"{where}: argument 'x' has dtype {x.dtype}; supported: float32, bfloat16, float16")
    if x.dim() < 1:
        raise ValueError(f"{where}: argument 'x' must have at least 1 dim, got a scalar")
    n = x.shape[-1]
    if not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: argument 'x' must have a last dim in [1, {MAX_N}], got shape {tuple(x.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.device != x.device:
            raise ValueError(f"{where}: argument '{name}' is on {t.device} but 'x' is on {x.device}")
        if t.dtype not in (x.dtype, torch.float32):
            raise TypeError(f"{where}: argument '{name}' has dtype {t.dtype}; it must be x's dtype ({x.dtype}) or float32")
        if tuple(t.shape) != (n,):
            raise ValueError(f"{where}: argument '{name}' must have shape ({n},) (x's last dim), got {tuple(t.shape)}")
    if bias is not None and bias.dtype != weight.dtype:
        raise TypeError(f"{where}: argument 'bias' has dtype {bias.dtype} but 'weight' has {weight.dtype}; they must match")
    if residual is not None:
        if not isinstance(residual, torch.Tensor):
            raise TypeError(f"{where}: argument 'residual' must be a torch.Tensor, got {type(residual).__name__}")
        if residual.device != x.device:
            raise ValueError(f"{where}: argument 'residual' is on {residual.device} but 'x' is on {x.device}")
        if residual.dtype != x.dtype:
            raise TypeError(f"{where}: argument 'residual' has dtype {residual.dtype} but 'x' has {x.dtype}; they must match")
        if residual.shape != x.shape:
            raise ValueError(f"{where}: argument 'residual' has shape {tuple(residual.shape)} but 'x' has {tuple(x.shape)}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):  # numpy scalars too
        raise TypeError(f"{where}: argument 'eps' must be a float, got {type(eps).__name__}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{where}: argument 'eps' must be finite and >= 0, got {eps}")
    if device:  # last: a CPU caller sees the real problem first
        require_cuda(where, "x", x)


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
        launch = _fwd_plan(kind, x2, w, b, r2, eps, config)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[memo] = launch
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
                need_dw: bool = True) -> tuple[int, Any]:
    """(Q, the compiled backward) for (M, N) rows, M > 0: Q is the dweight partials' rows.
    ``need_dw=False``: the kernel that writes no partials (Q then only sizes its grid)."""
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
    return q, norm_bwd.get(key, params, cfg)


def _backward(kind: str, dy: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, mean: torch.Tensor | None,
              rstd: torch.Tensor, dsum: torch.Tensor | None, has_bias: bool, config: Any = None,
              need_dw: bool = True):
    """(dx, dweight, dbias or None); xs is the normalised input (x + residual if fused).
    ``need_dw=False`` (eager autograd when weight and bias need no gradient) skips the
    torch sums of the partials and returns None for both."""
    m, n = xs.shape
    xs = as_rows(xs)  # the saved x of a forward on a column-major view has last stride != 1
    dy = as_rows(dy.to(xs.dtype))
    dsum = None if dsum is None else as_rows(dsum.to(xs.dtype))
    w = _vec_of(w)
    dx = xs.new_empty(m, n)
    if m == 0:
        z = torch.zeros(n, dtype=w.dtype, device=w.device)
        return dx, z, (z.clone() if has_bias else None)
    memo = ("b", kind, has_bias, xs.dtype, xs.shape, xs.stride(), xs.data_ptr() & 15, xs.get_device(),
            w.dtype, w.data_ptr() & 15, dy.stride(), dy.data_ptr() & 15,
            None if dsum is None else (dsum.stride(), dsum.data_ptr() & 15),
            rstd.data_ptr() & 15, None if mean is None else mean.data_ptr() & 15, config)
    plan = _PLANS.get(memo)
    if plan is None:
        plan = _bwd_kernel(kind, xs, w, dy, mean, rstd, dsum, has_bias, config)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[memo] = plan
    q, launch = plan
    dwp = xs.new_empty(q, n, dtype=torch.float32)
    dbp = xs.new_empty(q, n, dtype=torch.float32) if has_bias else dwp
    launch(xs, w, dy, dy if dsum is None else dsum, rstd if mean is None else mean, rstd, dx, dwp, dbp)
    if not need_dw:
        return dx, None, None
    dw = dwp.sum(0).to(w.dtype)
    db = dbp.sum(0).to(w.dtype) if has_bias else None
    return dx, dw, db


# --------------------------------------------------------------------------- torch.library


def _empty(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(0)


def _fwd_op_plan(kind: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 residual: torch.Tensor | None, eps: float) -> Any:
    """The registered forward's launch plan (`registered.define`): inputs (x, weight,
    [bias,] residual) read in place, outputs (y, residual_out or an empty tensor, [mean,]
    rstd) as the op returns them; None where an operand would need a copy or M == 0."""
    x2 = rows_view(x) if x.dim() == 2 else None
    r2 = None if residual is None or residual.dim() != 2 else rows_view(residual)
    if (x2 is None or (residual is not None and r2 is None) or weight.stride(0) != 1
            or (bias is not None and bias.stride(0) != 1) or x2.shape[0] == 0):
        return None
    launch = _fwd_plan(kind, x2, weight, bias, r2, eps)
    m, n = x2.shape
    IN, OUT = native_launch.INPUT, native_launch.OUTPUT
    i_res = 2 if kind == "rms" else 3
    w = contiguous_arg(IN, 1, (n,))
    y, rstd, mean = contiguous_arg(OUT, 0, (m, n)), contiguous_arg(OUT, 2, (m,)), contiguous_arg(OUT, 3, (m,))
    args = [arg(IN, 0, x2), w, w if bias is None else contiguous_arg(IN, 2, (n,)),
            arg(IN, 0, x2) if r2 is None else arg(IN, i_res, r2), y,
            y if r2 is None else contiguous_arg(OUT, 1, (m, n)), rstd if kind == "rms" else mean, rstd]
    f32 = torch.float32
    outs = [((m, n), x.dtype), ((m, n) if r2 is not None else (0,), x.dtype), ((m,), f32)]
    outs += [((m,), f32)] if kind == "layer" else []
    returns = [0, 1, 2] if kind == "rms" else [0, 1, 3, 2]
    return native_launch.runner(f"cuteforge::{kind}_norm", launch, x.device, i_res + 1, outs, args, returns)


def _bwd_op_plan(kind: str, dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor | None,
                 rstd: torch.Tensor, dsum: torch.Tensor | None, has_bias: bool) -> Any:
    """The registered backward's launch plan: inputs (dy, x, weight, [mean,] rstd, dsum)
    read in place, outputs (dx, dweight[, dbias or an empty tensor]) with the dweight /
    dbias partials summed in C; None where an operand would need a copy or a cast."""
    views = [rows_view(t) if t is not None and t.dim() == 2 and t.dtype == x.dtype else None for t in (dy, x, dsum)]
    dy2, x2, ds2 = views
    if (dy2 is None or x2 is None or (dsum is not None and ds2 is None) or weight.stride(0) != 1
            or rstd.stride(0) != 1 or (mean is not None and mean.stride(0) != 1) or x2.shape[0] == 0
            or dy2.shape != x2.shape):
        return None
    m, n = x2.shape
    q, launch = _bwd_kernel(kind, x2, weight, dy2, mean, rstd, ds2, has_bias)
    IN, OUT = native_launch.INPUT, native_launch.OUTPUT
    i_mean, i_rstd, i_dsum = (None, 3, 4) if kind == "rms" else (3, 4, 5)
    parts = [contiguous_arg(OUT, 1, (q, n)), contiguous_arg(OUT, 1, (q, n), q * n if has_bias else 0)]
    args = [arg(IN, 1, x2), contiguous_arg(IN, 2, (n,)), arg(IN, 0, dy2), arg(IN, 0, dy2) if ds2 is None else arg(IN, i_dsum, ds2),
            contiguous_arg(IN, i_rstd if i_mean is None else i_mean, (m,)), contiguous_arg(IN, i_rstd, (m,)),
            contiguous_arg(OUT, 0, (m, n)), *parts]
    wd = dtype_name(weight.dtype)
    outs = [((m, n), x.dtype), ((2, q, n) if has_bias else (q, n), torch.float32)]
    if kind == "rms":
        returns = [0, (1, wd, -1)]
    elif has_bias:
        returns = [0, (1, wd, 0), (1, wd, 1)]
    else:
        outs.append(((0,), weight.dtype))
        returns = [0, (1, wd, -1), 2]
    return native_launch.runner(f"cuteforge::{kind}_norm_backward", launch, x.device, i_dsum + 1, outs, args, returns)


def _rms_impl(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
              eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, ro, _, rstd = _forward("rms", x, weight, None, residual, eps)
    return y, (ro if ro is not None else _empty(x)), rstd


def _rms_fake(x, weight, residual, eps):
    ro = x.new_empty(x.shape) if residual is not None else _empty(x)
    return x.new_empty(x.shape), ro, x.new_empty(x.shape[0], dtype=torch.float32)


def _ln_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
             eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    y, ro, mean, rstd = _forward("layer", x, weight, bias, residual, eps)
    return y, (ro if ro is not None else _empty(x)), mean, rstd


def _ln_fake(x, weight, bias, residual, eps):
    ro = x.new_empty(x.shape) if residual is not None else _empty(x)
    st = x.new_empty(x.shape[0], dtype=torch.float32)
    return x.new_empty(x.shape), ro, st, st.new_empty(st.shape)


def _rms_bwd_impl(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                  dsum: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dw, _ = _backward("rms", dy, x, weight, None, rstd, dsum, False)
    return dx, dw


def _ln_bwd_impl(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                 dsum: torch.Tensor | None, has_bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dw, db = _backward("layer", dy, x, weight, mean, rstd, dsum, has_bias)
    return dx, dw, (db if db is not None else _empty(weight))


def _rms_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    x, weight, residual, _eps = inputs
    _y, ro, rstd = output
    ctx.has_res = residual is not None
    ctx.save_for_backward(ro if ctx.has_res else x, weight, rstd)


def _rms_grad(ctx: Any, dy: torch.Tensor, dro: torch.Tensor, _drstd: Any) -> tuple[Any, ...]:
    xs, weight, rstd = ctx.saved_tensors
    dx, dw = _rms_bwd_op(dy, xs, weight, rstd, dro if ctx.has_res else None)
    return dx, dw, (dx if ctx.has_res else None), None


def _ln_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    x, weight, bias, residual, _eps = inputs
    _y, ro, mean, rstd = output
    ctx.has_res = residual is not None
    ctx.has_bias = bias is not None
    ctx.save_for_backward(ro if ctx.has_res else x, weight, mean, rstd)


def _ln_grad(ctx: Any, dy: torch.Tensor, dro: torch.Tensor, _dm: Any, _dr: Any) -> tuple[Any, ...]:
    xs, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = _ln_bwd_op(dy, xs, weight, mean, rstd, dro if ctx.has_res else None, ctx.has_bias)
    return dx, dw, (db if ctx.has_bias else None), (dx if ctx.has_res else None), None


_rms_bwd_op = define("cuteforge::rms_norm_backward", _rms_bwd_impl,
                     fake=lambda dy, x, weight, rstd, dsum: (x.new_empty(x.shape), weight.new_empty(weight.shape)),
                     plan=lambda dy, x, w, rstd, dsum: _bwd_op_plan("rms", dy, x, w, None, rstd, dsum, False))
_ln_bwd_op = define("cuteforge::layer_norm_backward", _ln_bwd_impl,
                    fake=lambda dy, x, weight, mean, rstd, dsum, has_bias: (
                        x.new_empty(x.shape), weight.new_empty(weight.shape),
                        weight.new_empty(weight.shape) if has_bias else _empty(weight)),
                    plan=lambda dy, x, w, mean, rstd, dsum, has_bias: _bwd_op_plan("layer", dy, x, w, mean, rstd, dsum,
                                                                                 has_bias))
_rms_op = define("cuteforge::rms_norm", _rms_impl, fake=_rms_fake,
                 plan=lambda x, w, r, eps: _fwd_op_plan("rms", x, w, None, r, eps),
                 backward=_rms_grad, setup_context=_rms_setup)
_ln_op = define("cuteforge::layer_norm", _ln_impl, fake=_ln_fake,
                plan=lambda x, w, b, r, eps: _fwd_op_plan("layer", x, w, b, r, eps),
                backward=_ln_grad, setup_context=_ln_setup)


# --------------------------------------------------------------------------- eager autograd
# Eager calls with grad skip the custom-op boundary too: its dispatch (forward, and the
# backward op called from register_autograd) cost more host time than the kernels take
# at small sizes (docs/kernels/norm.md).


class _RmsFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x2: torch.Tensor, weight: torch.Tensor, r2: torch.Tensor | None, eps: float) -> Any:
        y, ro, _, rstd = _forward("rms", x2, weight, None, r2, eps)
        ctx.has_res = r2 is not None
        ctx.save_for_backward(ro if ctx.has_res else x2, weight, rstd)
        return y if ro is None else (y, ro)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, dro: torch.Tensor | None = None) -> tuple[Any, ...]:
        xs, weight, rstd = ctx.saved_tensors
        need_dw = ctx.needs_input_grad[1]
        dx, dw, _ = _backward("rms", dy, xs, weight, None, rstd, dro if ctx.has_res else None, False, need_dw=need_dw)
        return dx, dw, (dx if ctx.has_res else None), None


class _LayerFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, r2: torch.Tensor | None,
                eps: float) -> Any:
        y, ro, mean, rstd = _forward("layer", x2, weight, bias, r2, eps)
        ctx.has_res = r2 is not None
        ctx.has_bias = bias is not None
        ctx.save_for_backward(ro if ctx.has_res else x2, weight, mean, rstd)
        return y if ro is None else (y, ro)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, dro: torch.Tensor | None = None) -> tuple[Any, ...]:
        xs, weight, mean, rstd = ctx.saved_tensors
        need_dw = ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2])
        dx, dw, db = _backward("layer", dy, xs, weight, mean, rstd, dro if ctx.has_res else None, ctx.has_bias,
                               need_dw=need_dw)
        return dx, dw, (db if ctx.has_bias else None), (dx if ctx.has_res else None), None


# --------------------------------------------------------------------------- the C++ autograd node

_NODE_PLANS: dict[tuple[Any, ...], Any] = {}


def _node_plan(kind: str, xs: torch.Tensor, w: torch.Tensor, y: torch.Tensor, mean: torch.Tensor | None,
               rstd: torch.Tensor, has_bias: bool, has_res: bool, need_dw: bool = True) -> Any:
    """The C++ node's plan: saved (xs, w, [mean], rstd); inputs (x, weight, [bias], residual);
    the kernel writes dx and fp32 (Q, N) dweight / dbias partials, which the node sums over
    Q (with bias both halves of one (2, Q, N) buffer: one sum, one cast).

    ``need_dw=False`` (neither weight nor bias requires grad: frozen norms, as under
    LoRA): the kernel without partials, and no partial buffer allocated per backward (one
    allocation of two on a host-bound call). Its partial operands are a stand-in that only
    gives the grid its Q rows: the saved rstd (fp32, 16-byte aligned: allocated by the
    forward) viewed as (Q, N) with row stride 0, which that kernel never touches."""
    m, n = xs.shape
    q, fn = _bwd_kernel(kind, xs, w, y, mean, rstd, y if has_res else None, has_bias, need_dw=need_dw)
    f32 = torch.float32
    i_rstd = 2 if mean is None else 3
    rows = (m, n)
    buffers: list[tuple[Any, torch.dtype]] = [(rows, xs.dtype)]
    if need_dw:  # dweight and dbias partials in one (2, Q, N) buffer: one sum and one cast for both
        parts = [native.contiguous_arg(native.BUFFER, 1, (q, n)),
                 native.contiguous_arg(native.BUFFER, 1, (q, n), q * n if has_bias else 0)]
        buffers.append(((2, q, n) if has_bias else (q, n), f32))
    else:
        parts = [(native.SAVED, i_rstd, [q, n], [0, 1], 0)] * 2
    args = [native.arg(native.SAVED, 0, xs), native.arg(native.SAVED, 1, w),
            native.contiguous_arg(native.GRAD, 0, rows), native.contiguous_arg(native.GRAD, 1 if has_res else 0, rows),
            native.contiguous_arg(native.SAVED, 2, (m,)), native.contiguous_arg(native.SAVED, i_rstd, (m,)),
            native.contiguous_arg(native.BUFFER, 0, rows), *parts]
    res_out = (native.AS_IS, 0, xs.dtype) if has_res else (native.NO_GRAD, 0, xs.dtype)
    no_grad = (native.NO_GRAD, 0, w.dtype)
    outs = [(native.AS_IS, 0, xs.dtype), (native.COLUMN_SUM, 1, w.dtype, 0 if has_bias else -1) if need_dw else no_grad]
    if kind == "layer":
        outs.append((native.COLUMN_SUM, 1, w.dtype, 1) if has_bias and need_dw else no_grad)
    outs.append(res_out)

    def fallback(grads: list[Any], saved: list[Any]) -> list[Any]:
        # (nothing of the plan's first forward is captured: a plan outlives its tensors)
        dy = saved[0].new_zeros(m, n) if grads[0] is None else grads[0]
        dro = None
        if has_res:
            dro = saved[0].new_zeros(m, n) if grads[1] is None else grads[1]
        t_mean = saved[2] if kind == "layer" else None
        dx, dw, db = _backward(kind, dy, saved[0], saved[1], t_mean, saved[-1], dro, has_bias, need_dw=need_dw)
        return [dx, dw] + ([db] if kind == "layer" else []) + [dx if has_res else None]

    grads = [native.grad_as_is(y)] * (2 if has_res else 1)
    name = "CuteforgeRmsNormBackward" if kind == "rms" else "CuteforgeLayerNormBackward"
    return native.make_plan(name, fn, xs.device, grads, buffers, args, outs, fallback)


def _autograd(kind: str, x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, r2: torch.Tensor | None,
              eps: float) -> Any:
    """The forward with autograd for 2-D x: through the C++ node where it applies (unit
    last strides, M > 0, no forward AD), else through the Python autograd.Function."""
    if (native.module() is None or native.forward_ad_active() or x2.shape[0] == 0 or x2.stride(1) != 1
            or weight.stride(0) != 1 or (bias is not None and bias.stride(0) != 1)
            or (r2 is not None and r2.stride(1) != 1)):
        if kind == "rms":
            return _RmsFn.apply(x2, weight, r2, eps)
        return _LayerFn.apply(x2, weight, bias, r2, eps)
    y, ro, mean, rstd = _forward(kind, x2, weight, bias, r2, eps)
    xs = x2 if ro is None else ro
    # partials only where a dweight or dbias is wanted (the input edges are fixed now); the
    # kernel without them views rstd as its stand-in, which needs rstd 16-byte aligned
    # (`_forward` allocates it, so it is; checked, since that kernel's key assumes it)
    need_dw = weight.requires_grad or (bias is not None and bias.requires_grad) or rstd.data_ptr() % 16 != 0
    key = (kind, bias is not None, xs.dtype, xs.shape, xs.stride(), xs.data_ptr() & 15, xs.get_device(),
           weight.dtype, weight.data_ptr() & 15, r2 is not None, need_dw)
    plan = _NODE_PLANS.get(key)
    if plan is None:
        if len(_NODE_PLANS) >= _MAX_PLANS:
            _NODE_PLANS.clear()
        plan = _NODE_PLANS[key] = _node_plan(kind, xs, weight, y, mean, rstd, bias is not None, r2 is not None,
                                             need_dw)
    if kind == "rms":
        native.attach(plan, [x2, weight, r2], [y] if ro is None else [y, ro], [xs, weight, rstd])
    else:
        native.attach(plan, [x2, weight, bias, r2], [y] if ro is None else [y, ro], [xs, weight, mean, rstd])
    return y if ro is None else (y, ro)


# --------------------------------------------------------------------------- public entry points

_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


# The eager warm path: one lookup keyed by everything `_check` and the plan read (kind,
# eps with its type, so eps=True never reuses eps=1's plan, and every operand's dtype, shape,
# strides, 16-byte alignment and device) gives run(x, weight, bias, residual) for no-grad
# calls; a hit also stands for "already checked" on the autograd path.
_Run = Callable[[torch.Tensor, torch.Tensor, Any, Any], Any]
_EAGER: dict[tuple[Any, ...], _Run] = {}
native_build.when_ready(_EAGER.clear)  # runs made while the extension built are Python launches
# ... and its C copy for the C launches, keyed by (eps, x, weight, bias, residual): a warm
# no-grad call is one C call
_TABLES = {"rms": native_launch.Table(1), "layer": native_launch.Table(1)}


def _layout(t: Any) -> Any:
    return None if t is None else (t.dtype, t.shape, t.stride(), t.data_ptr() & 15, t.get_device())


def _eager_key(kind: str, x: Any, weight: Any, bias: Any, residual: Any, eps: Any) -> tuple[Any, ...]:
    # rms_norm / layer_norm build the same tuple inline
    return (kind, eps, type(eps), x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device(),
            weight.dtype, weight.shape, weight.stride(), weight.data_ptr() & 15, weight.get_device(),
            _layout(bias), _layout(residual))


def _eager_plan(kind: str, where: str, x: Any, weight: Any, bias: Any, residual: Any, eps: Any) -> _Run:
    """Validate (clear errors naming the argument), compile or load, and store the no-grad
    run() for this call's layout. Without grad nobody reads mean/rstd: the kernel gets one
    fp32 (M,) buffer for both (one thread writes both; only y and x + residual are used)."""
    _check(where, x, weight, bias, residual, eps)
    x2 = as_rows(x)
    r2 = None if residual is None else as_rows(residual)
    w2 = _vec_of(weight)
    b2 = None if bias is None else _vec_of(bias)
    launch = _fwd_plan(kind, x2, w2, b2, r2, float(eps))
    m, n = x2.shape
    shape = tuple(x.shape)
    f32 = torch.float32
    # one C call where the operands are read in place, else a Python closure
    run = None if launch is None else _native_run(where, launch, x, weight, bias, residual, x2, r2)
    if run is None and launch is None:  # M == 0
        def run(x: torch.Tensor, w: torch.Tensor, b: Any, r: Any) -> Any:
            y = x.new_empty(*shape)
            return y if r is None else (y, x.new_empty(*shape))
    elif run is None and x2 is x and w2 is weight and b2 is bias and residual is None:
        # the plain case: 2-D rows, unit-stride vectors, no residual; nothing but allocations
        def run(x: torch.Tensor, w: torch.Tensor, b: Any, r: Any) -> Any:
            y = x.new_empty(m, n)
            st = x.new_empty(m, dtype=f32)
            launch(x, w, w if b is None else b, x, y, y, st, st)
            return y
    elif run is None:
        xv, rv, wc = x2 is not x, r2 is not residual, w2 is not weight
        bc = b2 is not bias
        flat = len(shape) != 2

        def run(x: torch.Tensor, w: torch.Tensor, b: Any, r: Any) -> Any:
            xr = as_rows(x) if xv else x
            wr = w.contiguous() if wc else w
            br = wr if b is None else (b.contiguous() if bc else b)
            rr = xr if r is None else (as_rows(r) if rv else r)
            y = x.new_empty(*shape)
            st = x.new_empty(m, dtype=f32)
            y2 = y.view(m, n) if flat else y
            if r is None:
                launch(xr, wr, br, rr, y2, y2, st, st)
                return y
            ro = x.new_empty(*shape)
            launch(xr, wr, br, rr, y2, ro.view(m, n) if flat else ro, st, st)
            return y, ro

    if len(_EAGER) >= _MAX_PLANS:
        _EAGER.clear()
    _EAGER[_eager_key(kind, x, weight, bias, residual, eps)] = run
    _TABLES[kind].put((eps,), (x, weight, bias, residual), run)
    return run


def _native_run(where: str, launch: Any, x: torch.Tensor, weight: torch.Tensor, bias: Any, residual: Any,
                x2: torch.Tensor, r2: torch.Tensor | None) -> _Run | None:
    """run(x, weight, bias, residual) as one C call (`native.launch`: the outputs allocated
    and the kernel called without Python between), where every operand is read in place
    (x and residual as row views, x2 / r2 their `as_rows`; unit-stride weight and bias);
    else None."""
    xv = rows_view(x, x2)
    rv = None if residual is None else rows_view(residual, r2)
    if xv is None or (residual is not None and rv is None) or weight.stride(0) != 1 or (
            bias is not None and bias.stride(0) != 1):
        return None
    m, n = xv.shape
    shape, IN, OUT = tuple(x.shape), native_launch.INPUT, native_launch.OUTPUT
    y = contiguous_arg(OUT, 0, (m, n))
    st = contiguous_arg(OUT, 1, (m,))  # mean and rstd share it: nobody reads them without grad
    ro = y if residual is None else contiguous_arg(OUT, 2, (m, n))
    w = contiguous_arg(IN, 1, (n,))
    args = [arg(IN, 0, xv), w, w if bias is None else contiguous_arg(IN, 2, (n,)),
            arg(IN, 0, xv) if rv is None else arg(IN, 3, rv), y, ro, st, st]
    outs = [(shape, x.dtype), ((m,), torch.float32)] + ([] if residual is None else [(shape, x.dtype)])
    return native_launch.runner(where, launch, x.device, 4, outs, args, [0] if residual is None else [0, 2])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, residual: torch.Tensor | None = None) -> Any:
    """RMSNorm over the last dim: ``x * rsqrt(mean(x^2) + eps) * weight`` (fp32 math).

    With ``residual`` returns ``(y, x + residual)`` and normalises the sum.
    x: fp32/bf16/fp16 CUDA tensor; weight: (N,) in x's dtype or fp32.
    """
    where = "cuteforge.ops.rms_norm"
    if not isinstance(eps, (float, int)) and isinstance(eps, numbers.Real):
        eps = float(eps)  # a numpy scalar
    if _is_compiling():
        _check(where, x, weight, None, residual, eps, device=False)  # the device: when the graph runs
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        r2 = None if residual is None else residual.reshape(-1, shape[-1])
        y, ro, _ = _rms_op(x2, weight, r2, float(eps))
        return y.view(shape) if residual is None else (y.view(shape), ro.view(shape))
    call = _TABLES["rms"].call  # the C memo: one C call for a warm no-grad layout
    if call is not None:
        out = call(eps, x, weight, None, residual)
        if out is not None:
            return out
    try:
        run = _EAGER[("rms", eps, type(eps), x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device(),
                      weight.dtype, weight.shape, weight.stride(), weight.data_ptr() & 15, weight.get_device(), None,
                      None if residual is None else (residual.dtype, residual.shape, residual.stride(),
                                                     residual.data_ptr() & 15, residual.get_device()))]
    except (AttributeError, KeyError, TypeError):
        run = _eager_plan("rms", where, x, weight, None, residual, eps)  # raises on bad input
    if _grad_enabled() and (x.requires_grad or weight.requires_grad or (residual is not None and residual.requires_grad)):
        if x.dim() == 2:  # no reshape/view nodes in the autograd graph
            return _autograd("rms", x, weight, None, residual, float(eps))
        shape = x.shape
        r2 = None if residual is None else residual.reshape(-1, shape[-1])
        out = _autograd("rms", x.reshape(-1, shape[-1]), weight, None, r2, float(eps))
        return out.view(shape) if residual is None else (out[0].view(shape), out[1].view(shape))
    return run(x, weight, None, residual)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5, *,
               residual: torch.Tensor | None = None) -> Any:
    """LayerNorm over the last dim: ``(x - mean) * rsqrt(var + eps) * weight + bias`` (fp32 math,
    biased variance like torch). With ``residual`` returns ``(y, x + residual)``."""
    where = "cuteforge.ops.layer_norm"
    if not isinstance(eps, (float, int)) and isinstance(eps, numbers.Real):
        eps = float(eps)  # a numpy scalar
    if _is_compiling():
        _check(where, x, weight, bias, residual, eps, device=False)  # the device: when the graph runs
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        r2 = None if residual is None else residual.reshape(-1, shape[-1])
        y, ro, _, _ = _ln_op(x2, weight, bias, r2, float(eps))
        return y.view(shape) if residual is None else (y.view(shape), ro.view(shape))
    call = _TABLES["layer"].call  # the C memo: one C call for a warm no-grad layout
    if call is not None:
        out = call(eps, x, weight, bias, residual)
        if out is not None:
            return out
    try:
        run = _EAGER[("layer", eps, type(eps), x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device(),
                      weight.dtype, weight.shape, weight.stride(), weight.data_ptr() & 15, weight.get_device(),
                      None if bias is None else (bias.dtype, bias.shape, bias.stride(), bias.data_ptr() & 15, bias.get_device()),
                      None if residual is None else (residual.dtype, residual.shape, residual.stride(),
                                                     residual.data_ptr() & 15, residual.get_device()))]
    except (AttributeError, KeyError, TypeError):
        run = _eager_plan("layer", where, x, weight, bias, residual, eps)  # raises on bad input
    if _grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
                            or (residual is not None and residual.requires_grad)):
        if x.dim() == 2:
            return _autograd("layer", x, weight, bias, residual, float(eps))
        shape = x.shape
        r2 = None if residual is None else residual.reshape(-1, shape[-1])
        out = _autograd("layer", x.reshape(-1, shape[-1]), weight, bias, r2, float(eps))
        return out.view(shape) if residual is None else (out[0].view(shape), out[1].view(shape))
    return run(x, weight, bias, residual)
