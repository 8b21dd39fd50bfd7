"""Tuning problems: what `cuteforge tune KERNEL --shapes ...` times for a kernel.

A kernel is tunable from the command line once its family registers a *problem factory*,
`(shape, dtype, params) -> ProblemInputs`, with `register_problem` (each family does so in
its own `tune.py`, imported with the family package). The autotuner knows no kernel: this
registry is filled by whoever imports the families (the `cuteforge tune` command imports
them all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class ProblemInputs:
    key: Any  # BoundKey of the call
    params: dict[str, Any]
    dims: dict[str, int]  # dynamic extents
    make_tensors: Callable[[], tuple[Any, ...]]  # on the GPU (only called when timing)
    reference: Callable[..., Any] | None = None
    configs: list[Any] | None = None  # shape-aware candidates (default: the kernel's own list)
    outputs: tuple[str, ...] | None = None  # the written arguments (default: the last one)


ProblemFactory = Callable[[tuple[int, ...], str, dict[str, Any]], ProblemInputs]
PROBLEMS: dict[str, ProblemFactory] = {}


def register_problem(kernel_name: str, factory: ProblemFactory) -> None:
    """Make `kernel_name` tunable from the command line through `factory`."""
    PROBLEMS[kernel_name] = factory


def problem_factory(kernel_name: str) -> ProblemFactory:
    """The registered factory of a kernel, or a ValueError naming the kernels that have one."""
    if kernel_name not in PROBLEMS:
        raise ValueError(f"kernel {kernel_name!r} has no problem factory for the command line (its family registers one "
                         f"when imported); known: {', '.join(sorted(PROBLEMS))}")
    return PROBLEMS[kernel_name]


def rows_shape(kernel_name: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(M, N) of a row kernel's `--shapes MxN` entry, or a ValueError naming the kernel."""
    if len(shape) != 2:
        raise ValueError(f"{kernel_name} takes shapes MxN, got {'x'.join(map(str, shape))}")
    return shape[0], shape[1]


def parse_shapes(shapes: list[str] | str) -> list[tuple[int, ...]]:
    """'32768x4096,4096x65536' (or a list of such) -> [(32768, 4096), (4096, 65536)]."""
    items = shapes.split(",") if isinstance(shapes, str) else [s for part in shapes for s in part.split(",")]
    out = []
    for s in items:
        s = s.strip().lower()
        if not s:
            continue
        try:
            dims = tuple(int(d) for d in s.split("x"))
        except ValueError:
            raise ValueError(f"bad shape {s!r}: expected integers joined by 'x', e.g. 32768x4096") from None
        if any(d <= 0 for d in dims):
            raise ValueError(f"bad shape {s!r}: extents must be positive")
        out.append(dims)
    if not out:
        raise ValueError("no shapes given (e.g. --shapes 32768x4096,4096x65536)")
    return out
