"""Row reductions as torch ops: `cuteforge.ops.sum/mean/amax/amin/argmax(x, dim=-1)`.

The warm path is one dict lookup keyed by (op, dim, dtype, shape, strides, pointer
alignment, device): a hit skips validation and key derivation, which already happened
for that exact layout. A miss (or anything unusual, including bad input) takes the slow
path, which validates with clear errors and compiles at most once per key, ever.

Under torch.compile the ops go through `torch.ops.cuteforge.*` (custom ops with fake
impls); in eager mode they skip that boundary, which costs tens of microseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..arch import target_arch
from ..kernels.reduce.spec import OPS, config_for, out_dtype, row_reduce

_MAX_PLANS = 4096


# A plan is what the warm path needs, as a plain tuple (attribute access costs):
# (rows M, launch(x, out), the output dtype or None when it equals x's dtype).
_Plan = tuple[int, Callable[[torch.Tensor, torch.Tensor], Any], "torch.dtype | None"]
_PLANS: dict[tuple[Any, ...], _Plan] = {}


def _skip(x: torch.Tensor, out: torch.Tensor) -> None:
    """M == 0: nothing to launch."""


def _memo_key(op: str, x: torch.Tensor, dim: int) -> tuple[Any, ...]:
    # Everything the plan depends on; the pointer only through its 16-byte alignment.
    return (op, dim, x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device())


def _plan(op: str, x: Any, dim: Any) -> _Plan:
    """Validate, pick the config, compile or load: once per memo key."""
    where = f"cuteforge.ops.{op}"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: argument 'x' must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{where}: argument 'x' must be 2-D (M, N), got shape {tuple(x.shape)}")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{where}: argument 'dim' must be an int, got {type(dim).__name__}")
    if dim not in (-1, 1):
        raise ValueError(f"{where}: argument 'dim' must be -1 or 1 (the last dim of a 2-D input), got {dim}")
    m, n = x.shape
    if n == 0:
        raise ValueError(f"{where}: argument 'x' must have N >= 1 columns, got shape {tuple(x.shape)}")
    # N == 1 with a foreign last stride (a transposed column): any unit stride is right.
    restride = n == 1 and x.stride(1) != 1
    xv = x.as_strided(x.shape, (x.stride(0), 1)) if restride else x
    odt = out_dtype(op, x.dtype)
    out = torch.empty(m, dtype=odt, device=x.device)
    # Binding validates device, dtype and row contiguity even when M == 0.
    key = row_reduce.signature.bind((xv, out), where)
    launch: Callable[[torch.Tensor, torch.Tensor], Any] = _skip
    if m > 0:
        from ..autotune import lookup  # slow path only: a tuned config if one was stored

        cfg = lookup(row_reduce, key, (("op", op),), {"M": m}) or config_for(target_arch(), n, x.element_size() * 8, m)
        launch = row_reduce.get(key, (("op", op),), cfg)
        if restride:
            fn = launch
            launch = lambda t, o: fn(t.as_strided(t.shape, (t.stride(0), 1)), o)  # noqa: E731
    plan = (m, launch, None if odt == x.dtype else odt)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[_memo_key(op, x, dim)] = plan
    return plan


def _run(op: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    """The custom op's body (torch.compile, autograd); eager calls take `_entry`'s copy."""
    try:
        plan = _PLANS[_memo_key(op, x, dim)]
    except (AttributeError, KeyError, TypeError):
        plan = _plan(op, x, dim)
    m, launch, odt = plan
    out = x.new_empty(m) if odt is None else x.new_empty(m, dtype=odt)
    launch(x, out)
    return out


# --- torch.library registration: what torch.compile and CUDA graphs see -------------------


def _register(op: str) -> Any:
    @torch.library.custom_op(f"cuteforge::{op}", mutates_args=())
    def custom(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return _run(op, x, dim)

    @custom.register_fake
    def _(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        torch._check(x.dim() == 2, lambda: f"cuteforge.ops.{op}: x must be 2-D")
        return x.new_empty(x.shape[0], dtype=out_dtype(op, x.dtype))

    return custom


_CUSTOM = {op: _register(op) for op in OPS}


def _backward(op: str) -> Callable[..., Any] | None:
    if op == "sum":
        return lambda x, out, g: g.unsqueeze(-1).expand_as(x)
    if op == "mean":
        return lambda x, out, g: (g / x.shape[-1]).unsqueeze(-1).expand_as(x)
    if op in ("amax", "amin"):
        # torch's convention: the gradient is shared evenly among tied extrema.
        def grad(x: torch.Tensor, out: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
            mask = (x == out.unsqueeze(-1)).to(g.dtype)
            return mask * (g / mask.sum(-1)).unsqueeze(-1)

        return grad
    return None


def _setup_context(op: str) -> Any:
    def setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(inputs[0], output)

    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, None]:
        x, out = ctx.saved_tensors
        return _backward(op)(x, out, g), None

    return setup, backward


for _op in ("sum", "mean", "amax", "amin"):
    _setup, _bwd = _setup_context(_op)
    _CUSTOM[_op].register_autograd(_bwd, setup_context=_setup)


def _entry(op: str) -> Callable[..., torch.Tensor]:
    custom = _CUSTOM[op]
    is_compiling = torch.compiler.is_compiling
    grad_enabled = torch.is_grad_enabled
    plans = _PLANS

    def fn(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        # Tracing and autograd need the custom-op boundary; plain eager calls skip it
        # (it costs far more than the launch). The warm path is inlined on purpose:
        # every Python call level here is ~0.1 us of a ~6 us budget.
        if is_compiling():
            return custom(x, dim)
        try:
            plan = plans[(op, dim, x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device())]
        except (AttributeError, KeyError, TypeError):
            plan = None
        if getattr(x, "requires_grad", False) and grad_enabled():
            return custom(x, dim)
        if plan is None:
            plan = _plan(op, x, dim)
        m, launch, odt = plan
        out = x.new_empty(m) if odt is None else x.new_empty(m, dtype=odt)
        launch(x, out)
        return out

    fn.__name__ = op
    fn.__qualname__ = op
    fn.__doc__ = f"Row {op} over the last dim of a 2-D CUDA tensor (fp32/bf16/fp16, fp32 accumulation)."
    return fn


sum = _entry("sum")  # noqa: A001 - mirrors torch.sum
mean = _entry("mean")
amax = _entry("amax")
amin = _entry("amin")
argmax = _entry("argmax")
