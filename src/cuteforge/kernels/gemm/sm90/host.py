"""Host entry points: views the signature's torch-order tensors in the kernel's order
((M, K, L), (N, K, L), (M, N, L)) without copies and launches the persistent kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cutlass.cute as cute
from cuda.bindings.driver import CUstream

from .config import GemmConfig
from .kernel import Sm90Gemm


def _perm(t: cute.Tensor, modes: list[int]) -> cute.Tensor:
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=modes))


def make_gemm(
    cfg: GemmConfig,
    stages: int,
    a_k_major: bool,
    b_k_major: bool,
    kinds: tuple[str, ...],
    epi_fn: Callable[..., Any] | None,
    max_clusters: int,
) -> Any:
    g = Sm90Gemm(cfg, stages, a_k_major, b_k_major, kinds, epi_fn, max_clusters)

    def operand(t: cute.Tensor, kind: str) -> cute.Tensor:
        return _perm(t, [1, 2, 0]) if kind == "full" else t

    # The DSL traces fixed argument lists, so one wrapper per operand count.
    n = len(kinds)
    if n == 0:

        @cute.jit
        def run0(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, stream: CUstream) -> None:
            g(_perm(a, [1, 2, 0]), _perm(b, [2, 1, 0]), _perm(out, [1, 2, 0]), None, None, None, stream)

        return run0
    if n == 1:

        @cute.jit
        def run1(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, e0: cute.Tensor, stream: CUstream) -> None:
            g(_perm(a, [1, 2, 0]), _perm(b, [2, 1, 0]), _perm(out, [1, 2, 0]), operand(e0, kinds[0]), None, None, stream)

        return run1
    if n == 2:

        @cute.jit
        def run2(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, e0: cute.Tensor, e1: cute.Tensor, stream: CUstream) -> None:
            g(_perm(a, [1, 2, 0]), _perm(b, [2, 1, 0]), _perm(out, [1, 2, 0]), operand(e0, kinds[0]), operand(e1, kinds[1]), None, stream)

        return run2
    if n == 3:

        @cute.jit
        def run3(
            a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, e0: cute.Tensor, e1: cute.Tensor, e2: cute.Tensor, stream: CUstream
        ) -> None:
            g(
                _perm(a, [1, 2, 0]),
                _perm(b, [2, 1, 0]),
                _perm(out, [1, 2, 0]),
                operand(e0, kinds[0]),
                operand(e1, kinds[1]),
                operand(e2, kinds[2]),
                stream,
            )

        return run3
    raise ValueError(f"the GEMM epilogue takes at most 3 tensor operands, got {n}")
