"""Plans for the C++ autograd node (ffi_backward.cpp): the Python side of an op's eager
backward without a Python autograd node.

An op builds one Plan per forward layout, at its first forward with grad, and attaches
it to every later forward's outputs (`attach`: one C++ call). A Plan says, in terms the
node checks and executes without Python:

- grads: per differentiable output, the gradient the kernel reads: `grad_as_is(t)` (a
  contiguous, 16-byte aligned tensor of t's dtype and shape; any other gradient takes the
  fallback) or `grad_scalar_rows(m)` (a 0-dim loss gradient spread over m fp32 rows);
- buffers: (shape, dtype) allocated per backward;
- args: the compiled kernel's operands in order, each a saved tensor, a gradient or a
  buffer with the (sizes, strides) view the kernel reads (`arg`);
- outs: per differentiable input, its gradient: none, a buffer as is, or a buffer summed
  over dim 0 and cast (dweight from per-CTA partials; skipped when not needed);
- fallback(grads, saved) -> input gradients: the op's ordinary Python backward, for
  everything else (another gradient layout, an undefined gradient, double backward).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import build

SAVED, GRAD, BUFFER = 0, 1, 2
NO_GRAD, AS_IS, COLUMN_SUM = 0, 1, 2

Plan = Any  # the extension's Plan object


def module() -> Any:
    """The extension, or None where it is disabled or cannot be built."""
    return build.load()


def forward_ad_active() -> bool:
    """Dual tensors need the Python nodes' error for a missing forward derivative."""
    return torch.autograd.forward_ad._current_level >= 0


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def grad_as_is(t: torch.Tensor) -> tuple[Any, ...]:
    return (0, dtype_name(t.dtype), list(t.shape), 0, -1)


def grad_scalar_rows(rows: int, divide_by_saved: int = -1) -> tuple[Any, ...]:
    """A 0-dim gradient g becomes (g.float() [/ saved[k][rows]]).expand(rows).contiguous()."""
    return (1, "float32", [], rows, divide_by_saved)


def arg(source: int, index: int, t: torch.Tensor) -> tuple[Any, ...]:
    """Operand `index` of `source` (SAVED / GRAD / BUFFER) viewed with t's sizes and strides."""
    return (source, index, list(t.shape), list(t.stride()))


def contiguous_arg(source: int, index: int, shape: Sequence[int]) -> tuple[Any, ...]:
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s *= d
    return (source, index, list(shape), strides[::-1])


def make_plan(name: str, fn: Any, device: torch.device, grads: list[tuple[Any, ...]],
              buffers: list[tuple[Sequence[int], torch.dtype]], args: list[tuple[Any, ...]],
              outs: list[tuple[int, int, torch.dtype]], fallback: Callable[[list[Any], list[Any]], Sequence[Any]]) -> Plan:
    """A Plan for the extension. `fn` is the compiled TVM-FFI function (None: always the
    fallback)."""
    mod = module()
    handle = 0 if fn is None else int(fn.__chandle__())
    return mod.make_plan(name, handle, device.type, device.index or 0, grads,
                         [(list(s), dtype_name(d)) for s, d in buffers], args,
                         [(k, i, dtype_name(d)) for k, i, d in outs], fallback)


def attach(plan: Plan, inputs: list[torch.Tensor | None], outputs: list[torch.Tensor], saved: list[torch.Tensor]) -> None:
    """Make `outputs` (computed without autograd) the outputs of a node with `plan`."""
    build.load().attach(plan, inputs, outputs, saved)
