"""cross_entropy on JAX arrays: per-row forward and backward kernels in one jax.custom_vjp."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from cuteforge import checks
from cuteforge.signature import BoundKey

from . import bridge
from .bridge import check_array, check_n, dtype_name, identity, vec_rows

_REDUCTIONS = ("mean", "sum", "none")


def _as_int64_pairs(t: Any) -> Any:
    """int32/int64 targets -> an int32 (M, 2) array whose bytes are M little-endian int64s
    (works with jax_enable_x64 off, where JAX has no int64 arrays)."""
    if jnp.dtype(t.dtype).itemsize == 8:
        return jax.lax.bitcast_convert_type(t, jnp.int32)  # (M, 2): native (little-endian) words
    t32 = t.astype(jnp.int32)
    return jnp.stack([t32, t32 >> 31], axis=-1)


def _ce_key(logits: Any, with_grad: bool) -> tuple[BoundKey, Any]:
    from cuteforge.kernels.cross_entropy.spec import config_for

    m, n = logits.shape
    d = dtype_name(logits.dtype)
    itemsize = jnp.dtype(logits.dtype).itemsize
    v = vec_rows(n, itemsize)
    if with_grad:
        key = BoundKey((d, "int64", "float32", "float32", d), (("N", n),), (v, 2, 4, 4, v))
    else:
        key = BoundKey((d, "int64", "float32", "float32"), (("N", n),), (v, 2, 4, 4))
    return key, config_for(n, itemsize * 8, with_grad)


def _ce_fwd_impl(ignore_index: int, logits: Any, pairs: Any) -> tuple[Any, Any]:
    """Per-row (loss, lse), fp32, through `cross_entropy_fwd`."""
    from cuteforge.kernels.cross_entropy.spec import cross_entropy_fwd

    m, n = logits.shape
    d = dtype_name(logits.dtype)
    key, cfg = _ce_key(logits, False)
    obj = bridge.kernel_object(cross_entropy_fwd, key, (("ignore_index", ignore_index),), cfg,
                  (("rows", n), ("i64",), ("m",), ("m",)), (d, "int64", "float32", "float32"), "identity", identity)
    loss, lse = bridge.ffi(obj, [logits, pairs], [((m,), jnp.float32), ((m,), jnp.float32)])
    return loss, lse


def _ce_bwd_impl(ignore_index: int, logits: Any, pairs: Any, lse: Any, dloss: Any) -> Any:
    """dlogits = (softmax - onehot) * dloss per row (ignored rows 0), `cross_entropy_bwd`."""
    from cuteforge.kernels.cross_entropy.spec import cross_entropy_bwd

    m, n = logits.shape
    d = dtype_name(logits.dtype)
    key, cfg = _ce_key(logits, True)
    obj = bridge.kernel_object(cross_entropy_bwd, key, (("ignore_index", ignore_index),), cfg,
                  (("rows", n), ("i64",), ("m",), ("m",), ("rows", n)), (d, "int64", "float32", "float32", d),
                  "identity", identity)
    (dlogits,) = bridge.ffi(obj, [logits, pairs, lse, dloss.astype(jnp.float32)], [((m, n), logits.dtype)])
    return dlogits


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ce_rows(ignore_index: int, logits: Any, pairs: Any) -> Any:
    return _ce_fwd_impl(ignore_index, logits, pairs)[0]


def _ce_rows_fwd(ignore_index: int, logits: Any, pairs: Any) -> tuple[Any, Any]:
    loss, lse = _ce_fwd_impl(ignore_index, logits, pairs)
    return loss, (logits, pairs, lse)


def _ce_rows_bwd(ignore_index: int, res: Any, g: Any) -> tuple[Any, None]:
    logits, pairs, lse = res
    return _ce_bwd_impl(ignore_index, logits, pairs, lse, g), None  # integer targets: no gradient


_ce_rows.defvjp(_ce_rows_fwd, _ce_rows_bwd)


def cross_entropy(logits: jax.Array, target: jax.Array, *, reduction: str = "mean",
                  ignore_index: int = -100) -> jax.Array:
    """Cross-entropy of (M, N) logits (float32/bfloat16/float16) against (M,) integer class
    targets, as cuteforge.ops.cross_entropy: fp32 loss, rows whose target is
    ``ignore_index`` contribute 0 and are left out of the mean. Differentiable in logits
    (``jax.custom_vjp``: the backward is cuteforge's ``cross_entropy_bwd`` kernel, which
    never materializes the softmax)."""
    where = "cuteforge.jax.cross_entropy"
    check_array(where, "logits", logits, min_ndim=2)
    if logits.ndim != 2:
        raise ValueError(f"{where}: argument 'logits' must be 2-D (M, N), got shape {tuple(logits.shape)}")
    if not isinstance(target, jax.Array):
        raise TypeError(f"{where}: argument 'target' must be a jax.Array, got {type(target).__name__}")
    if not jnp.issubdtype(target.dtype, jnp.integer):
        raise TypeError(f"{where}: argument 'target' must have an integer dtype, got {dtype_name(target.dtype)}")
    m, n = (int(s) for s in logits.shape)
    if tuple(target.shape) != (m,):
        raise ValueError(f"{where}: argument 'target' must have shape ({m},) (logits' rows), got {tuple(target.shape)}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{where}: argument 'reduction' must be one of {_REDUCTIONS}, got {reduction!r}")
    ignore_index = checks.integer(where, "ignore_index", ignore_index)
    bits = 64 if jnp.dtype(target.dtype).itemsize >= 8 else 32
    if not -(2 ** (bits - 1)) <= ignore_index < 2 ** (bits - 1):
        raise ValueError(f"{where}: argument 'ignore_index'={ignore_index} does not fit the int{bits} targets")
    if n == 0:
        raise ValueError(f"{where}: argument 'logits' has no classes (N = 0)")
    check_n(where, "logits", n, 1 << 20)
    if m == 0:
        loss = jnp.zeros((0,), jnp.float32)
    else:
        loss = _ce_rows(ignore_index, logits, _as_int64_pairs(target))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    count = jnp.sum(target != ignore_index)
    return jnp.sum(loss) / count.astype(jnp.float32)
