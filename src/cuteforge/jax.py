"""cuteforge's kernels on JAX arrays, inside ``jax.jit``.

    import jax, jax.numpy as jnp
    import cuteforge.jax as cfj

    @jax.jit
    def f(x, w, w1):
        return cfj.gemm(cfj.rms_norm(cfj.softmax(x), w, 1e-6), w1, epilogue="gelu")

Every op but the reductions is differentiable (``jax.custom_vjp``): softmax, the norms
and cross-entropy run cuteforge's backward kernels, gemm two more GEMMs. Each op builds
the same kernel as the torch op of the same name (the builders in
``cuteforge.kernels.*.spec``, the same config heuristic, the same compile key) and calls
it through the CuTe DSL's JAX bridge (``cutlass.jax``): an XLA FFI custom call whose
attribute is the compiled host+device object. The object is compiled by cuteforge, not by
``cutlass.jax.cutlass_call``, so it can live in cuteforge's persistent cache: one entry per
(kernel, arch, BoundKey, params, config) under ``<cache>/<fingerprint>/<kernel>.jax/``.
A later process, or a later trace in this one, loads the object instead of compiling it.
See docs/jax.md.

Importing ``cuteforge`` never imports JAX; importing this module needs JAX >= 0.6.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

try:
    import jax
    import jax.numpy as jnp
except ImportError as _e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "cuteforge.jax needs JAX >= 0.6 (the CuTe DSL's JAX bridge, cutlass.jax, requires it); "
        "install it with `pip install 'jax[cuda12]'` (or `pip install jax` to compile without a GPU)"
    ) from _e

MIN_JAX = (0, 6, 0)


def _jax_version() -> tuple[int, ...]:
    info = getattr(getattr(jax, "version", None), "__version_info__", None)
    if info is None:
        info = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())
    return tuple(info)


if _jax_version() < MIN_JAX:
    raise ImportError(f"cuteforge.jax needs JAX >= 0.6; found jax {jax.__version__}")

from cuteforge import cache as _cache  # noqa: E402  (after the JAX check on purpose)
from cuteforge import compiler as _compiler  # noqa: E402
from cuteforge.arch import target_arch  # noqa: E402
from cuteforge.kernel import CompileSpec, Kernel  # noqa: E402
from cuteforge.signature import BoundKey, vector_width  # noqa: E402

_compiler.prepare_dsl()  # the DSL reads its target arch when first imported
from cuda.bindings.driver import CUstream  # noqa: E402  (the entry's annotations are resolved
from cutlass.jax.types import JaxTracedArray  # noqa: E402  in this module's globals)

__all__ = [
    "softmax",
    "log_softmax",
    "rms_norm",
    "layer_norm",
    "sum",
    "mean",
    "amax",
    "amin",
    "cross_entropy",
    "gemm",
    "compile_stats",
    "MIN_JAX",
]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
MAX_N = 262144  # the longest row the torch ops accept (softmax, norms); the same limit here
FFI_PREFIX = "cutlass_call"  # the symbol prefix the DSL's FFI runtime looks the entry up by
XLA_ALIGN = 16  # bytes every XLA buffer is at least aligned to (it uses more)


# --------------------------------------------------------------------------- operands
#
# A "form" says how one FFI buffer is shown to the kernel, in the layout the torch path's
# fake tensors give it: ("rows", N) a row-major (M, N) with N static, M dynamic and a
# 64-bit row stride; ("m",) a (M,) vector; ("n", N) a static (N,) vector; ("i64", ) an
# int32 (M, 2) buffer read as (M,) int64 (how int64 targets cross without jax_enable_x64);
# ("raw", ndim) the bridge's compact tensor as it is (the op's `arrange` builds the layout:
# the GEMM's operands share their dynamic extents).


def _present(t: Any, form: tuple[Any, ...]) -> Any:
    """Runs inside the @cute.jit entry: the bridge's compact tensor -> the kernel's tensor."""
    import cutlass
    import cutlass.cute as cute

    kind = form[0]
    if kind == "rows":
        n = form[1]
        # A 64-bit row stride as in the torch path's fake tensors (offsets past 2**31
        # elements), with the divisibility that the aligned vector accesses rely on.
        row_stride = cute.assume(cutlass.Int64(n), divby=n & -n)
        return cute.make_tensor(t.iterator, cute.make_layout((t.shape[0], n), stride=(row_stride, 1)))
    if kind == "n":
        return cute.make_tensor(t.iterator, cute.make_layout((form[1],), stride=(1,)))
    if kind == "m":
        return cute.make_tensor(t.iterator, cute.make_layout((t.shape[0],), stride=(1,)))
    if kind == "i64":
        ptr = cute.recast_ptr(t.iterator, dtype=cutlass.Int64)
        return cute.make_tensor(ptr, cute.make_layout((t.shape[0],), stride=(1,)))
    if kind == "raw":
        return t
    raise ValueError(f"unknown operand form {form!r}")


def _placeholder(dtype_name: str, form: tuple[Any, ...]) -> Any:
    """The compile-time stand-in of one FFI buffer. Its shape is fixed (M = 1) and every
    divisibility hint is 1, so the object never depends on the M that compiled it."""
    import cutlass
    from cutlass.jax.types import DEFAULT_CUTLASS_DEVICE_MEMSPACE, JaxArray, JaxTracedArray

    from .signature import cutlass_dtype

    kind = form[0]
    if kind == "rows":
        shape: tuple[int, ...] = (1, form[1])
    elif kind == "n":
        shape = (form[1],)
    elif kind == "i64":
        shape = (1, 2)
    elif kind == "raw":
        shape = (1,) * form[1]
    else:
        shape = (1,)
    dt = cutlass.Int32 if kind == "i64" else cutlass_dtype(dtype_name)
    array = JaxArray(dt, shape, DEFAULT_CUTLASS_DEVICE_MEMSPACE, XLA_ALIGN, None, None, False, (1,) * len(shape))
    return JaxTracedArray(array)


def _make_entry(run: Any, forms: tuple[tuple[Any, ...], ...], arrange: Callable[[list[Any]], list[Any]]) -> Any:
    """The exported host function: (stream, *FFI buffers) -> run(*kernel tensors, stream)."""
    import cutlass.cute as cute

    @cute.jit
    def cuteforge_jax_entry(stream: CUstream, *bufs: JaxTracedArray):
        tensors = [_present(b.get_tensor(), f) for b, f in zip(bufs, forms)]
        run(*arrange(tensors), stream)

    return cuteforge_jax_entry


# --------------------------------------------------------------------------- the cache

_L1: dict[str, tuple[bytes, bytes]] = {}  # jax key -> (object, sha256 digest)


def compile_stats() -> dict[str, float]:
    """cuteforge's cache counters for this process (shared with the torch ops)."""
    return _cache.STATS.as_dict()


def _build(spec: CompileSpec, kernel: Kernel, forms: tuple[tuple[Any, ...], ...], dtypes: tuple[str, ...],
           arrange: Callable[[list[Any]], list[Any]]) -> Callable[[bool], _compiler.CompileResult]:
    def build(keep_artifacts: bool) -> _compiler.CompileResult:
        _compiler.prepare_dsl(spec.arch)
        import cutlass.cute as cute

        entry = _make_entry(kernel.builder(spec), forms, arrange)
        args = [_placeholder(d, f) for d, f in zip(dtypes, forms)]
        with _compiler.artifact_options(keep_artifacts) as keep:
            with _compiler.COMPILE_LOCK:
                compiled = cute.compile(entry, CUstream(0), *args, options=f"--gpu-arch {spec.arch}{keep}")
                module = compiled.dump_to_object(FFI_PREFIX)
            ptx = getattr(compiled, "__ptx__", None) if keep_artifacts else None
            cubin = getattr(compiled, "__cubin__", None) if keep_artifacts else None
        return _compiler.CompileResult(module, None, ptx, cubin)  # type: ignore[arg-type]

    return build


def _module(kernel: Kernel, key: BoundKey, params: tuple[tuple[str, Any], ...], config: Any,
            forms: tuple[tuple[Any, ...], ...], dtypes: tuple[str, ...], layout: str,
            arrange: Callable[[list[Any]], list[Any]]) -> tuple[bytes, bytes]:
    """The FFI object for one kernel specialization: L1 dict, else the disk cache, else a
    compile (written to the disk cache under the same per-key lock protocol as torch's).

    `layout` names how the FFI buffers map onto the kernel's arguments (`arrange`), so
    two ops sharing a kernel with different buffer lists get different entries."""
    spec = kernel.spec(key, params, config)
    key_repr = repr(("jax", FFI_PREFIX, spec.key_repr(), forms, dtypes, layout))
    hit = _L1.get(key_repr)
    if hit is not None:
        _cache.STATS.l1_hits += 1
        return hit
    build = _build(spec, kernel, forms, dtypes, arrange)
    data = _cache.DEFAULT_CACHE.get_bytes(kernel=f"{kernel.name}.jax", key_repr=key_repr, arch=spec.arch, compile_fn=build,
                                          extra_fingerprint=kernel.source_fingerprint(), source_path=kernel.source_path)
    hit = (data, hashlib.sha256(data).digest())
    _L1[key_repr] = hit
    return hit


# --------------------------------------------------------------------------- the FFI call

_TARGET: list[str] = []


def _target() -> str:
    """The DSL runtime's XLA FFI handler (registered once per process)."""
    if not _TARGET:
        import cutlass.jax as cj

        if not cj.is_available():
            raise ImportError("cuteforge.jax: the CuTe DSL's JAX bridge (cutlass.jax) is not available here")
        version = cj.get_cutlass_call_ffi_version()
        cj.register_ffi(version)
        _TARGET.append(cj.get_cutlass_call_ffi_name(True, version))
    return _TARGET[0]


def _ffi(obj: tuple[bytes, bytes], inputs: Sequence[Any], outputs: Sequence[tuple[tuple[int, ...], Any]]) -> list[Any]:
    module, digest = obj
    shapes = [jax.ShapeDtypeStruct(s, d) for s, d in outputs]
    call = jax.ffi.ffi_call(_target(), shapes, vmap_method="sequential")
    return list(call(*inputs, module=module, key=digest))


# --------------------------------------------------------------------------- checks


def _dtype_name(dt: Any) -> str:
    return jnp.dtype(dt).name


def _check_array(where: str, name: str, a: Any, *, min_ndim: int = 1) -> None:
    if not isinstance(a, jax.Array):
        raise TypeError(f"{where}: argument {name!r} must be a jax.Array, got {type(a).__name__}")
    d = _dtype_name(a.dtype)
    if d not in _DTYPES:
        raise TypeError(f"{where}: argument {name!r} has dtype {d}; supported: float32, bfloat16, float16")
    if a.ndim < min_ndim:
        raise ValueError(f"{where}: argument {name!r} must have at least {min_ndim} dim, got a {a.ndim}-d array")


def _check_axis(where: str, axis: Any, ndim: int) -> None:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{where}: argument 'axis' must be an int, got {type(axis).__name__}")
    if axis not in (-1, ndim - 1):
        raise ValueError(
            f"{where}: argument 'axis' must be the last axis (-1 or {ndim - 1}) of a {ndim}-D input, got {axis}"
            " (move the axis last, e.g. with jnp.moveaxis)"
        )


def _check_n(where: str, name: str, n: int, limit: int = MAX_N) -> None:
    if n > limit:
        raise ValueError(f"{where}: argument {name!r} has a last dim of {n}; at most {limit} is supported")


def _rows_shape(x: Any) -> tuple[int, int]:
    n = int(x.shape[-1])
    return math.prod(int(s) for s in x.shape[:-1]), n


def _vec_rows(n: int, itemsize: int) -> int:
    """The vector width of a contiguous (M, n) XLA buffer: 16-byte aligned start."""
    return vector_width(0, (n,), itemsize)


def _vec_flat(itemsize: int) -> int:
    return vector_width(0, (), itemsize)


def _identity(ts: list[Any]) -> list[Any]:
    return ts


# --------------------------------------------------------------------------- softmax


def _softmax_kernel(mode: str, x2: Any) -> Any:
    from cuteforge.autotune import lookup
    from cuteforge.kernels.softmax.spec import config_for, kernel_params, softmax_bwd, softmax_fwd

    m, n = x2.shape
    d = _dtype_name(x2.dtype)
    bits = jnp.dtype(x2.dtype).itemsize * 8
    vec = _vec_rows(n, bits // 8)
    bwd = mode.endswith("_bwd")
    k = softmax_bwd if bwd else softmax_fwd
    nargs = 3 if bwd else 2
    key = BoundKey((d,) * nargs, (("N", n),), (vec,) * nargs)
    cfg = lookup(k, key, (("mode", mode),), {"M": m}) or config_for(target_arch(), n, bits, bwd, m, mode, key)
    forms = (("rows", n),) * nargs
    # XLA's buffers are aligned and these rows contiguous: every operand has the same heads
    return _module(k, key, kernel_params(mode, key, True), cfg, forms, (d,) * nargs, "identity", _identity)


def _softmax_impl(mode: str, x: Any) -> Any:
    m, n = _rows_shape(x)
    if m == 0 or n == 0:
        return jnp.zeros(x.shape, x.dtype)
    x2 = x.reshape(m, n)
    (y,) = _ffi(_softmax_kernel(mode, x2), [x2], [((m, n), x2.dtype)])
    return y.reshape(x.shape)


def _softmax_bwd_impl(mode: str, y: Any, dy: Any) -> Any:
    m, n = _rows_shape(y)
    if m == 0 or n == 0:
        return jnp.zeros(y.shape, y.dtype)
    y2, dy2 = y.reshape(m, n), dy.astype(y.dtype).reshape(m, n)
    (dx,) = _ffi(_softmax_kernel(f"{mode}_bwd", y2), [dy2, y2], [((m, n), y2.dtype)])
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
        _check_array(where, "x", x)
        _check_axis(where, axis, x.ndim)
        _check_n(where, "x", int(x.shape[-1]))
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


# --------------------------------------------------------------------------- reductions


def _reduce(op: str) -> Callable[..., Any]:
    def fn(x: jax.Array, axis: int = -1, keepdims: bool = False) -> jax.Array:
        from cuteforge.autotune import lookup
        from cuteforge.kernels.reduce.spec import config_for, row_reduce

        where = f"cuteforge.jax.{op}"
        _check_array(where, "x", x)
        _check_axis(where, axis, x.ndim)
        if not isinstance(keepdims, bool):
            raise TypeError(f"{where}: argument 'keepdims' must be a bool, got {type(keepdims).__name__}")
        m, n = _rows_shape(x)
        out_shape = tuple(x.shape[:-1]) + ((1,) if keepdims else ())
        if n == 0 and op in ("amax", "amin"):
            raise ValueError(f"{where}: argument 'x' has an empty last axis; {op} of nothing is undefined")
        if m == 0 or n == 0:
            fill = 0.0 if op == "sum" else float("nan")
            return jnp.full(out_shape, fill, x.dtype)
        d = _dtype_name(x.dtype)
        itemsize = jnp.dtype(x.dtype).itemsize
        key = BoundKey((d, d), (("N", n),), (_vec_rows(n, itemsize), _vec_flat(itemsize)))
        params = (("op", op),)
        cfg = lookup(row_reduce, key, params, {"M": m}) or config_for(target_arch(), n, itemsize * 8, m)
        obj = _module(row_reduce, key, params, cfg, (("rows", n), ("m",)), (d, d), "identity", _identity)
        (out,) = _ffi(obj, [x.reshape(m, n)], [((m,), x.dtype)])
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


# --------------------------------------------------------------------------- norms
#
# The forward and backward run as one jax.custom_vjp per (kind, eps, bias?, residual?):
# the forward saves what ops/norm.py saves (the normalised input x or x + residual,
# weight, mean, rstd); the backward is `norm_bwd`, whose dweight/dbias come out as fp32
# partials (Q, N) summed here, Q persistent CTA groups as in ops/norm.py.

_SMS: list[int] = []


def _sm_count() -> int:
    """SMs of the GPU the kernels run on: JAX's first CUDA device (`core_count`), else the
    target's flagship part (the torch ops' fallback without a GPU: 132 on sm_90a)."""
    if not _SMS:
        n = 0
        try:
            for d in jax.devices():
                if d.platform == "gpu" and getattr(d, "core_count", 0):
                    n = int(d.core_count)
                    break
        except RuntimeError:
            pass
        if not n:
            from cuteforge.arch import limits_for

            n = limits_for(target_arch()).sm_count
        _SMS.append(n)
    return _SMS[0]


def _check_norm(where: str, x: Any, weight: Any, bias: Any, eps: Any, residual: Any) -> int:
    """Argument errors naming the argument; returns N."""
    _check_array(where, "x", x)
    n = int(x.shape[-1])
    if not 1 <= n <= MAX_N:
        raise ValueError(f"{where}: argument 'x' must have a last dim in [1, {MAX_N}], got shape {tuple(x.shape)}")
    xd = _dtype_name(x.dtype)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, jax.Array):
            raise TypeError(f"{where}: argument {name!r} must be a jax.Array, got {type(t).__name__}")
        if _dtype_name(t.dtype) not in (xd, "float32"):
            raise TypeError(
                f"{where}: argument {name!r} has dtype {_dtype_name(t.dtype)}; it must be x's dtype ({xd}) or float32"
            )
        if tuple(t.shape) != (n,):
            raise ValueError(f"{where}: argument {name!r} must have shape ({n},) (x's last dim), got {tuple(t.shape)}")
    if bias is not None and bias.dtype != weight.dtype:
        raise TypeError(
            f"{where}: argument 'bias' has dtype {_dtype_name(bias.dtype)} but 'weight' has "
            f"{_dtype_name(weight.dtype)}; they must match"
        )
    if residual is not None:
        if not isinstance(residual, jax.Array):
            raise TypeError(f"{where}: argument 'residual' must be a jax.Array, got {type(residual).__name__}")
        if residual.dtype != x.dtype:
            raise TypeError(
                f"{where}: argument 'residual' has dtype {_dtype_name(residual.dtype)} but 'x' has {xd}; they must match"
            )
        if residual.shape != x.shape:
            raise ValueError(
                f"{where}: argument 'residual' has shape {tuple(residual.shape)} but 'x' has {tuple(x.shape)}"
            )
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{where}: argument 'eps' must be a float, got {type(eps).__name__}")
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
    xd, wd = _dtype_name(x2.dtype), _dtype_name(w.dtype)
    xs, ws = jnp.dtype(x2.dtype).itemsize, jnp.dtype(w.dtype).itemsize
    vx, vw = _vec_rows(n, xs), _vec_flat(ws)
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
    obj = _module(norm_fwd, key, params, None, tuple(forms), tuple(dtypes), layout, arrange)
    ins = [x2, w] + ([b] if has_b else []) + ([r2] if has_r else [])
    outs: list[tuple[tuple[int, ...], Any]] = [((m, n), x2.dtype)]
    if has_r:
        outs.append(((m, n), x2.dtype))
    outs.append(((m,), jnp.float32))
    if is_ln:
        outs.append(((m,), jnp.float32))
    res = iter(_ffi(obj, ins, outs))
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
    xd, wd = _dtype_name(xs.dtype), _dtype_name(w.dtype)
    xb, wb = jnp.dtype(xs.dtype).itemsize, jnp.dtype(w.dtype).itemsize
    cfg = norm_config.default_bwd_config(n, xb * 8, True, kind)
    blocks = -(-m // cfg.rows_per_cta)
    q = max(1, min(blocks, _sm_count() * cfg.ctas_per_sm // cfg.cluster_n))
    vx, vw, vp = _vec_rows(n, xb), _vec_flat(wb), _vec_rows(n, 4)
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
    obj = _module(norm_bwd, key, params, cfg, tuple(forms), tuple(dtypes), layout, arrange)
    ins = [xs, w, dy.astype(xs.dtype)] + ([dsum.astype(xs.dtype)] if has_d else []) + ([mean] if is_ln else []) + [rstd]
    outs: list[tuple[tuple[int, ...], Any]] = [((m, n), xs.dtype), ((q, n), jnp.float32)]
    if has_b:
        outs.append(((q, n), jnp.float32))
    res = _ffi(obj, ins, outs)
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


# --------------------------------------------------------------------------- cross-entropy

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
    d = _dtype_name(logits.dtype)
    itemsize = jnp.dtype(logits.dtype).itemsize
    v = _vec_rows(n, itemsize)
    if with_grad:
        key = BoundKey((d, "int64", "float32", "float32", d), (("N", n),), (v, 2, 4, 4, v))
    else:
        key = BoundKey((d, "int64", "float32", "float32"), (("N", n),), (v, 2, 4, 4))
    return key, config_for(n, itemsize * 8, with_grad)


def _ce_fwd_impl(ignore_index: int, logits: Any, pairs: Any) -> tuple[Any, Any]:
    """Per-row (loss, lse), fp32, through `cross_entropy_fwd`."""
    from cuteforge.kernels.cross_entropy.spec import cross_entropy_fwd

    m, n = logits.shape
    d = _dtype_name(logits.dtype)
    key, cfg = _ce_key(logits, False)
    obj = _module(cross_entropy_fwd, key, (("ignore_index", ignore_index),), cfg,
                  (("rows", n), ("i64",), ("m",), ("m",)), (d, "int64", "float32", "float32"), "identity", _identity)
    loss, lse = _ffi(obj, [logits, pairs], [((m,), jnp.float32), ((m,), jnp.float32)])
    return loss, lse


def _ce_bwd_impl(ignore_index: int, logits: Any, pairs: Any, lse: Any, dloss: Any) -> Any:
    """dlogits = (softmax - onehot) * dloss per row (ignored rows 0), `cross_entropy_bwd`."""
    from cuteforge.kernels.cross_entropy.spec import cross_entropy_bwd

    m, n = logits.shape
    d = _dtype_name(logits.dtype)
    key, cfg = _ce_key(logits, True)
    obj = _module(cross_entropy_bwd, key, (("ignore_index", ignore_index),), cfg,
                  (("rows", n), ("i64",), ("m",), ("m",), ("rows", n)), (d, "int64", "float32", "float32", d),
                  "identity", _identity)
    (dlogits,) = _ffi(obj, [logits, pairs, lse, dloss.astype(jnp.float32)], [((m, n), logits.dtype)])
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
    _check_array(where, "logits", logits, min_ndim=2)
    if logits.ndim != 2:
        raise ValueError(f"{where}: argument 'logits' must be 2-D (M, N), got shape {tuple(logits.shape)}")
    if not isinstance(target, jax.Array):
        raise TypeError(f"{where}: argument 'target' must be a jax.Array, got {type(target).__name__}")
    if not jnp.issubdtype(target.dtype, jnp.integer):
        raise TypeError(f"{where}: argument 'target' must have an integer dtype, got {_dtype_name(target.dtype)}")
    m, n = (int(s) for s in logits.shape)
    if tuple(target.shape) != (m,):
        raise ValueError(f"{where}: argument 'target' must have shape ({m},) (logits' rows), got {tuple(target.shape)}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{where}: argument 'reduction' must be one of {_REDUCTIONS}, got {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{where}: argument 'ignore_index' must be an int, got {type(ignore_index).__name__}")
    bits = 64 if jnp.dtype(target.dtype).itemsize >= 8 else 32
    if not -(2 ** (bits - 1)) <= ignore_index < 2 ** (bits - 1):
        raise ValueError(f"{where}: argument 'ignore_index'={ignore_index} does not fit the int{bits} targets")
    if n == 0:
        raise ValueError(f"{where}: argument 'logits' has no classes (N = 0)")
    _check_n(where, "logits", n, 1 << 20)
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


# --------------------------------------------------------------------------- gemm
#
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
    ad, od = _dtype_name(a3.dtype), _dtype_name(odt)
    ab, ob = jnp.dtype(a3.dtype).itemsize, jnp.dtype(odt).itemsize
    vecs = (vector_width(0, (m * k, k), ab), vector_width(0, (k * n, n), ab), vector_width(0, (m * n, n), ob))
    dtypes: tuple[str, ...] = (ad, ad, od, "int32")  # a, b, out, work (see _present_gemm)
    vecs += (4,)
    if bias is not None:
        bd = _dtype_name(bias.dtype)
        dtypes += (bd,)
        vecs += (_vec_flat(jnp.dtype(bias.dtype).itemsize),)
    key = BoundKey(dtypes, (), vecs)
    sms = _sm_count()
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
    obj = _module(kern, key, params, cfg, forms, ffi_dtypes, layout, _present_gemm(vecs, kinds))
    ins = [a3, b3] + ([bias] if bias is not None else [])
    (out,) = _ffi(obj, ins, [((n_l, m, n), odt)])
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
    plain = ("none", _dtype_name(cd))
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
        if _dtype_name(t.dtype) not in _GEMM_AB:
            raise TypeError(f"{where}: argument {name!r} has dtype {_dtype_name(t.dtype)}; supported: bfloat16, float16")
        if t.ndim not in (2, 3):
            raise ValueError(f"{where}: argument {name!r} must be 2-D or 3-D (batched), got shape {tuple(t.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"{where}: argument 'b' has dtype {_dtype_name(b.dtype)} but 'a' has {_dtype_name(a.dtype)}; "
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
        if _dtype_name(bias.dtype) not in _DTYPES:
            raise TypeError(f"{where}: argument 'bias' has dtype {_dtype_name(bias.dtype)}; "
                            "supported: float32, bfloat16, float16")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"{where}: argument 'bias' must have shape ({n},) (one value per output column), "
                             f"got {tuple(bias.shape)}")
    if out_dtype is None:
        odt = _dtype_name(a.dtype)
    else:
        try:
            odt = _dtype_name(out_dtype)
        except TypeError:
            raise TypeError(f"{where}: argument 'out_dtype' must be a dtype, got {out_dtype!r}") from None
        if odt not in _DTYPES:
            raise TypeError(f"{where}: argument 'out_dtype' is {odt}; supported: float32, bfloat16, float16")
    st = (act, odt)
    if a.ndim == 3 and b.ndim == 2:  # (L, M, K) @ (K, N): one (L*M, K) @ (K, N) GEMM
        n_l, m, k = (int(s) for s in a.shape)
        return _gemm_op(st, a.reshape(n_l * m, k), b, bias).reshape(n_l, m, n)
    if a.ndim == 2 and b.ndim == 3:
        a = jnp.broadcast_to(a[None], (int(b.shape[0]), *a.shape))
    return _gemm_op(st, a, b, bias)
