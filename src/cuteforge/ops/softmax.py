"""Softmax and log-softmax over the last dim as torch ops, with autograd.

`cuteforge.ops.softmax(x, dim=-1)` / `log_softmax(x, dim=-1)`: x is a CUDA tensor of
fp32/bf16/fp16 with any number of dims >= 1; softmax runs over `dim` (fp32 math, output
in x's dtype). Over the last dim: leading dims are flattened (a view when they can be; a
2-D view with a row stride runs without a copy), a last dim that is not unit-stride is
copied first, and the output is contiguous. Over another dim the kernels take a copy
with that dim moved last, and the output is that copy's result moved back (a view).

The warm no-grad path is one C call where x's rows are a view of it (the op's launch
table in `cuteforge.native.launch`, keyed by dim with its type and x's dtype, shape,
strides, 16-byte pointer alignment and device: it allocates y and launches), else one
dict lookup keyed by the same; a miss validates (errors name the argument), picks the
config and compiles at most once per key, ever. Under torch.compile the ops go
through `torch.ops.cuteforge.{softmax,log_softmax}` and their backward ops (custom ops
with fake impls and autograd). Eager calls skip that boundary, which costs more than the
kernel at small sizes: with grad the forward's output gets the C++ autograd node of
`cuteforge.native`, whose backward launches the backward kernel without Python (or, where
that node is unavailable, a plain torch.autograd.Function calling the warm paths).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch

from .. import checks
from ..arch import target_arch
from ..kernels.softmax.spec import config_for, kernel_params, softmax_bwd, softmax_fwd
from ..native import backward as native
from ..native import build as native_build
from ..native import launch as native_launch
from ..native.args import arg, contiguous_arg
from ..signature import FLOAT_DTYPES, dtype_name
from .layout import as_rows, rows_view
from .memo import remember
from .registered import define

__all__ = ["softmax", "log_softmax", "softmax_backward", "log_softmax_backward", "warm"]

# Longest row the configs hold (backward: 16 CTAs x 512 threads x 32 elements); the
# tested range. Longer rows would fail in the config heuristic without naming x.
MAX_N = 262144
_MOVE_DIM = "move the softmax dim last, e.g. with movedim"  # checks.last_dim's hint
# backward plan: (output shape as a tuple of ints, launch(*operands, out)). launch takes the
# caller's tensors as they are (a 2-D operand goes straight to the compiled function; other
# layouts get a wrapper that views or copies them into rows; an empty problem gets a no-op),
# so the warm path is one lookup, one allocation and one call with no further checks.
_Plan = tuple[tuple[int, ...], Callable[..., Any]]
_PLANS: dict[tuple[Any, ...], _Plan] = {}
# the forward's memo: run(x) -> y, the C launch of `native.launch` where x's rows can be
# read in place (one C call: allocation, argument views, launch), else a Python closure
_Run = Callable[[torch.Tensor], torch.Tensor]
_FWD: dict[tuple[Any, ...], _Run] = {}
native_build.when_ready(_FWD.clear)  # runs made while the extension built are Python launches
# ... and its C copy for the C launches, keyed by (dim, x): a warm call is one C call
_TABLES = {mode: native_launch.Table(1) for mode in ("softmax", "log_softmax")}


def _check(where: str, name: str, t: Any, device: bool = True) -> None:
    checks.tensor(where, name, t, FLOAT_DTYPES)
    if t.dim() < 1:
        raise ValueError(f"{where}: argument {name!r} must have at least 1 dim, got a 0-d tensor")
    if t.shape[-1] > MAX_N:
        raise ValueError(f"{where}: argument {name!r} has a last dim of {t.shape[-1]}; at most {MAX_N} is supported")
    if device:
        checks.on_cuda(where, name, t)


def _direct(t: torch.Tensor) -> bool:
    """t already is an (M, N) operand the kernel takes as is."""
    return t.dim() == 2 and t.stride(1) == 1


def _skip(*args: Any) -> None:
    """An empty problem: nothing to launch."""


def _memo_key(mode: str, dim: Any, *ts: torch.Tensor) -> tuple[Any, ...]:
    """Everything a plan depends on, flat: the scalar arguments (dim with its type, so
    dim=True never reuses dim=1's plan), then per operand its dtype, shape, strides,
    16-byte pointer alignment and device. The warm paths build the same tuple inline."""
    key: tuple[Any, ...] = (mode, dim, type(dim))
    for t in ts:
        key += (t.dtype, t.shape, t.stride(), t.data_ptr() & 15, t.get_device())
    return key


def _same_heads(n: int, *ts: torch.Tensor) -> bool:
    """Every row of these (M, n) operands starts as far from a 16-byte boundary as the
    rows of a fresh contiguous output (`kernel_params`): aligned pointers and row strides
    that differ from n by a multiple of 16 bytes. From pointers and strides only, which
    the plans' memo keys hold."""
    return all((t.data_ptr() & 15) == 0 and (t.stride(0) - n) * t.element_size() % 16 == 0 for t in ts)


def _plan_fwd(mode: str, x: Any, dim: Any) -> _Run:
    where = f"cuteforge.ops.{mode}"
    _check(where, "x", x, device=False)
    checks.last_dim(where, "dim", dim, x.dim(), _MOVE_DIM)
    checks.on_cuda(where, "x", x)  # last: a CPU caller sees the real problem first
    x2 = as_rows(x)
    m, n = x2.shape
    shape = tuple(x.shape)
    run: _Run | None = None
    if m == 0 or n == 0:
        def run(t: torch.Tensor) -> torch.Tensor:
            return t.new_empty(*shape)
    else:
        y2 = torch.empty(m, n, dtype=x.dtype, device=x.device)
        key = softmax_fwd.signature.bind((x2, y2), where)
        from ..autotune import lookup  # slow path only: a tuned config if one was stored

        cfg = lookup(softmax_fwd, key, (("mode", mode),), {"M": m}) or config_for(target_arch(), n, x.element_size() * 8, False, m, mode, key)
        fn = softmax_fwd.get(key, kernel_params(mode, key, _same_heads(n, x2)), cfg)
        xv = rows_view(x, x2)
        if xv is not None:  # x read in place: allocation and launch in one C call
            run = native_launch.runner(where, fn, x.device, 1, [(shape, x.dtype)],
                                [arg(native_launch.INPUT, 0, xv), contiguous_arg(native_launch.OUTPUT, 0, (m, n))], [0])
        if run is None and _direct(x):
            def run(t: torch.Tensor) -> torch.Tensor:
                y = t.new_empty(m, n)
                fn(t, y)
                return y
        elif run is None:
            def run(t: torch.Tensor) -> torch.Tensor:
                y = t.new_empty(*shape)
                fn(as_rows(t), y.view(-1, n))
                return y
    remember(_FWD, _memo_key(mode, dim, x), run)
    _TABLES[mode].put((dim,), (x,), run)
    return run


def _fwd_planned(mode: str, x: torch.Tensor, dim: int) -> _Run:
    """The memoized run for this call's layout, made on a miss."""
    try:
        return _FWD[(mode, dim, type(dim), x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device())]
    except (AttributeError, KeyError, TypeError, RuntimeError):  # not a dense tensor: the plan says so
        return _plan_fwd(mode, x, dim)


def _fwd(mode: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    return _fwd_planned(mode, x, dim)(x)


def _bwd_kernel(mode: str, dy2: torch.Tensor, y2: torch.Tensor, where: str) -> Any:
    """The compiled backward for (M, N) operands (M, N > 0)."""
    m, n = y2.shape
    dx2 = torch.empty(m, n, dtype=y2.dtype, device=y2.device)
    key = softmax_bwd.signature.bind((dy2, y2, dx2), where)
    from ..autotune import lookup

    cfg = lookup(softmax_bwd, key, (("mode", mode),), {"M": m}) or config_for(target_arch(), n, y2.element_size() * 8, True, m)
    return softmax_bwd.get(key, kernel_params(mode, key, _same_heads(n, dy2, y2)), cfg)


def _plan_bwd(mode: str, dy: Any, y: Any, dim: Any) -> _Plan:
    where = f"cuteforge.ops.{mode.removesuffix('_bwd')}_backward"
    _check(where, "grad", dy, device=False)
    _check(where, "y", y, device=False)
    checks.matches(where, "grad", dy, "y", y)
    checks.last_dim(where, "dim", dim, y.dim(), _MOVE_DIM)
    checks.on_cuda(where, "grad", dy)
    dy2, y2 = as_rows(dy), as_rows(y)
    m, n = y2.shape
    launch: Callable[..., Any] = _skip
    if m > 0 and n > 0:
        fn = _bwd_kernel(mode, dy2, y2, where)
        if _direct(dy) and _direct(y):
            launch = fn
        else:
            def launch(g: torch.Tensor, t: torch.Tensor, dx: torch.Tensor) -> None:
                fn(as_rows(g), as_rows(t), dx.view(-1, n))
    return remember(_PLANS, _memo_key(mode, dim, dy, y), (tuple(y.shape), launch))


def _bwd(mode: str, dy: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    try:
        shape, launch = _PLANS[(mode, dim, type(dim), dy.dtype, dy.shape, dy.stride(), dy.data_ptr() & 15, dy.get_device(),
                                y.dtype, y.shape, y.stride(), y.data_ptr() & 15, y.get_device())]
    except (AttributeError, KeyError, TypeError):
        shape, launch = _plan_bwd(mode, dy, y, dim)
    dx = y.new_empty(*shape)
    launch(dy, y, dx)
    return dx


# --- torch.library registration: what torch.compile, autograd and CUDA graphs see ----


def _bwd_op_plan(mode: str, dy: torch.Tensor, y: torch.Tensor, dim: int) -> Any:
    """The registered backward's launch plan: grad and y read in place as (M, N) rows,
    dx allocated in y's shape; None where either needs a copy (the call stays on Python)."""
    dy2, y2 = rows_view(dy), rows_view(y)
    if dy2 is None or y2 is None:
        return None
    shape, _ = _plan_bwd(f"{mode}_bwd", dy, y, dim)  # checks, compiles (memoized)
    if 0 in y2.shape:
        return None
    m, n = y2.shape
    IN = native_launch.INPUT
    fn = _bwd_kernel(f"{mode}_bwd", dy2, y2, f"cuteforge.ops.{mode}_backward")
    return native_launch.runner(f"cuteforge::{mode}_backward", fn, y.device, 2, [(shape, y.dtype)],
                                [arg(IN, 0, dy2), arg(IN, 1, y2), contiguous_arg(native_launch.OUTPUT, 0, (m, n))], [0])


def _register(mode: str) -> tuple[Any, Any]:
    bwd_mode = f"{mode}_bwd"

    def backward_impl(grad: torch.Tensor, y: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return _bwd(bwd_mode, grad, y, dim)

    def backward_fake(grad: torch.Tensor, y: torch.Tensor, dim: int = -1) -> torch.Tensor:
        torch._check(grad.shape == y.shape, lambda: f"cuteforge.ops.{mode}_backward: grad and y shapes differ")
        return y.new_empty(y.shape)

    backward_op = define(f"cuteforge::{mode}_backward", backward_impl, fake=backward_fake,
                         plan=lambda grad, y, dim: _bwd_op_plan(mode, grad, y, dim))

    def forward_impl(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return _fwd(mode, x, dim)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(output)
        ctx.dim = inputs[1] if len(inputs) > 1 else -1

    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None]:
        (y,) = ctx.saved_tensors
        return backward_op(grad, y, ctx.dim), None

    # the forward's plan is the eager one: x read in place, y in x's shape
    forward_op = define(f"cuteforge::{mode}", forward_impl, fake=lambda x, dim=-1: x.new_empty(x.shape),
                        plan=lambda x, dim: _fwd_planned(mode, x, dim), backward=backward, setup_context=setup_context)
    return forward_op, backward_op


_softmax_op, _softmax_bwd_op = _register("softmax")
_log_softmax_op, _log_softmax_bwd_op = _register("log_softmax")


def _eager_function(mode: str) -> Any:
    """Eager autograd without the custom-op boundary: forward and backward call the
    warm paths directly. Through the custom ops, an autograd.grad of a small softmax
    cost several times the kernel's time in host dispatch (docs/kernels/softmax.md)."""
    bwd_mode = f"{mode}_bwd"

    class _Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
            y = _fwd(mode, x, dim)
            ctx.save_for_backward(y)
            ctx.dim = dim
            return y

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None]:
            (y,) = ctx.saved_tensors
            return _bwd(bwd_mode, grad, y, ctx.dim), None

    _Fn.__name__ = _Fn.__qualname__ = f"_{mode.title().replace('_', '')}Function"
    return _Fn


_NODE_PLANS: dict[tuple[Any, ...], Any] = {}


def _node_plan(mode: str, y: torch.Tensor, dim: int) -> Any:
    """The C++ autograd node's plan for a forward output y (fresh, contiguous): the
    backward kernel reads (grad, y) as (M, N) rows and writes dx."""
    bwd_mode = f"{mode}_bwd"
    n = y.shape[-1]
    m = y.numel() // n if n else 0
    fn = None
    if m > 0 and n > 0:
        y2 = y.view(m, n)
        fn = _bwd_kernel(bwd_mode, y2, y2, f"cuteforge.ops.{mode}_backward")

    def fallback(grads: list[Any], saved: list[Any]) -> list[Any]:
        (g,), (t,) = grads, saved
        return [_bwd(bwd_mode, torch.zeros_like(t) if g is None else g, t, dim)]

    rows = (m, n)
    return native.make_plan(
        f"Cuteforge{mode.title().replace('_', '')}Backward", fn, y.device,
        grads=[native.grad_as_is(y)], buffers=[(y.shape, y.dtype)],
        args=[contiguous_arg(native.GRAD, 0, rows), contiguous_arg(native.SAVED, 0, rows),
              contiguous_arg(native.BUFFER, 0, rows)],
        outs=[(native.BUFFER_OUT, 0)], fallback=fallback)


def _native_autograd(mode: str, x: torch.Tensor, dim: int) -> torch.Tensor | None:
    """y with the C++ autograd node as grad_fn; None where that node is unavailable."""
    if native.module() is None or native.forward_ad_active():
        return None
    y = _fwd(mode, x, dim)
    key = (mode, dim, y.dtype, y.shape, y.get_device())
    plan = _NODE_PLANS.get(key)
    if plan is None:
        plan = remember(_NODE_PLANS, key, _node_plan(mode, y, dim))
    native.attach(plan, [x], [y], [y])
    return y


def _other_dim(x: Any, dim: Any) -> bool:
    """dim is a valid dim of tensor x other than its last."""
    return (isinstance(x, torch.Tensor) and isinstance(dim, numbers.Integral) and not isinstance(dim, bool)
            and -x.dim() <= dim < x.dim() and int(dim) % x.dim() != x.dim() - 1)


def _entry(mode: str, custom: Any) -> Callable[..., torch.Tensor]:
    is_compiling = torch.compiler.is_compiling
    grad_enabled = torch.is_grad_enabled
    plans = _FWD
    table = _TABLES[mode]
    apply = _eager_function(mode).apply

    def fn(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        # Tracing needs the custom-op boundary; eager autograd goes through the C++ node
        # (else a plain autograd.Function) and no-grad calls skip both.
        # The warm path is inlined on purpose: each Python call level costs ~0.1 us.
        if (type(dim) is not int or dim != -1) and _other_dim(x, dim):  # a tensor dim is never compared
            # the kernels run over rows: the dim moves last (a transposing copy), and back
            return fn(x.movedim(int(dim), -1), -1).movedim(-1, int(dim))
        if is_compiling():
            return custom(x, dim)
        call = table.call  # the C memo: one C call for a warm no-grad layout
        if call is not None:
            y = call(dim, x)
            if y is not None:
                return y
        if getattr(x, "requires_grad", False) and grad_enabled():
            y = _native_autograd(mode, x, dim)
            return apply(x, dim) if y is None else y
        try:
            run = plans[(mode, dim, type(dim), x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device())]
        except (AttributeError, KeyError, TypeError, RuntimeError):
            run = _plan_fwd(mode, x, dim)
        return run(x)

    fn.__name__ = fn.__qualname__ = mode
    fn.__doc__ = (
        f"{mode} over dim of a CUDA tensor (fp32/bf16/fp16, fp32 math), with autograd and "
        "torch.compile support. Returns a tensor of x's shape and dtype: contiguous for the last "
        "dim; for another dim the kernels run on a transposed copy and the result is its view."
    )
    return fn


softmax = _entry("softmax", _softmax_op)
log_softmax = _entry("log_softmax", _log_softmax_op)


def softmax_backward(grad: torch.Tensor, y: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """dx = y * (grad - sum(grad * y)) from y = softmax(x) (the backward kernel alone)."""
    if torch.compiler.is_compiling():
        return _softmax_bwd_op(grad, y, dim)
    return _bwd("softmax_bwd", grad, y, dim)


def log_softmax_backward(grad: torch.Tensor, y: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """dx = grad - exp(y) * sum(grad) from y = log_softmax(x) (the backward kernel alone)."""
    if torch.compiler.is_compiling():
        return _log_softmax_bwd_op(grad, y, dim)
    return _bwd("log_softmax_bwd", grad, y, dim)


def warm(problems: list[tuple[str, torch.dtype, int, int]], workers: int | None = None) -> list[Any]:
    """Compile, in parallel GPU-blind worker processes, the kernels that calls on
    contiguous (M, N) tensors will use: `problems` is [(mode, dtype, M, N)], mode one of
    softmax, log_softmax, softmax_bwd, log_softmax_bwd. Returns the compile outcomes.
    Later calls load the objects from the disk cache (milliseconds)."""
    from ..autotune.pool import CompileJob, compile_all
    from ..signature import BoundKey, vector_width

    arch = target_arch()
    jobs = {}
    for mode, dt, m, n in problems:
        bwd = mode.endswith("_bwd")
        k = softmax_bwd if bwd else softmax_fwd
        vec = vector_width(0, (n,), dt.itemsize)  # what binding a fresh contiguous tensor gives
        nargs = 3 if bwd else 2

        key = BoundKey((dtype_name(dt),) * nargs, (("N", n),), (vec,) * nargs)
        cfg = config_for(arch, n, dt.itemsize * 8, bwd, m, mode, key)
        job = CompileJob.of(k, key, kernel_params(mode, key, True), cfg, arch)  # contiguous: same heads
        jobs[job] = None
    return compile_all(list(jobs), workers=workers, arch=arch)
