"""The row reductions on JAX arrays (sum, mean, amax, amin over the last axis; forward only)."""

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
    dtype_name,
    identity,
    rows_shape,
    vec_flat,
    vec_rows,
)


def _reduce(op: str) -> Callable[..., Any]:
    def fn(x: jax.Array, axis: int = -1, keepdims: bool = False) -> jax.Array:
        from cuteforge.autotune import lookup
        from cuteforge.kernels.reduce.spec import config_for, row_reduce

        where = f"cuteforge.jax.{op}"
        check_array(where, "x", x)
        check_axis(where, axis, x.ndim)
        if not isinstance(keepdims, bool):
            raise TypeError(f"{where}: argument 'keepdims' must be a bool, got {type(keepdims).__name__}")
        m, n = rows_shape(x)
        out_shape = tuple(x.shape[:-1]) + ((1,) if keepdims else ())
        if n == 0 and op in ("amax", "amin"):
            raise ValueError(f"{where}: argument 'x' has an empty last axis; {op} of nothing is undefined")
        if m == 0 or n == 0:
            fill = 0.0 if op == "sum" else float("nan")
            return jnp.full(out_shape, fill, x.dtype)
        d = dtype_name(x.dtype)
        itemsize = jnp.dtype(x.dtype).itemsize
        key = BoundKey((d, d), (("N", n),), (vec_rows(n, itemsize), vec_flat(itemsize)))
        params = (("op", op),)
        cfg = lookup(row_reduce, key, params, {"M": m}) or config_for(target_arch(), n, itemsize * 8, m)
        obj = bridge.kernel_object(row_reduce, key, params, cfg, (("rows", n), ("m",)), (d, d), "identity", identity)
        (out,) = bridge.ffi(obj, [x.reshape(m, n)], [((m,), x.dtype)])
        return out.reshape(out_shape)

    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = (
        f"{op} over the last axis of a jax.Array (float32/bfloat16/float16, fp32 accumulation), "
        f"usable inside jax.jit (forward only). Same kernel as cuteforge.ops.{op}(x, dim=-1)."
    )
    return fn


sum = _reduce("sum")  # noqa: A001  (the op's name, as in cuteforge.ops)
mean = _reduce("mean")
amax = _reduce("amax")
amin = _reduce("amin")
