"""The part-ring staged backward (``NormConfig.parts`` >= 2).

The row-staged backward (bwd.py ``make_norm_bwd_staged``) moves whole row chunks through
S stages. At fp32 N = 262144 a CTA's chunk of x and dy is 128 KiB, so only one stage fits
and nothing is in flight while a row is reduced, exchanged and written: the kernel ran at
62-81 % of copy there, against 96-99 % at N <= 131072.

Here a CTA's chunk is cut into P parts of whole rounds (round k of the chunk is the k-th
T x vec block of it, so part p holds rounds [p RP, (p + 1) RP), RP = KT1 / P), and the
parts move through a ring of L > P part-sized slots: part u of the CTA's stream (row u // P
of its rows, part u % P) lives in slot u % L and is waited for with parity (u // L) % 2.
Every slot has a "full" mbarrier (thread 0 arms it with the part's bytes and bulk-copies
x, dy, dsum parts in) and an "empty" one (one arrival per warp, after the warp's last read
of the part: its dx pass). Thread 0 refills a slot with the part L ahead once its empty
barrier completes; it does so one part behind its own dx pass (the slowest warp has then
usually released it) and for the row's last part at the row's end. So the next row's
first L - P parts are in flight during this row's sums and exchange, and its remaining
parts start as soon as this row's dx pass frees their slots.

Why it cannot deadlock or race: a slot's next fill needs every warp's release of its
current part, which each warp gives after reading it, with no dependence on thread 0; a
warp waiting for a part has released every earlier part it read, and thread 0 issues
parts in stream order, each right after the release it needs. A full-barrier phase can
run at most one ahead of a waiting warp (the next fill of a slot needs that warp's
release), and an empty-barrier phase at most one ahead of thread 0's wait (the next use
needs the fill thread 0 issues after that wait), so parity waits are unambiguous.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.nvgpu import cpasync

from ..rows.grid import wait_for_peers
from ..rows.staging import (
    launch_bounds,
    make_chunk,
    make_stage_barrier_init,
    persistent_coords,
    staged_smem,
)
from .common import (
    Tile,
    advance_row_stats,
    bwd_fragments,
    first_row_stats,
    make_bwd_columns,
    make_row_io,
    next_row_stats,
    row_view,
    store_partial_rows,
)
from .config import NormConfig, ring_slots, staged_rows
from .exchange import make_chunk_allreduce


def ring_fit(config: NormConfig, n: int, x_dtype, w_dtype, has_dsum: bool, w_aligned: bool) -> int:
    """The ring's slot count L for these operands, or 0 when the ring does not apply: it
    keeps the weight's chunk in shared memory (in registers, beside the dweight / dbias
    accumulators, fp32 N = 262144 on 512 threads made ptxas spill 36-132 bytes), so the
    weight must be 16-byte aligned and leave room for parts + 1 slots."""
    w_bytes = n // config.cluster_n * w_dtype.width // 8
    if not (config.parts and w_aligned and w_bytes % 16 == 0):
        return 0
    return ring_slots(config, n, x_dtype.width, has_dsum, reserve=w_bytes + 256)


def make_part_issue(dtype, nc: int, c: int, n_rows: int, parts: int):
    """@cute.jit issue(a, b, d, sring, full, row, p, slot, cta) for thread 0: arm mbarrier
    ``full + slot`` with one part's bytes of n_rows operands and bulk-copy part p (of
    ``parts``) of this CTA's chunk of row ``row`` of a, b (, d) into slots ``slot * n_rows +
    i`` of ``sring`` ((nc / parts, L * n_rows) shared memory)."""
    chunk = make_chunk(nc, c)
    np_ = nc // parts
    part_bytes = np_ * dtype.width // 8

    @cute.jit
    def issue(a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, sring: cute.Tensor, full, row, p, slot, cta):
        atom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), dtype, num_bits_per_copy=part_bytes * 8)
        bar = full + slot
        cute.arch.mbarrier_arrive_and_expect_tx(bar, n_rows * part_bytes)
        cute.copy(atom, cute.local_tile(chunk(a[row, None], cta), (np_,), (p,)), sring[None, slot * n_rows], mbar_ptr=bar)
        if cutlass.const_expr(n_rows > 1):
            cute.copy(atom, cute.local_tile(chunk(b[row, None], cta), (np_,), (p,)), sring[None, slot * n_rows + 1],
                      mbar_ptr=bar)
        if cutlass.const_expr(n_rows > 2):
            cute.copy(atom, cute.local_tile(chunk(d[row, None], cta), (np_,), (p,)), sring[None, slot * n_rows + 2],
                      mbar_ptr=bar)

    return issue


def make_norm_bwd_ring(kind: str, x_dtype, w_dtype, n: int, vec: int, config: NormConfig, has_bias: bool,
                       has_dsum: bool, w_aligned: bool, launcher, has_dw: bool = True):
    """The part-ring backward (module docstring). Same launch signature and results as
    bwd.py's ``make_norm_bwd``; rows 16-byte aligned, ``config.parts`` >= 2 validated
    (chunks of whole rounds) and ``ring_fit`` > 0 for these operands, which the caller
    checks (bwd.py falls back to whole-row stages)."""
    C = config.cluster_n
    NC = n // C
    T = config.threads
    P = config.parts
    w_bytes = NC * w_dtype.width // 8
    L = ring_fit(config, n, x_dtype, w_dtype, has_dsum, w_aligned)
    if not L:
        raise ValueError(f"parts={P}: fewer than {P + 1} part slots fit beside the weight ({config}, n={n}, dsum={has_dsum})")
    tile = Tile(NC, vec, T, 1, T)  # the chunk over the CTA's threads
    if tile.REM or tile.TAIL or tile.KT1 % P:
        raise ValueError(f"parts={P} needs the chunk ({NC} elements) in whole rounds of {T} x {vec}, a multiple of {P}")
    ptile = Tile(NC // P, vec, T, 1, T)  # one part
    _, _, store_scalar, load_col, store_col = make_row_io(tile)
    V, RP = tile.vec, tile.KT1 // P
    is_ln = kind == "layer"
    nval = 2 if is_ln else 1
    inv_n = 1.0 / n
    reduce_row, xtx, n_smem = make_chunk_allreduce(tile, n, C, nval)
    n_rows = staged_rows(True, has_dsum)
    W = T // 32
    _issue = make_part_issue(x_dtype, NC, C, n_rows, P)
    # the column math of bwd.py's whole-row staged kernel (common.make_bwd_columns)
    sums_col, row_sums, dx_col = make_bwd_columns(tile, x_dtype, w_dtype, is_ln, has_bias, has_dsum)
    # L full mbarriers + the weight's, then L empty ones (one arrival per warp)
    _init = make_stage_barrier_init(L + 1, C, xtx, n_empty=L, empty_count=W)
    _bounds = launch_bounds(T, config.ctas_per_sm)
    _chunk = make_chunk(NC, C)
    EMPTY = L + 1  # offset of the empty mbarriers from `full`

    @cute.jit
    def load_part_col(spart: cute.Tensor, frag: cute.Tensor, g, kk: cutlass.Constexpr, k: cutlass.Constexpr):
        """frag[:, k] <- round kk of this thread's share of one staged part."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), spart.element_type,
                                   num_bits_per_copy=V * spart.element_type.width)
        cute.copy(atom, row_view(ptile, spart)[None, g, None][None, kk], frag[None, k])

    @cute.jit
    def refill(x, dy, dsum, sring, full, u, q, n_q, m, cta):
        """Thread 0: once every warp released part u, bring part u + L into its slot."""
        nu = u + L
        nb = q + (nu // P) * n_q
        if nb < m:
            slot = u % L
            cute.arch.mbarrier_wait(full + EMPTY + slot, (u // L) % 2)
            _issue(x, dy, dsum, sring, full, nb, nu % P, slot, cta)

    @cute.jit
    def _body(x, w, dy, dsum, mean_in, rstd_in, dx, dwp, dbp):
        tidx, cta, q, n_q, m = persistent_coords(C, x)
        g = tidx
        smem, sring, buf, full, xbar = staged_smem(x_dtype, NC // P, L * n_rows, n_smem, 2 * L + 1, C)
        sw = smem.allocate_tensor(w_dtype, cute.make_layout((NC,)), byte_alignment=128)  # the weight's chunk
        _init(tidx, full, xbar if cutlass.const_expr(C > 1) else full)
        if tidx == 0:
            watom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), w_dtype, num_bits_per_copy=w_bytes * 8)
            cute.arch.mbarrier_arrive_and_expect_tx(full + L, w_bytes)
            cute.copy(watom, _chunk(w, cta), sw, mbar_ptr=full + L)
            for u in cutlass.range_constexpr(L):  # the first L parts of the CTA's stream
                if q + (u // P) * n_q < m:
                    _issue(x, dy, dsum, sring, full, q + (u // P) * n_q, u % P, u, cta)

        dwa, dba, wr, xc, dyc, dsc, oc, f, (acc1, acc2) = bwd_fragments(tile, x_dtype, w_dtype)
        cute.arch.mbarrier_wait(full + L, 0)
        st, stn = first_row_stats(rstd_in, mean_in, q, is_ln)
        wait_for_peers(C)

        for blk in cutlass.range(q, m, n_q, unroll=1):
            it = (blk - q) // n_q  # this CTA's row count so far
            u0 = it * P  # the row's first part in the CTA's stream
            rstd, mean = next_row_stats(st, stn, rstd_in, mean_in, blk + n_q, m, is_ln)
            acc1.fill(0.0)
            acc2.fill(0.0)
            slot0 = u0 % L
            phase0 = (u0 // L) % 2
            for p in cutlass.range_constexpr(P):  # row sums, part by part as they land
                wrap = slot0 + p >= L
                slot = cutlass.select_(wrap, slot0 + p - L, slot0 + p)
                cute.arch.mbarrier_wait(full + slot, cutlass.select_(wrap, 1 - phase0, phase0))
                for kk in cutlass.range_constexpr(RP):
                    k = p * RP + kk
                    load_part_col(sring[None, slot * n_rows], xc, g, kk, k)
                    load_part_col(sring[None, slot * n_rows + 1], dyc, g, kk, k)
                    load_col(sw, wr, g, k)
                    sums_col(xc, dyc, wr, f, (acc1, acc2), mean, rstd, k)
            s1, s2 = row_sums((acc1, acc2))
            s1, s2 = reduce_row(s1, s2, buf, xbar, it, g, cta)
            c1 = s1 * Float32(inv_n)
            c2 = Float32(0.0)
            if cutlass.const_expr(is_ln):
                c2 = s2 * Float32(inv_n)
            dxr = _chunk(dx[blk, None], cta)
            for p in cutlass.range_constexpr(P):  # dx, part by part, each slot released after it
                slot = cutlass.select_(slot0 + p >= L, slot0 + p - L, slot0 + p)
                for kk in cutlass.range_constexpr(RP):
                    k = p * RP + kk
                    load_part_col(sring[None, slot * n_rows], xc, g, kk, k)
                    load_part_col(sring[None, slot * n_rows + 1], dyc, g, kk, k)
                    load_col(sw, wr, g, k)
                    if cutlass.const_expr(has_dsum):
                        load_part_col(sring[None, slot * n_rows + 2], dsc, g, kk, k)
                    dx_col(xc, dyc, wr, dsc, f, mean, rstd, c1, c2, dwa, dba, oc, k)
                    store_col(oc, dxr, g, k)
                # the warp is done with this part: release its slot (every lane's reads
                # precede the elected arrive through the warp barrier)
                cute.arch.sync_warp()
                if tidx % 32 == 0:
                    cute.arch.mbarrier_arrive(full + EMPTY + slot)
                if cutlass.const_expr(p > 0):
                    if tidx == 0:
                        refill(x, dy, dsum, sring, full, u0 + p - 1, q, n_q, m, cta)
            if tidx == 0:
                refill(x, dy, dsum, sring, full, u0 + P - 1, q, n_q, m, cta)
            advance_row_stats(st, stn)

        store_partial_rows(store_scalar, _chunk, dwa, dba, dwp, dbp, q, cta, g, has_dw, has_bias)

    return launcher(_body, T, C, _bounds)
