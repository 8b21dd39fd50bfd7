"""The online-softmax merge both softmax kernels fold their rows with (device code, traced
inline): (max, sum) pairs over base-2 exponentials, x already scaled by log2(e)."""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

NEG_INF = -math.inf


def merge_max_sum(a1, b1, a2, b2):
    """(max, sum) of two partials (a1, b1), (a2, b2): the larger max, and each sum rescaled
    to it; two empty partials (max -inf) give (-inf, 0) rather than a NaN."""
    m = cute.arch.fmax(a1, a2)
    ms = Float32(cutlass.select_(m == Float32(NEG_INF), Float32(0.0), m))
    s = b1 * cute.math.exp2(a1 - ms, fastmath=True) + b2 * cute.math.exp2(a2 - ms, fastmath=True)
    return m, s


def make_lane_reduce(merge, pair: bool):
    """@cute.jit lane_reduce(a, b, group) -> (a, b): the partials of each aligned group of
    ``group`` lanes (a Constexpr power of 2) merged by butterfly shuffles with ``merge(a, b,
    a_other, b_other)``, every lane ending with the group's result. Without ``pair`` only a
    is shuffled (b passes through merge as it is)."""

    @cute.jit
    def lane_reduce(a, b, group: cutlass.Constexpr):
        for step in cutlass.range_constexpr(int(math.log2(group))):
            off = group >> (step + 1)
            oa = cute.arch.shuffle_sync_bfly(a, offset=off)
            ob = b
            if cutlass.const_expr(pair):
                ob = cute.arch.shuffle_sync_bfly(b, offset=off)
            a, b = merge(a, b, oa, ob)
        return a, b

    return lane_reduce
