"""The SwiGLU activation of Llama-family MLPs, ``silu(gate) * up``, forward and backward.

Rows of (M, N) with a unit inner stride; M, N and the row strides are dynamic, so one
kernel per (dtype, alignment, tiling) serves every shape. The grid is (M, column blocks):
a CTA covers ``threads * vec * unroll`` columns of one row, each thread ``unroll``
vectors of ``vec`` elements (16 bytes where every operand's rows allow), and a row's last
partial vector element by element. The math is fp32, rounded once into each output.

    forward:   out = silu(gate) * up
    backward:  dup = grad * silu(gate)
               dgate = grad * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate)))

The backward recomputes sigmoid(gate) from the saved gate, so the forward saves its two
inputs and no activation.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .vectors import load_f32, store_f32, vector_copy, vector_view


@cute.jit
def _sigmoid(x: Any) -> Any:
    return 1.0 / (cute.math.exp(-x, fastmath=True) + 1.0)


class SiluMul:
    """One launch of the forward (operands gate, up, out) or the backward (grad, gate, up,
    dgate, dup) over (M, N) rows."""

    def __init__(self, dtype: Any, vec: int, threads: int, unroll: int, backward: bool) -> None:
        self.dtype, self.vec, self.threads, self.unroll, self.backward = dtype, vec, threads, unroll, backward
        self.block_cols = threads * vec * unroll  # columns of one CTA

    def __call__(self, operands: tuple[cute.Tensor, ...], stream: Any) -> None:
        m, n = operands[0].shape
        grid = (m, cute.ceil_div(n, self.block_cols), 1)
        if cutlass.const_expr(self.backward):
            self.kernel_backward(*operands).launch(grid=grid, block=(self.threads, 1, 1), stream=stream)
        else:
            self.kernel_forward(*operands).launch(grid=grid, block=(self.threads, 1, 1), stream=stream)

    @cute.jit
    def math(self, values: list) -> list:
        """The outputs from the inputs (fp32 vectors or scalars)."""
        if cutlass.const_expr(self.backward):
            grad, gate, up = values
            sig = _sigmoid(gate)
            silu = gate * sig
            return [grad * up * (sig + silu * (1.0 - sig)), grad * silu]
        gate, up = values
        return [gate * _sigmoid(gate) * up]

    @cute.jit
    def rows(self, ins: tuple, outs: tuple) -> None:
        """This CTA's columns of its row: whole vectors, then the row's partial one by elements."""
        vec, unroll, n_in, n_out = self.vec, self.unroll, len(ins), len(outs)
        tidx, _, _ = cute.arch.thread_idx()
        row, block, _ = cute.arch.block_idx()
        n = ins[0].shape[1]
        atom = vector_copy(self.dtype, vec)
        in_rows = [vector_view(ins[i][row, None], vec, n // vec) for i in range(n_in)]
        out_rows = [vector_view(outs[i][row, None], vec, n // vec) for i in range(n_out)]
        for u in cutlass.range_constexpr(unroll):
            j = (block * unroll + u) * self.threads + tidx  # the vector this thread takes
            if (j + 1) * vec <= n:
                values = self.math([load_f32(atom, in_rows[i][None, j], vec) for i in range(n_in)])
                for i in cutlass.range_constexpr(n_out):
                    store_f32(atom, values[i], out_rows[i][None, j], vec)
            else:
                for e in cutlass.range_constexpr(vec):
                    col = j * vec + e
                    if col < n:
                        values = self.math([ins[i][row, col].to(Float32) for i in range(n_in)])
                        for i in cutlass.range_constexpr(n_out):
                            outs[i][row, col] = values[i].to(outs[i].element_type)

    @cute.kernel
    def kernel_forward(self, gate: cute.Tensor, up: cute.Tensor, out: cute.Tensor) -> None:
        self.rows((gate, up), (out,))

    @cute.kernel
    def kernel_backward(self, grad: cute.Tensor, gate: cute.Tensor, up: cute.Tensor, dgate: cute.Tensor,
                        dup: cute.Tensor) -> None:
        self.rows((grad, gate, up), (dgate, dup))


def make_silu_mul(dtype: Any, vec: int, threads: int, unroll: int, backward: bool) -> Any:
    """A @cute.jit f(*operands, stream): the forward's (gate, up, out) or the backward's
    (grad, gate, up, dgate, dup), every operand (M, N) : (stride, 1)."""
    silu_mul = SiluMul(dtype, vec, threads, unroll, backward)
    if backward:

        @cute.jit
        def silu_mul_backward(grad: cute.Tensor, gate: cute.Tensor, up: cute.Tensor, dgate: cute.Tensor,
                              dup: cute.Tensor, stream: Any) -> None:
            silu_mul((grad, gate, up, dgate, dup), stream)

        return silu_mul_backward

    @cute.jit
    def silu_mul_forward(gate: cute.Tensor, up: cute.Tensor, out: cute.Tensor, stream: Any) -> None:
        silu_mul((gate, up, out), stream)

    return silu_mul_forward
