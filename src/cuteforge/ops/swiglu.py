"""`cuteforge.ops.silu_mul(gate, up)`: the SwiGLU activation ``F.silu(gate) * up`` as one
kernel, forward and backward.

torch runs it as two kernels forward (silu, multiply) and three backward, and autograd
keeps ``silu(gate)`` alive beside gate and up; here the forward reads gate and up once and
writes the product, the backward reads the incoming gradient, gate and up once and
writes both gradients, recomputing the sigmoid (nothing but gate and up is saved).

gate and up: the same shape, dtype (fp32, bf16, fp16) and CUDA device; any layout whose
last dim has unit stride and whose leading dims flatten into one is read in place
(others are copied first). The output is contiguous. Under torch.compile the op traces
as ``F.silu(gate) * up``, which Inductor fuses into one kernel of its own, with any
neighbouring pointwise work.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .. import checks
from ..kernel import Kernel
from ..kernels.pointwise import silu_mul as forward_kernel
from ..kernels.pointwise import silu_mul_backward as backward_kernel
from ..kernels.pointwise.spec import silu_mul_tiling
from ..signature import FLOAT_DTYPES, vector_width

__all__ = ["silu_mul"]

_WHERE = "cuteforge.ops.silu_mul"
_MAX_COLUMN_BLOCKS = 65535  # the grid's y extent


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as (M, N) rows with a unit inner stride: a view where one exists, else a copy."""
    n = t.shape[-1]
    if t.stride(-1) == 1 or n == 1:
        try:
            return t.view(-1, n)
        except RuntimeError:
            pass
    return t.contiguous().view(-1, n)


def _launch(kernel: Kernel, operands: tuple[torch.Tensor, ...]) -> None:
    n = operands[0].shape[1]
    tiling = silu_mul_tiling(n)
    columns = tiling["threads"] * tiling["unroll"]  # of vectors, a CTA's
    if n > columns * _MAX_COLUMN_BLOCKS:  # long rows only: the vector width the kernel's key binds
        vec = min(vector_width(t.data_ptr(), (t.stride(0),), t.element_size()) for t in operands)
        if -(-n // (columns * vec)) > _MAX_COLUMN_BLOCKS:
            raise ValueError(f"{_WHERE}: rows of {n} elements are longer than the kernel's grid covers")
    kernel(*operands, **tiling)


def _forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if out.numel():
        _launch(forward_kernel, (_rows(gate), _rows(up), out.view(-1, gate.shape[-1])))
    return out


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return _forward(gate, up)

    @staticmethod
    @once_differentiable  # no double backward: a clear error rather than gradients taken as constants
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        return silu_mul_backward(grad, gate, up)


def silu_mul_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d gate, d up) of ``F.silu(gate) * up`` for the incoming `grad`, one kernel (CUDA
    tensors of one shape and dtype)."""
    dgate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    dup = torch.empty(up.shape, dtype=up.dtype, device=up.device)
    if dgate.numel():
        n = gate.shape[-1]
        _launch(backward_kernel, (_rows(grad), _rows(gate), _rows(up), dgate.view(-1, n), dup.view(-1, n)))
    return dgate, dup


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` in one kernel (and its backward in one), fp32 math rounded once."""
    checks.tensor(_WHERE, "gate", gate, FLOAT_DTYPES)
    checks.matches(_WHERE, "up", up, "gate", gate)
    if gate.dim() == 0:
        raise ValueError(f"{_WHERE}: argument 'gate' must have at least one dim, got a 0-d tensor")
    if torch.compiler.is_compiling():
        return F.silu(gate) * up
    checks.on_cuda(_WHERE, "gate", gate)
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SiluMul.apply(gate, up)
    return _forward(gate, up)
