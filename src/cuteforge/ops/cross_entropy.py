"""`cuteforge.ops.cross_entropy(logits, target, *, reduction="mean", ignore_index=-100, out_dtype=None)`.

logits (M, N) fp32/bf16/fp16 on CUDA (rows contiguous, any row stride), target (M,) int64
on the same device. Like `torch.nn.functional.cross_entropy` for class-index targets
(no weight, no label smoothing); the result has logits' dtype, or `out_dtype`'s
(torch.float32: the fp32 sum without the rounding to bf16, as transformers reports a
causal LM's loss; the loss's own gradient then reaches the backward unrounded too).

Forward: one kernel reads each row once. `reduction="none"`: it writes the per-row loss
and logsumexp (fp32). `mean`/`sum` (eager): `cross_entropy_fwd_reduce` also reduces the
losses in the same launch and writes the scalar (fp32 sum rounded once to the result's dtype;
mean divides by the number of rows whose target is not `ignore_index`, so all-ignored
gives NaN like torch), bitwise the same on every run (no float atomics: per-CTA partials,
the last CTA adds them in a fixed order); with grad it also writes lse and the count.
Backward: one kernel reads the logits once and writes dlogits = (softmax - onehot) * g,
with g the per-row gradient (zero on ignored rows). The softmax is never materialized.

The reduced forward needs a workspace (int32, `kernels.work_words(grid)`: 128 KiB plus 8
bytes per CTA): ticket counters that must be 0 when a launch starts (the launch sets them
back to 0 before it ends) and the partials. It comes from `cuteforge.workspace` (one per
device and current stream for eager calls, a fresh one per call under CUDA-graph capture;
that module's doc says why). Grids beyond
`kernels.reduce_fits` (M of millions of rows) reduce with torch ops after the per-row
kernel instead.

Targets outside [0, N) (and not `ignore_index`) are not checked on the host by default
(that would synchronize): their row's loss is NaN, so `mean`/`sum` are NaN, and their
gradient row is NaN. Nothing is clamped or read out of bounds. With the environment
variable `CUTEFORGE_CHECK_TARGETS=1` set at import (or this module's `CHECK_TARGETS` set to
True) eager calls raise a ValueError on the host instead (one device sync per call).

Under torch.compile the kernels run as `torch.ops.cuteforge.cross_entropy_fwd` /
`cross_entropy_bwd` (custom ops with fake impls and autograd) and mean/sum stay torch ops
after the per-row kernel (Inductor fuses them; the reduced kernel is eager-only); eager
calls skip that boundary (when logits require grad, the C++ autograd node of
`cuteforge.native` on the loss, with mean/sum after the reduced kernel; where that node
is unavailable, an autograd.Function, for mean/sum one that holds the reduced kernel).
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable
from typing import Any

import torch

from .. import checks
from ..kernels.cross_entropy.config import WORK_ZERO
from ..native import backward as native
from ..native import build as native_build
from ..native import launch as native_launch
from ..native.args import arg, contiguous_arg
from ..signature import FLOAT_DTYPES, dtype_name
from ..workspace import stream_workspace
from . import cross_entropy_launch as launch
from .cross_entropy_launch import _WHERE
from .memo import remember
from .registered import define

__all__ = ["cross_entropy", "CHECK_TARGETS"]

CHECK_TARGETS = os.environ.get("CUTEFORGE_CHECK_TARGETS", "") not in ("", "0")
_REDUCTIONS = ("mean", "sum", "none")


def _check(logits: Any, target: Any, reduction: Any, ignore_index: Any) -> None:
    checks.tensor(_WHERE, "logits", logits)
    checks.tensor(_WHERE, "target", target)
    if logits.dim() != 2:
        raise ValueError(f"{_WHERE}: argument 'logits' must be 2-D (M, N), got shape {tuple(logits.shape)}")
    checks.dtype_in(_WHERE, "logits", logits, FLOAT_DTYPES)
    if target.dtype != torch.int64:
        raise TypeError(f"{_WHERE}: argument 'target' must be int64 class indices, got dtype {dtype_name(target.dtype)}")
    if target.dim() != 1 or target.shape[0] != logits.shape[0]:
        raise ValueError(
            f"{_WHERE}: argument 'target' must have shape ({logits.shape[0]},) to match logits "
            f"{tuple(logits.shape)}, got {tuple(target.shape)}"
        )
    checks.same_device(_WHERE, "target", target, "logits", logits)
    if not 1 <= logits.shape[1] <= checks.INT32_MAX:  # the kernels index a row in int32
        raise ValueError(f"{_WHERE}: argument 'logits' must have 1 to {checks.INT32_MAX} classes, got shape "
                         f"{tuple(logits.shape)}")
    if not isinstance(reduction, str) or reduction not in _REDUCTIONS:
        raise ValueError(f"{_WHERE}: argument 'reduction' must be one of {_REDUCTIONS}, got {reduction!r}")
    checks.integer(_WHERE, "ignore_index", ignore_index)
    if not -(2**63) <= ignore_index < 2**63:  # compared with int64 targets in the kernel
        raise ValueError(f"{_WHERE}: argument 'ignore_index'={ignore_index} does not fit in int64")


def _check_targets(target: torch.Tensor, n: int, ignore_index: int) -> None:
    bad = (target != ignore_index) & ((target < 0) | (target >= n))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{_WHERE}: argument 'target' has target[{i}] = {int(target[i])}, outside [0, {n}) "
            f"and not ignore_index={ignore_index}"
        )


WORKSPACE_OWNER = "cross_entropy"  # its key in cuteforge.workspace


def _work(device: int, words: int) -> torch.Tensor:
    """A workspace of at least `words` whose ticket counters are zero (module doc)."""
    return stream_workspace(WORKSPACE_OWNER, device, words, WORK_ZERO)


def _empty_result(logits: torch.Tensor, mean: bool, dtype: torch.dtype) -> torch.Tensor:
    """M == 0: torch's answer (mean 0 / 0 = NaN, sum 0) without a launch."""
    return logits.new_full((), float("nan") if mean else 0.0, dtype=dtype)


# --- torch.library registration (torch.compile) and the eager autograd path --------------


def _fwd_impl(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    return launch._fwd(logits, target, ignore_index)


def _fwd_fake(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch._check(logits.dim() == 2, lambda: f"{_WHERE}: logits must be 2-D")
    m = logits.shape[0]
    return logits.new_empty(m, dtype=torch.float32), logits.new_empty(m, dtype=torch.float32)


def _bwd_impl(logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor,
              ignore_index: int) -> torch.Tensor:
    return launch._bwd(logits, target, lse, dloss, ignore_index)


def _bwd_fake(logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor,
              ignore_index: int) -> torch.Tensor:
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _in_place(logits: torch.Tensor, *vectors: torch.Tensor) -> bool:
    """Operands a launch plan reads as they are: (M, N) logits with unit last stride,
    unit-stride (M,) vectors, M > 0 (else the Python path copies or skips)."""
    return (logits.dim() == 2 and logits.stride(1) == 1 and logits.shape[0] > 0
            and all(v.dim() == 1 and v.stride(0) == 1 for v in vectors))


def _fwd_op_plan(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> Any:
    """The registered forward's launch plan: (loss, lse) fp32 per row."""
    if not _in_place(logits, target):
        return None
    try:
        fn = launch._FWD[launch._key(logits, target, ignore_index)]
    except KeyError:
        fn = launch._fwd_launcher(logits, target, ignore_index)
    m = logits.shape[0]
    IN, OUT = native_launch.INPUT, native_launch.OUTPUT
    return native_launch.runner("cuteforge::cross_entropy_fwd", fn, logits.device, 2, [((m,), torch.float32)] * 2,
                                [arg(IN, 0, logits), contiguous_arg(IN, 1, (m,)),
                                 contiguous_arg(OUT, 0, (m,)), contiguous_arg(OUT, 1, (m,))], [0, 1])


def _bwd_op_plan(logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor,
                 ignore_index: int) -> Any:
    """The registered backward's launch plan: dlogits (M, N) contiguous."""
    if not _in_place(logits, target, lse, dloss) or dloss.dtype != torch.float32:
        return None
    m, n = logits.shape
    dlogits = torch.empty((m, n), dtype=logits.dtype, device=logits.device)
    fn = launch._bwd_kernel(logits, target, lse, dloss, dlogits, ignore_index)
    IN, OUT = native_launch.INPUT, native_launch.OUTPUT
    return native_launch.runner("cuteforge::cross_entropy_bwd", fn, logits.device, 4, [((m, n), logits.dtype)],
                                [arg(IN, 0, logits), contiguous_arg(IN, 1, (m,)),
                                 contiguous_arg(IN, 2, (m,)), contiguous_arg(IN, 3, (m,)),
                                 contiguous_arg(OUT, 0, (m, n))], [0])


_bwd_op = define("cuteforge::cross_entropy_bwd", _bwd_impl, fake=_bwd_fake, plan=_bwd_op_plan)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    logits, target, ignore_index = inputs
    ctx.ignore_index = ignore_index
    ctx.save_for_backward(logits, target, output[1])


def _backward(ctx: Any, g_loss: torch.Tensor, g_lse: Any) -> tuple[Any, None, None]:
    # lse is an auxiliary output for the backward: its gradient (zeros, autograd
    # materializes it) is ignored, so torch.ops.cuteforge.cross_entropy_fwd's lse is not
    # differentiable.
    logits, target, lse = ctx.saved_tensors
    return _bwd_op(logits, target, lse, g_loss.float().contiguous(), ctx.ignore_index), None, None


_fwd_op = define("cuteforge::cross_entropy_fwd", _fwd_impl, fake=_fwd_fake, plan=_fwd_op_plan, backward=_backward,
                 setup_context=_setup)


class _Eager(torch.autograd.Function):
    """The same forward/backward for eager autograd without the custom-op dispatch
    (which costs more host time than a small step's kernels)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
        loss, lse = launch._fwd(logits, target, ignore_index)
        ctx.ignore_index = ignore_index
        ctx.save_for_backward(logits, target, lse)
        return loss

    @staticmethod
    def backward(ctx: Any, g_loss: torch.Tensor) -> tuple[Any, None, None]:
        logits, target, lse = ctx.saved_tensors
        return launch._bwd(logits, target, lse, g_loss, ctx.ignore_index), None, None


def _reduced_with_lse(logits: torch.Tensor, target: torch.Tensor, ignore_index: int,
                      mean: bool, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(loss, lse) from one launch of the reduced forward for M >= 1 rows and a unit-stride
    target: lse (M + 1) holds each row's logsumexp and, at lse[M], the count of rows not
    ignored. None where the grid is beyond the kernel's two levels."""
    try:
        fn, words = launch._RED[(*launch._key(logits, target, ignore_index), mean, True, out_dtype)]
    except KeyError:
        fn, words = launch._red_launcher(logits, target, ignore_index, mean, True, out_dtype)
    if fn is None:
        return None
    lse = logits.new_empty(logits.shape[0] + 1, dtype=torch.float32)
    out = logits.new_empty((), dtype=out_dtype)
    fn(logits, target, out.view(1), lse, _work(logits.get_device(), words))
    return out, lse


class _EagerReduced(torch.autograd.Function):
    """mean/sum with grad: one autograd node around one launch of the reduced forward
    (which also writes lse (M) and the count of non-ignored rows after it, at lse[M]).
    The chain _Eager -> sum -> div -> to(dtype) cost four nodes of host time in the
    backward, more than the kernel at small sizes (docs/kernels/cross_entropy.md)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, ignore_index: int, mean: bool,
                dtype: torch.dtype) -> torch.Tensor:
        m = logits.shape[0]
        ctx.ignore_index, ctx.mean = ignore_index, mean
        if m == 0:
            ctx.save_for_backward(logits, target, logits.new_zeros(1, dtype=torch.float32))
            return _empty_result(logits, mean, dtype)
        if target.stride(0) != 1:
            target = target.contiguous()
        reduced = _reduced_with_lse(logits, target, ignore_index, mean, dtype)
        if reduced is None:  # a grid beyond the kernel's two levels: torch reduces the rows' losses
            loss, lse = launch._fwd(logits, target, ignore_index)
            count = target.ne(ignore_index).sum()
            ctx.save_for_backward(logits, target, torch.cat([lse, count.float().view(1)]))
            return _reduce(loss, target, "mean" if mean else "sum", ignore_index, dtype)
        out, lse = reduced
        ctx.save_for_backward(logits, target, lse)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, None, None, None, None]:
        logits, target, lse = ctx.saved_tensors
        m = logits.shape[0]
        scale = g.float()
        if ctx.mean:
            scale = scale / lse[m]  # the count (fp32), as torch divides by it
        # a stride-0 (M,) view: launch._bwd materializes it as the kernel's contiguous dloss
        return launch._bwd(logits, target, lse[:m], scale.expand(m), ctx.ignore_index), None, None, None, None


# --- the C++ autograd node (cuteforge.native): the eager backward without a Python node ---

_NODE_PLANS: dict[tuple[Any, ...], Any] = {}


def _node_plan(logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, ignore_index: int,
               reduced: bool, mean: bool) -> Any:
    """Saved (logits, target, lse); the kernel reads a per-row fp32 dloss: the loss's own
    gradient ("none"), or the scalar's spread over the rows (mean: divided by the count
    the reduced forward stores at lse[M])."""
    m, n = logits.shape
    rows_lse = lse[:m]
    dloss = torch.empty(m, dtype=torch.float32, device=logits.device)
    dlogits = torch.empty((m, n), dtype=logits.dtype, device=logits.device)
    fn = launch._bwd_kernel(logits, target, rows_lse, dloss, dlogits, ignore_index)
    grad = native.grad_scalar_rows(m, 2 if mean else -1) if reduced else native.grad_as_is(dloss)

    def fallback(grads: list[Any], saved: list[Any]) -> list[Any]:
        lg, t, ls = saved
        g = grads[0]
        if reduced:
            scale = torch.zeros((), device=lg.device) if g is None else g.float()
            if mean:
                scale = scale / ls[m]
            return [launch._bwd(lg, t, ls[:m], scale.expand(m), ignore_index)]
        return [launch._bwd(lg, t, ls, lg.new_zeros(m, dtype=torch.float32) if g is None else g, ignore_index)]

    args = [arg(native.SAVED, 0, logits), contiguous_arg(native.SAVED, 1, (m,)),
            contiguous_arg(native.SAVED, 2, (m,)), contiguous_arg(native.GRAD, 0, (m,)),
            contiguous_arg(native.BUFFER, 0, (m, n))]
    return native.make_plan("CuteforgeCrossEntropyBackward", fn, logits.device, [grad], [((m, n), logits.dtype)],
                            args, [(native.BUFFER_OUT, 0)], fallback)


def _plan_for(logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, ignore_index: int, reduced: bool,
              mean: bool) -> Any:
    key = (*launch._key(logits, target, ignore_index), lse.shape, reduced, mean)
    plan = _NODE_PLANS.get(key)
    if plan is None:
        plan = remember(_NODE_PLANS, key, _node_plan(logits, target, lse, ignore_index, reduced, mean))
    return plan


def _native_autograd(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str,
                     out_dtype: torch.dtype) -> torch.Tensor | None:
    """The loss with the C++ node as grad_fn, or None where the Python nodes run instead
    (no extension, forward AD, M == 0, a strided target, a grid the reduced kernel
    does not take)."""
    m = logits.shape[0]
    if native.module() is None or native.forward_ad_active() or m == 0 or target.stride(0) != 1:
        return None
    if reduction == "none":
        loss, lse = launch._fwd(logits, target, ignore_index)
        native.attach(_plan_for(logits, target, lse, ignore_index, False, False), [logits], [loss],
                      [logits, target, lse])
        return loss.to(out_dtype)
    mean = reduction == "mean"
    reduced = _reduced_with_lse(logits, target, ignore_index, mean, out_dtype)
    if reduced is None:
        return None
    out, lse = reduced
    native.attach(_plan_for(logits, target, lse, ignore_index, True, mean), [logits], [out], [logits, target, lse])
    return out


def _reduce(loss: torch.Tensor, target: torch.Tensor, reduction: str, ignore_index: int, dtype: torch.dtype) -> torch.Tensor:
    if reduction == "none":
        return loss.to(dtype)
    total = loss.sum()
    if reduction == "sum":
        return total.to(dtype)
    return (total / (target != ignore_index).sum()).to(dtype)


# The eager no-grad warm path: one lookup keyed by everything `_check` and the launcher
# read (reduction, ignore_index with its type, so True never reuses 1's plan, and both
# tensors' dtype, shape, strides, 16-byte alignment and device) gives run(logits, target),
# which allocates and launches with no further checks (mean/sum: one launch that reduces
# too, on the current stream's workspace: `_work`, a capture check and a stream lookup).
_Run = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_PLANS: dict[tuple[Any, ...], _Run] = {}
native_build.when_ready(_PLANS.clear)  # runs made while the extension built are Python launches


def _memo_key(logits: torch.Tensor, target: torch.Tensor, reduction: Any, ignore_index: Any,
              out_dtype: Any) -> tuple[Any, ...]:
    # cross_entropy builds the same tuple inline
    return (reduction, ignore_index, type(ignore_index), out_dtype, logits.dtype, logits.shape, logits.stride(),
            logits.data_ptr() & 15, logits.get_device(), target.dtype, target.shape, target.stride(),
            target.data_ptr() & 15, target.get_device())


def _plan(logits: Any, target: Any, reduction: Any, ignore_index: Any, out_dtype: Any) -> _Run:
    """Validate (clear errors), compile or load the forward, and store run() for the
    call's layout. run() does what `_fwd` + `_reduce` do, with the fewest torch calls:
    "none": one allocation per kernel output (and the cast unless the result is fp32);
    mean/sum: the scalar's allocation and one launch of the reduced kernel (no lse)."""
    _check(logits, target, reduction, ignore_index)
    dtype = _result_dtype(logits, out_dtype)
    copy = target.stride(0) != 1
    if copy:  # no copy of a CPU target (an expanded one can be huge): the device error first
        checks.on_cuda(_WHERE, "logits", logits)
    tgt = target.contiguous() if copy else target
    m, f32 = logits.shape[0], torch.float32
    same = dtype == f32
    # mean / sum: the row config the reduced forward shares with the per-row one
    cfg = launch._row_config(logits, tgt, ignore_index) if reduction != "none" and m > 0 else None

    # per-row losses: "none", or a mean / sum whose grid is beyond the reduced kernel's two levels
    if reduction == "none" or (m > 0 and not launch._red_words(logits, cfg)):
        fn = launch._fwd_launcher(logits, tgt, ignore_index)

        def run(lg: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            if copy:
                t = t.contiguous()
            loss = lg.new_empty(m, dtype=f32)
            fn(lg, t, loss, lg.new_empty(m, dtype=f32))
            if reduction != "none":
                return _reduce(loss, t, reduction, ignore_index, dtype)
            return loss if same else loss.to(dtype)

    elif m == 0:
        launch._red_key(logits, tgt, dtype)  # validates; nothing to launch
        mean = reduction == "mean"

        def run(lg: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return _empty_result(lg, mean, dtype)

    else:
        # validated now; compiled on the first call without grad (a call with grad runs
        # the variant with lse instead: _EagerReduced), then this plan replaces itself
        key = launch._red_key(logits, tgt, dtype)
        words = launch._red_words(logits, cfg)
        args = (cfg, ignore_index, reduction == "mean", False)
        unused = logits.new_empty(1, dtype=f32)  # the lse argument, never touched without lse
        device = logits.get_device()
        memo = _memo_key(logits, target, reduction, ignore_index, out_dtype)

        def run(lg: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            red = launch._red_get(key, *args)

            def fast(lg: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                if copy:
                    t = t.contiguous()
                out = lg.new_empty((), dtype=dtype)
                red(lg, t, out.view(1), unused, _work(device, words))
                return out

            _PLANS[memo] = fast
            return fast(lg, t)

    remember(_PLANS, _memo_key(logits, target, reduction, ignore_index, out_dtype), run)
    return run


def _result_dtype(logits: torch.Tensor, out_dtype: Any) -> torch.dtype:
    """The loss's dtype: logits' (None, as torch's), or fp32; anything else is refused."""
    if out_dtype is None:
        return logits.dtype
    if out_dtype is not torch.float32 and out_dtype is not logits.dtype:
        raise ValueError(f"{_WHERE}: argument 'out_dtype' must be None, torch.float32 or logits' dtype "
                         f"({dtype_name(logits.dtype)}), got {out_dtype!r}")
    return out_dtype


_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, *, reduction: str = "mean", ignore_index: int = -100,
    check_targets: bool | None = None, out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """torch.nn.functional.cross_entropy(logits, target, reduction=..., ignore_index=...)
    for (M, N) logits and int64 class targets, in one pass forward and one backward.

    The result has logits' dtype, as torch's, unless ``out_dtype=torch.float32``: the
    kernel's fp32 sum without the final rounding (what transformers reports for bf16
    logits, which it upcasts first); the backward is the same kernel, handed the loss's
    gradient in the result's dtype (fp32: not rounded to bf16 on the way).

    A target outside [0, N) that is not ``ignore_index`` makes its row's loss and gradient
    NaN (so a mean or sum is NaN) without a host sync; ``check_targets=True`` (default: the
    module's CHECK_TARGETS, from CUTEFORGE_CHECK_TARGETS) raises a ValueError naming the
    first such target before launch instead (one device sync a call)."""
    if check_targets is None:
        check_targets = CHECK_TARGETS
    elif type(check_targets) is not bool:  # "no" would be true
        check_targets = checks.boolean(_WHERE, "check_targets", check_targets)
    if not isinstance(ignore_index, int) and isinstance(ignore_index, numbers.Integral):
        ignore_index = int(ignore_index)  # a numpy integer
    if _is_compiling():
        # checked at trace time too: the custom op validates tensors only when it runs,
        # and an unknown reduction would otherwise silently reduce as "mean"
        _check(logits, target, reduction, ignore_index)
        if check_targets:  # no host sync inside a graph: torch's device-side assert
            bad = (target != ignore_index) & ((target < 0) | (target >= logits.shape[1]))
            torch._assert_async(~bad.any(), f"{_WHERE}: a target is outside [0, N) and not ignore_index")
        loss, _ = _fwd_op(logits, target, ignore_index)
        return _reduce(loss, target, reduction, ignore_index, _result_dtype(logits, out_dtype))
    try:
        run = _PLANS[(reduction, ignore_index, type(ignore_index), out_dtype, logits.dtype, logits.shape,
                      logits.stride(), logits.data_ptr() & 15, logits.get_device(), target.dtype, target.shape,
                      target.stride(), target.data_ptr() & 15, target.get_device())]
    except (AttributeError, KeyError, TypeError, RuntimeError):  # not a dense tensor: _plan says so
        run = _plan(logits, target, reduction, ignore_index, out_dtype)  # raises on bad input
    if check_targets:
        _check_targets(target, logits.shape[1], ignore_index)
    if logits.requires_grad and _grad_enabled():
        dtype = logits.dtype if out_dtype is None else out_dtype  # checked by _plan
        loss = _native_autograd(logits, target, ignore_index, reduction, dtype)
        if loss is not None:
            return loss
        if reduction != "none":
            return _EagerReduced.apply(logits, target, ignore_index, reduction == "mean", dtype)
        return _Eager.apply(logits, target, ignore_index).to(dtype)
    return run(logits, target)


# torch.ops.cuteforge.cross_entropy: a composite op (it decomposes into the two custom ops
# above under autograd and tracing), so the whole loss is reachable through torch.ops too.
torch.library.define(
    "cuteforge::cross_entropy",
    "(Tensor logits, Tensor target, str reduction='mean', int ignore_index=-100, ScalarType? out_dtype=None) -> Tensor",
)


@torch.library.impl("cuteforge::cross_entropy", "CompositeImplicitAutograd")
def _composite(logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean", ignore_index: int = -100,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    return cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index, out_dtype=out_dtype)
