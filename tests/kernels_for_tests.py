"""Small user-style kernels the CPU tests compile through the public authoring API."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cuda.bindings.driver import CUstream

import cuteforge
from cuteforge import Signature, TensorArg


def scale_jit(threads: int, factor: float):
    """A @cute.jit host function computing y = x * factor, one element per thread."""

    @cute.kernel
    def body(x: cute.Tensor, y: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * threads + tidx
        if i < x.shape[0]:
            y[i] = (x[i].to(cutlass.Float32) * factor).to(y.element_type)

    @cute.jit
    def run(x: cute.Tensor, y: cute.Tensor, stream: CUstream):
        body(x, y).launch(grid=(cute.ceil_div(x.shape[0], threads), 1, 1), block=(threads, 1, 1), stream=stream)

    return run


@cuteforge.kernel(
    name="test_scale",
    signature=Signature(TensorArg("x", ("M",)), TensorArg("y", ("M",), dtype_like="x")),
    archs=("sm_80+",),
)
def scale(spec: cuteforge.CompileSpec):
    return scale_jit(128, float(spec.param("factor", 2.0)))


@cuteforge.kernel(
    name="test_sm90_only",
    signature=Signature(TensorArg("x", ("M",))),
    archs=("sm_90a",),
)
def sm90_only(spec: cuteforge.CompileSpec):
    @cute.kernel
    def body(x: cute.Tensor):
        pass

    @cute.jit
    def run(x: cute.Tensor, stream: CUstream):
        body(x).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

    return run


@cuteforge.kernel(
    name="test_copy2d",
    signature=Signature(
        TensorArg("x", ("M", "N"), leading=0),  # column-major source
        TensorArg("y", ("M", "N"), dtype_like="x"),  # row-major destination
    ),
)
def copy2d(spec: cuteforge.CompileSpec):
    threads = 128

    @cute.kernel
    def body(x: cute.Tensor, y: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * threads + tidx
        m, n = x.shape
        if i < m * n:
            r = i // n
            c = i - r * n
            y[r, c] = x[r, c]

    @cute.jit
    def run(x: cute.Tensor, y: cute.Tensor, stream: CUstream):
        m, n = x.shape
        body(x, y).launch(grid=(cute.ceil_div(m * n, threads), 1, 1), block=(threads, 1, 1), stream=stream)

    return run
