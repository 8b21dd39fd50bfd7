"""The bridge from cuteforge's kernels to XLA: the operand forms a kernel sees, the
compile of its XLA FFI object through the DSL's JAX bridge (`cutlass.jax`), the object's
place in cuteforge's persistent cache, the FFI call, and the argument checks the ops share.
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
from cuteforge import checks  # noqa: E402
from cuteforge import compiler as _compiler  # noqa: E402
from cuteforge.arch import target_arch  # noqa: E402
from cuteforge.kernel import CompileSpec, Kernel  # noqa: E402
from cuteforge.signature import BoundKey, vector_width  # noqa: E402

_compiler.prepare_dsl()  # the DSL reads its target arch when first imported
from cuda.bindings.driver import CUstream  # noqa: E402  (the entry's annotations are resolved
from cutlass.jax.types import JaxTracedArray  # noqa: E402  in this module's globals)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
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

    from ..signature import cutlass_dtype

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


def kernel_object(kernel: Kernel, key: BoundKey, params: tuple[tuple[str, Any], ...], config: Any,
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


def ffi(obj: tuple[bytes, bytes], inputs: Sequence[Any], outputs: Sequence[tuple[tuple[int, ...], Any]]) -> list[Any]:
    module, digest = obj
    shapes = [jax.ShapeDtypeStruct(s, d) for s, d in outputs]
    call = jax.ffi.ffi_call(_target(), shapes, vmap_method="sequential")
    return list(call(*inputs, module=module, key=digest))


# --------------------------------------------------------------------------- checks


def dtype_name(dt: Any) -> str:
    return jnp.dtype(dt).name


def check_array(where: str, name: str, a: Any, *, min_ndim: int = 1) -> None:
    if not isinstance(a, jax.Array):
        raise TypeError(f"{where}: argument {name!r} must be a jax.Array, got {type(a).__name__}")
    d = dtype_name(a.dtype)
    if d not in DTYPES:
        raise TypeError(f"{where}: argument {name!r} has dtype {d}; supported: float32, bfloat16, float16")
    if a.ndim < min_ndim:
        raise ValueError(f"{where}: argument {name!r} must have at least {min_ndim} dim, got a {a.ndim}-d array")


def check_axis(where: str, axis: Any, ndim: int) -> None:
    checks.last_dim(where, "axis", axis, ndim, "move the axis last, e.g. with jnp.moveaxis")


def check_n(where: str, name: str, n: int, limit: int = MAX_N) -> None:
    if n > limit:
        raise ValueError(f"{where}: argument {name!r} has a last dim of {n}; at most {limit} is supported")


def rows_shape(x: Any) -> tuple[int, int]:
    n = int(x.shape[-1])
    return math.prod(int(s) for s in x.shape[:-1]), n


def vec_rows(n: int, itemsize: int) -> int:
    """The vector width of a contiguous (M, n) XLA buffer: 16-byte aligned start."""
    return vector_width(0, (n,), itemsize)


def vec_flat(itemsize: int) -> int:
    return vector_width(0, (), itemsize)


def identity(ts: list[Any]) -> list[Any]:
    return ts


_SMS: list[int] = []


def sm_count() -> int:
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
