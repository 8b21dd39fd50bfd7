"""The sm_90a GEMM on JAX arrays, with its preset epilogues; the backward is two more GEMMs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp

from cuteforge.signature import BoundKey, vector_width

from . import bridge
from .bridge import DTYPES, dtype_name, sm_count, vec_flat

# The sm_90a GEMM of cuteforge.ops.gemm: the same kernel (`gemm_sm90_tt*`: A row-major
# (K-major), B row-major (N-major), which is what a JAX (M, K) @ (K, N) is), the same
# BoundKey, sms parameter, epilogue and config choice. Every extent is dynamic in that
# kernel (TMA descriptors are built by its host code at run time), so one object serves
# every M, N, K and batch. TMA needs 16-byte aligned rows: K (a's rows) and N (b's and
# the output's rows) are padded with zeros to a multiple of 8 elements when they are not
# (a copy of the operand; the output is sliced back).

GEMM_ALIGN = 8  # elements per 16 bytes of bf16/fp16: K and N are padded up to a multiple
_GEMM_AB = ("bfloat16", "float16")
_GEMM_ACTS = (None, "none", "relu", "gelu", "silu")


def _present_gemm(vecs: tuple[int, ...], kinds: tuple[str, ...]) -> Callable[[list[Any]], list[Any]]:
    """The gemm entry's `arrange`: FFI buffers a (L, M, K), b (L, K, N), epilogue operands
    ("col": (N,)), out (L, M, N), as the raw bridge tensors -> the kernel's (a, b, out, e0..)
    in the torch path's fake-tensor layouts: dynamic extents shared across operands (L, M
    from a, K from a, N from b), unit last stride, 64-bit outer strides divisible by the
    argument's vector width."""

    def arrange(ts: list[Any]) -> list[Any]:
        import cutlass
        import cutlass.cute as cute

        a_t, b_t = ts[0], ts[1]
        ops, out_t = ts[2:-1], ts[-1]
        n_l, n_m, n_k = a_t.shape
        n_n = b_t.shape[2]

        def mat(t: Any, rows: Any, cols: Any, vec: int) -> Any:
            rs = cute.assume(cutlass.Int64(cols), divby=vec)
            ls = cute.assume(cutlass.Int64(rows) * cutlass.Int64(cols), divby=vec)
            return cute.make_tensor(t.iterator, cute.make_layout((n_l, rows, cols), stride=(ls, rs, 1)))

        extras = []
        for t, kind in zip(ops, kinds):
            if kind != "col":  # pragma: no cover - only presets with a column bias are offered
                raise ValueError(f"unsupported epilogue operand kind {kind!r}")
            extras.append(cute.make_tensor(t.iterator, cute.make_layout((n_n,), stride=(1,))))
        # The stream-K workspace argument: JAX runs configs without stream_k (they never
        # touch it), so one int32 word viewed at the output's address stands in.
        work = cute.make_tensor(cute.recast_ptr(out_t.iterator, dtype=cutlass.Int32), cute.make_layout((1,)))
        return [mat(a_t, n_m, n_k, vecs[0]), mat(b_t, n_k, n_n, vecs[1]), mat(out_t, n_m, n_n, vecs[2]), work, *extras]

    return arrange


def _gemm_kernel_call(a3: Any, b3: Any, bias: Any, act: str, odt: Any, dims: tuple[int, int, int]) -> Any:
    """act(a3 @ b3 + bias) through the sm_90a kernel; a3 (L, M, K), b3 (L, K, N) bf16/fp16
    with K and N multiples of GEMM_ALIGN, bias (N,) or None. Returns (L, M, N) in odt.
    `dims`: the problem's (M, N, K) before padding, which pick the config as in torch."""
    from cuteforge.autotune import lookup
    from cuteforge.kernels.gemm.epilogue import GemmEpilogue
    from cuteforge.kernels.gemm.sm90.config import default_config, fit_swizzle, usable_tuned
    from cuteforge.kernels.gemm.spec import gemm_kernel

    n_l, m, k = (int(s) for s in a3.shape)
    n = int(b3.shape[2])
    epi = GemmEpilogue.preset(act, bias="col" if bias is not None else None)
    kinds = epi.kinds if epi is not None else ()
    kern = gemm_kernel(True, False, kinds)  # a K-major (row-major), b N-major (row-major)
    ad, od = dtype_name(a3.dtype), dtype_name(odt)
    ab, ob = jnp.dtype(a3.dtype).itemsize, jnp.dtype(odt).itemsize
    vecs = (vector_width(0, (m * k, k), ab), vector_width(0, (k * n, n), ab), vector_width(0, (m * n, n), ob))
    dtypes: tuple[str, ...] = (ad, ad, od, "int32")  # a, b, out, work (see _present_gemm)
    vecs += (4,)
    if bias is not None:
        bd = dtype_name(bias.dtype)
        dtypes += (bd,)
        vecs += (vec_flat(jnp.dtype(bias.dtype).itemsize),)
    key = BoundKey(dtypes, (), vecs)
    sms = sm_count()
    params = tuple(sorted((("sms", sms),) + ((("epilogue", epi.key),) if epi is not None else ())))
    pm, pn, pk = dims
    tuned = usable_tuned(lookup(kern, key, params, {"M": pm, "N": pn, "K": pk}), ab, ob)
    if tuned is not None:
        cfg = fit_swizzle(tuned, pm, pn)
    else:
        cfg = default_config(pm, pn, pk, sms, ab, fused=epi is not None, batch=n_l, whole_tiles=True)
    # no persistent zeroed workspace under XLA: a tuned stream-K config runs whole tiles
    cfg = replace(cfg, stream_k=False, stream_k_ends=False)
    # FFI buffers: inputs a, b[, bias]; output out. Kernel order: a, b, out, work[, bias].
    forms = (("raw", 3), ("raw", 3)) + ((("raw", 1),) if bias is not None else ()) + (("raw", 3),)
    ffi_dtypes = (ad, ad) + ((bd,) if bias is not None else ()) + (od,)
    layout = f"gemm:a,b{',bias' if bias is not None else ''}->out"
    obj = bridge.kernel_object(kern, key, params, cfg, forms, ffi_dtypes, layout, _present_gemm(vecs, kinds))
    ins = [a3, b3] + ([bias] if bias is not None else [])
    (out,) = bridge.ffi(obj, ins, [((n_l, m, n), odt)])
    return out


def _round_up(v: int, unit: int) -> int:
    return -(-v // unit) * unit


def _gemm_impl(st: tuple[str, str], a: Any, b: Any, bias: Any) -> Any:
    """act(a @ b + bias) for a, b of equal rank (2 or 3, equal batch), any K and N: pads K
    and N to GEMM_ALIGN, runs the kernel, slices the output back."""
    act, odt_name = st
    odt = jnp.dtype(odt_name)
    batched = a.ndim == 3
    a3 = a if batched else a[None]
    b3 = b if batched else b[None]
    n_l, m, k = (int(s) for s in a3.shape)
    n = int(b3.shape[2])
    if n_l == 0 or m == 0 or n == 0 or k == 0:
        out = _gemm_reference(a3, b3, bias, act, odt)
        return out if batched else out[0]
    kp, np_ = _round_up(k, GEMM_ALIGN), _round_up(n, GEMM_ALIGN)
    if kp != k:
        a3 = jnp.pad(a3, ((0, 0), (0, 0), (0, kp - k)))
    if kp != k or np_ != n:
        b3 = jnp.pad(b3, ((0, 0), (0, kp - k), (0, np_ - n)))
    bp = bias
    if bias is not None and np_ != n:
        bp = jnp.pad(bias, (0, np_ - n))
    out = _gemm_kernel_call(a3, b3, bp, act, odt, (m, n, k))
    if np_ != n:
        out = out[:, :, :n]
    return out if batched else out[0]


def _act_jnp(act: str, z: Any) -> Any:
    """The epilogue's activation in jnp (gelu: tanh form, as the kernel)."""
    if act == "relu":
        return jnp.maximum(z, 0.0)
    if act == "gelu":
        return jax.nn.gelu(z, approximate=True)
    if act == "silu":
        return jax.nn.silu(z)
    return z


def _gemm_reference(a: Any, b: Any, bias: Any, act: str, odt: Any) -> Any:
    """jnp: fp32 accumulate, the same epilogue (empty problems; no kernel launch)."""
    z = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32))
    if bias is not None:
        z = z + bias.astype(jnp.float32)
    return _act_jnp(act, z).astype(odt)


def _swap(x: Any) -> Any:
    return jnp.swapaxes(x, -1, -2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gemm_op(st: tuple[str, str], a: Any, b: Any, bias: Any) -> Any:
    return _gemm_impl(st, a, b, bias)


def _gemm_op_fwd(st: tuple[str, str], a: Any, b: Any, bias: Any) -> tuple[Any, Any]:
    # the op itself, not _gemm_impl: under a second differentiation the output keeps its rule
    return _gemm_op(st, a, b, bias), (a, b, bias)


def _gemm_op_bwd(st: tuple[str, str], res: Any, g: Any) -> tuple[Any, Any, Any]:
    """dA = dZ @ B^T, dB = A^T @ dZ (two kernel GEMMs, themselves differentiable), dbias =
    the sum of dZ over rows; dZ = dC, or dC * act'(Z) with Z = a @ b + bias recomputed by
    the kernel in fp32 (as the torch op's backward recomputes its forward)."""
    act, _ = st
    a, b, bias = res
    cd = a.dtype
    if act == "none":
        dz = g
    else:
        z = _gemm_op(("none", "float32"), a, b, bias)
        _, pull = jax.vjp(lambda v: _act_jnp(act, v), z)
        (dz,) = pull(g.astype(jnp.float32))
    dz_c = dz.astype(cd)
    plain = ("none", dtype_name(cd))
    da = _gemm_op(plain, dz_c, _swap(b), None)
    db = _gemm_op(plain, _swap(a), dz_c, None)
    dbias = None
    if bias is not None:
        dbias = jnp.sum(dz.astype(jnp.float32), axis=tuple(range(dz.ndim - 1))).astype(bias.dtype)
    return da, db, dbias


_gemm_op.defvjp(_gemm_op_fwd, _gemm_op_bwd)


def gemm(a: jax.Array, b: jax.Array, *, bias: jax.Array | None = None, epilogue: str | None = None,
         out_dtype: Any = None) -> jax.Array:
    """act(a @ b + bias) on Hopper (sm_90a): cuteforge's TMA + WGMMA GEMM with the epilogue
    fused before the store, the same kernel, key and config as ``cuteforge.ops.gemm``.

    a: (M, K) or (L, M, K), b: (K, N) or (L, K, N), bfloat16 or float16 (the same dtype),
    row-major as JAX arrays are; a 3-D a with a 2-D b runs as one (L*M, K) @ (K, N) GEMM,
    a 2-D a with a 3-D b is broadcast over the batch. bias: (N,) per column, any float
    dtype. epilogue: None, "relu", "gelu" (tanh form) or "silu". out_dtype: float32,
    bfloat16 or float16 (default a's dtype); fp32 accumulation. K or N that is not a
    multiple of 8 is padded with zeros (TMA's 16-byte rows). Usable inside jax.jit;
    differentiable in a, b and bias (``jax.custom_vjp``: dA and dB are two more kernel
    GEMMs; with an activation, the backward recomputes a @ b + bias in fp32 first)."""
    where = "cuteforge.jax.gemm"
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, jax.Array):
            raise TypeError(f"{where}: argument {name!r} must be a jax.Array, got {type(t).__name__}")
        if dtype_name(t.dtype) not in _GEMM_AB:
            raise TypeError(f"{where}: argument {name!r} has dtype {dtype_name(t.dtype)}; supported: bfloat16, float16")
        if t.ndim not in (2, 3):
            raise ValueError(f"{where}: argument {name!r} must be 2-D or 3-D (batched), got shape {tuple(t.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"{where}: argument 'b' has dtype {dtype_name(b.dtype)} but 'a' has {dtype_name(a.dtype)}; "
                        "they must match")
    if int(a.shape[-1]) != int(b.shape[-2]):
        raise ValueError(f"{where}: argument 'b' has {int(b.shape[-2])} rows but 'a' has K = {int(a.shape[-1])} "
                         f"columns (a {tuple(a.shape)} @ b {tuple(b.shape)})")
    if a.ndim == 3 and b.ndim == 3 and int(a.shape[0]) != int(b.shape[0]):
        raise ValueError(f"{where}: argument 'b' has batch {int(b.shape[0])} but 'a' has {int(a.shape[0])}; they must match")
    if epilogue not in _GEMM_ACTS:
        raise ValueError(f"{where}: argument 'epilogue' must be None, 'relu', 'gelu' or 'silu', got {epilogue!r}")
    act = epilogue or "none"
    n = int(b.shape[-1])
    if bias is not None:
        if not isinstance(bias, jax.Array):
            raise TypeError(f"{where}: argument 'bias' must be a jax.Array, got {type(bias).__name__}")
        if dtype_name(bias.dtype) not in DTYPES:
            raise TypeError(f"{where}: argument 'bias' has dtype {dtype_name(bias.dtype)}; "
                            "supported: float32, bfloat16, float16")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"{where}: argument 'bias' must have shape ({n},) (one value per output column), "
                             f"got {tuple(bias.shape)}")
    if out_dtype is None:
        odt = dtype_name(a.dtype)
    else:
        try:
            odt = dtype_name(out_dtype)
        except TypeError:
            raise TypeError(f"{where}: argument 'out_dtype' must be a dtype, got {out_dtype!r}") from None
        if odt not in DTYPES:
            raise TypeError(f"{where}: argument 'out_dtype' is {odt}; supported: float32, bfloat16, float16")
    st = (act, odt)
    if a.ndim == 3 and b.ndim == 2:  # (L, M, K) @ (K, N): one (L*M, K) @ (K, N) GEMM
        n_l, m, k = (int(s) for s in a.shape)
        return _gemm_op(st, a.reshape(n_l * m, k), b, bias).reshape(n_l, m, n)
    if a.ndim == 2 and b.ndim == 3:
        a = jnp.broadcast_to(a[None], (int(b.shape[0]), *a.shape))
    return _gemm_op(st, a, b, bias)
