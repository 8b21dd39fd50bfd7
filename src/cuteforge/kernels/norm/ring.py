"""The part-ring staged backward (``NormConfig.parts`` >= 2).

The row-staged backward (bwd.py ``NormBackwardStaged``) moves whole row chunks through
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
    make_stage_barrier_init,
    persistent_coords,
    staged_smem,
)
from .bwd_base import StagedBackward
from .common import Tile, row_view
from .config import NormConfig, ring_slots


def ring_fit(config: NormConfig, n: int, x_dtype, w_dtype, has_dsum: bool, w_aligned: bool) -> int:
    """The ring's slot count L for these operands, or 0 when the ring does not apply: it
    keeps the weight's chunk in shared memory (in registers, beside the dweight / dbias
    accumulators, fp32 N = 262144 on 512 threads made ptxas spill 36-132 bytes), so the
    weight must be 16-byte aligned and leave room for parts + 1 slots."""
    w_bytes = n // config.cluster_n * w_dtype.width // 8
    if not (config.parts and w_aligned and w_bytes % 16 == 0):
        return 0
    return ring_slots(config, n, x_dtype.width, has_dsum, reserve=w_bytes + 256)



class NormBackwardRing(StagedBackward):
    """The part-ring backward (module docstring). Same launch signature and results as
    bwd.py's ``NormBackward``; rows 16-byte aligned, ``config.parts`` >= 2 validated
    (chunks of whole rounds) and ``ring_fit`` > 0 for these operands, which the caller
    checks (bwd.py falls back to whole-row stages)."""

    def __init__(self, kind: str, x_dtype, w_dtype, n: int, vec: int, config: NormConfig, has_bias: bool,
                 has_dsum: bool, w_aligned: bool, has_dw: bool = True) -> None:
        C, T, P = config.cluster_n, config.threads, config.parts
        NC = n // C
        self.parts = P
        self.w_bytes = NC * w_dtype.width // 8
        self.slots = L = ring_fit(config, n, x_dtype, w_dtype, has_dsum, w_aligned)
        if not L:
            raise ValueError(f"parts={P}: fewer than {P + 1} part slots fit beside the weight ({config}, n={n}, dsum={has_dsum})")
        tile = Tile(NC, vec, T, 1, T)  # the chunk over the CTA's threads
        if tile.REM or tile.TAIL or tile.KT1 % P:
            raise ValueError(f"parts={P} needs the chunk ({NC} elements) in whole rounds of {T} x {vec}, a multiple of {P}")
        self.part_tile = Tile(NC // P, vec, T, 1, T)  # one part
        super().__init__(kind, x_dtype, w_dtype, n, config, has_bias, has_dsum, has_dw, tile)
        self.rounds_per_part = tile.KT1 // P
        self.part_bytes = NC // P * x_dtype.width // 8
        # L full mbarriers + the weight's, then L empty ones (one arrival per warp)
        self.barrier_init = make_stage_barrier_init(L + 1, C, self.xtx, n_empty=L, empty_count=T // 32)
        self.empty = L + 1  # offset of the empty mbarriers from `full`

    @cute.jit
    def issue_part(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, sring: cute.Tensor, full, row, p, slot, cta):
        """Thread 0: arm mbarrier ``full + slot`` with one part's bytes of the n_rows
        operands and bulk-copy part p of this CTA's chunk of row ``row`` of a, b (, d) into
        slots ``slot * n_rows + i`` of ``sring`` ((NC / parts, L * n_rows) shared memory)."""
        n_rows, part_bytes, np_, chunk = self.n_rows, self.part_bytes, self.part_tile.n, self.chunk
        atom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), self.x_dtype, num_bits_per_copy=part_bytes * 8)
        bar = full + slot
        cute.arch.mbarrier_arrive_and_expect_tx(bar, n_rows * part_bytes)
        cute.copy(atom, cute.local_tile(chunk(a[row, None], cta), (np_,), (p,)), sring[None, slot * n_rows], mbar_ptr=bar)
        if cutlass.const_expr(n_rows > 1):
            cute.copy(atom, cute.local_tile(chunk(b[row, None], cta), (np_,), (p,)), sring[None, slot * n_rows + 1],
                      mbar_ptr=bar)
        if cutlass.const_expr(n_rows > 2):
            cute.copy(atom, cute.local_tile(chunk(d[row, None], cta), (np_,), (p,)), sring[None, slot * n_rows + 2],
                      mbar_ptr=bar)

    @cute.jit
    def load_part_col(self, spart: cute.Tensor, frag: cute.Tensor, g, kk: cutlass.Constexpr, k: cutlass.Constexpr):
        """frag[:, k] <- round kk of this thread's share of one staged part."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), spart.element_type,
                                   num_bits_per_copy=self.tile.vec * spart.element_type.width)
        cute.copy(atom, row_view(self.part_tile, spart)[None, g, None][None, kk], frag[None, k])

    @cute.jit
    def refill(self, x, dy, dsum, sring, full, u, q, n_q, m, cta):
        """Thread 0: once every warp released part u, bring part u + L into its slot."""
        L, P = self.slots, self.parts
        nu = u + L
        nb = q + (nu // P) * n_q
        if nb < m:
            slot = u % L
            cute.arch.mbarrier_wait(full + self.empty + slot, (u // L) % 2)
            self.issue_part(x, dy, dsum, sring, full, nb, nu % P, slot, cta)

    @cute.kernel
    def kernel(self, x: cute.Tensor, w: cute.Tensor, dy: cute.Tensor, dsum: cute.Tensor, mean_in: cute.Tensor,
               rstd_in: cute.Tensor, dx: cute.Tensor, dwp: cute.Tensor, dbp: cute.Tensor):
        C, NC, P, L, RP, EMPTY = self.cluster_n, self.chunk_n, self.parts, self.slots, self.rounds_per_part, self.empty
        x_dtype, w_dtype, w_bytes, has_dsum, is_ln, inv_n = (self.x_dtype, self.w_dtype, self.w_bytes, self.has_dsum,
                                                             self.is_ln, self.inv_n)
        n_rows, n_smem, load_col, store_col, _chunk = self.n_rows, self.n_smem, self.load_col, self.store_col, self.chunk
        sums_col, row_sums, dx_col, reduce_row = self.sums_col, self.row_sums, self.dx_col, self.reduce_row
        _init, load_part_col, refill = self.barrier_init, self.load_part_col, self.refill
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
                    self.issue_part(x, dy, dsum, sring, full, q + (u // P) * n_q, u % P, u, cta)

        dwa, dba, wr, xc, dyc, dsc, oc, f, (acc1, acc2) = self.fragments()
        cute.arch.mbarrier_wait(full + L, 0)
        st, stn = self.first_row_stats(rstd_in, mean_in, q)
        wait_for_peers(C)

        for blk in cutlass.range(q, m, n_q, unroll=1):
            it = (blk - q) // n_q  # this CTA's row count so far
            u0 = it * P  # the row's first part in the CTA's stream
            rstd, mean = self.next_row_stats(st, stn, rstd_in, mean_in, blk + n_q, m)
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
            self.advance_row_stats(st, stn)

        self.store_partials(dwa, dba, dwp, dbp, q, cta, g)
