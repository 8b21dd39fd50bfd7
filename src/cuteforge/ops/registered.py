"""The registered ops (``torch.ops.cuteforge.*``, what torch.compile and CUDA graphs see),
defined in one way for every family.

    op = define("cuteforge::rms_norm", impl, fake=fake, plan=plan,
                backward=grad, setup_context=setup)

- ``impl(*args)``: the Python implementation; its annotations give the schema.
- ``fake(*args)``: outputs of the right shapes, dtypes and strides for tracing.
- ``plan(*args) -> run | None``: the launch plan for this call's layout
  (`cuteforge.native.launch.runner`, returning the op's outputs in schema order from its
  tensor arguments in schema order); None, or any other run, where the layout has none
  (the call then stays on ``impl``; ``plan`` runs on every such call, so it should answer
  such layouts from a memo or cheap checks). With it, the op's CUDA and autograd kernels are C++ (`native.dispatch`):
  every later call of the layout allocates and launches without Python. They are
  registered at the op's first real call, where the C++ extension is available.
- ``backward`` / ``setup_context``: the autograd formula (`torch.library.register_autograd`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..native import dispatch


def define(qualname: str, impl: Callable[..., Any], *, fake: Callable[..., Any],
           plan: Callable[..., Any] | None = None, backward: Callable[..., Any] | None = None,
           setup_context: Callable[..., Any] | None = None, backend: str = "CUDA") -> Any:
    """Define ``qualname`` ("ns::name") as a custom op (module doc); ``backend`` is the
    dispatch key of its C++ kernel ("CPU" in the CPU tests)."""
    schema = torch.library.infer_schema(impl, mutates_args=())
    parsed = torch._C.parse_schema(f"{qualname}{schema}")
    tensor_type = torch._C.OptionalType(torch._C.TensorType.get())
    tensors = tuple(i for i, a in enumerate(parsed.arguments) if a.type.isSubtypeOf(tensor_type))
    op: Any = None
    registered = False

    def miss(*args: Any) -> tuple[Any, Any]:
        run = plan(*args) if plan is not None else None
        c_plan = None if run is None else dispatch.plan_of(run)
        if c_plan is None:  # no C plan for this layout: the op's own (memoized) Python path
            return impl(*args), None
        return run(*(args[i] for i in tensors)), c_plan

    def body(*args: Any) -> Any:
        nonlocal registered
        out = impl(*args)
        if not registered and plan is not None:
            # once, whether or not the extension is there; while it builds in the
            # background, again at later calls until it is ready
            registered = dispatch.register(op, miss, backend) or not dispatch.pending()
        return out

    op = torch.library.custom_op(qualname, body, mutates_args=(), schema=schema)
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return op
