"""`SoftmaxConfig`: the launch and tiling knobs of the softmax kernels and `validate`.

The row stays on chip: each of the ``threads_per_row * cluster_n`` threads that share a
row holds about ``n / (threads_per_row * cluster_n)`` elements of it (of each input: one
for the forward, two for the backward) as fp32. That count is what a config trades: more
elements per thread means fewer threads and CTAs per row (cheaper reductions, no cluster)
but more registers per thread, hence fewer CTAs resident per SM to overlap one CTA's
reduction with another's loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....arch import DeviceLimits
from ...rows.tiling import RowTiling, is_pow2

MODES = ("softmax", "log_softmax", "softmax_bwd", "log_softmax_bwd")
# Kernel variants (`SoftmaxConfig.path`):
#   regs   device.py: rows interleaved over the cluster, loads straight into registers,
#          full cluster barrier for the DSMEM exchange
#   mbar   chunked.py: each CTA owns a contiguous chunk of the row, loads into registers,
#          the (max, sum) exchange is st.async + an mbarrier's transaction count
#   async  as mbar, but the chunk arrives through cp.async into shared memory and is then
#          converted into registers
#   smem   as async, but the row is never held in registers: max, sum and the output
#          are three passes over shared memory (exponentials recomputed), so registers
#          stay free and the CTAs per SM are limited by shared memory instead
#   The backward has regs and mbar (chunked.make_softmax_chunked_bwd: one fp32 sum per
#   warp and row over st.async; cluster_n >= 2, threads_per_row a multiple of 32).
PATHS = ("regs", "mbar", "async", "smem")
STAGED_PATHS = ("async", "smem")
SMEM_PER_SM = 227 * 1024
CLUSTER_SIZES = (1, 2, 4, 8, 16)  # 16 is non-portable; the DSL marks kernels to allow it
REGS_PER_SM = 65536
MAX_REGS_PER_THREAD = 255
OVERHEAD_REGS = 32  # addressing, reduction temporaries, predicates
# Elements of one input a thread may hold (fp32 registers): above this ptxas spills.
MAX_ELEMS = {False: 128, True: 64}


def is_backward(mode: str) -> bool:
    if mode not in MODES:
        raise ValueError(f"unknown softmax mode {mode!r}; expected one of {MODES}")
    return mode.endswith("_bwd")


@dataclass(frozen=True)
class SoftmaxConfig(RowTiling):
    """threads:          CTA size (multiple of 32, <= 1024).
    threads_per_row:  threads of one CTA sharing a row (power of 2 dividing threads);
                      rows per CTA = threads // threads_per_row.
    cluster_n:        CTAs sharing a row (1 = none; 2..16 an sm_90 thread-block
                      cluster, partial reductions exchanged through DSMEM).
    path:             kernel variant, one of PATHS (module comment above); anything but
                      "regs" is sm_90+; "async" / "smem" are forward-only, the backward
                      has "regs" and "mbar" (the latter with a cluster, chunked.py).
    """

    threads: int = 128
    threads_per_row: int = 128
    cluster_n: int = 1
    path: str = "regs"

    def elems_per_thread(self, n: int) -> int:
        """Upper bound on one input's elements a thread holds (any vector width)."""
        return -(-n // (self.threads_per_row * self.cluster_n))

    def est_regs_per_thread(self, n: int, backward: bool) -> int:
        if self.path == "smem":
            return OVERHEAD_REGS + 16  # one 16-byte vector at a time, converted
        return self.elems_per_thread(n) * (2 if backward else 1) + OVERHEAD_REGS

    def stage_bytes(self, n: int, dtype_bits: int) -> int:
        """Shared memory of the staged paths: each CTA's rows chunk (at 16-byte vectors)."""
        if self.path not in STAGED_PATHS:
            return 0
        vec = 128 // dtype_bits
        nv = -(-n // vec)
        rounds = -(-nv // (self.threads_per_row * self.cluster_n))
        return self.rows_per_cta * rounds * self.threads_per_row * 16

    def smem_bytes(self, n: int = 0, dtype_bits: int = 32) -> int:
        warps_per_row = max(self.threads_per_row // 32, 1)
        red = self.rows_per_cta * warps_per_row * self.cluster_n * 8  # (max, sum) fp32 pairs
        return red + 16 + (self.stage_bytes(n, dtype_bits) if n else 0)

    def validate(self, n: int, dtype_bits: int, backward: bool = False, limits: DeviceLimits | None = None) -> None:
        """Raise ValueError if this config cannot run rows of n elements of dtype_bits bits."""
        t, p, c = self.threads, self.threads_per_row, self.cluster_n
        self.check_rows(n, dtype_bits)
        if not is_pow2(p) or p > t or t % p != 0:
            raise ValueError(f"threads_per_row={p}: must be a power of 2 dividing threads={t}")
        if c not in CLUSTER_SIZES:
            raise ValueError(f"cluster_n={c}: must be one of {CLUSTER_SIZES}")
        if self.path not in PATHS:
            raise ValueError(f"path={self.path!r}: must be one of {PATHS}")
        if self.path != "regs":
            if backward and self.path != "mbar":
                raise ValueError(f"path={self.path!r} is forward-only; the backward has paths 'regs' and 'mbar'")
            if backward and c < 2:
                raise ValueError(f"path='mbar' backward needs a cluster (cluster_n >= 2), got cluster_n={c}; use path='regs'")
            if c > 1 and p % 32:
                raise ValueError(f"path={self.path!r} with a cluster needs threads_per_row a multiple of 32, got {p}")
            if self.path in STAGED_PATHS and self.smem_bytes(n, dtype_bits) > SMEM_PER_SM:
                raise ValueError(
                    f"path={self.path!r}: {self.smem_bytes(n, dtype_bits)} B of shared memory per CTA > {SMEM_PER_SM} B; "
                    "use a larger cluster_n or fewer rows per CTA"
                )
        if c > 1:
            need = c * p * (128 // dtype_bits)
            if n < need:
                raise ValueError(
                    f"cluster_n={c} with threads_per_row={p} needs n >= {need} "
                    f"(one 16-byte vector per thread of the cluster); got n={n}"
                )
        e = self.elems_per_thread(n)
        if e > MAX_ELEMS[backward] and self.path != "smem":
            raise ValueError(
                f"{e} elements per thread > {MAX_ELEMS[backward]} (registers would spill); "
                "use more threads_per_row or a larger cluster_n"
            )
        regs = self.est_regs_per_thread(n, backward)
        if regs > MAX_REGS_PER_THREAD or regs * t > REGS_PER_SM:
            raise ValueError(f"~{regs} registers/thread x {t} threads > {REGS_PER_SM} per SM; use fewer threads")
        if limits is not None:
            if t > limits.threads_per_block:
                raise ValueError(f"threads={t} > {limits.threads_per_block} per block on sm_{limits.sm}")
            if c > 1 and limits.max_cluster_size <= 1:
                raise ValueError(f"cluster_n={c}: sm_{limits.sm} has no thread-block clusters")
            if self.path != "regs" and limits.sm < 90:
                raise ValueError(f"path={self.path!r} needs sm_90 (mbarrier transaction counts, st.async); got sm_{limits.sm}")
            if self.smem_bytes(n, dtype_bits) > limits.smem_per_block:
                raise ValueError(f"shared memory {self.smem_bytes(n, dtype_bits)} B > {limits.smem_per_block} B on sm_{limits.sm}")
