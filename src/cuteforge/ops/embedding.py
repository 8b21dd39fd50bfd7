"""`cuteforge.ops.embedding(ids, weight, padding_idx=None)`: ``F.embedding`` whose weight
gradient stays in the weight's dtype under torch.compile.

Inductor decomposes the embedding's backward into an fp32 scatter-add over a zeroed fp32
copy of the whole table, converted to the weight's dtype at the end: for a bf16 table of
128256 x 4096 that is 2 GiB of fp32 buffer next to the 1 GiB gradient, at the end of the
backward where every other gradient is alive too, and 1.2 ms of zero fill and
conversion on an H200 (docs/nn.md). Here the backward sums in fp32 only what the tokens
touch: the token ids sorted, each run of equal ids one segment, the segments' rows summed
in a (tokens, H) fp32 buffer (smaller than the table while a step has fewer tokens than
the vocabulary has rows), and each segment's sum written, in the weight's dtype, into its
row of a zeroed table (by every token of the segment: the same value). Both directions
are torch expressions (an autograd.Function), so Inductor compiles them with the rest of
the graph (a few small kernels beside the table's zero fill) and no opaque op stands in
the graph. Like Inductor's own scatter, the fp32 sums are atomic adds, so their rounding
order is not fixed.

Eager calls run ``F.embedding`` itself (torch's CUDA backward already writes the gradient
in the weight's dtype, deterministically).

ids: integer tensor of any shape; weight (V, H) floating. Rows at ``padding_idx`` get no
gradient, as in torch. ``max_norm``, ``scale_grad_by_freq`` and ``sparse`` are not taken
(use ``F.embedding`` for those).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .. import checks
from ..signature import dtype_name

__all__ = ["embedding"]

_WHERE = "cuteforge.ops.embedding"


def weight_grad(grad: torch.Tensor, ids: torch.Tensor, rows: int, padding_idx: int) -> torch.Tensor:
    """The (rows, H) gradient of ``F.embedding(ids, weight, padding_idx)``'s weight for the
    output gradient ``grad`` (``(*ids.shape, H)``), in grad's dtype, with fp32 sums over
    repeated ids and nothing at ``padding_idx`` (-1: none)."""
    h = grad.shape[-1]
    flat = ids.reshape(-1).long()
    g = grad.reshape(-1, h)
    if padding_idx >= 0:
        g = g.masked_fill((flat == padding_idx).unsqueeze(1), 0)
    sorted_ids, order = flat.sort()
    # segment of each sorted token: runs of equal ids share one
    starts = torch.cat([torch.ones_like(sorted_ids[:1], dtype=torch.bool), sorted_ids[1:] != sorted_ids[:-1]])
    segment = starts.cumsum(0) - 1
    sums = torch.zeros(flat.shape[0], h, dtype=torch.float32, device=g.device)
    sums = sums.index_add(0, segment, g[order].float())
    out = torch.zeros(rows, h, dtype=grad.dtype, device=g.device)
    # every token of a segment writes its segment's sum to the segment's row: the same
    # value each time, so whichever write lands last the row is the same
    return out.index_put((sorted_ids,), sums[segment].to(grad.dtype))


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.rows, ctx.padding_idx = weight.shape[0], padding_idx
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (ids,) = ctx.saved_tensors
        return weight_grad(grad, ids, ctx.rows, ctx.padding_idx), None, None


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
    if not torch.compiler.is_compiling():
        return F.embedding(ids, weight, None if padding_idx < 0 else padding_idx)
    return _Embedding.apply(weight, ids, int(padding_idx))
