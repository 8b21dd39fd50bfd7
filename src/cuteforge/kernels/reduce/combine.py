"""What a reduction op is, as the row and column kernels fold it (device code, traced
inline): the start value, the pairwise combine, the per-chain update as elements arrive
and the merge of two partials; argmax keeps an Int32 index beside each value and merges
with torch's rule (first NaN, else first maximum)."""

from __future__ import annotations

import math
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .config import OPS

SENTINEL = 2**31 - 1  # "no index yet" for argmax chains


def select(cond: Any, a: Any, b: Any, ty: Any) -> Any:
    return ty(cutlass.select_(cond, a, b))


def argmax_take(v_new: Any, i_new: Any, v_old: Any, i_old: Any) -> Any:
    """True if (v_new, i_new) beats (v_old, i_old) under torch's GreaterOrNan."""
    new_nan = v_new != v_new
    old_nan = v_old != v_old
    lower = i_new < i_old
    gt = v_new > v_old
    eq = v_new == v_old
    # new NaN: wins unless old is NaN with a lower index
    nan_case = new_nan & ((~old_nan) | lower)
    # new number: wins only against a number that is smaller (or equal, higher idx)
    num_case = (~new_nan) & (~old_nan) & (gt | (eq & lower))
    return nan_case | num_case


class ReduceOp:
    """One of OPS: ``init`` (the value of an empty chain), ``accumulate`` and ``merge``."""

    def __init__(self, op: str) -> None:
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
        self.op = op
        self.is_arg = op == "argmax"
        self.init = 0.0 if op in ("sum", "mean") else (-math.inf if op in ("amax", "argmax") else math.inf)

    def check_operands(self, in_dtype: Any, out_dtype: Any, vec: int) -> None:
        """Raise ValueError unless the kernels take these dtypes and vector width."""
        if in_dtype not in (Float32, cutlass.BFloat16, cutlass.Float16):
            raise ValueError(f"unsupported input dtype {in_dtype}")
        bits = in_dtype.width
        if vec not in (1, 2, 4, 8) or vec * bits > 128:
            raise ValueError(f"vec={vec} invalid for {bits}-bit dtype (vec*bits must be <= 128)")
        if self.is_arg and out_dtype is not Int64:
            raise ValueError(f"argmax writes Int64 indices, got out_dtype={out_dtype}")

    def combine(self, a: Any, b: Any) -> Any:
        if self.op in ("sum", "mean"):
            return a + b
        if self.op == "amax":
            return cute.arch.fmax(a, b, nan=True)
        return cute.arch.fmin(a, b, nan=True)

    @cute.jit
    def accumulate(self, acc, aidx, v: cutlass.Constexpr, xv, idx):
        """Chain v takes element xv at index idx (elements arrive in increasing index order)."""
        xf = xv.to(Float32)
        if cutlass.const_expr(self.is_arg):
            old = acc[v]
            take = (~(xf <= old)) & (old == old)  # strictly greater, or first NaN
            acc[v] = select(take, xf, old, Float32)
            aidx[v] = select(take, Int32(idx), aidx[v], Int32)
        else:
            acc[v] = self.combine(acc[v], xf)

    @cute.jit
    def merge(self, val, idx, oval, oidx):
        """The two partials (val, idx) and (oval, oidx) as one."""
        if cutlass.const_expr(self.is_arg):
            take = argmax_take(oval, oidx, val, idx)
            return select(take, oval, val, Float32), select(take, oidx, idx, Int32)
        else:
            return self.combine(val, oval), idx
