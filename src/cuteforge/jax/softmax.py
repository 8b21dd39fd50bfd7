"""softmax / log_softmax on JAX arrays: forward and backward kernels in one jax.custom_vjp."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from cuteforge.arch import target_arch
from cuteforge.signature import BoundKey

from . import bridge
from .bridge import (
    check_array,
    check_axis,
    check_n,
    dtype_name,
    identity,
    rows_shape,
    vec_rows,
)


def _softmax_kernel(mode: str, x2: Any) -> Any:
    from cuteforge.autotune import lookup
    from cuteforge.kernels.softmax.spec import config_for, kernel_params, softmax_bwd, softmax_fwd

    m, n = x2.shape
    d = dtype_name(x2.dtype)
    bits = jnp.dtype(x2.dtype).itemsize * 8
    vec = vec_rows(n, bits // 8)
    bwd = mode.endswith("_bwd")
    k = softmax_bwd if bwd else softmax_fwd
    nargs = 3 if bwd else 2
    key = BoundKey((d,) * nargs, (("N", n),), (vec,) * nargs)
    cfg = lookup(k, key, (("mode", mode),), {"M": m}) or config_for(target_arch(), n, bits, bwd, m, mode, key)
    forms = (("rows", n),) * nargs
    # XLA's buffers are aligned and these rows contiguous: every operand has the same heads
    return bridge.kernel_object(k, key, kernel_params(mode, key, True), cfg, forms, (d,) * nargs, "identity", identity)


def _softmax_impl(mode: str, x: Any) -> Any:
    m, n = rows_shape(x)
    if m == 0 or n == 0:
        return jnp.zeros(x.shape, x.dtype)
    x2 = x.reshape(m, n)
    (y,) = bridge.ffi(_softmax_kernel(mode, x2), [x2], [((m, n), x2.dtype)])
    return y.reshape(x.shape)


def _softmax_bwd_impl(mode: str, y: Any, dy: Any) -> Any:
    m, n = rows_shape(y)
    if m == 0 or n == 0:
        return jnp.zeros(y.shape, y.dtype)
    y2, dy2 = y.reshape(m, n), dy.astype(y.dtype).reshape(m, n)
    (dx,) = bridge.ffi(_softmax_kernel(f"{mode}_bwd", y2), [dy2, y2], [((m, n), y2.dtype)])
    return dx.reshape(y.shape)


def _make_softmax(mode: str) -> Callable[..., Any]:
    @jax.custom_vjp
    def op(x: Any) -> Any:
        return _softmax_impl(mode, x)

    def fwd(x: Any) -> tuple[Any, Any]:
        y = _softmax_impl(mode, x)
        return y, y

    def bwd(y: Any, dy: Any) -> tuple[Any]:
        return (_softmax_bwd_impl(mode, y, dy),)

    op.defvjp(fwd, bwd)

    def fn(x: jax.Array, axis: int = -1) -> jax.Array:
        where = f"cuteforge.jax.{mode}"
        check_array(where, "x", x)
        check_axis(where, axis, x.ndim)
        check_n(where, "x", int(x.shape[-1]))
        return op(x)

    fn.__name__ = fn.__qualname__ = mode
    fn.__doc__ = (
        f"{mode} over the last axis of a jax.Array (float32/bfloat16/float16, fp32 math), usable "
        "inside jax.jit, differentiable (the backward is cuteforge's backward kernel). Same kernel, "
        "config and compile key as cuteforge.ops." + mode + "."
    )
    return fn


softmax = _make_softmax("softmax")
log_softmax = _make_softmax("log_softmax")
