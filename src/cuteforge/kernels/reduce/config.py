"""Launch configs of the reduction kernels: `RowReduceConfig` (the last-dim kernel,
row.py) and `ColReduceConfig` (any other dim, col.py), each with its validation, the
heuristic default and the autotuner's candidates."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...arch import DeviceLimits
from ..rows.tiling import RowTiling, is_pow2, pow2_ceil

OPS = ("sum", "mean", "amax", "amin", "argmax")
LOAD_HINTS = ("", "nc", "no_alloc", "l2_256", "no_alloc_l2_256", "cs")

_SMEM_LIMIT = 227 * 1024  # sm_90 opt-in max dynamic smem per CTA
_REGS_PER_SM = 65536
_MAX_REGS_PER_THREAD = 255


@dataclass(frozen=True)
class RowReduceConfig(RowTiling):
    """Launch/tiling knobs of the row-reduce kernel (hashable, picklable).

    threads:          CTA size (multiple of 32, <= 1024).
    threads_per_row:  threads cooperating on one row (power of 2, <= threads);
                      rows per CTA = threads // threads_per_row.
    unroll:           vector loads issued per thread before they are reduced
                      (loads in flight per thread), 1..16.
    cluster_n:        CTAs per row (1 = no cluster; 2/4/8 use an sm_90 cluster
                      and a DSMEM reduction).
    load_hint:        cache qualifiers of the vector loads, one of LOAD_HINTS
                      ("" = plain ld.global; see the module docstring).
    """

    threads: int = 256
    threads_per_row: int = 256
    unroll: int = 4
    cluster_n: int = 1
    load_hint: str = ""

    @property
    def warps_per_row(self) -> int:
        return max(self.threads_per_row // 32, 1)

    def smem_bytes(self) -> int:
        # fp32 partial + int32 index per (row, warp-of-row, cta-of-cluster)
        return self.rows_per_cta * self.warps_per_row * self.cluster_n * 8

    def est_regs_per_thread(self) -> int:
        # 16-byte fragment per in-flight load (4 regs), argmax-sized
        # accumulators (value+index for 4..8 chains) and addressing overhead.
        return 40 + 4 * self.unroll

    def validate(self, n: int, dtype_bits: int, limits: DeviceLimits | None = None) -> None:
        """Raise ValueError if this config cannot run for rows of n elements
        of a dtype of dtype_bits bits (on a device with `limits`, default sm_90)."""
        t, p = self.threads, self.threads_per_row
        if limits is not None:
            if t > limits.threads_per_block:
                raise ValueError(f"threads={t} > {limits.threads_per_block} per block on sm_{limits.sm}")
            if self.cluster_n > limits.max_cluster_size:
                raise ValueError(f"cluster_n={self.cluster_n}: sm_{limits.sm} allows clusters of at most {limits.max_cluster_size}")
            if self.smem_bytes() > limits.smem_per_block:
                raise ValueError(f"shared memory {self.smem_bytes()} B > {limits.smem_per_block} B on sm_{limits.sm}")
            if self.est_regs_per_thread() * t > limits.registers_per_sm:
                raise ValueError(f"~{self.est_regs_per_thread() * t} registers per CTA > {limits.registers_per_sm} on sm_{limits.sm}")
        self.check_rows(n, dtype_bits)
        if not isinstance(p, int) or not is_pow2(p) or p > t:
            raise ValueError(f"threads_per_row={p}: must be a power of 2 and <= threads ({t})")
        if t % p != 0:
            raise ValueError(f"threads_per_row={p} must divide threads={t}")
        if not isinstance(self.unroll, int) or not 1 <= self.unroll <= 16:
            raise ValueError(f"unroll={self.unroll}: must be in [1, 16]")
        if self.cluster_n not in (1, 2, 4, 8):
            raise ValueError(
                f"cluster_n={self.cluster_n}: must be 1, 2, 4 or 8 (portable cluster sizes)"
            )
        if self.load_hint not in LOAD_HINTS:
            raise ValueError(f"load_hint={self.load_hint!r}: must be one of {LOAD_HINTS}")
        if self.cluster_n > 1:
            vec_max = 128 // dtype_bits
            need = self.cluster_n * p * vec_max
            if n < need:
                raise ValueError(
                    f"cluster_n={self.cluster_n} with threads_per_row={p} needs n >= "
                    f"{need} (one 16-byte vector per thread of the cluster); got n={n}"
                )
        regs = self.est_regs_per_thread()
        if regs > _MAX_REGS_PER_THREAD or regs * t > _REGS_PER_SM:
            raise ValueError(
                f"unroll={self.unroll} with threads={t} needs ~{regs} registers/thread "
                f"({regs * t} per CTA > {_REGS_PER_SM}); lower unroll or threads"
            )
        if self.smem_bytes() > _SMEM_LIMIT:
            raise ValueError(f"shared memory {self.smem_bytes()} B > {_SMEM_LIMIT} B")


def default_config(n: int, dtype_bits: int, m: int | None = None) -> RowReduceConfig:
    """Heuristic config for rows of n elements of dtype_bits bits.

    ``m`` (optional, number of rows) lets very long rows with few rows use a
    cluster to fill the GPU; without it no cluster is used.
    """
    vec_max = 128 // dtype_bits
    nv = -(-n // vec_max)  # 16-byte vectors per row
    # ~4 vectors per thread, whole rows per warp-group for short rows.
    p = min(1024, pow2_ceil(max(1, -(-nv // 4))))
    if p >= 1024:
        threads, unroll = 1024, 4
    elif p >= 256:
        threads, unroll = p, 4
    else:
        threads, unroll = 256, 4
    per_thread = -(-nv // p)
    unroll = max(1, min(unroll, per_thread))
    cluster_n = 1
    if m is not None and p == 1024:
        # few long rows: split rows over a cluster until ~2 CTAs per SM
        ctas = m
        while cluster_n < 8 and ctas * cluster_n < 264 and nv >= 2 * cluster_n * p * 4:
            cluster_n *= 2
    cfg = _canonical(RowReduceConfig(threads, p, unroll, cluster_n), n, dtype_bits)
    cfg.validate(n, dtype_bits)
    return cfg


def _canonical(c: RowReduceConfig, n: int, dtype_bits: int) -> RowReduceConfig:
    """Clip unroll to the full rounds a thread actually has at the widest vector
    (configs that differ only beyond that compile to the same kernel)."""
    nv = n // (128 // dtype_bits)
    rounds = nv // (c.threads_per_row * c.cluster_n)
    return replace(c, unroll=max(1, min(c.unroll, rounds)))


def candidate_configs(n: int, dtype_bits: int) -> list[RowReduceConfig]:
    """A small (<= 8) set of distinct, valid configs around the heuristic for
    autotuning; the first one is :func:`default_config`."""
    base = default_config(n, dtype_bits)
    nv = -(-n // (128 // dtype_bits))
    p0 = base.threads_per_row
    cands: list[RowReduceConfig] = [base]
    seen = {_canonical(base, n, dtype_bits)}

    def add(c: RowReduceConfig) -> None:
        try:
            c.validate(n, dtype_bits)
        except ValueError:
            return
        key = _canonical(c, n, dtype_bits)
        if key not in seen:
            seen.add(key)
            cands.append(key)

    if p0 < 256:
        # short rows: rows per CTA, threads per row (-> loads per thread), hints
        u = base.unroll
        add(RowReduceConfig(256, max(1, p0 // 2), 8))
        add(RowReduceConfig(128, p0, u))
        add(RowReduceConfig(512, p0, u))
        add(RowReduceConfig(256, min(256, p0 * 2), max(1, u // 2)))
        add(RowReduceConfig(1024, p0, u))
        add(RowReduceConfig(256, p0, u, load_hint="nc"))
        add(RowReduceConfig(256, p0, u, load_hint="no_alloc_l2_256"))
    else:
        # long rows: CTA size vs. loads in flight vs. rows per CTA, clusters
        add(RowReduceConfig(512, 512, 8))
        add(RowReduceConfig(1024, 1024, 4))
        add(RowReduceConfig(256, 256, 8))
        add(RowReduceConfig(512, 256, 8))
        add(RowReduceConfig(base.threads, p0, base.unroll, load_hint="no_alloc_l2_256"))
        if nv >= 2 * 2 * 1024 * 4:
            add(RowReduceConfig(1024, 1024, 4, cluster_n=2))
        if nv >= 2 * 4 * 512 * 8:
            add(RowReduceConfig(512, 512, 8, cluster_n=4))
        add(RowReduceConfig(1024, 512, 8))
        add(RowReduceConfig(base.threads, p0, base.unroll, load_hint="nc"))
    return cands[:8]


_TARGET_CTAS = 132 * 4  # 4 resident 256-thread CTAs per H200 SM: ~64 KB of loads in flight


@dataclass(frozen=True)
class ColReduceConfig:
    """threads: CTA size; threads_x: threads across the inner dim (each owns one
    vector); unroll: loads in flight per thread; cluster_n: CTAs splitting R."""

    threads: int = 256
    threads_x: int = 8
    unroll: int = 4
    cluster_n: int = 1

    def validate(self, dtype_bits: int, limits: DeviceLimits | None = None) -> None:
        t, tx = self.threads, self.threads_x
        if dtype_bits not in (16, 32):
            raise ValueError(f"dtype_bits must be 16 or 32, got {dtype_bits}")
        if not isinstance(t, int) or t < 32 or t > 1024 or t % 32 != 0:
            raise ValueError(f"threads={t}: must be a multiple of 32 in [32, 1024]")
        if not isinstance(tx, int) or not is_pow2(tx) or tx * (128 // dtype_bits) > t:
            raise ValueError(f"threads_x={tx}: must be a power of 2 with threads_x * vec <= threads ({t})")
        if not isinstance(self.unroll, int) or not 1 <= self.unroll <= 16:
            raise ValueError(f"unroll={self.unroll}: must be in [1, 16]")
        if self.cluster_n not in (1, 2, 4, 8):
            raise ValueError(f"cluster_n={self.cluster_n}: must be 1, 2, 4 or 8")
        if limits is not None and self.cluster_n > limits.max_cluster_size:
            raise ValueError(f"cluster_n={self.cluster_n}: sm_{limits.sm} allows clusters of at most {limits.max_cluster_size}")


def default_col_config(o: int, r: int, i: int, dtype_bits: int, vec: int, clusters: bool = True) -> ColReduceConfig:
    """Heuristic: 8 threads (128 B) across the inner dim, 256-thread CTAs, and a
    cluster split of R when the (outer x inner) tiles alone cannot fill the GPU, up to
    about one wave of 4 CTAs per SM."""
    ncv = -(-i // vec)
    tx = min(8, pow2_ceil(ncv))
    t, u = 256, 4
    ty = t // tx
    ctas = o * -(-ncv // tx)
    c = 1
    if clusters:
        # double while the grid stays within one wave of ~4 CTAs per SM: on the H200 a
        # 1024-CTA grid (two partial waves) ran 6-14 % slower than 512 CTAs
        while c < 8 and ctas * c * 2 <= _TARGET_CTAS and r >= 4 * u * ty * c:
            c *= 2
    cfg = ColReduceConfig(t, tx, u, c)
    cfg.validate(dtype_bits)
    return cfg


def candidate_col_configs(o: int, r: int, i: int, dtype_bits: int, vec: int) -> list[ColReduceConfig]:
    base = default_col_config(o, r, i, dtype_bits, vec)
    out = [base]
    for c in (
        ColReduceConfig(256, base.threads_x, 8, base.cluster_n),
        ColReduceConfig(512, base.threads_x, 4, base.cluster_n),
        ColReduceConfig(256, min(32, base.threads_x * 2), 4, base.cluster_n),
        ColReduceConfig(256, base.threads_x, 4, min(8, base.cluster_n * 2)),
    ):
        try:
            c.validate(dtype_bits)
        except ValueError:
            continue
        if c not in out:
            out.append(c)
    return out
