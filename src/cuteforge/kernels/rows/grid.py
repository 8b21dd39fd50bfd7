"""Where a thread stands in the row kernels' grid (device code, traced inline): CTAs of
``R`` rows of ``P`` threads each, or, with ``C`` > 1, clusters of ``C`` CTAs that share
each row (CTA ``cta`` of a cluster holds threads ``cta * P .. cta * P + P - 1`` of the
row's ``C * P``)."""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute


def cluster_block(C: int, arrive: bool = True) -> tuple[Any, Any, Any]:
    """(tidx, cta, block): the thread's index in its CTA, its CTA's rank in the cluster (0
    without one) and the cluster's (or the CTA's) index in the grid. ``arrive``: with a
    cluster, arrive (relaxed) on the cluster barrier first, for a kernel whose exchange
    waits on it later."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    if C > 1:
        if arrive:
            cute.arch.cluster_arrive_relaxed()
        return tidx, cute.arch.block_idx_in_cluster(), bidx // C
    return tidx, 0, bidx


def wait_for_peers(c: int) -> None:
    """With a cluster (c > 1), the wait on the cluster barrier its prologue arrived on
    (relaxed, after arming its mbarriers): every peer CTA resident, its mbarriers armed,
    before the first ``st.async`` into it."""
    if c > 1:
        cute.arch.cluster_wait()


def row_coords(C: int, P: int, R: int, arrive: bool = True) -> tuple[Any, Any, Any, Any, Any, Any]:
    """(tidx, cta, r, t, g, row_block): the thread's index in its CTA, its CTA's rank in
    the cluster (0 without one), its row in the CTA and its thread in that row, its thread
    in the whole row (over the cluster) and the CTA's (cluster's) block of R rows: the
    thread's row is ``row_block * R + r`` (left to the caller, whose instruction order
    stays as it was). ``arrive``: with a cluster, arrive (relaxed) on the cluster barrier
    first, for a kernel whose exchange waits on it later."""
    tidx, cta, row_block = cluster_block(C, arrive)
    r = tidx // P
    t = tidx % P
    g = cta * P + t
    return tidx, cta, r, t, g, row_block


def clamped_row(row, x) -> tuple[Any, Any, Any]:
    """(row, m, row_c): the thread's ``row``, the row count m of x, and the row it reads,
    clamped into x: rows past the end (the last CTA's) re-read row m - 1, so that every
    lane joins the row's shuffles and barriers; they store nothing."""
    m = x.shape[0]
    return row, m, cutlass.min(row, m - 1)
