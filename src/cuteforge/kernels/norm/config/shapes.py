"""Builders of norm configs of a given shape: the cluster forward and backward, the
cp_async forward, the row-staged and cluster-staged kernels (forward and backward), the
part ring, the backward's row grid. Each returns None where its shape is not valid for
the row (the defaults and the candidate lists try the next one)."""

from __future__ import annotations

from dataclasses import replace

from ...rows.tiling import pow2_ceil
from .knobs import (
    REGS_PER_SM,
    SMEM_CTA_RESERVED,
    SMEM_PER_SM,
    NormConfig,
    elems_per_thread,
    ring_slots,
    row_bytes,
)

CLUSTER_FWD_THREADS = 256
CLUSTER_FWD_ELEMS = 32


def cluster_fwd_config(n: int, dtype_bits: int, threads: int = CLUSTER_FWD_THREADS, elems: int = CLUSTER_FWD_ELEMS) -> NormConfig | None:
    """The mbar-exchange forward config for a long row: `threads`-thread CTAs (one row
    each), the smallest cluster (2..16) that leaves a thread <= `elems` elements (or 16
    CTAs), None when no cluster config is valid for n."""
    c = 2
    while c < 16 and elems_per_thread(n, threads, c) > elems:
        c *= 2
    while c >= 2:
        cfg = NormConfig(threads, threads, c, 1, exchange="mbar")
        try:
            cfg.validate(n, dtype_bits)
            return cfg
        except ValueError:
            c //= 2  # too short for this many CTAs (or too long for the registers: then none fits)
    return None


def async_fwd_config(n: int, dtype_bits: int, threads: int = 256, elems: int = 32, level: int = 2,
                     ctas_per_sm: int = 1) -> NormConfig | None:
    """The cp_async forward on ``cluster_fwd_config``'s shape (``threads``-thread
    CTAs, the smallest cluster leaving <= ``elems`` elements per thread), ``cp_async =
    level``, ``ctas_per_sm`` the register budget (1: none; ptxas fills whatever budget it
    gets, so a loose one costs occupancy: rms bf16 N = 262144 82 % of copy under a
    2-CTA budget, 96 % with none). None when it does not fit, or for rows that are not of
    16-byte vectors."""
    if n % (128 // dtype_bits):
        return None
    cfg = cluster_fwd_config(n, dtype_bits, threads, elems)
    if cfg is None:
        return None
    cfg = replace(cfg, cp_async=level, ctas_per_sm=ctas_per_sm)
    try:
        cfg.validate(n, dtype_bits)
    except ValueError:
        return None
    return cfg


def row_grid_shape(p: int) -> NormConfig:
    """A row-grid config of p threads per row: CTAs of at least 128 threads (several rows
    each when p is smaller), a register budget of 128 per thread (512 / threads CTAs)."""
    t = max(128, p)
    return NormConfig(t, p, 1, max(1, 512 // t), row_grid=True)


def staged_fwd_config(n: int, dtype_bits: int, threads: int, stages: int,
                      chunk_bytes: int = 32 * 1024) -> NormConfig | None:
    """The staged forward with ``threads``-thread CTAs and ``stages`` stages on the smallest
    cluster (1..16) whose chunks hold <= ``chunk_bytes`` (16 CTAs at most: fp32 N = 262144
    has 64 KiB chunks), as many CTAs per SM as fit; None when it is not valid for n (N not
    cut into 16-byte multiples, too many elements per thread, the stages do not fit)."""
    c = 1
    while c < 16 and row_bytes(n, dtype_bits) > c * chunk_bytes:
        c *= 2
    cfg = staged_config(n, dtype_bits, 1 << 30, stages, threads=threads, cluster_n=c, backward=False)
    if cfg is None or cfg.stages != stages:
        return None
    return cfg


def cluster_bwd_config(
    n: int, dtype_bits: int, threads: int = 256, elems: int = 16, exchange: str = "mbar", prefetch: bool = False
) -> NormConfig | None:
    """A long-row backward config: `threads`-thread CTAs (one row each), the smallest
    cluster (2..16) leaving a thread <= `elems` elements (else 16), `reload` when x and dy
    do not fit in registers beside the accumulators, and as many persistent CTAs per SM
    (1..4) as the register estimate allows. None when nothing valid fits."""
    c = 2
    while c < 16 and elems_per_thread(n, threads, c) > elems:
        c *= 2
    while c >= 2:
        for reload in (False, True):
            if reload and prefetch:
                continue
            probe = NormConfig(threads, threads, c, 1, reload, prefetch, exchange=exchange)
            regs = probe.est_regs_per_thread(n, dtype_bits, True)
            occ = max(1, min(4, REGS_PER_SM // (regs * threads), 2048 // threads))
            cfg = NormConfig(threads, threads, c, occ, reload, prefetch, exchange=exchange)
            try:
                cfg.validate(n, dtype_bits, backward=True)
                return cfg
            except ValueError:
                continue
        c //= 2
    return None


def staged_config(n: int, dtype_bits: int, elems: int = 32, stages: int = 3, threads: int | None = None,
                  cluster_n: int = 1, backward: bool = True) -> NormConfig | None:
    """A row-staged backward config (``NormConfig.stages``): one row per CTA of
    ``threads`` (default: the power of 2 leaving a thread <= ``elems`` elements of its
    chunk, 128..1024), ``stages`` rows in shared memory (fewer if they do not fit one CTA),
    and as many persistent CTAs per SM (1..4) as registers, shared memory and 2048 threads
    allow. With ``cluster_n`` > 1 the row is split over a cluster: each CTA stages
    its contiguous N / cluster_n chunk, the row sums meet through the mbarrier exchange.
    None when no such config is valid for n (chunks of a multiple of 16 bytes only).
    ``backward=False``: the staged forward's config of the same shape."""
    c = cluster_n
    if n % c or row_bytes(n // c, dtype_bits) % 16:
        return None
    nc = n // c
    ex = "mbar" if c > 1 else "barrier"
    t = threads or min(1024, max(128, pow2_ceil(-(-nc // elems))))
    for s in range(stages, 0, -1):
        probe = NormConfig(t, t, c, 1, stages=s, exchange=ex)
        regs = probe.est_regs_per_thread(n, dtype_bits, backward)
        per_cta = probe.smem_bytes(n, backward, dtype_bits) + SMEM_CTA_RESERVED
        occ = max(1, min(4, REGS_PER_SM // (regs * t), 2048 // t, SMEM_PER_SM // per_cta))
        cfg = NormConfig(t, t, c, occ, stages=s, exchange=ex)
        try:
            cfg.validate(n, dtype_bits, backward=backward)
            return cfg
        except ValueError:
            continue
    return None


def cluster_staged_config(n: int, dtype_bits: int, elems: int = 32, stages: int = 3, min_cluster: int = 2,
                          backward: bool = True) -> NormConfig | None:
    """The staged backward for a row split over a cluster: the smallest cluster
    (>= ``min_cluster``, 2..16) whose CTAs can stage ``stages`` chunks of x / dy with
    <= ``elems`` elements per thread; if no cluster holds that many stages, the 16-CTA
    config with as many as fit. None when nothing valid fits (N not a multiple of
    cluster_n x 16 bytes' worth)."""
    best = None
    c = max(2, min_cluster)
    while c <= 16:
        cfg = staged_config(n, dtype_bits, elems, stages, cluster_n=c, backward=backward)
        if cfg is not None and -(-(n // c) // cfg.threads) <= elems:
            if cfg.stages == stages:
                return cfg
            if best is None or cfg.stages > best.stages:
                best = cfg
        c *= 2
    return best


def ring_config(base: NormConfig | None, n: int, dtype_bits: int, parts: int, stages: int = 2) -> NormConfig | None:
    """``base`` (a staged backward config) as the part-ring backward: its rows cut
    into ``parts`` parts in a ring of up to stages x parts slots; None when that is not
    valid for n (chunks not of whole rounds) or when, with a weight of x's dtype, fewer than
    parts + 1 slots fit beside the weight's chunk (the ring keeps it in shared memory;
    ring.py ``ring_fit``; the kernel would build whole-row stages instead)."""
    if base is None or not base.stages:
        return None
    cfg = replace(base, stages=stages, parts=parts)
    try:
        cfg.validate(n, dtype_bits, backward=True)
    except ValueError:
        return None
    if not ring_slots(cfg, n, dtype_bits, False, reserve=row_bytes(n // cfg.cluster_n, dtype_bits) + 256):
        return None
    return cfg


def staged_fwd_groups(cfg: NormConfig, sm_count: int, max_clusters: int | None = None) -> int:
    """The persistent staged forward's CTA groups (clusters) at most (the grid is this or
    the row count, whichever is smaller): sm_count x ctas_per_sm / cluster_n, and with a
    cluster at most the clusters the device runs at once x ctas_per_sm (as
    ``ops.norm.bwd_groups`` caps the staged backward: a group that does not fit would run
    as a second wave)."""
    q = max(1, sm_count * cfg.ctas_per_sm // cfg.cluster_n)
    if cfg.cluster_n > 1 and max_clusters:
        q = max(1, min(q, max_clusters * cfg.ctas_per_sm))
    return q
