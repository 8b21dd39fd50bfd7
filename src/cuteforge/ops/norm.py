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
CTA group (Q is about 132-528 rows), and the column-reduction kernel of ``ops.sum`` adds
them up into the weight's dtype, launched right after it (one C plan calls both).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch

from ..native import backward as native
from ..native import build as native_build
from ..native import launch as native_launch
from ..native.args import arg, contiguous_arg
from . import norm_launch
from .layout import as_rows, rows_view
from .memo import remember

# the custom ops' bodies and the backward's groups, also reached from here (benchmarks)
from .norm_launch import _backward as _backward
from .norm_launch import _forward as _forward
from .norm_launch import bwd_groups as bwd_groups
from .registered import define

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
    launch = norm_launch._fwd_plan(kind, x2, weight, bias, r2, eps)
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


def _infer_op_plan(kind: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> Any:
    """The no-grad registered forward's launch plan: inputs (x, weight[, bias]) read in
    place, output y; mean and rstd share one (M,) buffer, which nobody reads. None where an
    operand would need a copy or M == 0."""
    x2 = rows_view(x) if x.dim() == 2 else None
    if x2 is None or weight.stride(0) != 1 or (bias is not None and bias.stride(0) != 1) or x2.shape[0] == 0:
        return None
    launch = norm_launch._fwd_plan(kind, x2, weight, bias, None, eps)
    m, n = x2.shape
    IN, OUT = native_launch.INPUT, native_launch.OUTPUT
    w, y, st = contiguous_arg(IN, 1, (n,)), contiguous_arg(OUT, 0, (m, n)), contiguous_arg(OUT, 1, (m,))
    args = [arg(IN, 0, x2), w, w if bias is None else contiguous_arg(IN, 2, (n,)), arg(IN, 0, x2), y, y, st, st]
    outs = [((m, n), x.dtype), ((m,), torch.float32)]
    return native_launch.runner(f"cuteforge::{kind}_norm_infer", launch, x.device, 2 if kind == "rms" else 3, outs,
                                args, [0])


def _bwd_op_plan(kind: str, dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor | None,
                 rstd: torch.Tensor, dsum: torch.Tensor | None, has_bias: bool) -> Any:
    """The registered backward's launch plan: inputs (dy, x, weight, [mean,] rstd, dsum)
    read in place, outputs (dx, dweight) or for LayerNorm with a bias (dx, dweight and
    dbias as the rows of one (2, N) tensor: a custom op's returns may not share memory):
    the kernel writes dx and the fp32 partials, the column sum adds them up in the weight's
    dtype; None where an operand would need a copy or a cast."""
    views = [rows_view(t) if t is not None and t.dim() == 2 and t.dtype == x.dtype else None for t in (dy, x, dsum)]
    dy2, x2, ds2 = views
    if (dy2 is None or x2 is None or (dsum is not None and ds2 is None) or weight.stride(0) != 1
            or rstd.stride(0) != 1 or (mean is not None and mean.stride(0) != 1) or x2.shape[0] == 0
            or dy2.shape != x2.shape):
        return None
    m, n = x2.shape
    q, launch, column_sum = norm_launch._bwd_kernel(kind, x2, weight, dy2, mean, rstd, ds2, has_bias)
    IN, OUT = native_launch.INPUT, native_launch.OUTPUT
    i_mean, i_rstd, i_dsum = (None, 3, 4) if kind == "rms" else (3, 4, 5)
    r = 2 if has_bias else 1
    parts = [contiguous_arg(OUT, 1, (q, n)), contiguous_arg(OUT, 1, (q, n), q * n if has_bias else 0)]
    args = [arg(IN, 1, x2), contiguous_arg(IN, 2, (n,)), arg(IN, 0, dy2), arg(IN, 0, dy2) if ds2 is None else arg(IN, i_dsum, ds2),
            contiguous_arg(IN, i_rstd if i_mean is None else i_mean, (m,)), contiguous_arg(IN, i_rstd, (m,)),
            contiguous_arg(OUT, 0, (m, n)), *parts]
    sums = [contiguous_arg(OUT, 1, (r, q, n)), contiguous_arg(OUT, 2, (r, n))]
    outs = [((m, n), x.dtype), ((r, q, n), torch.float32), ((r, n) if has_bias else (n,), weight.dtype)]
    return native_launch.runner(f"cuteforge::{kind}_norm_backward", launch, x.device, i_dsum + 1, outs, args, [0, 2],
                                then=[native_launch.kernel_step(column_sum, sums)])


def _rms_impl(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
              eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, ro, _, rstd = norm_launch._forward("rms", x, weight, None, residual, eps)
    return y, (ro if ro is not None else _empty(x)), rstd


def _rms_infer_impl(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return norm_launch._forward("rms", x, weight, None, None, eps)[0]


def _ln_infer_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return norm_launch._forward("layer", x, weight, bias, None, eps)[0]


def _rms_fake(x, weight, residual, eps):
    ro = x.new_empty(x.shape) if residual is not None else _empty(x)
    return x.new_empty(x.shape), ro, x.new_empty(x.shape[0], dtype=torch.float32)


def _ln_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
             eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    y, ro, mean, rstd = norm_launch._forward("layer", x, weight, bias, residual, eps)
    return y, (ro if ro is not None else _empty(x)), mean, rstd


def _ln_fake(x, weight, bias, residual, eps):
    ro = x.new_empty(x.shape) if residual is not None else _empty(x)
    st = x.new_empty(x.shape[0], dtype=torch.float32)
    return x.new_empty(x.shape), ro, st, st.new_empty(st.shape)


def _rms_bwd_impl(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                  dsum: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    return norm_launch._backward_sums("rms", dy, x, weight, None, rstd, dsum, False)


def _ln_bwd_impl(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                 dsum: torch.Tensor | None, has_bias: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight) or with ``has_bias`` (dx, dweight and dbias as the rows of one (2, N) tensor)."""
    return norm_launch._backward_sums("layer", dy, x, weight, mean, rstd, dsum, has_bias)


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
    dx, sums = _ln_bwd_op(dy, xs, weight, mean, rstd, dro if ctx.has_res else None, ctx.has_bias)
    dw, db = (sums[0], sums[1]) if ctx.has_bias else (sums, None)
    return dx, dw, db, (dx if ctx.has_res else None), None


_rms_bwd_op = define("cuteforge::rms_norm_backward", _rms_bwd_impl,
                     fake=lambda dy, x, weight, rstd, dsum: (x.new_empty(x.shape), weight.new_empty(weight.shape)),
                     plan=lambda dy, x, w, rstd, dsum: _bwd_op_plan("rms", dy, x, w, None, rstd, dsum, False))
_ln_bwd_op = define("cuteforge::layer_norm_backward", _ln_bwd_impl,
                    fake=lambda dy, x, weight, mean, rstd, dsum, has_bias: (
                        x.new_empty(x.shape), weight.new_empty((2, *weight.shape) if has_bias else weight.shape)),
                    plan=lambda dy, x, w, mean, rstd, dsum, has_bias: _bwd_op_plan("layer", dy, x, w, mean, rstd, dsum,
                                                                                 has_bias))
_rms_op = define("cuteforge::rms_norm", _rms_impl, fake=_rms_fake,
                 plan=lambda x, w, r, eps: _fwd_op_plan("rms", x, w, None, r, eps),
                 backward=_rms_grad, setup_context=_rms_setup)
_ln_op = define("cuteforge::layer_norm", _ln_impl, fake=_ln_fake,
                plan=lambda x, w, b, r, eps: _fwd_op_plan("layer", x, w, b, r, eps),
                backward=_ln_grad, setup_context=_ln_setup)

# No grad, no residual (a compiled inference graph): y alone, as the eager no-grad call
# returns it; the ops above also allocate and return residual_out, mean and rstd.
_rms_infer_op = define("cuteforge::rms_norm_infer", _rms_infer_impl, fake=lambda x, weight, eps: x.new_empty(x.shape),
                       plan=lambda x, w, eps: _infer_op_plan("rms", x, w, None, eps))
_ln_infer_op = define("cuteforge::layer_norm_infer", _ln_infer_impl,
                      fake=lambda x, weight, bias, eps: x.new_empty(x.shape),
                      plan=lambda x, w, b, eps: _infer_op_plan("layer", x, w, b, eps))


# --------------------------------------------------------------------------- eager autograd
# Eager calls with grad skip the custom-op boundary too: its dispatch (forward, and the
# backward op called from register_autograd) cost more host time than the kernels take
# at small sizes (docs/kernels/norm.md).


class _RmsFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x2: torch.Tensor, weight: torch.Tensor, r2: torch.Tensor | None, eps: float) -> Any:
        y, ro, _, rstd = norm_launch._forward("rms", x2, weight, None, r2, eps)
        ctx.has_res = r2 is not None
        ctx.save_for_backward(ro if ctx.has_res else x2, weight, rstd)
        return y if ro is None else (y, ro)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, dro: torch.Tensor | None = None) -> tuple[Any, ...]:
        xs, weight, rstd = ctx.saved_tensors
        need_dw = ctx.needs_input_grad[1]
        dx, dw, _ = norm_launch._backward("rms", dy, xs, weight, None, rstd, dro if ctx.has_res else None, False, need_dw=need_dw)
        return dx, dw, (dx if ctx.has_res else None), None


class _LayerFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, r2: torch.Tensor | None,
                eps: float) -> Any:
        y, ro, mean, rstd = norm_launch._forward("layer", x2, weight, bias, r2, eps)
        ctx.has_res = r2 is not None
        ctx.has_bias = bias is not None
        ctx.save_for_backward(ro if ctx.has_res else x2, weight, mean, rstd)
        return y if ro is None else (y, ro)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, dro: torch.Tensor | None = None) -> tuple[Any, ...]:
        xs, weight, mean, rstd = ctx.saved_tensors
        need_dw = ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2])
        dx, dw, db = norm_launch._backward("layer", dy, xs, weight, mean, rstd, dro if ctx.has_res else None, ctx.has_bias,
                               need_dw=need_dw)
        return dx, dw, (db if ctx.has_bias else None), (dx if ctx.has_res else None), None


# --------------------------------------------------------------------------- the C++ autograd node

_NODE_PLANS: dict[tuple[Any, ...], Any] = {}


def _node_plan(kind: str, xs: torch.Tensor, w: torch.Tensor, y: torch.Tensor, mean: torch.Tensor | None,
               rstd: torch.Tensor, has_bias: bool, has_res: bool, need_dw: bool = True) -> Any:
    """The C++ node's plan: saved (xs, w, [mean], rstd); inputs (x, weight, [bias], residual);
    the kernel writes dx and fp32 (Q, N) dweight / dbias partials (with bias both halves of
    one (2, Q, N) buffer), which the column sum adds up into the rows of one (R, N) buffer
    in the weight's dtype.

    ``need_dw=False`` (neither weight nor bias requires grad: frozen norms, as under
    LoRA): the kernel without partials, and no partial buffer allocated per backward (one
    allocation of two on a host-bound call). Its partial operands are a stand-in that only
    gives the grid its Q rows: the saved rstd (fp32, 16-byte aligned: allocated by the
    forward) viewed as (Q, N) with row stride 0, which that kernel never touches."""
    m, n = xs.shape
    q, fn, column_sum = norm_launch._bwd_kernel(kind, xs, w, y, mean, rstd, y if has_res else None, has_bias,
                                                need_dw=need_dw)
    i_rstd = 2 if mean is None else 3
    rows = (m, n)
    r = 2 if has_bias else 1
    buffers: list[tuple[Any, torch.dtype]] = [(rows, xs.dtype)]
    then = []
    if need_dw:  # dweight and dbias partials in one (2, Q, N) buffer: one column sum for both
        parts = [contiguous_arg(native.BUFFER, 1, (q, n)),
                 contiguous_arg(native.BUFFER, 1, (q, n), q * n if has_bias else 0)]
        buffers += [((r, q, n), torch.float32), ((r, n) if has_bias else (n,), w.dtype)]
        then.append(native_launch.kernel_step(column_sum, [contiguous_arg(native.BUFFER, 1, (r, q, n)),
                                                           contiguous_arg(native.BUFFER, 2, (r, n))]))
    else:
        parts = [(native.SAVED, i_rstd, [q, n], [0, 1], 0)] * 2
    args = [arg(native.SAVED, 0, xs), arg(native.SAVED, 1, w),
            contiguous_arg(native.GRAD, 0, rows), contiguous_arg(native.GRAD, 1 if has_res else 0, rows),
            contiguous_arg(native.SAVED, 2, (m,)), contiguous_arg(native.SAVED, i_rstd, (m,)),
            contiguous_arg(native.BUFFER, 0, rows), *parts]
    dx_out, no_grad = (native.BUFFER_OUT, 0), (native.NO_GRAD, 0)
    outs = [dx_out, ((native.BUFFER_OUT, 2, 0) if has_bias else (native.BUFFER_OUT, 2)) if need_dw else no_grad]
    if kind == "layer":
        outs.append((native.BUFFER_OUT, 2, 1) if has_bias and need_dw else no_grad)
    outs.append(dx_out if has_res else no_grad)

    def fallback(grads: list[Any], saved: list[Any]) -> list[Any]:
        # (nothing of the plan's first forward is captured: a plan outlives its tensors)
        dy = saved[0].new_zeros(m, n) if grads[0] is None else grads[0]
        dro = None
        if has_res:
            dro = saved[0].new_zeros(m, n) if grads[1] is None else grads[1]
        t_mean = saved[2] if kind == "layer" else None
        dx, dw, db = norm_launch._backward(kind, dy, saved[0], saved[1], t_mean, saved[-1], dro, has_bias, need_dw=need_dw)
        return [dx, dw] + ([db] if kind == "layer" else []) + [dx if has_res else None]

    grads = [native.grad_as_is(y)] * (2 if has_res else 1)
    name = "CuteforgeRmsNormBackward" if kind == "rms" else "CuteforgeLayerNormBackward"
    return native.make_plan(name, fn, xs.device, grads, buffers, args, outs, fallback, then)


# The eager forward with grad per layout: the registered op's C launch (`_fwd_op_plan`),
# or None where it has none (then `norm_launch._forward`, a Python launch).
_GRAD_FORWARD: dict[tuple[Any, ...], Any] = {}
native_build.when_ready(_GRAD_FORWARD.clear)  # layouts met while the extension built had no C launch


def _grad_forward(kind: str, x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  r2: torch.Tensor | None, eps: float) -> tuple[Any, Any, Any, Any]:
    """(y, residual_out or None, mean or None, rstd) for `_autograd`: outputs allocated
    and the kernel launched in one C call where the layout has a launch plan."""
    key = (kind, eps, x2.dtype, x2.shape, x2.stride(), x2.data_ptr() & 15, x2.get_device(), weight.dtype,
           weight.data_ptr() & 15, None if bias is None else (bias.dtype, bias.data_ptr() & 15),
           None if r2 is None else (r2.stride(), r2.data_ptr() & 15))
    try:
        run = _GRAD_FORWARD[key]
    except KeyError:
        run = remember(_GRAD_FORWARD, key, _fwd_op_plan(kind, x2, weight, bias, r2, eps))
    if run is None:
        return norm_launch._forward(kind, x2, weight, bias, r2, eps)
    if kind == "rms":
        y, ro, rstd = run(x2, weight, r2)
        return y, (None if r2 is None else ro), None, rstd
    y, ro, mean, rstd = run(x2, weight, bias, r2)
    return y, (None if r2 is None else ro), mean, rstd


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
    y, ro, mean, rstd = _grad_forward(kind, x2, weight, bias, r2, eps)
    xs = x2 if ro is None else ro
    # partials only where a dweight or dbias is wanted (the input edges are fixed now); the
    # kernel without them views rstd as its stand-in, which needs rstd 16-byte aligned
    # (`_forward` allocates it, so it is; checked, since that kernel's key assumes it)
    need_dw = weight.requires_grad or (bias is not None and bias.requires_grad) or rstd.data_ptr() % 16 != 0
    key = (kind, bias is not None, xs.dtype, xs.shape, xs.stride(), xs.data_ptr() & 15, xs.get_device(),
           weight.dtype, weight.data_ptr() & 15, r2 is not None, need_dw)
    plan = _NODE_PLANS.get(key)
    if plan is None:
        plan = remember(_NODE_PLANS, key, _node_plan(kind, xs, weight, y, mean, rstd, bias is not None,
                                                     r2 is not None, need_dw))
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
    norm_launch._check(where, x, weight, bias, residual, eps)
    x2 = as_rows(x)
    r2 = None if residual is None else as_rows(residual)
    w2 = norm_launch._vec_of(weight)
    b2 = None if bias is None else norm_launch._vec_of(bias)
    launch = norm_launch._fwd_plan(kind, x2, w2, b2, r2, float(eps))
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

    remember(_EAGER, _eager_key(kind, x, weight, bias, residual, eps), run)
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


def _traced(kind: str, where: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            residual: torch.Tensor | None, eps: Any) -> Any:
    """Under torch.compile: the registered op on 2-D views, checked at trace time (the
    device when the graph runs); with grad off and no residual, the op that returns y alone."""
    norm_launch._check(where, x, weight, bias, residual, eps, device=False)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if residual is None and not torch.is_grad_enabled():
        y = _rms_infer_op(x2, weight, float(eps)) if kind == "rms" else _ln_infer_op(x2, weight, bias, float(eps))
        return y.view(shape)
    r2 = None if residual is None else residual.reshape(-1, shape[-1])
    y, ro = (_rms_op(x2, weight, r2, float(eps)) if kind == "rms" else _ln_op(x2, weight, bias, r2, float(eps)))[:2]
    return y.view(shape) if residual is None else (y.view(shape), ro.view(shape))


def _with_grad(kind: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               residual: torch.Tensor | None, eps: Any) -> Any:
    """Eager with grad: the forward with its autograd node, on 2-D x as it is (no
    reshape/view nodes in the autograd graph), else on its (M, N) view."""
    if x.dim() == 2:
        return _autograd(kind, x, weight, bias, residual, float(eps))
    shape = x.shape
    r2 = None if residual is None else residual.reshape(-1, shape[-1])
    out = _autograd(kind, x.reshape(-1, shape[-1]), weight, bias, r2, float(eps))
    return out.view(shape) if residual is None else (out[0].view(shape), out[1].view(shape))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, residual: torch.Tensor | None = None) -> Any:
    """RMSNorm over the last dim: ``x * rsqrt(mean(x^2) + eps) * weight`` (fp32 math).

    With ``residual`` returns ``(y, x + residual)`` and normalises the sum.
    x: fp32/bf16/fp16 CUDA tensor; weight: (N,) in x's dtype or fp32.
    """
    return _norm("rms", "cuteforge.ops.rms_norm", x, weight, None, residual, eps)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5, *,
               residual: torch.Tensor | None = None) -> Any:
    """LayerNorm over the last dim: ``(x - mean) * rsqrt(var + eps) * weight + bias`` (fp32 math,
    biased variance like torch). With ``residual`` returns ``(y, x + residual)``."""
    return _norm("layer", "cuteforge.ops.layer_norm", x, weight, bias, residual, eps)


def _norm(kind: str, where: str, x: Any, weight: Any, bias: Any, residual: Any, eps: Any) -> Any:
    """Both ops' call: traced under torch.compile, else the C memo, else the Python plan
    memoized per layout (a miss validates, with clear errors), with autograd when a
    gradient is wanted."""
    if not isinstance(eps, (float, int)) and isinstance(eps, numbers.Real):
        eps = float(eps)  # a numpy scalar
    if _is_compiling():
        return _traced(kind, where, x, weight, bias, residual, eps)
    call = _TABLES[kind].call  # the C memo: one C call for a warm no-grad layout
    if call is not None:
        out = call(eps, x, weight, bias, residual)
        if out is not None:
            return out
    try:
        run = _EAGER[(kind, eps, type(eps), x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device(),
                      weight.dtype, weight.shape, weight.stride(), weight.data_ptr() & 15, weight.get_device(),
                      None if bias is None else (bias.dtype, bias.shape, bias.stride(), bias.data_ptr() & 15, bias.get_device()),
                      None if residual is None else (residual.dtype, residual.shape, residual.stride(),
                                                     residual.data_ptr() & 15, residual.get_device()))]
    except (AttributeError, KeyError, TypeError, RuntimeError):  # not a dense tensor: the plan says so
        run = _eager_plan(kind, where, x, weight, bias, residual, eps)  # raises on bad input
    if _grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
                            or (residual is not None and residual.requires_grad)):
        return _with_grad(kind, x, weight, bias, residual, eps)
    return run(x, weight, bias, residual)
