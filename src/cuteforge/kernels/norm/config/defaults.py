"""The norm kernels' default configs: the tables of measured shapes (H200 unless a row
says otherwise, % of copy bandwidth) as named rows, each with a one-line why, and the
heuristic that covers every other row length.

A table row holds for N in [lo, hi] (inclusive) of the dtype width or (kind, dtype width)
it is filed under; the first row that holds and builds wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...rows.tiling import pow2_ceil
from .knobs import REGS_PER_SM, NormConfig, elems_per_thread
from .shapes import (
    CLUSTER_FWD_ELEMS,
    CLUSTER_FWD_THREADS,
    async_fwd_config,
    cluster_fwd_config,
    cluster_staged_config,
    ring_config,
    row_grid_shape,
    staged_config,
    staged_fwd_config,
)

# fp32 registers of row data a thread should hold: forward (x, plus transient weight)
# and backward (x, dy, dweight and dbias accumulators) differ by ~4x in live arrays.
TARGET_ELEMS = {False: 32, True: 16}
MAX_THREADS_PER_ROW = 512  # longer rows split over a cluster


@dataclass(frozen=True)
class NRange:
    """Row lengths [lo, hi] that take a rule."""

    lo: int
    hi: int
    why: str = ""

    def holds(self, n: int) -> bool:
        return self.lo <= n <= self.hi


@dataclass(frozen=True)
class ClusterFwdShape:
    """The cluster forward's CTA size and the elements per thread it aims for."""

    threads: int
    elems: int
    why: str = ""


@dataclass(frozen=True)
class StagedBwdRow(NRange):
    """The row-staged backward (`staged_config(n, bits, elems, stages)`), CTAs per SM capped
    at `max_ctas` where given."""

    elems: int = 32
    stages: int = 3
    max_ctas: int | None = None


@dataclass(frozen=True)
class ClusterStagedBwdRow(NRange):
    """The cluster-staged backward (`cluster_staged_config`); `double_cluster`: on twice the
    smallest cluster (smaller chunks, more CTAs per SM)."""

    elems: int = 32
    stages: int = 3
    double_cluster: bool = False


@dataclass(frozen=True)
class CtaCapRow(NRange):
    """The register backward held to `max_ctas` CTAs per SM (prefetching where that fits)."""

    max_ctas: int = 2


@dataclass(frozen=True)
class ShapeRow(NRange):
    """NormConfig fields that replace the default's, where the result validates."""

    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StagedFwdRow(NRange):
    """The staged forward (`staged_fwd_config`: `threads`, `stages`, the smallest cluster
    whose chunks hold <= `chunk_kib`), with `lag` at `ctas_per_sm` CTAs per SM (0: as
    built) where those are given."""

    threads: int = 256
    stages: int = 4
    lag: int = 0
    ctas_per_sm: int = 0
    chunk_kib: int = 32

    @property
    def plain(self) -> bool:
        """Neither lagged nor refitted nor on other chunks: the shape as built."""
        return not self.lag and not self.ctas_per_sm and self.chunk_kib == 32


@dataclass(frozen=True)
class AsyncFwdRow(NRange):
    """The cp_async register forward (`async_fwd_config`)."""

    threads: int = 256
    elems: int = 32
    level: int = 2
    ctas_per_sm: int = 1


# The cluster forward with the mbarrier exchange: the N that take it, per dtype bits.
CLUSTER_FWD_MIN_N: dict[int, int | None] = {16: 16385, 32: 16385}
# Its shape per (kind, dtype bits): best or within ~1 % of best over N = 32768..262144.
CLUSTER_FWD_SHAPE: dict[tuple[str, int], ClusterFwdShape] = {
    ("rms", 16): ClusterFwdShape(256, 32),
    ("rms", 32): ClusterFwdShape(256, 64),
    ("layer", 16): ClusterFwdShape(512, 32),
    ("layer", 32): ClusterFwdShape(256, 32),
}

# The backward without partials (frozen weight and bias) on the row grid (one CTA per row
# block; `frozen_row_grid_config` gives the shape).
FROZEN_ROW_GRID_N: dict[int, tuple[NRange, ...]] = {
    32: (NRange(256, 4096, "2-8 points over the persistent grid; fp32 8192 stays persistent"),),
    16: (NRange(256, 4096, "+1 to +8 points over the persistent grid"),
         NRange(8192, 8192, "+1 to +8 points over the persistent grid")),
}
FROZEN_ROW_BYTES = 32  # of its row each thread holds (fp32 at N >= 2048: twice that)

# The row-staged backward (with partials) as the default, per dtype bits.
STAGED_BWD: dict[int, tuple[StagedBwdRow, ...]] = {
    16: (
        StagedBwdRow(2049, 3071, "80-87 % against the register default's 65-84 % (LayerNorm 68-80 against 31-70)",
                     elems=32, stages=3),
        StagedBwdRow(3072, 3584, "as above; 2 stages from 3072", elems=32, stages=2),
        StagedBwdRow(4097, 5632, "RMSNorm 88-93, LayerNorm 76-93 % against 74-82 and 60-74; 3 CTAs per SM spill",
                     elems=32, stages=3, max_ctas=2),
        StagedBwdRow(5633, 8191, "94-96 % against 84-90; LayerNorm spills at 3 CTAs per SM", elems=32, stages=2,
                     max_ctas=2),
        StagedBwdRow(8192, 8192, "89-94 % against the register default's 85-92", elems=32, stages=2),
        StagedBwdRow(8193, 16384, "87-97 % against 62-72 (the register default needs a cluster)", elems=32, stages=3),
    ),
    32: (
        StagedBwdRow(4097, 8191, "97-101 % against the register default's 61-92 (late loads)", elems=32, stages=3),
        StagedBwdRow(8193, 16384, "95-96 % against 91-94 (one 128 KiB stage fits)", elems=32, stages=3),
    ),
}

# The register backward with partials held to fewer CTAs per SM than the heuristic's
# register estimate allows, per norm (LayerNorm holds more per thread: dbias, the mean).
REGISTER_BWD_MAX_CTAS: dict[str, tuple[CtaCapRow, ...]] = {
    "layer": (CtaCapRow(1025, 1408, "3 CTAs per SM ran slow: 2 with prefetch read 52-84 % against 33-76", max_ctas=2),
              CtaCapRow(2049, 3071, "3 CTAs per SM spilled LayerNorm's kernel; 2 read 81-87 % against 67-72",
                        max_ctas=2)),
    "rms": (CtaCapRow(1025, 1408, "2 CTAs per SM with prefetch read 64-89 % against 54-87 on 3", max_ctas=2),),
}

# The cluster-staged backward as the default for long rows, per dtype bits (the register
# default read 24-57 % there).
STAGED_BWD_CLUSTER: dict[int, tuple[ClusterStagedBwdRow, ...]] = {
    16: (ClusterStagedBwdRow(16385, 32768, "2 CTAs of 512 threads, 3 stages: 90-97 %", elems=32, stages=3),
         ClusterStagedBwdRow(32769, 131072, "256-thread CTAs at 2 per SM: 84-94 %", elems=32, stages=3,
                             double_cluster=True),
         ClusterStagedBwdRow(131073, 262144, "16 CTAs of 512 threads: 78-93 %", elems=32, stages=3)),
    32: (ClusterStagedBwdRow(16385, 262144, "<= 16 elements per thread, 3 stages: 96-100 % up to 131072", elems=16,
                             stages=3),),
}
# Rows whose chunks leave the cluster-staged backward one whole stage (fp32 N = 262144)
# take the part ring in this many parts: 96-97 % against 91-95 on the H100.
RING_PARTS = 8

# The backward without partials where the default's shape ran well below itself with
# partials: the fields that replace the default's, per dtype bits.
FROZEN_BWD_SHAPES: dict[int, tuple[ShapeRow, ...]] = {
    16: (ShapeRow(131073, 262144, "best for both norms of 47 shapes: 88-94 % against 78-86 without the ring",
                  fields={"threads": 256, "threads_per_row": 256, "ctas_per_sm": 1, "stages": 2, "parts": 4}),),
    32: (ShapeRow(8192, 8192, "98-99 % against 87 (ptxas issued part of the default's loads late)",
                  fields={"threads": 128, "threads_per_row": 128, "cluster_n": 2, "ctas_per_sm": 2, "exchange": "mbar",
                          "stages": 2}),),
}

# The row-staged backward without partials, ahead of the row grid's exclusions.
FROZEN_STAGED_BWD: dict[int, tuple[StagedBwdRow, ...]] = {
    16: (StagedBwdRow(4097, 8191, "93-97 % where the row grid read 71-97 through autograd", elems=32, stages=2),),
}

# The staged forward as the default for long rows, per (kind, dtype bits); lagged rows are
# taken where the lagged form is built. Rows not listed stay in registers (within a point,
# or faster).
STAGED_FWD: dict[tuple[str, int], tuple[StagedFwdRow, ...]] = {
    ("rms", 32): (StagedFwdRow(131073, 262144, "94 % against the register default's 79", threads=1024, stages=2),),
    ("layer", 16): (
        StagedFwdRow(32769, 65536, "lagged on 16 KiB chunks: 92 % against 90", threads=256, stages=3, lag=1,
                     ctas_per_sm=2, chunk_kib=16),
        StagedFwdRow(131073, 262144, "lagged: 90 % against 87 unlagged", threads=256, stages=4, lag=1, ctas_per_sm=1),
        StagedFwdRow(32768, 32768, "94 % (the lagged 512-thread shape read 87)", threads=1024, stages=3),
        StagedFwdRow(32769, 65536, "90 % against 4 stages' 88-89", threads=512, stages=6),
        StagedFwdRow(65537, 262144, "93 % at 131072 (the lagged shape read 84)", threads=256, stages=4),
    ),
    ("layer", 32): (
        StagedFwdRow(65537, 131072, "lagged: 95 % against 92", threads=512, stages=6, lag=1, ctas_per_sm=1),
        StagedFwdRow(65536, 131072, "92-93 % against the register default's 78-87", threads=256, stages=4),
        StagedFwdRow(131073, 262144, "weight and bias in registers beside the stages: 93 % against 73",
                     threads=512, stages=2),
    ),
}
# Staged forward defaults (without a residual) that take `short_chains`: its largest gain,
# about a point at LayerNorm 16-bit 262144; elsewhere it read level or behind.
SHORT_CHAINS_FWD: dict[tuple[str, int], tuple[NRange, ...]] = {
    ("layer", 16): (NRange(262144, 262144, "90-91 % against 89-90"),),
}
# With a fused residual (two rows a stage, so fewer stages fit), ahead of STAGED_FWD.
STAGED_FWD_RESIDUAL: dict[tuple[str, int], tuple[StagedFwdRow, ...]] = {
    ("layer", 16): (
        StagedFwdRow(32768, 32768, "lagged on 16 KiB chunks: 93 % (the 1024-thread shape 88-89)", threads=256,
                     stages=3, lag=1, ctas_per_sm=1, chunk_kib=16),
        StagedFwdRow(32769, 131072, "16 KiB chunks: 93-95 % against 73-89", threads=256, stages=4, lag=0,
                     ctas_per_sm=1, chunk_kib=16),
        StagedFwdRow(131073, 262144, "unlagged 1024 threads: 85-88 % (the lagged 256-thread shape 78)",
                     threads=1024, stages=2),
    ),
    ("layer", 32): (StagedFwdRow(65536, 131072, "lagged measured level: unlagged", threads=256, stages=4),),
}
# Lagged staged forwards that the tuner times beside the defaults (without a residual):
# 93-96 % on the H100, where the defaults read up to 3 points less; 84-92 on the H200.
LAGGED_FWD_ALTERNATIVES: dict[tuple[str, int], tuple[StagedFwdRow, ...]] = {
    ("layer", 16): (StagedFwdRow(32768, 131072, "H100: 93-95 %", threads=512, stages=2, lag=1, ctas_per_sm=3),
                    StagedFwdRow(131073, 262144, "H100: 95-96 %", threads=256, stages=3, lag=1, ctas_per_sm=1)),
    ("layer", 32): (StagedFwdRow(65537, 131072, "H100: 96 %", threads=256, stages=3, lag=1, ctas_per_sm=1),),
}

# The cp_async register forward as the default, ahead of STAGED_FWD, per (kind, dtype
# bits). LayerNorm otherwise keeps the staged forward (its weight and bias shares take
# shared memory and registers: 86-92 % at best against 93-94).
ASYNC_FWD: dict[tuple[str, int], tuple[AsyncFwdRow, ...]] = {
    ("rms", 16): (AsyncFwdRow(32768, 262144, "96-97 % against 89-94 (straight into registers: 73-91)", threads=256,
                              elems=32, level=2, ctas_per_sm=1),),
    ("rms", 32): (AsyncFwdRow(32769, 131072, "97 % against 92-95", threads=256, elems=32, level=2, ctas_per_sm=1),),
    ("layer", 32): (AsyncFwdRow(32768, 32768, "94 % against 91", threads=256, elems=32, level=2, ctas_per_sm=1),),
}

# LayerNorm's 16-bit register forward takes the threads a row nearest N / 32 (in log
# scale) instead of the next power of two up, which left a last vector round mostly idle.
LAYER_FWD_NEAREST_P: dict[int, NRange] = {16: NRange(1025, 8191, "e.g. 4608: 95 % on 128 threads a row against 84 on 256")}

# The backward prefetches the next row block for 16-bit rows of these N: 6-9 % faster at
# 1024..16384 (fp32 rows and N = 256 lose).
PREFETCH_BWD_N = NRange(768, 16384, "16-bit rows gain 6-9 %")


def frozen_row_grid_config(n: int, dtype_bits: int) -> NormConfig | None:
    """The row-grid shape of the backward without partials for rows of n, None outside
    ``FROZEN_ROW_GRID_N`` (see there)."""
    if not any(r.holds(n) for r in FROZEN_ROW_GRID_N.get(dtype_bits, ())):
        return None
    e = FROZEN_ROW_BYTES * 8 // dtype_bits * (2 if dtype_bits == 32 and n >= 2048 else 1)
    return row_grid_shape(min(512, max(16, pow2_ceil(-(-n // e)))))


def default_config(n: int, dtype_bits: int, backward: bool = False, kind: str = "rms",
                   residual: bool = False) -> NormConfig:
    """Long forward rows (``CLUSTER_FWD_MIN_N``) take the mbar exchange shaped by
    ``CLUSTER_FWD_SHAPE``, or the tables' cp_async and staged shapes; backward rows in the
    staged tables' ranges the row-staged or cluster-staged backward; otherwise
    ~``TARGET_ELEMS`` elements per thread; rows longer than 512 threads' worth split over a
    cluster (up to 16 CTAs); then, if the registers do not fit, the backward reloads x/dy
    and finally gives each thread a larger share. ``residual``: the forward fuses a
    residual add (``STAGED_FWD_RESIDUAL``'s shapes come first)."""
    if backward:
        return _default_bwd_with_partials(n, dtype_bits, kind)
    for row in ASYNC_FWD.get((kind, dtype_bits), ()):
        if row.holds(n):
            cfg = async_fwd_config(n, dtype_bits, row.threads, row.elems, row.level, row.ctas_per_sm)
            if cfg is not None:
                return cfg
    table = STAGED_FWD.get((kind, dtype_bits), ())
    if residual:
        table = STAGED_FWD_RESIDUAL.get((kind, dtype_bits), ()) + table
    cfg = staged_table_config(table, n, dtype_bits)
    if cfg is None:
        return default_register_fwd_config(n, dtype_bits, kind)
    for rng in SHORT_CHAINS_FWD.get((kind, dtype_bits), ()) if not residual else ():
        if rng.holds(n) and cfg.stages and cfg.cluster_n > 1:
            cfg = replace(cfg, short_chains=True)
    return cfg


def _default_bwd_with_partials(n: int, dtype_bits: int, kind: str) -> NormConfig:
    for row in STAGED_BWD.get(dtype_bits, ()):
        if row.holds(n):
            cfg = staged_config(n, dtype_bits, row.elems, row.stages)
            if cfg is not None:
                return replace(cfg, ctas_per_sm=min(cfg.ctas_per_sm, row.max_ctas)) if row.max_ctas else cfg
    for crow in STAGED_BWD_CLUSTER.get(dtype_bits, ()):
        if crow.holds(n):
            cfg = cluster_staged_config(n, dtype_bits, crow.elems, crow.stages)
            if cfg is not None and crow.double_cluster and cfg.cluster_n < 16:
                cfg = cluster_staged_config(n, dtype_bits, crow.elems, crow.stages, min_cluster=2 * cfg.cluster_n) or cfg
            if cfg is None:
                cfg = cluster_staged_config(n, dtype_bits)
            if cfg is not None and cfg.stages == 1:
                cfg = ring_config(cfg, n, dtype_bits, RING_PARTS) or cfg  # one whole-row stage: the part ring
            if cfg is not None:
                return cfg
    cfg = default_register_config(n, dtype_bits)
    for cap in REGISTER_BWD_MAX_CTAS.get(kind, ()):
        if cap.holds(n) and cfg.ctas_per_sm > cap.max_ctas and not cfg.reload:
            cfg = replace(cfg, ctas_per_sm=cap.max_ctas)
            try:
                replace(cfg, prefetch=True).validate(n, dtype_bits, backward=True)
                cfg = replace(cfg, prefetch=True)
            except ValueError:
                pass
    return cfg


def staged_table_config(table: tuple[StagedFwdRow, ...], n: int, dtype_bits: int) -> NormConfig | None:
    """The first row of a ``STAGED_FWD``-style table whose N range holds n and that builds
    for it (lagged rows only where the lagged form is built), or None."""
    for row in table:
        if row.holds(n):
            cfg = staged_fwd_config(n, dtype_bits, row.threads, row.stages, row.chunk_kib * 1024)
            if cfg is not None and (row.lag or row.ctas_per_sm):
                cfg = fitted_fwd_config(cfg, n, dtype_bits, row.lag, row.ctas_per_sm)
            if cfg is not None:
                return cfg
    return None


def unlagged_default(n: int, dtype_bits: int, kind: str) -> NormConfig:
    """The forward default that STAGED_FWD's first plain row for n gives."""
    plain = tuple(row for row in STAGED_FWD.get((kind, dtype_bits), ()) if row.plain)
    return staged_table_config(plain, n, dtype_bits) or default_register_fwd_config(n, dtype_bits, kind)


def fitted_fwd_config(cfg: NormConfig, n: int, dtype_bits: int, lag: int, ctas_per_sm: int) -> NormConfig | None:
    """``cfg`` with ``lag`` at ``ctas_per_sm`` CTAs per SM (0: as it is), or None where that
    occupancy does not fit or the lagged form would not be built (a chunk that leaves a warp
    part of a vector round: the statistics then take two exchanges)."""
    vec = 128 // dtype_bits
    if lag and (cfg.cluster_n < 2 or (n // cfg.cluster_n) % (cfg.threads * vec)):
        return None
    out = replace(cfg, lag=lag, ctas_per_sm=ctas_per_sm or cfg.ctas_per_sm)
    try:
        out.validate(n, dtype_bits)
    except ValueError:
        return None
    return out


def default_register_fwd_config(n: int, dtype_bits: int, kind: str = "rms") -> NormConfig:
    """The forward default with the row in registers (stages = 0): what a staged config
    falls back to when its rows are not 16-byte aligned."""
    return heuristic_config(n, dtype_bits, False, kind)


def default_bwd_config(n: int, dtype_bits: int, has_dw: bool = True, kind: str = "rms") -> NormConfig:
    """The backward's default: ``default_config(backward=True, kind=kind)``; for the kernel
    without partials (``has_dw=False``) the row grid's shape where it was measured faster
    (``frozen_row_grid_config``), the row-staged shapes of ``FROZEN_STAGED_BWD`` and the
    shapes of ``FROZEN_BWD_SHAPES`` (one rule for RMSNorm and LayerNorm each time)."""
    cfg = default_config(n, dtype_bits, backward=True, kind=kind)
    if has_dw:
        return cfg
    row = frozen_row_grid_config(n, dtype_bits)
    if row is not None:
        return row
    for row in FROZEN_STAGED_BWD.get(dtype_bits, ()):
        if row.holds(n):
            staged = staged_config(n, dtype_bits, row.elems, row.stages)
            if staged is not None:
                return staged
    for shape_row in FROZEN_BWD_SHAPES.get(dtype_bits, ()):
        if shape_row.holds(n):
            shape = replace(cfg, **shape_row.fields)
            try:
                shape.validate(n, dtype_bits, backward=True)
                return shape
            except ValueError:
                pass  # rows whose chunks the shape cannot cut: the default
    return cfg


def default_register_config(n: int, dtype_bits: int) -> NormConfig:
    """The backward default with the row in registers (stages = 0): what a staged config
    falls back to when its rows are not 16-byte aligned."""
    return heuristic_config(n, dtype_bits, True, "rms")


def pow2_nearest(v: float) -> int:
    """The power of two nearest v in log scale (ties go up)."""
    lo = 1 << max(0, int(v).bit_length() - 1)
    return lo if v * v < 2 * lo * lo else 2 * lo


def heuristic_config(n: int, dtype_bits: int, backward: bool, kind: str) -> NormConfig:
    lo = CLUSTER_FWD_MIN_N.get(dtype_bits)
    if not backward and lo is not None and n >= lo:
        shape = CLUSTER_FWD_SHAPE.get((kind, dtype_bits), ClusterFwdShape(CLUSTER_FWD_THREADS, CLUSTER_FWD_ELEMS))
        threads, elems = shape.threads, shape.elems
        if threads < 512 and elems_per_thread(n, threads, 16) > elems and (kind, dtype_bits) != ("layer", 32):
            # even 16 CTAs leave too much per thread: larger CTAs measured faster (N = 262144),
            # but not for fp32 LayerNorm's one-exchange statistics (67 % on 256 threads, 57 on 512)
            threads = 512
        cluster = cluster_fwd_config(n, dtype_bits, threads, elems)
        if cluster is not None:
            return cluster
    e = TARGET_ELEMS[backward]
    p = max(8, pow2_ceil(-(-n // e)))
    nearest = LAYER_FWD_NEAREST_P.get(dtype_bits)
    if not backward and kind == "layer" and nearest is not None and nearest.holds(n):
        p = pow2_nearest(n / e)
    c = 1
    while p > MAX_THREADS_PER_ROW and c < 16:
        c *= 2
        p = max(8, pow2_ceil(-(-n // (e * c))))
    p = min(p, 1024)
    tries = [(p, False), (p, True), (p // 2, True), (p // 4, True)] if backward else [(p, False), (p // 2, False)]
    err: ValueError | None = None
    for pt, reload in tries:
        if pt < 8:
            continue
        t = pt if (pt >= 256 or c > 1) else 256
        probe = NormConfig(t, pt, c, 1, reload)
        regs = probe.est_regs_per_thread(n, dtype_bits, backward)
        occ = max(1, min(4, REGS_PER_SM // (regs * t), 2048 // t))
        cfg = NormConfig(t, pt, c, occ, reload)
        try:
            cfg.validate(n, dtype_bits, backward=backward)
        except ValueError as exc:
            err = exc
            continue
        return _with_prefetch(cfg, n, dtype_bits) if backward else cfg
    raise ValueError(f"no norm config fits n={n}, {dtype_bits}-bit: {err}")


def _with_prefetch(cfg: NormConfig, n: int, dtype_bits: int) -> NormConfig:
    """The backward default with `prefetch` where it measured faster, if it fits."""
    if dtype_bits != 16 or cfg.reload or not PREFETCH_BWD_N.holds(n):
        return cfg
    pf = NormConfig(cfg.threads, cfg.threads_per_row, cfg.cluster_n, cfg.ctas_per_sm, False, True)
    if pf.est_regs_per_thread(n, dtype_bits, True) * pf.threads * pf.ctas_per_sm > REGS_PER_SM:
        return cfg  # the second register set would cost resident CTAs
    try:
        pf.validate(n, dtype_bits, backward=True)
    except ValueError:
        return cfg
    return pf
