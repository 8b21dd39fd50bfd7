"""cuteforge's kernels on JAX arrays, inside ``jax.jit``.

    import jax, jax.numpy as jnp
    import cuteforge.jax as cfj

    @jax.jit
    def f(x, w):
        return cfj.rms_norm(cfj.softmax(x), w, 1e-6)

Each op builds the same kernel as the torch op of the same name (the builders in
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

import hashlib
import math
from collections.abc import Callable, Sequence
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
# int32 (M, 2) buffer read as (M,) int64 (how int64 targets cross without jax_enable_x64).


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
        options = f"--gpu-arch {spec.arch}"
        if keep_artifacts:
            options += " --keep-ptx --keep-cubin"
        with _compiler.COMPILE_LOCK:
            compiled = cute.compile(entry, CUstream(0), *args, options=options)
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
    from cuteforge.kernels.softmax.spec import config_for, softmax_bwd, softmax_fwd

    m, n = x2.shape
    d = _dtype_name(x2.dtype)
    bits = jnp.dtype(x2.dtype).itemsize * 8
    vec = _vec_rows(n, bits // 8)
    bwd = mode.endswith("_bwd")
    k = softmax_bwd if bwd else softmax_fwd
    nargs = 3 if bwd else 2
    key = BoundKey((d,) * nargs, (("N", n),), (vec,) * nargs)
    params = (("mode", mode),)
    cfg = lookup(k, key, params, {"M": m}) or config_for(target_arch(), n, bits, bwd, m)
    forms = (("rows", n),) * nargs
    return _module(k, key, params, cfg, forms, (d,) * nargs, "identity", _identity)


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


def _norm(kind: str, x: Any, weight: Any, bias: Any, eps: Any, residual: Any) -> Any:
    from cuteforge.kernels.norm.spec import norm_fwd

    where = f"cuteforge.jax.{kind}_norm"
    _check_array(where, "x", x)
    m, n = _rows_shape(x)
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
    if m == 0:
        y = jnp.zeros(x.shape, x.dtype)
        return y if residual is None else (y, jnp.zeros(x.shape, x.dtype))

    has_b, has_r, is_ln = bias is not None, residual is not None, kind == "layer"
    wd = _dtype_name(weight.dtype)
    xs, ws = jnp.dtype(x.dtype).itemsize, jnp.dtype(weight.dtype).itemsize
    vx, vw = _vec_rows(n, xs), _vec_flat(ws)
    key = BoundKey((xd, wd, wd, xd, xd, xd, "float32", "float32"), (("N", n),), (vx, vw, vw, vx, vx, vx, 4, 4))
    params = (("eps", float(eps)), ("has_bias", has_b), ("has_residual", has_r), ("kind", kind))
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
    ins = [x.reshape(m, n), weight] + ([bias] if has_b else []) + ([residual.reshape(m, n)] if has_r else [])
    outs: list[tuple[tuple[int, ...], Any]] = [((m, n), x.dtype)]
    if has_r:
        outs.append(((m, n), x.dtype))
    outs.append(((m,), jnp.float32))
    if is_ln:
        outs.append(((m,), jnp.float32))
    res = _ffi(obj, ins, outs)
    y = res[0].reshape(x.shape)
    return (y, res[1].reshape(x.shape)) if has_r else y


def rms_norm(x: jax.Array, weight: jax.Array, eps: float = 1e-6, *, residual: jax.Array | None = None) -> Any:
    """RMSNorm over the last axis: y = x / sqrt(mean(x^2) + eps) * weight (fp32 math, y in
    x's dtype; weight in x's dtype or float32). With ``residual``, normalises h = x +
    residual and returns (y, h). Forward only; usable inside jax.jit."""
    return _norm("rms", x, weight, None, eps, residual)


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array | None = None, eps: float = 1e-5, *,
               residual: jax.Array | None = None) -> Any:
    """LayerNorm over the last axis (biased variance, fp32 math), with optional bias and
    fused residual (returns (y, x + residual) then). Forward only; usable inside jax.jit."""
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


def cross_entropy(logits: jax.Array, target: jax.Array, *, reduction: str = "mean",
                  ignore_index: int = -100) -> jax.Array:
    """Cross-entropy of (M, N) logits (float32/bfloat16/float16) against (M,) integer class
    targets, as cuteforge.ops.cross_entropy: fp32 loss, rows whose target is
    ``ignore_index`` contribute 0 and are left out of the mean. Forward only."""
    from cuteforge.kernels.cross_entropy.spec import config_for, cross_entropy_fwd

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
        d = _dtype_name(logits.dtype)
        itemsize = jnp.dtype(logits.dtype).itemsize
        key = BoundKey((d, "int64", "float32", "float32"), (("N", n),), (_vec_rows(n, itemsize), 2, 4, 4))
        params = (("ignore_index", ignore_index),)
        obj = _module(cross_entropy_fwd, key, params, config_for(n, itemsize * 8),
                      (("rows", n), ("i64",), ("m",), ("m",)), (d, "int64", "float32", "float32"),
                      "identity", _identity)
        loss, _lse = _ffi(obj, [logits, _as_int64_pairs(target)], [((m,), jnp.float32), ((m,), jnp.float32)])
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    count = jnp.sum(target != ignore_index)
    return jnp.sum(loss) / count.astype(jnp.float32)
