"""rms_norm / layer_norm on JAX arrays: the forward and backward kernels in one jax.custom_vjp."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from cuteforge import checks
from cuteforge.signature import BoundKey

from . import bridge
from .bridge import MAX_N, check_array, dtype_name, sm_count, vec_flat, vec_rows

# The forward and backward run as one jax.custom_vjp per (kind, eps, bias?, residual?):
# the forward saves what ops/norm.py saves (the normalised input x or x + residual,
# weight, mean, rstd); the backward is `norm_bwd`, whose dweight/dbias come out as fp32
# partials (Q, N) summed here, Q persistent CTA groups as in ops/norm.py.

def _check_norm(where: str, x: Any, weight: Any, bias: Any, eps: Any, residual: Any) -> int:
    """Argument errors naming the argument; returns N."""
    check_array(where, "x", x)
    n = int(x.shape[-1])
    if not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: argument 'x' must have a last dim in [1, {MAX_N}], got shape {tuple(x.shape)}")
    xd = dtype_name(x.dtype)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, jax.Array):
            raise TypeError(f"{where}: argument {name!r} must be a jax.Array, got {type(t).__name__}")
        if dtype_name(t.dtype) not in (xd, "float32"):
            raise TypeError(
                f"{where}: argument {name!r} has dtype {dtype_name(t.dtype)}; it must be x's dtype ({xd}) or float32"
            )
        if tuple(t.shape) != (n,):
            raise ValueError(f"{where}: argument {name!r} must have shape ({n},) (x's last dim), got {tuple(t.shape)}")
    if bias is not None and bias.dtype != weight.dtype:
        raise TypeError(
            f"{where}: argument 'bias' has dtype {dtype_name(bias.dtype)} but 'weight' has "
            f"{dtype_name(weight.dtype)}; they must match"
        )
    if residual is not None:
        if not isinstance(residual, jax.Array):
            raise TypeError(f"{where}: argument 'residual' must be a jax.Array, got {type(residual).__name__}")
        if residual.dtype != x.dtype:
            raise TypeError(
                f"{where}: argument 'residual' has dtype {dtype_name(residual.dtype)} but 'x' has {xd}; they must match"
            )
        if residual.shape != x.shape:
            raise ValueError(
                f"{where}: argument 'residual' has shape {tuple(residual.shape)} but 'x' has {tuple(x.shape)}"
            )
    checks.real(where, "eps", eps)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{where}: argument 'eps' must be finite and >= 0, got {eps}")
    return n


# (kind, eps, has_bias, has_residual): the static part of one norm call
_NormStatic = tuple[str, float, bool, bool]


def _norm_fwd_impl(st: _NormStatic, x2: Any, w: Any, b: Any, r2: Any) -> tuple[Any, Any, Any, Any]:
    """(y, x + residual or None, mean or None, rstd) of 2-D x through `norm_fwd`."""
    from cuteforge.kernels.norm.spec import norm_fwd

    kind, eps, has_b, has_r = st
    m, n = x2.shape
    is_ln = kind == "layer"
    xd, wd = dtype_name(x2.dtype), dtype_name(w.dtype)
    xs, ws = jnp.dtype(x2.dtype).itemsize, jnp.dtype(w.dtype).itemsize
    vx, vw = vec_rows(n, xs), vec_flat(ws)
    key = BoundKey((xd, wd, wd, xd, xd, xd, "float32", "float32"), (("N", n),), (vx, vw, vw, vx, vx, vx, 4, 4))
    params = (("eps", eps), ("has_bias", has_b), ("has_residual", has_r), ("kind", kind))
    # FFI buffers: inputs x, weight[, bias][, residual]; outputs y[, residual_out], rstd[, mean].
    forms: list[tuple[Any, ...]] = [("rows", n), ("n", n)]
    dtypes = [xd, wd]
    if has_b:
        forms.append(("n", n))
        dtypes.append(wd)
    if has_r:
        forms.append(("rows", n))
        dtypes.append(xd)
    forms.append(("rows", n))
    dtypes.append(xd)
    if has_r:
        forms.append(("rows", n))
        dtypes.append(xd)
    forms.append(("m",))
    dtypes.append("float32")
    if is_ln:
        forms.append(("m",))
        dtypes.append("float32")

    def arrange(ts: list[Any]) -> list[Any]:
        it = iter(ts)
        x_t, w_t = next(it), next(it)
        b_t = next(it) if has_b else w_t
        r_t = next(it) if has_r else x_t
        y_t = next(it)
        ro_t = next(it) if has_r else y_t
        rstd_t = next(it)
        mean_t = next(it) if is_ln else rstd_t
        return [x_t, w_t, b_t, r_t, y_t, ro_t, mean_t, rstd_t]

    layout = f"x,w{',b' if has_b else ''}{',r' if has_r else ''}->y{',ro' if has_r else ''},rstd{',mean' if is_ln else ''}"
    obj = bridge.kernel_object(norm_fwd, key, params, None, tuple(forms), tuple(dtypes), layout, arrange)
    ins = [x2, w] + ([b] if has_b else []) + ([r2] if has_r else [])
    outs: list[tuple[tuple[int, ...], Any]] = [((m, n), x2.dtype)]
    if has_r:
        outs.append(((m, n), x2.dtype))
    outs.append(((m,), jnp.float32))
    if is_ln:
        outs.append(((m,), jnp.float32))
    res = iter(bridge.ffi(obj, ins, outs))
    y = next(res)
    ro = next(res) if has_r else None
    rstd = next(res)
    mean = next(res) if is_ln else None
    return y, ro, mean, rstd


def _norm_bwd_impl(kind: str, has_b: bool, dy: Any, xs: Any, w: Any, mean: Any, rstd: Any,
                   dsum: Any) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias or None) through `norm_bwd`, as ops/norm.py's `_backward`."""
    from cuteforge.kernels.norm import config as norm_config
    from cuteforge.kernels.norm.spec import norm_bwd

    m, n = xs.shape
    has_d, is_ln = dsum is not None, kind == "layer"
    xd, wd = dtype_name(xs.dtype), dtype_name(w.dtype)
    xb, wb = jnp.dtype(xs.dtype).itemsize, jnp.dtype(w.dtype).itemsize
    cfg = norm_config.default_bwd_config(n, xb * 8, True, kind)
    blocks = -(-m // cfg.rows_per_cta)
    q = max(1, min(blocks, sm_count() * cfg.ctas_per_sm // cfg.cluster_n))
    vx, vw, vp = vec_rows(n, xb), vec_flat(wb), vec_rows(n, 4)
    f32 = "float32"
    key = BoundKey((xd, wd, xd, xd, f32, f32, xd, f32, f32), (("N", n),), (vx, vw, vx, vx, 4, 4, vx, vp, vp))
    params = (("has_bias", has_b), ("has_dsum", has_d), ("kind", kind))
    # FFI buffers: inputs x, weight, dy[, dsum][, mean], rstd; outputs dx, dwp[, dbp].
    forms: list[tuple[Any, ...]] = [("rows", n), ("n", n), ("rows", n)]
    dtypes = [xd, wd, xd]
    if has_d:
        forms.append(("rows", n))
        dtypes.append(xd)
    if is_ln:
        forms.append(("m",))
        dtypes.append(f32)
    forms += [("m",), ("rows", n), ("rows", n)]
    dtypes += [f32, xd, f32]
    if has_b:
        forms.append(("rows", n))
        dtypes.append(f32)

    def arrange(ts: list[Any]) -> list[Any]:
        it = iter(ts)
        x_t, w_t, dy_t = next(it), next(it), next(it)
        ds_t = next(it) if has_d else dy_t
        mean_t = next(it) if is_ln else None
        rstd_t = next(it)
        dx_t, dwp_t = next(it), next(it)
        dbp_t = next(it) if has_b else dwp_t
        return [x_t, w_t, dy_t, ds_t, rstd_t if mean_t is None else mean_t, rstd_t, dx_t, dwp_t, dbp_t]

    layout = f"x,w,dy{',dsum' if has_d else ''}{',mean' if is_ln else ''},rstd->dx,dwp{',dbp' if has_b else ''}"
    obj = bridge.kernel_object(norm_bwd, key, params, cfg, tuple(forms), tuple(dtypes), layout, arrange)
    ins = [xs, w, dy.astype(xs.dtype)] + ([dsum.astype(xs.dtype)] if has_d else []) + ([mean] if is_ln else []) + [rstd]
    outs: list[tuple[tuple[int, ...], Any]] = [((m, n), xs.dtype), ((q, n), jnp.float32)]
    if has_b:
        outs.append(((q, n), jnp.float32))
    res = bridge.ffi(obj, ins, outs)
    dw = jnp.sum(res[1], axis=0).astype(w.dtype)
    db = jnp.sum(res[2], axis=0).astype(w.dtype) if has_b else None
    return res[0], dw, db


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _norm_op(st: _NormStatic, x2: Any, w: Any, b: Any, r2: Any) -> Any:
    y, ro, _, _ = _norm_fwd_impl(st, x2, w, b, r2)
    return (y, ro) if st[3] else y


def _norm_op_fwd(st: _NormStatic, x2: Any, w: Any, b: Any, r2: Any) -> tuple[Any, Any]:
    y, ro, mean, rstd = _norm_fwd_impl(st, x2, w, b, r2)
    xs = ro if st[3] else x2  # what was normalised
    return ((y, ro) if st[3] else y), (xs, w, mean, rstd)


def _norm_op_bwd(st: _NormStatic, res: Any, g: Any) -> tuple[Any, Any, Any, Any]:
    kind, _, has_b, has_r = st
    xs, w, mean, rstd = res
    dy, dsum = g if has_r else (g, None)
    dx, dw, db = _norm_bwd_impl(kind, has_b, dy, xs, w, mean, rstd, dsum)
    # x + residual: the residual gets x's gradient
    return dx, dw, db, (dx if has_r else None)


_norm_op.defvjp(_norm_op_fwd, _norm_op_bwd)


def _norm(kind: str, x: Any, weight: Any, bias: Any, eps: Any, residual: Any) -> Any:
    n = _check_norm(f"cuteforge.jax.{kind}_norm", x, weight, bias, eps, residual)
    m = math.prod(int(s) for s in x.shape[:-1])
    if m == 0:
        y = jnp.zeros(x.shape, x.dtype)
        return y if residual is None else (y, jnp.zeros(x.shape, x.dtype))
    st = (kind, float(eps), bias is not None, residual is not None)
    out = _norm_op(st, x.reshape(m, n), weight, bias, None if residual is None else residual.reshape(m, n))
    if residual is None:
        return out.reshape(x.shape)
    return out[0].reshape(x.shape), out[1].reshape(x.shape)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float = 1e-6, *, residual: jax.Array | None = None) -> Any:
    """RMSNorm over the last axis: y = x / sqrt(mean(x^2) + eps) * weight (fp32 math, y in
    x's dtype; weight in x's dtype or float32). With ``residual``, normalises h = x +
    residual and returns (y, h). Usable inside jax.jit; differentiable in x, weight and
    residual (``jax.custom_vjp``: the backward is cuteforge's ``norm_bwd`` kernel)."""
    return _norm("rms", x, weight, None, eps, residual)


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array | None = None, eps: float = 1e-5, *,
               residual: jax.Array | None = None) -> Any:
    """LayerNorm over the last axis (biased variance, fp32 math), with optional bias and
    fused residual (returns (y, x + residual) then). Usable inside jax.jit; differentiable
    in x, weight, bias and residual (the backward is cuteforge's ``norm_bwd`` kernel)."""
    return _norm("layer", x, weight, bias, eps, residual)
