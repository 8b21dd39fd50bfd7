"""Host-side pieces of the cross-entropy kernels (no DSL): the heuristic config of each
direction, `ce_config`, and the reduced forward's workspace layout (`reduce_group`, the
WORK_ words, `reduce_fits`, `work_words`), which the op sizes and zeroes its workspace by.
The device code is device.py."""

from __future__ import annotations

from ..reduce.config import RowReduceConfig
from ..rows.tiling import pow2_ceil

__all__ = ["GROUP_MAX", "REDUCE_CHUNK", "WORK_ZERO", "ce_config", "reduce_fits", "reduce_group", "work_words"]


def ce_config(n: int, dtype_bits: int, backward: bool = False) -> RowReduceConfig:
    """One row per CTA from 64 threads per row up (a CTA holding several long rows makes
    each wait for the others at the cross-warp merge: the forward lost 10-30 % that way
    on the H200), then (H200 sweeps):

    - forward: 4 vectors in flight per thread (the cp.async ring's chunk), a row share of
      about 4 vectors (8 for rows of 1025-2048 vectors and 16-bit rows of 1024), at most
      512 threads looping over longer rows (1024-thread CTAs ran one per SM: 59-88 % of
      copy at 16-bit N = 32768-65536 against 107-109 %), 256 for 16-bit rows of at most
      4096 vectors (N = 32001, whose realigned build takes 50 registers: 512 threads read
      88-90 % of copy on the H200, 256 102-104; level at 32768; longer rows lost 1.5-5
      points on 256 through the op on an H100);
    - backward: about 4 vectors per thread (8 for rows of 1025-2048 vectors), up to 1024
      threads; rows of 4096 vectors and more 512 threads x 8 vectors in flight."""
    nv = -(-n // (128 // dtype_bits))
    if backward and nv >= 4096:
        cfg = RowReduceConfig(512, 512, 8)
    else:
        per = 8 if 1024 < nv <= 2048 or (not backward and dtype_bits == 16 and nv == 1024) else 4
        p = min(1024 if backward else (256 if dtype_bits == 16 and nv <= 4096 else 512), pow2_ceil(max(1, -(-nv // per))))
        cfg = RowReduceConfig(256 if p <= 32 else p, p, max(1, min(per if backward else 4, -(-nv // p))))
    cfg.validate(n, dtype_bits)
    return cfg


# The reduced forward's workspace, int32 words (one per device and stream, see ops): ticket
# counters (0 between launches), then the group partials, then the CTA partials (pad after
# them: the last CTA of a group loads whole chunks and masks what lies beyond the group).
REDUCE_CHUNK = 8  # partials each thread of a reducing CTA loads before adding them


def reduce_group(threads: int) -> int:
    """CTAs per group S: the last CTA of a group adds the group's partials, S / threads per
    thread; at least 2048 (small CTAs), 8 per thread from 256 threads up."""
    return max(2048, REDUCE_CHUNK * threads)


GROUP_MAX = reduce_group(1024)
WORK_TOP = 0  # the top level's ticket counter
WORK_CNT1 = 32  # one ticket counter per group
WORK_GSUM = WORK_CNT1 + GROUP_MAX  # per-group partial sums (fp32 bits) ...
WORK_GCNT = WORK_GSUM + GROUP_MAX  # ... and counts
WORK_PART = WORK_GCNT + GROUP_MAX  # per-CTA sums [G], then counts [G]
WORK_ZERO = WORK_GSUM  # words that must be 0 when a launch starts


def reduce_fits(ctas: int, threads: int) -> bool:
    """Two levels of groups reach S^2 CTAs (at least 4M: M of 4M rows and more)."""
    s = reduce_group(threads)
    return ctas <= s * s


def work_words(ctas: int) -> int:
    """Workspace words for a grid of `ctas` CTAs."""
    return WORK_PART + 2 * ctas + GROUP_MAX
