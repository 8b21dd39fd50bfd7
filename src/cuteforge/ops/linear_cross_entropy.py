"""`cuteforge.ops.linear_cross_entropy(x, weight, target)`: ``cross_entropy(x @ weight.T,
target)`` without the (tokens x vocab) logits in memory.

An LM head's logits at a large vocabulary dominate a training step's peak memory
(2 x 2048 tokens x 128256 classes: 1 GiB in bf16, twice that once a loss upcasts them,
and as much again for their gradient). Here the tokens go through in chunks: a chunk's
logits (cuBLAS), its per-row loss and logsumexp (the cross-entropy forward kernel), its
logits gradient written over the logits (the backward kernel), then that chunk's share
of dx and dweight (cuBLAS, dweight accumulated over the chunks). The gradients are made in the forward,
where the logits are at hand, and scaled by the loss's incoming gradient in the
backward; only one chunk's logits and their gradient live at a time.

Where dweight is wanted (bf16 / fp32) and the whole batch's logits are no larger than
the weight (T <= H) or the chunk budget, they are one chunk and the forward keeps their
gradient instead of dweight: the backward makes dweight in one GEMM with the incoming
gradient folded into x, a (T, H) scale instead of a pass over the (V, H) weight
gradient (1 GiB read and written at a 128256 x 4096 head), and no second chunk's
read-modify-write of dweight. Held between forward and backward: the (T, V) logits'
gradient and x (saved) instead of the (V, H) dweight; the forward's peak is no higher
than the chunked path's. fp16 keeps the scale on dweight: x times 1 / rows would fall
into fp16's subnormals.

x (T, H) and weight (V, H) fp32/bf16/fp16 CUDA, the same dtype; target (T,) int64 class
indices (``ignore_index`` rows count for nothing); reduction "mean" (over the rows not
ignored) or "sum". The loss is fp32.

Registered as ``torch.ops.cuteforge.linear_cross_entropy`` (one opaque op under
torch.compile), which returns the summed loss and the gradients of that sum; the mean's
division by the rows not ignored is a torch expression around it (Inductor fuses it). A
call layout with a unit-stride target gets a C launch plan (`native.launch`): the chunk
loop unrolled into its steps (each chunk's GEMMs through ATen's mm, its cross-entropy
kernels, then the column kernel of ``ops.sum`` over the per-row losses), so the op's warm
call runs no Python (in eager mode the wrapper's checks and the autograd formula still do).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import checks
from ..arch import target_arch
from ..kernels.reduce.spec import col_config_for, col_reduce
from ..native import launch as native_launch
from ..native.args import contiguous_arg, strided_arg
from ..signature import FLOAT_DTYPES, dtype_name
from . import cross_entropy_launch as _ce
from .registered import define

__all__ = ["linear_cross_entropy"]

_WHERE = "cuteforge.ops.linear_cross_entropy"
CHUNK_BYTES = 512 << 20  # a chunk's logits at most (`chunk_rows`; `chunking` may take the weight's size)


def _check(x: Any, weight: Any, target: Any, ignore_index: Any, reduction: Any) -> None:
    for name, t in (("x", x), ("weight", weight), ("target", target)):
        checks.tensor(_WHERE, name, t)
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"{_WHERE}: arguments 'x' (T, H) and 'weight' (V, H) must be 2-D, got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"{_WHERE}: argument 'weight' has {weight.shape[1]} columns but 'x' has {x.shape[1]}")
    if x.dtype not in FLOAT_DTYPES or weight.dtype != x.dtype:
        raise TypeError(f"{_WHERE}: arguments 'x' and 'weight' must share one of float32, bfloat16, float16; got "
                        f"{x.dtype} and {weight.dtype}")
    if target.dtype != torch.int64:
        raise TypeError(f"{_WHERE}: argument 'target' must be int64 class indices, got dtype {dtype_name(target.dtype)}")
    if target.shape != (x.shape[0],):
        raise ValueError(f"{_WHERE}: argument 'target' must have shape ({x.shape[0]},) to match 'x' "
                         f"{tuple(x.shape)}, got {tuple(target.shape)}")
    if weight.shape[0] == 0:
        raise ValueError(f"{_WHERE}: argument 'weight' must have V >= 1 rows (classes), got shape {tuple(weight.shape)}")
    if not isinstance(reduction, str) or reduction not in ("mean", "sum"):
        raise ValueError(f"{_WHERE}: argument 'reduction' must be 'mean' or 'sum', got {reduction!r}")
    checks.integer(_WHERE, "ignore_index", ignore_index)
    if not -(2**63) <= ignore_index < 2**63:  # compared with int64 targets in the kernel
        raise ValueError(f"{_WHERE}: argument 'ignore_index'={ignore_index} does not fit in int64")
    checks.same_device(_WHERE, "weight", weight, "x", x)
    checks.same_device(_WHERE, "target", target, "x", x)
    checks.on_cuda(_WHERE, "x", x)


def chunk_rows(tokens: int, vocab: int, itemsize: int) -> int:
    """Rows a chunk takes: its logits within CHUNK_BYTES (at least 128 rows), the chunks
    balanced and whole 128-row GEMM tiles (1 for an empty batch)."""
    if tokens <= 0:
        return 1
    most = max(128, CHUNK_BYTES // max(1, vocab * itemsize) // 128 * 128)
    chunks = -(-tokens // most)
    rows = -(-tokens // chunks)
    return max(1, min(tokens, -(-rows // 128) * 128))


def _chunk_step(where: str, t: int, chunk: int) -> int:
    """The rows a chunk takes: ``chunk`` where it is whole 128-row tiles or the whole batch
    (every chunk's slices of the target and the per-row losses then start 16-byte aligned,
    as the kernels were bound for), else a clear error."""
    if chunk < 1 or (chunk < t and chunk % 128):
        raise ValueError(f"{where}: argument 'chunk' must be a multiple of 128 or at least the {t} rows, got {chunk}")
    return chunk


def defers_dw(t: int, chunk: int, dtype: torch.dtype, need_dw: bool) -> bool:
    """Whether the op may keep the logits' gradient for the backward to make dweight from
    (module doc): dweight wanted, one chunk holds the whole (non-empty) batch, and x's
    dtype has fp32's exponent range for x times the incoming gradient."""
    return need_dw and 0 < t <= chunk and dtype != torch.float16


def chunking(tokens: int, vocab: int, hidden: int, dtype: torch.dtype, need_dw: bool) -> tuple[int, bool]:
    """(rows a chunk takes, whether dweight is deferred) for a call: the whole batch as one
    chunk with dweight deferred where that is allowed (`defers_dw`) and the batch's logits
    are no larger than the weight or CHUNK_BYTES (held until the backward in dweight's
    place, so no more than the chunked path holds), else `chunk_rows`."""
    itemsize = dtype.itemsize
    if defers_dw(tokens, tokens, dtype, need_dw) and tokens * vocab * itemsize <= max(CHUNK_BYTES,
                                                                                     vocab * hidden * itemsize):
        return tokens, True
    return chunk_rows(tokens, vocab, itemsize), False


def _impl(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int, chunk: int, need_dx: bool,
          need_dw: bool, defer_dw: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, dx, dweight) of the summed loss (dx and dweight empty where not needed), over
    chunks of ``chunk`` rows (`chunk_rows`): the logits' gradient stays unscaled by the
    mean's 1 / rows, so fp16 keeps it out of subnormals. With ``defer_dw`` (`defers_dw`)
    the third output is the logits' gradient (T, V) in dweight's place. The op's Python
    body; `_op_plan` is the same loop as C steps."""
    t = x.shape[0]
    if target.stride(0) != 1:
        target = target.contiguous()
    step = _chunk_step(_WHERE, t, chunk)
    if defer_dw and not defers_dw(t, step, x.dtype, need_dw):
        raise ValueError(f"{_WHERE}: argument 'defer_dw' needs dweight wanted, one chunk of a non-empty batch and "
                         f"bfloat16 or float32; got {t} rows in chunks of {step}, {dtype_name(x.dtype)}")
    # contiguous gradients, as the plan and the fake make them, whatever x's and weight's strides
    dx = x.new_empty(x.shape) if need_dx else x.new_empty(0)
    dw = (weight.new_empty(weight.shape) if t else weight.new_zeros(weight.shape)) if need_dw and not defer_dw \
        else weight.new_empty(0)
    losses = x.new_empty(t, dtype=torch.float32)
    ones = torch.ones(min(t, step), device=x.device)
    for s in range(0, t, step):
        e = min(t, s + step)
        xc, tc = x[s:e], target[s:e]
        logits = xc @ weight.t()
        # chunks start on whole 128-row tiles, so each chunk's losses are a 16-byte aligned view
        _, lse = _ce._fwd(logits, tc, ignore_index, losses[s:e])
        if need_dx or need_dw:
            # the logits' gradient over the logits (the kernel is elementwise per position
            # given the row's logsumexp): one chunk buffer instead of two
            dlogits, dloss = logits, ones[: e - s]
            _ce._bwd_into(logits, tc, lse, dloss, dlogits, ignore_index)
            if need_dx:
                torch.mm(dlogits, weight, out=dx[s:e])
            if defer_dw:
                dw = dlogits  # the whole batch's: the backward makes dweight from it
            elif need_dw and s == 0:
                torch.mm(dlogits.t(), xc, out=dw)  # the first chunk writes dweight: no zero fill, no read
            elif need_dw:
                dw.addmm_(dlogits.t(), xc)
    return losses.sum(), dx, dw


def _op_plan(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int, chunk: int,
             need_dx: bool, need_dw: bool, defer_dw: bool) -> Any:
    """The C launch plan of `_impl`'s loop for this layout: outputs (loss, dx, dweight,
    then the per-row losses, one chunk's logits and its logsumexp as scratch; with
    ``defer_dw`` the logits are output 2 and the scratch slot is empty), the chunks'
    steps, and a ones vector the plan holds (the backward kernel's per-row loss gradient,
    only read); None for an empty batch or a strided target (`_impl` copies it)."""
    t, h = x.shape
    v = weight.shape[0]
    if t == 0 or target.stride(0) != 1:
        return None
    IN, OUT, FIXED = native_launch.INPUT, native_launch.OUTPUT, native_launch.FIXED
    step = _chunk_step(_WHERE, t, chunk)
    if defer_dw and not defers_dw(t, step, x.dtype, need_dw):
        return None  # `_impl` raises the argument error
    ones = torch.ones(min(t, step), device=x.device)
    sx, sw = x.stride(), weight.stride()
    f32 = torch.float32
    dw_shape = (t, v) if defer_dw else (v, h) if need_dw else (0,)
    logits_out = 2 if defer_dw else 4
    outs = [((), f32), ((t, h) if need_dx else (0,), x.dtype), (dw_shape, weight.dtype),
            ((t,), f32), ((0,) if defer_dw else (min(t, step), v), x.dtype), ((min(t, step),), f32)]
    steps = []
    kernels: dict[int, tuple[Any, Any]] = {}
    for s in range(0, t, step):
        r = min(t, s + step) - s
        if r not in kernels:  # the chunk's forward and backward, bound as `_impl` binds them
            logits = x.new_empty(r, v)
            lse = logits.new_empty(r, dtype=f32)
            tc = target[s:s + r]
            fwd = _ce._fwd_launcher(logits, tc, ignore_index)
            bwd = _ce._bwd_kernel(logits, tc, lse, ones[:r], logits, ignore_index) if need_dx or need_dw else None
            kernels[r] = fwd, bwd
        fwd, bwd = kernels[r]
        logits_v, target_v = strided_arg(OUT, logits_out, (r, v), (v, 1)), strided_arg(IN, 2, (r,), (1,), s)
        lse_v, x_c = strided_arg(OUT, 5, (r,), (1,)), strided_arg(IN, 0, (r, h), sx, s * sx[0])
        steps.append(native_launch.matmul_step(logits_v, x_c, strided_arg(IN, 1, (h, v), (sw[1], sw[0]))))
        steps.append(native_launch.kernel_step(fwd, [logits_v, target_v, strided_arg(OUT, 3, (r,), (1,), s), lse_v]))
        if bwd is not None:
            steps.append(native_launch.kernel_step(bwd, [logits_v, target_v, lse_v, strided_arg(FIXED, 0, (r,), (1,)), logits_v]))
        if need_dx:
            steps.append(native_launch.matmul_step(strided_arg(OUT, 1, (r, h), (h, 1), s * h), logits_v, strided_arg(IN, 1, (v, h), sw)))
        if need_dw and not defer_dw:
            steps.append(native_launch.matmul_step(contiguous_arg(OUT, 2, (v, h)), strided_arg(OUT, 4, (v, r), (1, v)), x_c,
                                                   accumulate=s > 0))
    # the loss: the per-row losses summed, (1, T, 1) -> (1, 1)
    total = _sum_kernel(t, x.device)
    steps.append(native_launch.kernel_step(total, [strided_arg(OUT, 3, (1, t, 1), (t, 1, 1)), strided_arg(OUT, 0, (1, 1), (1, 1))]))
    return native_launch.runner("cuteforge::linear_cross_entropy", None, x.device, 3, outs, [], [0, 1, 2],
                                fixed=[ones], then=steps)


def _sum_kernel(t: int, device: torch.device) -> Any:
    """``ops.sum``'s column kernel over T fp32 losses viewed as (1, T, 1), into (1, 1)."""
    losses3 = torch.empty(1, t, 1, dtype=torch.float32, device=device)
    key = col_reduce.signature.bind((losses3, losses3.new_empty(1, 1)))
    return col_reduce.get(key, (("op", "sum"),), col_config_for(target_arch(), 1, t, 1, 32, key.vec[0]))


def _fake(x, weight, target, ignore_index, chunk, need_dx, need_dw, defer_dw):
    dx = x.new_empty(x.shape) if need_dx else x.new_empty(0)
    dw = x.new_empty(x.shape[0], weight.shape[0]) if defer_dw else \
        weight.new_empty(weight.shape) if need_dw else weight.new_empty(0)
    return x.new_empty((), dtype=torch.float32), dx, dw


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    _, dx, dw = output
    ctx.mark_non_differentiable(dx, dw)
    ctx.set_materialize_grads(False)  # eager autograd would zero-fill a dweight-sized gradient for dw
    ctx.need = inputs[5], inputs[6]
    ctx.defer_dw = inputs[7]
    # x without its history: the backward's dweight stays a constant of the graph, as
    # `dw * g` was (no second-order path through a gradient the op does not differentiate)
    ctx.save_for_backward(dx, dw, inputs[0].detach() if ctx.defer_dw else None)


def _backward(ctx: Any, g: torch.Tensor | None, *_: Any) -> tuple[Any, ...]:
    dx, dw, x = ctx.saved_tensors
    if g is None:
        return (None,) * 8
    # g: the summed loss's gradient (fp32; the mean's 1 / rows is in it already)
    gx = dx * g.to(dx.dtype) if ctx.need[0] else None
    if ctx.defer_dw:  # dw holds the logits' gradient (T, V): dweight = dlogits^T (g x), g on the small side
        gw = torch.mm(dw.t(), x * g.to(x.dtype)) if ctx.needs_input_grad[1] else None
    else:
        gw = dw * g.to(dw.dtype) if ctx.need[1] else None
    return gx, gw, None, None, None, None, None, None


_op = define("cuteforge::linear_cross_entropy", _impl, fake=_fake, plan=_op_plan, backward=_backward, setup_context=_setup)


def _autocast_operands(x: Any, weight: Any) -> tuple[Any, Any]:
    """Under autocast, x and weight in its dtype, as the LM head's ``F.linear`` would take
    them (fp32 master weights trained with bf16 autocast); the op itself takes one dtype."""
    if (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and x.device.type in ("cuda", "cpu")
            and x.is_floating_point() and weight.is_floating_point() and torch.is_autocast_enabled(x.device.type)):
        dtype = torch.get_autocast_dtype(x.device.type)
        return x.to(dtype), weight.to(dtype)
    return x, weight


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                         reduction: str = "mean") -> torch.Tensor:
    """``F.cross_entropy(x @ weight.T, target, ignore_index=, reduction=)`` (fp32 loss) with
    only one chunk of the logits in memory at a time (module doc). x may be N-D (..., H)
    with target (...). Under autocast x and weight run in its dtype (gradients flow back
    to them in theirs)."""
    x, weight = _autocast_operands(x, weight)
    if isinstance(x, torch.Tensor) and isinstance(target, torch.Tensor) and x.dim() > 2:
        if tuple(target.shape) != tuple(x.shape[:-1]):  # flattened, any equal count would pass
            raise ValueError(f"{_WHERE}: argument 'target' must have shape {tuple(x.shape[:-1])} to match 'x' "
                             f"{tuple(x.shape)}, got {tuple(target.shape)}")
        x, target = x.reshape(-1, x.shape[-1]), target.reshape(-1)
    _check(x, weight, target, ignore_index, reduction)
    grad = torch.is_grad_enabled()
    t, h = x.shape
    need_dw = grad and weight.requires_grad
    chunk, defer_dw = chunking(t, weight.shape[0], h, x.dtype, need_dw)  # part of the op's key: a plan's chunks
    loss = _op(x, weight, target, ignore_index, chunk, grad and x.requires_grad, need_dw, defer_dw)[0]
    if reduction == "sum":
        return loss
    # the mean over the rows not ignored (0 / 0 gives NaN, as torch)
    return loss / (target != ignore_index).sum(dtype=torch.float32)
