"""Reductions as torch ops: `cuteforge.ops.sum/mean/amax/amin/argmax(x, dim=-1, keepdim=False)`.

Any dim of an N-D tensor: when only size-1 dims follow the reduced one it is a row
reduction (leading dims flattened into M); otherwise an (outer, R, inner) column
reduction with the inner dims contiguous. Layouts that no such view expresses are
copied with `.contiguous()` first (the only copy; ordinary tensors never take it).

The warm path is one C call for row reductions whose rows are a view of x (the op's
launch table in `cuteforge.native.launch`: keyed by dim and keepdim with their types and
x's dtype, shape, strides, pointer alignment and device; it allocates the output and
launches), else one dict lookup keyed by the same: a hit skips validation and key
derivation, which already happened for that exact layout. A miss (or anything unusual,
including bad input) takes the slow path, which validates with clear errors and compiles
at most once per key, ever.

Under torch.compile the ops go through `torch.ops.cuteforge.*` (custom ops with fake
impls); in eager mode they skip that boundary, which costs tens of microseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import checks
from ..arch import target_arch
from ..kernels.reduce.config import ColReduceConfig
from ..kernels.reduce.spec import OPS, col_config_for, col_reduce, config_for, out_dtype, row_reduce
from ..native import build as native_build
from ..native import launch as native_launch
from ..native.args import contiguous_arg
from ..signature import FLOAT_DTYPES
from .memo import remember
from .registered import define

# A plan is what the warm path needs: run(x) -> out. Where x's rows are read in place by
# the row kernel it is one C call (`native.launch`: allocation and launch), else a
# Python closure allocating the output and calling launch(x, out).
_Plan = Callable[[torch.Tensor], torch.Tensor]
_PLANS: dict[tuple[Any, ...], _Plan] = {}
native_build.when_ready(_PLANS.clear)  # runs made while the extension built are Python launches
# ... and its C copy for the C launches, keyed by (dim, keepdim, x): a warm call is one C call
_TABLES = {op: native_launch.Table(2) for op in OPS}


def _skip(x: torch.Tensor, out: torch.Tensor) -> None:
    """Empty output: nothing to launch."""


def _memo_key(op: str, x: torch.Tensor, dim: int, keepdim: bool) -> tuple[Any, ...]:
    # Everything the plan depends on; the pointer only through its 16-byte alignment.
    # dim and keepdim with their types: keepdim=0 must not reuse keepdim=False's plan (the
    # check refuses it), as the launch table keys them
    return (op, dim, type(dim), keepdim, type(keepdim), x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device())


def _flat_stride(shape: Any, strides: Any, empty: int) -> int | None:
    """The one stride of these dims flattened into one (size-1 dims ignored; `empty`
    when none is left, where any stride is right), None when they need a copy."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if not dims:
        return empty
    for (_, s_outer), (n_inner, s_inner) in zip(dims, dims[1:]):
        if s_outer != n_inner * s_inner:
            return None
    return dims[-1][1]


def _prod(xs: Any) -> int:
    p = 1
    for v in xs:
        p *= v
    return p


def _check(op: str, x: Any, dim: Any, keepdim: Any) -> int:
    """Validate the arguments; returns dim normalized to [0, x.dim())."""
    where = f"cuteforge.ops.{op}"
    checks.tensor(where, "x", x)
    if x.dim() == 0:
        raise ValueError(f"{where}: argument 'x' must have at least one dim, got a 0-d tensor")
    dim = checks.integer(where, "dim", dim)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{where}: argument 'dim'={dim} is out of range for x of shape {tuple(x.shape)}")
    checks.boolean(where, "keepdim", keepdim)
    d = dim % x.dim()
    if x.shape[d] == 0:
        raise ValueError(f"{where}: argument 'x' has size 0 in the reduced dim {dim} (shape {tuple(x.shape)})")
    if x.shape[d] > checks.INT32_MAX:  # the kernels index within a row in int32, and argmax returns int32 positions
        raise ValueError(f"{where}: argument 'x' has {x.shape[d]} elements in the reduced dim {dim}; at most "
                         f"{checks.INT32_MAX} are supported (reduce a reshaped x twice)")
    return d


def _plan(op: str, x: Any, dim: Any, keepdim: Any = False) -> _Plan:
    """Validate, pick the kernel and its config, compile or load: once per memo key."""
    where = f"cuteforge.ops.{op}"
    d = _check(op, x, dim, keepdim)
    # before any copy of x below: a CPU or integer x gets its error, not a copy
    checks.dtype_in(where, "x", x, FLOAT_DTYPES)
    checks.on_cuda(where, "x", x)
    shape, strides = tuple(x.shape), x.stride()
    odt = out_dtype(op, x.dtype)
    n = shape[d]
    o, i = _prod(shape[:d]), _prod(shape[d + 1 :])
    out_shape: Any = shape[:d] + ((1,) if keepdim else ()) + shape[d + 1 :]
    if x.dim() == 2 and d == 1 and not keepdim:
        out_shape = o  # the measured warm path allocates with an int
    s_outer = _flat_stride(shape[:d], strides[:d], 0)
    run = None
    if i == 1:  # nothing but size-1 dims after the reduced one: a row reduction
        ok = s_outer is not None and (strides[d] == 1 or n == 1)
        launch, kernel = _row_launch(op, x if ok else x.contiguous(), where, d, o, n, ok, isinstance(out_shape, int))
        if ok and kernel is not None:
            run = _row_native(where, kernel, x, d, o, n, out_shape, odt)
    else:
        ok = s_outer is not None and _flat_stride(shape[d + 1 :], strides[d + 1 :], 1) == 1
        launch = _col_launch(op, x if ok else x.contiguous(), where, d, o, n, i, ok)
    plan = run or _python_run(launch, out_shape, None if odt == x.dtype else odt)
    remember(_PLANS, _memo_key(op, x, dim, keepdim), plan)
    _TABLES[op].put((dim, keepdim), (x,), plan)
    return plan


def _python_run(launch: Callable[..., Any], out_shape: Any, odt: torch.dtype | None) -> _Plan:
    if odt is None:
        def run(x: torch.Tensor) -> torch.Tensor:
            out = x.new_empty(out_shape)
            launch(x, out)
            return out
    else:
        def run(x: torch.Tensor) -> torch.Tensor:
            out = x.new_empty(out_shape, dtype=odt)
            launch(x, out)
            return out
    return run


def _row_native(where: str, kernel: Any, x: torch.Tensor, d: int, m: int, n: int, out_shape: Any,
                odt: torch.dtype) -> _Plan | None:
    """The row reduction as one C call (`native.launch`): x's rows, a view of x, read in place."""
    s_row = _flat_stride(x.shape[:d], x.stride()[:d], n)
    shape = (out_shape,) if isinstance(out_shape, int) else tuple(out_shape)
    rows = (native_launch.INPUT, 0, [m, n], [s_row, 1], 0)
    return native_launch.runner(where, kernel, x.device, 1, [(shape, odt)], [rows, contiguous_arg(native_launch.OUTPUT, 0, (m,))], [0])


def _rows(t: torch.Tensor, d: int, m: int, n: int) -> torch.Tensor:
    """t (M rows of N elements along dim d, size-1 dims after it) as an (M, N) view."""
    s_row = _flat_stride(t.shape[:d], t.stride()[:d], n)
    return t.as_strided((m, n), (s_row, 1))


def _row_launch(
    op: str, x: torch.Tensor, where: str, d: int, m: int, n: int, viewable: bool, flat_out: bool
) -> tuple[Callable[..., Any], Any]:
    """(launch(x, out), the compiled kernel or None when there is nothing to launch)."""
    xv = _rows(x, d, m, n)
    out = torch.empty(m, dtype=out_dtype(op, x.dtype), device=x.device)
    key = row_reduce.signature.bind((xv, out), where)  # device, dtype checks even when M == 0
    if m == 0:
        return _skip, None
    from ..autotune import lookup  # slow path only: a tuned config if one was stored

    cfg = lookup(row_reduce, key, (("op", op),), {"M": m}) or config_for(target_arch(), n, x.element_size() * 8, m)
    fn = row_reduce.get(key, (("op", op),), cfg)
    if viewable and flat_out and x.stride(1) == 1:
        return fn, fn  # the plain 2-D case: no views on the warm path
    if viewable:
        return (lambda t, out: fn(_rows(t, d, m, n), out.view(m))), fn
    return (lambda t, out: fn(_rows(t.contiguous(), d, m, n), out.view(m))), fn  # a layout no view can express


def _col_launch(op: str, x: torch.Tensor, where: str, d: int, o: int, r: int, i: int, viewable: bool) -> Callable[..., Any]:
    st = x.stride()
    shape3 = (o, r, i)
    stride3 = (_flat_stride(x.shape[:d], st[:d], r * st[d]), st[d], 1)
    xv = x.as_strided(shape3, stride3)
    out = torch.empty(o, i, dtype=out_dtype(op, x.dtype), device=x.device)
    key = col_reduce.signature.bind((xv, out), where)
    if o * i == 0:
        return _skip
    run = _col_runner(op, xv, out, key.vec[0])
    if viewable:
        return lambda t, out: run(t.as_strided(shape3, stride3), out.view(o, i))
    return lambda t, out: run(t.contiguous().as_strided(shape3, stride3), out.view(o, i))


_SPLIT_CTAS = 1056  # stage-1 CTAs a split of R aims for (8 per H200 SM)


def _pick_split(op: str, xv: torch.Tensor, vec: int) -> int:
    """Chunks of R for a two-stage reduction, 1 for none. Only when even a cluster of 8
    per tile gives under 2 CTAs per SM, R splits into equal chunks (so a mean of chunk means is
    the mean), and (O, chunks) flatten into one stride. Argmax keeps the cluster."""
    o, r, i = xv.shape
    s_o, s_r = xv.stride()[:2]
    ncv = -(-i // vec)
    tiles = o * -(-ncv // min(8, 1 << max(0, (ncv - 1).bit_length())))
    if op == "argmax" or tiles * 8 >= 264 or not (o == 1 or s_o == r * s_r):
        return 1
    s = 16
    while s < 1024 and tiles * s < _SPLIT_CTAS:
        s *= 2
    while s >= 16 and (r % s or r // s < 256):
        s //= 2
    return s if s >= 16 else 1


def _check_col_grid(op: str, o: int, i: int, vec: int, cfg: Any) -> None:
    """The column kernel's grid is one int32 extent: O x ceil(I / CTA columns) x cluster
    (`cfg` None: the kernel's default config)."""
    cfg = cfg if cfg is not None else ColReduceConfig()
    ctas = o * -(-i // (cfg.threads_x * vec)) * cfg.cluster_n
    if ctas > checks.INT32_MAX:
        raise ValueError(f"cuteforge.ops.{op}: argument 'x' would take {ctas} CTAs (its {o} x {i} kept elements); "
                         f"at most {checks.INT32_MAX} fit one launch")


def _col_runner(op: str, xv: torch.Tensor, out: torch.Tensor, vec: int, split: int | None = None, cfg: Any = None) -> Callable[..., Any]:
    """f(x3, out2) for x3 laid out like xv (O, R, I): one column kernel, or two: R in
    `split` equal chunks reduced into an fp32 workspace (O, split, I), then across chunks."""
    o, r, i = xv.shape
    arch, bits = target_arch(), xv.element_size() * 8
    split = _pick_split(op, xv, vec) if split is None else split
    params = (("op", op),)
    if split <= 1:
        key = col_reduce.signature.bind((xv, out))
        cfg = cfg or col_config_for(arch, o, r, i, bits, vec)
        _check_col_grid(op, o, i, vec, cfg)
        return col_reduce.get(key, params, cfg)
    rc = r // split
    shape1, stride1 = (o * split, rc, i), (rc * xv.stride(1), xv.stride(1), 1)
    x1 = xv.as_strided(shape1, stride1)
    ws = torch.empty(o * split, i, dtype=torch.float32, device=xv.device)
    key1 = col_reduce.signature.bind((x1, ws))
    cfg = cfg or col_config_for(arch, o * split, rc, i, bits, key1.vec[0])
    _check_col_grid(op, o * split, i, key1.vec[0], cfg)
    fn1 = col_reduce.get(key1, params, cfg)
    w3 = ws.view(o, split, i)
    key2 = col_reduce.signature.bind((w3, out))
    fn2 = col_reduce.get(key2, params, col_config_for(arch, o, split, i, 32, key2.vec[0]))

    def run(x3: torch.Tensor, out2: torch.Tensor) -> None:
        w = torch.empty(o * split, i, dtype=torch.float32, device=x3.device)
        fn1(x3.as_strided(shape1, stride1), w)
        fn2(w.view(o, split, i), out2)

    return run


def _planned(op: str, x: torch.Tensor, dim: int, keepdim: bool = False) -> _Plan:
    """The memoized run for this call's layout, made on a miss."""
    try:
        return _PLANS[_memo_key(op, x, dim, keepdim)]
    except (AttributeError, KeyError, TypeError, RuntimeError):  # not a dense tensor: _plan says so
        return _plan(op, x, dim, keepdim)


def _run(op: str, x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """The custom op's body (torch.compile, autograd); eager calls take `_entry`'s copy."""
    return _planned(op, x, dim, keepdim)(x)


# --- torch.library registration: what torch.compile and CUDA graphs see -------------------


def _out_shape(x: torch.Tensor, dim: int, keepdim: bool) -> list[int]:
    d = dim % x.dim()
    shape = list(x.shape)
    return shape[:d] + ([1] if keepdim else []) + shape[d + 1 :]


def _register(op: str) -> Any:
    def impl(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
        return _run(op, x, dim, keepdim)

    def fake(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
        torch._check(x.dim() >= 1, lambda: f"cuteforge.ops.{op}: x must have at least one dim")
        torch._check(-x.dim() <= dim < x.dim(), lambda: f"cuteforge.ops.{op}: dim={dim} out of range")
        return x.new_empty(_out_shape(x, dim, keepdim), dtype=out_dtype(op, x.dtype))

    # the plan is the eager one (a launch plan where x is read in place)
    setup, backward = _setup_context(op) if op != "argmax" else (None, None)
    return define(f"cuteforge::{op}", impl, fake=fake, plan=lambda x, dim, keepdim: _planned(op, x, dim, keepdim),
                  backward=backward, setup_context=setup)


def _grad_in(op: str, x: torch.Tensor, out: torch.Tensor, g: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    if not keepdim:
        g, out = g.unsqueeze(dim), out.unsqueeze(dim)
    if op == "sum":
        return g.expand_as(x)
    if op == "mean":
        return (g / x.shape[dim]).expand_as(x)
    # amax/amin, torch's convention: the gradient is shared evenly among tied extrema.
    mask = (x == out).to(g.dtype)
    return mask * (g / mask.sum(dim, keepdim=True))


def _setup_context(op: str) -> Any:
    def setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x = inputs[0]
        ctx.dim = inputs[1] % x.dim() if len(inputs) > 1 else x.dim() - 1
        ctx.keepdim = bool(inputs[2]) if len(inputs) > 2 else False
        ctx.save_for_backward(x, output)

    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, None, None]:
        x, out = ctx.saved_tensors
        return _grad_in(op, x, out, g, ctx.dim, ctx.keepdim), None, None

    return setup, backward



_CUSTOM = {op: _register(op) for op in OPS}


def _entry(op: str) -> Callable[..., torch.Tensor]:
    custom = _CUSTOM[op]
    is_compiling = torch.compiler.is_compiling
    grad_enabled = torch.is_grad_enabled
    plans = _PLANS
    table = _TABLES[op]

    def fn(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
        # Tracing and autograd need the custom-op boundary; plain eager calls skip it
        # (it costs far more than the launch). The warm path is inlined on purpose:
        # every Python call level here is ~0.1 us of a ~6 us budget.
        if is_compiling():
            return custom(x, dim, keepdim)
        call = table.call  # the C memo: one C call for a warm no-grad layout
        if call is not None:
            out = call(dim, keepdim, x)
            if out is not None:
                return out
        try:
            plan = plans[(op, dim, type(dim), keepdim, type(keepdim), x.dtype, x.shape, x.stride(), x.data_ptr() & 15,
                          x.get_device())]
        except (AttributeError, KeyError, TypeError, RuntimeError):
            plan = None
        if getattr(x, "requires_grad", False) and grad_enabled():
            if plan is None:
                _check(op, x, dim, keepdim)  # clear errors before the custom op's schema checks
            return custom(x, dim, keepdim)
        if plan is None:
            plan = _plan(op, x, dim, keepdim)
        return plan(x)

    fn.__name__ = op
    fn.__qualname__ = op
    fn.__doc__ = (
        f"torch.{op}(x, dim, keepdim) for CUDA tensors (fp32/bf16/fp16, fp32 accumulation): the last "
        "dim through the row kernel, any other dim through the column kernel (no transpose copy)."
    )
    return fn


sum = _entry("sum")  # noqa: A001 - mirrors torch.sum
mean = _entry("mean")
amax = _entry("amax")
amin = _entry("amin")
argmax = _entry("argmax")
