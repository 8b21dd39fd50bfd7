"""Operand views for the C++ launch and autograd plans: which tensor of a call (an input
or output of a forward launch, or a tensor its plan holds: `launch.INPUT` / `OUTPUT` /
`FIXED`; a saved tensor, gradient or buffer of a backward, `backward.SAVED` / `GRAD` /
`BUFFER`) the kernel reads as its operand, with what sizes and strides from which
element."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def arg(source: int, index: int, t: torch.Tensor) -> tuple[Any, ...]:
    """Operand `index` of `source` viewed with t's sizes and strides."""
    return (source, index, list(t.shape), list(t.stride()), 0)


def contiguous_arg(source: int, index: int, shape: Sequence[int], offset: int = 0) -> tuple[Any, ...]:
    """Operand `index` of `source` as a contiguous `shape` from element `offset`."""
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s *= d
    return (source, index, list(shape), strides[::-1], offset)


def strided_arg(source: int, index: int, sizes: Sequence[int], strides: Sequence[int], offset: int = 0) -> tuple[Any, ...]:
    """Operand `index` of `source` viewed with these sizes and strides from element `offset`
    (a transposed operand: swapped strides)."""
    return (source, index, list(sizes), list(strides), offset)
