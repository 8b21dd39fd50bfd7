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

Eager calls on layouts read in place run from C (`native.launch`, `native.backward`):
the forward's allocation and launch is one C call, and its backward is a C++ autograd
node, so a training step's warm call runs no Python kernel launch. Under forward-mode AD
the op is torch's expression, which carries the tangents.
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
from ..native import backward as native
from ..native import build as native_build
from ..native import launch as native_launch
from ..native.args import arg, contiguous_arg
from ..signature import FLOAT_DTYPES, vector_width
from .layout import rows_view
from .memo import EagerPath, remember

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


def _tiling(operands: tuple[torch.Tensor, ...]) -> dict[str, int]:
    """The kernel's tiling for these (M, N) operands; a clear error for rows longer than its grid covers."""
    n = operands[0].shape[1]
    tiling = silu_mul_tiling(n)
    columns = tiling["threads"] * tiling["unroll"]  # of vectors, a CTA's
    if n > columns * _MAX_COLUMN_BLOCKS:  # long rows only: the vector width the kernel's key binds
        vec = min(vector_width(t.data_ptr(), (t.stride(0),), t.element_size()) for t in operands)
        if -(-n // (columns * vec)) > _MAX_COLUMN_BLOCKS:
            raise ValueError(f"{_WHERE}: rows of {n} elements are longer than the kernel's grid covers")
    return tiling


def _launch(kernel: Kernel, operands: tuple[torch.Tensor, ...]) -> None:
    kernel(*operands, **_tiling(operands))


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


def _torch_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d gate, d up) as torch expressions, differentiable: the C++ node's backward under
    ``create_graph=True`` (a double backward), where the kernel's would be constants."""
    g = gate.float()
    sig = torch.sigmoid(g)
    dgate = grad.float() * up.float() * sig * (1 + g * (1 - sig))
    return dgate.to(gate.dtype), (grad.float() * g * sig).to(up.dtype)


# The eager calls' memo: layout (every operand's dtype, shape, strides, 16-byte alignment
# and device) -> its `EagerPath`, or None where an operand would need a copy, the extension
# is unavailable, or there is nothing to launch (those take the Python path). A hit also
# stands for "already checked".
_C_PATHS: dict[tuple[Any, ...], EagerPath | None] = {}
native_build.when_ready(_C_PATHS.clear)  # layouts met while the extension built had no C path


def _c_path(gate: torch.Tensor, up: torch.Tensor) -> EagerPath | None:
    """This layout's `EagerPath`; None where gate or up would need a copy, there is nothing
    to launch, or the extension is unavailable."""
    n = gate.shape[-1]
    g2, u2 = rows_view(gate), rows_view(up)
    if g2 is None or u2 is None or gate.numel() == 0 or native.module() is None:
        return None
    m = g2.shape[0]
    rows = torch.empty((m, n), dtype=gate.dtype, device=gate.device)
    tiling = _tiling((g2, u2, rows))
    IN, OUT = native_launch.INPUT, native_launch.OUTPUT
    shape = tuple(gate.shape)
    run = native_launch.runner(_WHERE, forward_kernel.launcher((g2, u2, rows), **tiling), gate.device, 2,
                               [(shape, gate.dtype)], [arg(IN, 0, g2), arg(IN, 1, u2), contiguous_arg(OUT, 0, (m, n))],
                               [0])
    return EagerPath(run, lambda gate, up: _node_plan(gate, up, tiling))


def _node_plan(gate: torch.Tensor, up: torch.Tensor, tiling: dict[str, int]) -> Any:
    """The C++ node's plan for gate's and up's layout: it reads a contiguous gradient (any
    other takes the fallback) and the saved gate and up in place, and writes contiguous
    gradients."""
    g2, u2 = rows_view(gate), rows_view(up)
    m, n = g2.shape
    shape, dtype = tuple(gate.shape), gate.dtype
    rows = torch.empty((m, n), dtype=dtype, device=gate.device)
    bwd = backward_kernel.launcher((rows, g2, u2, rows, rows), **tiling)
    SAVED, GRAD, BUFFER = native.SAVED, native.GRAD, native.BUFFER

    def fallback(grads: list[Any], saved: list[Any]) -> list[Any]:
        g = torch.zeros(shape, dtype=saved[0].dtype, device=saved[0].device) if grads[0] is None else grads[0]
        if torch.is_grad_enabled():
            return list(_torch_backward(g, saved[0], saved[1]))
        return list(silu_mul_backward(g, saved[0], saved[1]))

    return native.make_plan("CuteforgeSiluMulBackward", bwd, gate.device, [native.grad_as_is(rows.view(shape))],
                            [(shape, dtype), (shape, dtype)],
                            [contiguous_arg(GRAD, 0, (m, n)), arg(SAVED, 0, g2), arg(SAVED, 1, u2),
                             contiguous_arg(BUFFER, 0, (m, n)), contiguous_arg(BUFFER, 1, (m, n))],
                            [(native.BUFFER_OUT, 0), (native.BUFFER_OUT, 1)], fallback)


def _checked_c_path(gate: Any, up: Any) -> EagerPath | None:
    """A memo miss: the checks (clear errors naming the argument), then the layout's C path."""
    _check(gate, up)
    checks.on_cuda(_WHERE, "gate", gate)
    key = _layout_key(gate, up)
    return remember(_C_PATHS, key, _c_path(gate, up))


def _layout_key(gate: torch.Tensor, up: torch.Tensor) -> tuple[Any, ...]:
    # silu_mul builds the same tuple inline
    return (gate.dtype, gate.shape, gate.stride(), gate.data_ptr() & 15, gate.get_device(),
            up.dtype, up.shape, up.stride(), up.data_ptr() & 15, up.get_device())


def _check(gate: Any, up: Any) -> None:
    checks.tensor(_WHERE, "gate", gate, FLOAT_DTYPES)
    checks.matches(_WHERE, "up", up, "gate", gate)
    if gate.dim() == 0:
        raise ValueError(f"{_WHERE}: argument 'gate' must have at least one dim, got a 0-d tensor")


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` in one kernel (and its backward in one), fp32 math rounded once."""
    if torch.compiler.is_compiling() or native.forward_ad_active():  # dual tensors: torch's expression carries them
        _check(gate, up)
        return F.silu(gate) * up
    try:
        c_path = _C_PATHS[(gate.dtype, gate.shape, gate.stride(), gate.data_ptr() & 15, gate.get_device(),
                           up.dtype, up.shape, up.stride(), up.data_ptr() & 15, up.get_device())]
    except (AttributeError, KeyError, TypeError, RuntimeError):  # not a dense tensor: the checks say so
        c_path = _checked_c_path(gate, up)
    wants_grad = torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad)
    if c_path is None:
        return _SiluMul.apply(gate, up) if wants_grad else _forward(gate, up)
    out = c_path.run(gate, up) if c_path.run is not None else _forward(gate, up)
    if wants_grad:
        native.attach(c_path.plan(gate, up), [gate, up], [out], [gate, up])
    return out
