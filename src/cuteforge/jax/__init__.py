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

Importing ``cuteforge`` never imports JAX; importing this package needs JAX >= 0.6.
Modules: ``bridge`` (operand forms, compile, cache, the FFI call, argument checks), then
one module per family: ``softmax``, ``reduce``, ``norm``, ``cross_entropy``, ``gemm``.
"""

from .bridge import MIN_JAX, compile_stats
from .cross_entropy import cross_entropy
from .gemm import gemm
from .norm import layer_norm, rms_norm
from .reduce import amax, amin, mean, sum
from .softmax import log_softmax, softmax

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
