"""C++ dispatcher kernels for cuteforge's registered ops (ffi_dispatch.cpp): inside a
compiled graph, a warm call of ``torch.ops.cuteforge.<op>`` runs no Python.

`register(op, miss)` gives a `torch.library.custom_op` two C++ kernels: one for the
backend key (CUDA) that launches the plan its table holds for the call's layout, and one
for the autograd key that redispatches below autograd when no gradient is wanted (a
compiled graph's forward and backward run so) and otherwise calls the op's Python
autograd formula, as torch.library's own autograd kernel would. ``miss(*args)`` is the
op's Python implementation for a layout the table lacks; it returns ``(result, plan)``,
``plan`` from `cuteforge.native.launch.runner` (or None: the layout stays on Python).

Where the extension is unavailable, or `CUTEFORGE_NATIVE_LAUNCH=0`, nothing is
registered and the op keeps its Python kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from . import build
from . import launch as native_launch

Miss = Callable[..., tuple[Any, Any]]


def plan_of(run: Any) -> Any:
    """The plan capsule behind a `launch.runner` result, or None."""
    mod = build.load()
    if mod is not None and isinstance(run, functools.partial) and run.func is mod.launch:
        return run.args[0]
    return None


def pending() -> bool:
    """Whether a `register` that returned False may succeed later: the extension is being
    built in the background, or has become ready since (checked in that order)."""
    return native_launch.enabled() and (build.building() or build.load() is not None)


def register(op: Any, miss: Miss, backend: str = "CUDA") -> bool:
    """Register the C++ kernels for ``op`` (a `torch.library.custom_op` with its fake and
    autograd registered); False, and nothing registered, where the extension is
    unavailable or the C launch is turned off."""
    if not native_launch.enabled():
        return False
    mod = build.load()
    if mod is None:
        return False
    from torch._library.autograd import make_autograd_impl

    overload = op._opoverload
    autograd_impl = make_autograd_impl(overload, op)  # the kernel torch.library registered, rebuilt
    from_raw = torch._C.DispatchKeySet.from_raw_repr

    def grad(raw: int, *args: Any) -> Any:
        return autograd_impl(from_raw(raw), *args)

    mod.register_op(f"{overload._namespace}::{overload._opname}", miss, grad, backend)
    for key in ("CUDA", "AutogradCUDA", "CPU", "AutogradCPU"):  # tracing's Python dispatcher caches kernels
        overload._uncache_dispatch(getattr(torch._C.DispatchKey, key))
    return True


def plans(op: Any, backend: str = "CUDA") -> int:
    """The number of launch plans ``op``'s backend kernel holds (0 when unregistered)."""
    mod = build.load()
    if mod is None:
        return 0
    overload = op._opoverload
    return mod.op_plans(f"{overload._namespace}::{overload._opname}", backend)
