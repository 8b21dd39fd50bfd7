"""Device-side implementations of the fusion operations on CuTe `TensorSSA` values.

Called while a `@cute.jit` / `@cute.kernel` function traces (plain Python helpers: the
DSL records the cute operations they issue), both by `Epilogue.apply` and by the source
text `Epilogue.source` renders (`cf_ops.relu(...)`). Operands are fp32 `TensorSSA`
values of one shape, or Python numbers (compile-time constants).

Semantics follow torch: `relu`/`minimum`/`maximum` propagate NaN, `gelu` is the exact
erf form (`gelu_tanh` the tanh approximation), `sigmoid(x) = 1 / (1 + exp(-x))`.
"""

from __future__ import annotations

import math
from typing import Any

import cutlass
import cutlass.cute as cute

_SQRT1_2 = 0.7071067811865476
_SQRT2_PI = 0.7978845608028654
_GELU_C2 = 0.044715 * _SQRT2_PI


def _num(x: Any) -> bool:
    return isinstance(x, (int, float))


def _tensorize(x: Any, like: Any) -> Any:
    """A Python number as a TensorSSA shaped like `like` (some cute ops want two tensors)."""
    if _num(x):
        return cute.full_like(like, float(x), cutlass.Float32)
    return x


def neg(x: Any) -> Any:
    return -x if _num(x) else cute.math.neg(x)


def abs(x: Any) -> Any:  # noqa: A001 - the fusion op's name
    return math.fabs(x) if _num(x) else cute.math.abs(x)


def exp(x: Any) -> Any:
    return math.exp(x) if _num(x) else cute.math.exp(x)


def tanh(x: Any) -> Any:
    return math.tanh(x) if _num(x) else cute.math.tanh(x)


def sqrt(x: Any) -> Any:
    return math.sqrt(x) if _num(x) else cute.math.sqrt(x)


def rsqrt(x: Any) -> Any:
    return 1.0 / math.sqrt(x) if _num(x) else cute.math.rsqrt(x)


def log(x: Any) -> Any:
    return math.log(x) if _num(x) else cute.math.log(x)


def sigmoid(x: Any) -> Any:
    if _num(x):
        return 1.0 / (1.0 + math.exp(-x))
    return 1.0 / (cute.math.exp(-x) + 1.0)


def silu(x: Any) -> Any:
    return x * sigmoid(x)


def relu(x: Any) -> Any:
    if _num(x):
        return x if x != x or x >= 0 else 0.0
    # x < 0 is false for NaN, so NaN passes through as in torch.relu
    return cute.where(x < 0.0, cute.full_like(x, 0.0), x)


def gelu(x: Any) -> Any:
    if _num(x):
        return 0.5 * x * (1.0 + math.erf(x * _SQRT1_2))
    return x * 0.5 * (cute.math.erf(x * _SQRT1_2) + 1.0)


def gelu_tanh(x: Any) -> Any:
    if _num(x):
        return 0.5 * x * (1.0 + math.tanh(_SQRT2_PI * (x + 0.044715 * x * x * x)))
    # 0.5x + 0.5x tanh(x (c1 + c2 x^2)): five FP32 ops (ptxas fuses the mul-adds) and one
    # tanh, against eight before; in a GEMM epilogue this math is not hidden by the MMAs.
    half = x * 0.5
    return half * cute.math.tanh(x * (x * x * _GELU_C2 + _SQRT2_PI)) + half


def minimum(a: Any, b: Any) -> Any:
    if _num(a) and _num(b):
        return a if a != a or a <= b else b
    like = b if _num(a) else a
    return cute.math.min(_tensorize(a, like), _tensorize(b, like), propagate_nan=True)


def maximum(a: Any, b: Any) -> Any:
    if _num(a) and _num(b):
        return a if a != a or a >= b else b
    like = b if _num(a) else a
    return cute.math.max(_tensorize(a, like), _tensorize(b, like), propagate_nan=True)


def _cmp(a: Any, b: Any, op: str) -> Any:
    like = b if _num(a) else a
    a, b = _tensorize(a, like), _tensorize(b, like)
    return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[op]


def _comparison(op: str) -> Any:
    """The fusion op `op` (lt, le, ...): `_cmp` under the op's own name."""

    def compare(a: Any, b: Any) -> Any:
        return _cmp(a, b, op)

    compare.__name__ = compare.__qualname__ = op
    return compare


# the names Epilogue.source renders (cf_ops.lt(...)) and Epilogue.apply looks up
lt, le, gt, ge, eq, ne = (_comparison(op) for op in ("lt", "le", "gt", "ge", "eq", "ne"))


def where(cond: Any, a: Any, b: Any) -> Any:
    a = cute.full_like(cond, float(a), cutlass.Float32) if _num(a) else a
    b = cute.full_like(cond, float(b), cutlass.Float32) if _num(b) else b
    return cute.where(cond, a, b)
