"""Pointwise kernels as cuteforge kernels: the SwiGLU activation and the rotary position
embedding, each forward and backward. Every extent and stride is dynamic (the rotary
head dim excepted), so one compiled kernel per dtype and alignment serves every shape.
"""

from __future__ import annotations

from typing import Any

from ...kernel import CompileSpec, kernel
from ...signature import Signature, TensorArg

ROWS = ("M", "N")
MAX_HEAD_DIM = 1024  # rotary: a CTA holds at least a thread per vector of half a head
SILU_MUL = Signature(
    TensorArg("gate", ROWS), TensorArg("up", ROWS, dtype_like="gate"), TensorArg("out", ROWS, dtype_like="gate"),
)
SILU_MUL_BACKWARD = Signature(
    TensorArg("grad", ROWS), TensorArg("gate", ROWS, dtype_like="grad"), TensorArg("up", ROWS, dtype_like="grad"),
    TensorArg("dgate", ROWS, dtype_like="grad"), TensorArg("dup", ROWS, dtype_like="grad"),
)
ROTARY = Signature(
    TensorArg("q", ("B", "HQ", "S", "D")), TensorArg("k", ("B", "HK", "S", "D"), dtype_like="q"),
    TensorArg("cos", ("B", "S", "D"), dtype_like="q"), TensorArg("sin", ("B", "S", "D"), dtype_like="q"),
    TensorArg("q_out", ("B", "HQ", "S", "D"), dtype_like="q"), TensorArg("k_out", ("B", "HK", "S", "D"), dtype_like="q"),
    static=("D",),
)


def common_vec(spec: CompileSpec, names: tuple[str, ...], divides: int | None = None) -> int:
    """The widest vector every operand is aligned to (and that divides ``divides``)."""
    vec = min(spec.vec(n) for n in names)
    while divides is not None and divides % vec:
        vec //= 2
    return vec


def silu_mul_tiling(n: int) -> dict[str, int]:
    """threads (32..256) and unroll (4 for rows of 4 x threads 16-byte vectors or more) for rows of n elements."""
    vectors = max(1, (n + 7) // 8)
    threads = 32
    while threads < 256 and threads < vectors:
        threads *= 2
    return {"threads": threads, "unroll": 4 if vectors >= 4 * threads else 1}


def _silu_mul(spec: CompileSpec, backward: bool) -> Any:
    from .swiglu import make_silu_mul

    names = tuple(a.name for a in (SILU_MUL_BACKWARD if backward else SILU_MUL).args)
    return make_silu_mul(spec.dtype(names[0]), common_vec(spec, names), int(spec.param("threads")),
                         int(spec.param("unroll")), backward)


@kernel(name="silu_mul", signature=SILU_MUL, archs=("sm_80+",))
def silu_mul(spec: CompileSpec) -> Any:
    return _silu_mul(spec, backward=False)


@kernel(name="silu_mul_backward", signature=SILU_MUL_BACKWARD, archs=("sm_80+",))
def silu_mul_backward(spec: CompileSpec) -> Any:
    return _silu_mul(spec, backward=True)


@kernel(name="rotary_embedding", signature=ROTARY, archs=("sm_80+",))
def rotary_embedding(spec: CompileSpec) -> Any:
    from .rotary import make_rotary

    head_dim = spec.static("D")
    vec = common_vec(spec, tuple(a.name for a in ROTARY.args), head_dim // 2)
    return make_rotary(spec.dtype("q"), head_dim, vec, bool(spec.param("backward")))
