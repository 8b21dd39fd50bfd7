"""Plans for the eager forward launch (ffi_launch.cpp): an op's outputs allocated and its
compiled kernel called in one C call, for the layouts its warm path memoizes.

A Plan is made once per call layout (the op's memo key fixes every shape and stride) and
says:

- outs: (shape, dtype) of each tensor the call allocates;
- args: the kernel's operands in order, each an input (`INPUT`, by position in the call),
  an output (`OUTPUT`) or a tensor the plan holds (`FIXED`, such as a GEMM's workspace
  word) with the (sizes, strides) view the kernel reads
  (`args.arg`, `args.contiguous_arg` build them);
- then: steps after the first kernel, on the same stream and over the same inputs,
  outputs and fixed tensors: `kernel_step` (a norm backward's column sum of its per-CTA
  dweight partials into the weight's dtype) and `matmul_step` (a matrix product through
  ATen's mm: a fused linear loss's chunk GEMMs);
- returns: which outputs the call returns (one: the tensor; more: a tuple), each an
  output index, or ``(index, row)`` for row ``row`` of that output (a norm's dweight and
  dbias as the two rows of one (2, N) output).

`runner(...)` gives ``run(*inputs) -> outputs`` (None where the extension is unavailable
or `CUTEFORGE_NATIVE_LAUNCH=0`: the op keeps its Python launch). ``run`` checks only the
count of inputs, that each is a tensor on the plan's device or None where no argument
reads it (an absent bias); the layout is the memo key's. `Table` is an op's memo of such
plans on the C side; the registered ops' dispatcher kernels (`dispatch.py`) hold the same
plans, keyed by the op's arguments.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..signature import dtype_name
from . import build

INPUT, OUTPUT, FIXED = 0, 1, 2
_KERNEL, _MATMUL, _MATMUL_ADD = 0, 1, 2


def kernel_step(fn: Any, args: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    """A step calling the compiled TVM-FFI function ``fn`` with ``args``."""
    return (_KERNEL, fn, list(args))


def matmul_step(out: tuple[Any, ...], a: tuple[Any, ...], b: tuple[Any, ...], accumulate: bool = False) -> tuple[Any, ...]:
    """A step ``out = a @ b`` (``out += a @ b`` with ``accumulate``) over three 2-D operand
    views (`args.arg`: a transposed operand is a view with swapped strides)."""
    return (_MATMUL_ADD if accumulate else _MATMUL, None, [out, a, b])


def enabled() -> bool:
    """`CUTEFORGE_NATIVE_LAUNCH=0` turns the C launch off alone (the ops then launch from
    Python, as before it; the C++ autograd node stays), read when a plan is made."""
    return os.environ.get("CUTEFORGE_NATIVE_LAUNCH", "1") != "0"


def runner(name: str, fn: Any, device: torch.device, n_inputs: int, outs: Sequence[tuple[Sequence[int], torch.dtype]],
           args: Sequence[tuple[Any, ...]], returns: Sequence[int | tuple[int, int]],
           fixed: Sequence[torch.Tensor] = (),
           then: Sequence[tuple[Any, ...]] = ()) -> Callable[..., Any] | None:
    """``run(*inputs)`` calling the compiled TVM-FFI function ``fn``, then ``then``'s steps
    (`kernel_step`, `matmul_step`), or None where the extension or the launch is turned
    off, the extension cannot be built, or a kernel is no TVM-FFI function (a test's
    stand-in kernel). ``fn`` None: the plan starts with ``then`` (its ``args`` empty).
    ``fixed``: tensors the plan holds, which ``FIXED`` arguments read (the same buffer
    for every call, on ``device``)."""
    kernels = ([] if fn is None else [fn]) + [f for kind, f, _ in then if kind == _KERNEL]
    if not all(hasattr(f, "__chandle__") for f in kernels) or not enabled():
        return None
    mod = build.load()
    if mod is None:
        return None
    plan = mod.make_launch_plan(name, 0 if fn is None else int(fn.__chandle__()), device.type, device.index or 0, n_inputs,
                                [(list(s), dtype_name(d)) for s, d in outs], list(args), list(returns), list(fixed),
                                [(kind, 0 if f is None else int(f.__chandle__()), a) for kind, f, a in then])
    return functools.partial(mod.launch, plan)


class Table:
    """An op's eager memo on the C side (ffi_launch.cpp, "launch tables"): the layout of a
    call -> its plan, so a warm call is one C call with no Python key. ``call(*scalars,
    *inputs)`` is None until a plan is put in, then returns the plan's outputs, or None
    for a layout without a plan or an input that needs autograd while grad mode is on
    (the op's Python path takes those). The key is what the ops' Python memo keys hold:
    the ``n_scalars`` leading scalars with their types (exact int, float, bool or None)
    and per input None or (dtype, device, shape, strides, 16-byte pointer alignment), for
    plain tensors only (no subclass with ``__torch_function__``, no Python dispatch, no
    functionalized or functorch-wrapped tensor) and outside Python dispatch modes."""

    def __init__(self, n_scalars: int) -> None:
        self.n_scalars = n_scalars
        self.call: Callable[..., Any] | None = None
        self._handle: Any = None

    def put(self, scalars: tuple[Any, ...], inputs: tuple[Any, ...], run: Any) -> bool:
        """Key ``run`` (what `runner` returned) by this call's scalars and inputs; False,
        and nothing kept, for any other run (the Python memo keeps it) and for a call the
        table cannot key (a numpy float eps, an IntEnum dim, a tensor subclass: such calls
        stay on the op's Python path)."""
        mod = build.load()
        if mod is None or not (isinstance(run, functools.partial) and run.func is mod.launch):
            return False
        handle = self._handle if self._handle is not None else mod.make_table(self.n_scalars)
        if not mod.table_put(handle, scalars, inputs, run.args[0]):
            return False
        if self._handle is None:
            self._handle = handle
            self.call = functools.partial(mod.table_launch, handle)
        return True

    def __len__(self) -> int:
        return 0 if self._handle is None else build.load().table_size(self._handle)

    def clear(self) -> None:
        self.call = None
        self._handle = None
