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

x (T, H) and weight (V, H) fp32/bf16/fp16 CUDA, the same dtype; target (T,) int64 class
indices (``ignore_index`` rows count for nothing); reduction "mean" (over the rows not
ignored) or "sum". The loss is fp32. Registered as ``torch.ops.cuteforge.linear_cross_entropy``
(one opaque op under torch.compile).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import checks
from ..signature import FLOAT_DTYPES, dtype_name
from . import cross_entropy_launch as _ce
from .registered import define

__all__ = ["linear_cross_entropy"]

_WHERE = "cuteforge.ops.linear_cross_entropy"
CHUNK_BYTES = 512 << 20  # a chunk's logits at most (their gradient overwrites them)


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
    balanced and whole 128-row GEMM tiles."""
    most = max(128, CHUNK_BYTES // max(1, vocab * itemsize) // 128 * 128)
    chunks = -(-tokens // most)
    rows = -(-tokens // chunks)
    return max(1, min(tokens, -(-rows // 128) * 128))


def _impl(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int, mean: bool,
          need_dx: bool, need_dw: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, dx, dweight, scale): dx and dweight are the gradients of the summed loss (empty
    where not needed), ``scale`` what turns them into the loss's (1 / rows not ignored for
    the mean): the logits' gradient stays unscaled, so fp16 keeps it out of subnormals."""
    t, h = x.shape
    v = weight.shape[0]
    if target.stride(0) != 1:
        target = target.contiguous()
    dx = torch.empty_like(x) if need_dx else x.new_empty(0)
    dw = (torch.empty_like(weight) if t else torch.zeros_like(weight)) if need_dw else weight.new_empty(0)
    # 0 / 0 gives NaN for the mean, as torch
    scale = (target != ignore_index).sum(dtype=torch.float32).reciprocal() if mean else torch.ones((), device=x.device)
    losses = x.new_empty(t, dtype=torch.float32)
    step = chunk_rows(t, v, x.element_size())
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
            if need_dw and s == 0:
                torch.mm(dlogits.t(), xc, out=dw)  # the first chunk writes dweight: no zero fill, no read
            elif need_dw:
                dw.addmm_(dlogits.t(), xc)
    return losses.sum() * scale, dx, dw, scale


def _fake(x, weight, target, ignore_index, mean, need_dx, need_dw):
    dx = torch.empty_like(x) if need_dx else x.new_empty(0)
    dw = torch.empty_like(weight) if need_dw else weight.new_empty(0)
    return x.new_empty((), dtype=torch.float32), dx, dw, x.new_empty((), dtype=torch.float32)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    _, dx, dw, scale = output
    ctx.mark_non_differentiable(dx, dw, scale)
    ctx.set_materialize_grads(False)  # eager autograd would zero-fill a dweight-sized gradient for dw
    ctx.need = inputs[5], inputs[6]
    ctx.save_for_backward(dx, dw, scale)


def _backward(ctx: Any, g: torch.Tensor | None, *_: Any) -> tuple[Any, ...]:
    dx, dw, scale = ctx.saved_tensors
    if g is None:
        return (None,) * 7
    g = g * scale  # fp32: the incoming gradient times 1 / rows for the mean
    gx = dx * g.to(dx.dtype) if ctx.need[0] else None
    gw = dw * g.to(dw.dtype) if ctx.need[1] else None
    return gx, gw, None, None, None, None, None


_op = define("cuteforge::linear_cross_entropy", _impl, fake=_fake, backward=_backward, setup_context=_setup)


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                         reduction: str = "mean") -> torch.Tensor:
    """``F.cross_entropy(x @ weight.T, target, ignore_index=, reduction=)`` (fp32 loss) with
    only one chunk of the logits in memory at a time (module doc). x may be N-D (..., H)
    with target (...)."""
    if isinstance(x, torch.Tensor) and isinstance(target, torch.Tensor) and x.dim() > 2:
        if tuple(target.shape) != tuple(x.shape[:-1]):  # flattened, any equal count would pass
            raise ValueError(f"{_WHERE}: argument 'target' must have shape {tuple(x.shape[:-1])} to match 'x' "
                             f"{tuple(x.shape)}, got {tuple(target.shape)}")
        x, target = x.reshape(-1, x.shape[-1]), target.reshape(-1)
    _check(x, weight, target, ignore_index, reduction)
    grad = torch.is_grad_enabled()
    loss, _, _, _ = _op(x, weight, target, ignore_index, reduction == "mean", grad and x.requires_grad,
                     grad and weight.requires_grad)
    return loss
