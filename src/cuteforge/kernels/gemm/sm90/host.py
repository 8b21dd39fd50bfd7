"""Host entry points: views the signature's torch-order tensors in the kernel's order
((M, K, L), (N, K, L), (M, N, L)) without copies and launches the persistent kernel.
The gated kernel takes a, b (the gate weight), b_up, out, work.

Arguments: a, b, out, the int32 stream-K workspace `work` (see `Sm90Gemm.__call__`;
unused by configs without stream_k), then ("extras") the fp8 kernels' two per-tensor
scales (when `scaled`) and the epilogue operands."""

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
    scaled: bool = False,
    *,
    sms: int,
    gate_fn: Callable[..., Any] | None = None,
) -> Any:
    if len(kinds) > 3:
        raise ValueError(f"the GEMM epilogue takes at most 3 tensor operands, got {len(kinds)}")
    if gate_fn is not None and (kinds or not b_k_major or scaled):
        raise ValueError("the gated GEMM takes 16-bit K-major weights and no epilogue operands")
    g = Sm90Gemm(cfg, stages, a_k_major, b_k_major, kinds, epi_fn, max_clusters, scaled, sms=sms, gate_fn=gate_fn)
    n_scales = 2 if scaled else 0
    if gate_fn is not None:

        @cute.jit
        def run_gated(a: cute.Tensor, b: cute.Tensor, b_up: cute.Tensor, out: cute.Tensor, work: cute.Tensor,
                      stream: CUstream) -> None:
            g(_perm(a, [1, 2, 0]), _perm(b, [2, 1, 0]), _perm(out, [1, 2, 0]), work, None, None, None, None, None,
              _perm(b_up, [2, 1, 0]), stream)

        return run_gated

    def launch(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, work: cute.Tensor, extras: tuple[Any, ...],
               stream: CUstream) -> None:
        scales = extras[:n_scales] if scaled else (None, None)
        ops = [_perm(t, [1, 2, 0]) if kind == "full" else t for t, kind in zip(extras[n_scales:], kinds)]
        ops += [None] * (3 - len(ops))
        g(_perm(a, [1, 2, 0]), _perm(b, [2, 1, 0]), _perm(out, [1, 2, 0]), work, *scales, *ops, None, stream)

    # The DSL traces fixed argument lists: one wrapper per count of tensors after `out`.
    n = n_scales + len(kinds)
    if n == 0:

        @cute.jit
        def run0(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, work: cute.Tensor, stream: CUstream) -> None:
            launch(a, b, out, work, (), stream)

        return run0
    if n == 1:

        @cute.jit
        def run1(a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, work: cute.Tensor, x0: cute.Tensor, stream: CUstream) -> None:
            launch(a, b, out, work, (x0,), stream)

        return run1
    if n == 2:

        @cute.jit
        def run2(
            a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, work: cute.Tensor, x0: cute.Tensor, x1: cute.Tensor,
            stream: CUstream,
        ) -> None:
            launch(a, b, out, work, (x0, x1), stream)

        return run2
    if n == 3:

        @cute.jit
        def run3(
            a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, work: cute.Tensor, x0: cute.Tensor, x1: cute.Tensor,
            x2: cute.Tensor, stream: CUstream,
        ) -> None:
            launch(a, b, out, work, (x0, x1, x2), stream)

        return run3
    if n == 4:

        @cute.jit
        def run4(
            a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, work: cute.Tensor, x0: cute.Tensor, x1: cute.Tensor,
            x2: cute.Tensor, x3: cute.Tensor, stream: CUstream,
        ) -> None:
            launch(a, b, out, work, (x0, x1, x2, x3), stream)

        return run4

    @cute.jit
    def run5(
        a: cute.Tensor, b: cute.Tensor, out: cute.Tensor, work: cute.Tensor, x0: cute.Tensor, x1: cute.Tensor,
        x2: cute.Tensor, x3: cute.Tensor, x4: cute.Tensor, stream: CUstream,
    ) -> None:
        launch(a, b, out, work, (x0, x1, x2, x3, x4), stream)

    return run5
