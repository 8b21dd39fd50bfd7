"""Operand layouts the row kernels take ((M, N) with a unit last stride)."""

from __future__ import annotations

import torch


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """(..., N) -> (M, N) with unit last stride: a view where the strides allow, else a copy.

    N == 1 with a foreign last stride (a transposed column) only needs its stride relabelled."""
    n = t.shape[-1]
    if t.dim() != 2:
        t = t.reshape(-1, n)
    if t.stride(1) != 1:
        t = t.as_strided(t.shape, (t.stride(0), 1)) if n == 1 else t.contiguous()
    return t


def rows_view(t: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor | None:
    """`as_rows(t)` (``rows`` when the caller has it already) where it is a view of t's
    memory from t's data pointer (what a launch plan can read in place, `native.launch`),
    None where it is a copy."""
    r = as_rows(t) if rows is None else rows
    if r.data_ptr() != t.data_ptr() or r.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
        return None
    return r
