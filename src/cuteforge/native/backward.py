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
  buffer with the (sizes, strides) view the kernel reads, from an element offset (`arg`);
  ``then``: kernels called after it with their own operands (a norm's column sum of its
  per-CTA dweight partials into the weight's dtype);
- outs: per differentiable input, its gradient: none (``(NO_GRAD, 0)``), a buffer
  (``(BUFFER_OUT, b)``) or one row of a buffer (``(BUFFER_OUT, b, row)``: dweight and
  dbias as the two rows of one (2, N) buffer);
- fallback(grads, saved) -> input gradients: the op's ordinary Python backward, for
  everything else (another gradient layout, an undefined gradient, double backward).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..signature import dtype_name
from . import build

SAVED, GRAD, BUFFER = 0, 1, 2
NO_GRAD, BUFFER_OUT = 0, 1

Plan = Any  # the extension's Plan object


def module() -> Any:
    """The extension, or None where it is disabled or cannot be built."""
    return build.load()


def forward_ad_active() -> bool:
    """Dual tensors need the Python nodes' error for a missing forward derivative."""
    return torch.autograd.forward_ad._current_level >= 0


def grad_as_is(t: torch.Tensor) -> tuple[Any, ...]:
    return (0, dtype_name(t.dtype), list(t.shape), 0, -1)


def grad_scalar_rows(rows: int, divide_by_saved: int = -1) -> tuple[Any, ...]:
    """A 0-dim gradient g becomes (g.float() [/ saved[k][rows]]).expand(rows).contiguous()."""
    return (1, "float32", [], rows, divide_by_saved)


def make_plan(name: str, fn: Any, device: torch.device, grads: list[tuple[Any, ...]],
              buffers: list[tuple[Sequence[int], torch.dtype]], args: list[tuple[Any, ...]],
              outs: list[tuple[int, ...]], fallback: Callable[[list[Any], list[Any]], Sequence[Any]],
              then: Sequence[tuple[Any, ...]] = ()) -> Plan:
    """A Plan for the extension. `fn` is the compiled TVM-FFI function (None: always the
    fallback); ``then``: kernels called after it, in order (`launch.kernel_step`)."""
    mod = module()
    handle = 0 if fn is None else int(fn.__chandle__())
    return mod.make_plan(name, handle, device.type, device.index or 0, grads,
                         [(list(s), dtype_name(d)) for s, d in buffers], args,
                         [(o[0], o[1], o[2] if len(o) > 2 else -1) for o in outs], fallback,
                         [(kind, int(f.__chandle__()), list(a)) for kind, f, a in then])


def attach(plan: Plan, inputs: list[torch.Tensor | None], outputs: list[torch.Tensor], saved: list[torch.Tensor]) -> None:
    """Make `outputs` (computed without autograd) the outputs of a node with `plan`."""
    build.load().attach(plan, inputs, outputs, saved)
