"""`cuteforge.ops.embedding(ids, weight, padding_idx=None)`: ``F.embedding`` whose weight
gradient stays in the weight's dtype under torch.compile.

Inductor decomposes the embedding's backward into an fp32 scatter-add over a zeroed fp32
copy of the whole table, converted to the weight's dtype at the end: for a bf16 table of
128256 x 4096 that is 2 GiB of fp32 buffer next to the 1 GiB gradient, at the end of the
backward where every other gradient is alive too, and 1.2 ms of zero fill and
conversion on an H200 (docs/nn.md). Here the forward and the backward are opaque custom
ops (``torch.ops.cuteforge.embedding`` / ``embedding_backward``) that run torch's CUDA
kernels, whose backward sums each row's tokens in fp32 registers and writes the gradient
in the weight's dtype: one table-sized buffer, not three.

ids: integer tensor of any shape; weight (V, H) floating. Rows at ``padding_idx`` get no
gradient, as in torch. ``max_norm``, ``scale_grad_by_freq`` and ``sparse`` are not taken
(use ``F.embedding`` for those).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import checks
from ..signature import dtype_name
from .registered import define

__all__ = ["embedding"]

_WHERE = "cuteforge.ops.embedding"


def _forward(weight: torch.Tensor, ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
    return torch.ops.aten.embedding(weight, ids, padding_idx)


def _forward_fake(weight: torch.Tensor, ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
    return weight.new_empty((*ids.shape, weight.shape[1]))


def _backward_impl(grad: torch.Tensor, ids: torch.Tensor, num_weights: int, padding_idx: int) -> torch.Tensor:
    return torch.ops.aten.embedding_dense_backward(grad, ids, num_weights, padding_idx, False)


def _backward_fake(grad: torch.Tensor, ids: torch.Tensor, num_weights: int, padding_idx: int) -> torch.Tensor:
    return grad.new_empty((num_weights, grad.shape[-1]))


_backward_op = define("cuteforge::embedding_backward", _backward_impl, fake=_backward_fake)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    weight, ids, padding_idx = inputs
    ctx.save_for_backward(ids)
    ctx.num_weights, ctx.padding_idx = weight.shape[0], padding_idx


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    (ids,) = ctx.saved_tensors
    return _backward_op(grad.contiguous(), ids, ctx.num_weights, ctx.padding_idx), None, None


_op = define("cuteforge::embedding", _forward, fake=_forward_fake, backward=_backward, setup_context=_setup)


def embedding(ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """``F.embedding(ids, weight, padding_idx)`` (module doc): the rows of ``weight`` at
    ``ids``, shape ``(*ids.shape, H)``."""
    checks.tensor(_WHERE, "ids", ids, (torch.int32, torch.int64))  # what torch's embedding indexes with
    checks.tensor(_WHERE, "weight", weight)
    if not weight.dtype.is_floating_point:
        raise TypeError(f"{_WHERE}: argument 'weight' must be a floating tensor, got dtype {dtype_name(weight.dtype)}")
    if weight.dim() != 2:
        raise ValueError(f"{_WHERE}: argument 'weight' must be 2-D (rows, H), got shape {tuple(weight.shape)}")
    checks.same_device(_WHERE, "weight", weight, "ids", ids)
    rows = weight.shape[0]
    if padding_idx is None:
        padding_idx = -1  # torch's "none" (a negative index is normalized first)
    elif not -rows <= checks.integer(_WHERE, "padding_idx", padding_idx) < rows:
        raise ValueError(f"{_WHERE}: argument 'padding_idx' must be within the {rows} rows of 'weight', got "
                         f"{padding_idx}")
    elif padding_idx < 0:
        padding_idx += rows
    return _op(weight, ids, int(padding_idx))
