"""RMSNorm / LayerNorm backward: dx in one pass over (x, dy), dweight/dbias partials.

With xhat = (x - mean) * rstd (mean = 0 for rms) and g = dy * w:

    dx = rstd * (g - xhat * mean(g * xhat) - mean(g))       (the mean(g) term: ln only)
    dx += dsum                    (fused residual: the gradient of the returned x + res)
    dweight = sum_rows dy * xhat;  dbias = sum_rows dy

Persistent: the grid is Q CTA groups (Q = dwp.shape[0], chosen by the caller as
sm_count * ctas_per_sm / cluster_n, at most the number of row blocks); group q visits
row blocks q, q + Q, ... and keeps dweight/dbias sums for the columns its threads own
in fp32 registers. At the end each group writes one fp32 partial row, so
dweight = dwp.sum(0) (the caller launches the column reduction over Q x N right after).
With several rows per CTA (short rows) the R row-slots are first folded through shared
memory.

``reload`` re-reads x and dy after the row reduction instead of holding them in
registers across it (they come from L2: the CTA group read them microseconds before),
leaving the register file to the accumulators at huge N.

``exchange == "mbar"`` (cluster_n > 1): the row reductions go through
``common.make_allreduce_mbar_rows`` instead of a full cluster barrier per row: each
warp's lanes l < C ``st.async`` the partial sums into CTA l, counted on CTA l's
mbarrier, and each CTA waits on its own. Two mbarriers and two buffer halves alternate
over the CTA's rows (row j: slot j % 2, phase (j // 2) % 2); exchange.py argues why that
is race-free for a persistent loop.

``stages > 0`` (``NormBackwardStaged``): the rows come through shared memory.
Thread 0 brings row block j of the CTA into stage j % S with bulk asynchronous copies
(``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes``: x, dy and, when
fused, dsum; one copy per operand row, counted on the stage's mbarrier), S rows ahead.
The threads wait on the stage's mbarrier (phase (j // S) % 2), read x / dy column by
column from shared memory for the row sums, reduce, and read them again for dx, which
goes straight to global memory. Registers hold the weight (loaded once per launch), the
dweight / dbias accumulators and one vector at a time. A stage is refilled once every
thread is done with it: with S >= 2 and a multi-warp row, right after row j + 1's
reduction barrier (stage j % S gets row j + S; no extra barrier), otherwise after an
explicit CTA barrier at the end of row j. The weight is bulk-copied into shared memory
once when it fits beside the stages (else held in registers).

``parts >= 2`` (ring.py ``NormBackwardRing``): the staged chunks move through a
ring of part-sized slots instead of whole-row stages, each slot refilled as soon as its
part has been read for dx (for rows whose chunk allows only one whole stage).
"""


from __future__ import annotations

from dataclasses import replace

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64

from ..rows.grid import wait_for_peers
from ..rows.staging import (
    launch_bounds,
    make_stage_start,
    persistent_coords,
    staged_smem,
)
from .bwd_base import NormBackwardLaunch, StagedBackward
from .common import (
    Tile,
    column_of,
    fold_chains,
    make_row_io,
    staged_chunk,
)
from .config import (
    SMEM_PER_BLOCK,
    SMEM_PER_SM,
    NormConfig,
    default_register_config,
    staged_stages,
)
from .exchange import (
    make_allreduce,
    make_allreduce_mbar_rows,
    mbar_tx_bytes,
    reduce_smem_elems,
)
from .fwd import KINDS
from .ring import NormBackwardRing, ring_fit


def make_norm_bwd(kind: str, x_dtype, w_dtype, n: int, vec: int, config: NormConfig, has_bias: bool, has_dsum: bool,
                  rows_aligned: bool = True, w_aligned: bool = False, has_dw: bool = True):
    """@cute.jit norm_bwd(x, weight, dy, dsum, mean, rstd, dx, dwp, dbp, stream): the
    register backward (``NormBackward``), or for a staged config (``config.stages`` > 0) on
    aligned rows the row-staged one (``NormBackwardStaged``) or the part ring
    (``NormBackwardRing``, ``config.parts`` >= 2).

    x is the normalised input (x + residual when fused); dy and dsum have x's dtype.
    dwp/dbp: (Q, N) fp32 partials. Stand-ins: dsum -> dy, mean -> rstd (rms), dbp -> dwp.
    ``rows_aligned``: every row of x, dy and dsum starts 16-byte aligned (pointer and row
    stride), which the staged path's bulk copies need; without it a staged config builds
    the register path's default config instead (same results; the caller's Q stays valid:
    the persistent loop takes any grid).
    ``has_dw=False`` (no dweight / dbias wanted: frozen norm weights) writes no partial rows;
    dwp then only sizes the grid (Q = dwp.shape[0]) and may be a never-written stand-in (a
    stride-0 view). The partial sums go dead and the compiler drops them.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown norm kind {kind!r}; expected one of {KINDS}")
    if vec * max(x_dtype.width, w_dtype.width) > 128:
        raise ValueError(f"vec={vec} too wide for {x_dtype} / {w_dtype}")
    config.validate(n, x_dtype.width, backward=True)
    if config.stages and rows_aligned:
        backward = _staged_backward(kind, x_dtype, w_dtype, n, vec, config, has_bias, has_dsum, w_aligned, has_dw)
    else:
        if config.stages:
            config = default_register_config(n, x_dtype.width)
        backward = NormBackward(kind, x_dtype, w_dtype, n, vec, config, has_bias, has_dsum, has_dw)

    # the host function the callers compile: its name is the one a call with wrong
    # arguments reports
    @cute.jit
    def norm_bwd(x: cute.Tensor, w: cute.Tensor, dy: cute.Tensor, dsum: cute.Tensor, mean_in: cute.Tensor,
                 rstd_in: cute.Tensor, dx: cute.Tensor, dwp: cute.Tensor, dbp: cute.Tensor, stream):
        backward(x, w, dy, dsum, mean_in, rstd_in, dx, dwp, dbp, stream)

    return norm_bwd


def _staged_backward(kind: str, x_dtype, w_dtype, n: int, vec: int, config: NormConfig, has_bias: bool,
                     has_dsum: bool, w_aligned: bool, has_dw: bool) -> StagedBackward:
    """The part ring where ``config.parts`` asks for it and its slots fit, else the
    row-staged backward."""
    if config.parts:
        if ring_fit(config, n, x_dtype, w_dtype, has_dsum, w_aligned):
            return NormBackwardRing(kind, x_dtype, w_dtype, n, vec, config, has_bias, has_dsum, w_aligned, has_dw)
        # no room for parts + 1 slots beside the weight (dsum's third operand), or a
        # misaligned weight: whole-row stages, as many as fit (the staged kernel fits
        # them to dsum itself)
        config = next((c for c in (replace(config, parts=0, stages=s) for s in range(config.stages, 0, -1))
                       if c.smem_bytes(n, True, x_dtype.width) <= SMEM_PER_BLOCK), replace(config, parts=0, stages=1))
    return NormBackwardStaged(kind, x_dtype, w_dtype, n, vec, config, has_bias, has_dsum, w_aligned, has_dw)


class NormBackward(NormBackwardLaunch):
    """The register backward (module docstring): a persistent grid of CTA groups, each
    thread's share of a row block in registers, dweight / dbias sums per column in fp32
    registers until the group's partial row. ``make_norm_bwd`` checks the operands and
    picks this or a staged kernel."""

    def __init__(self, kind: str, x_dtype, w_dtype, n: int, vec: int, config: NormConfig, has_bias: bool,
                 has_dsum: bool, has_dw: bool) -> None:
        self.x_dtype, self.w_dtype, self.n, self.config = x_dtype, w_dtype, n, config
        self.has_bias, self.has_dsum, self.has_dw = has_bias, has_dsum, has_dw
        self.tile = tile = Tile.of(n, vec, config)
        self.threads, self.cluster_n = T, C = tile.T, tile.C
        self.is_ln = is_ln = kind == "layer"
        self.inv_n = 1.0 / n
        self.n_acc = n_acc = 2 if has_bias else 1  # accumulators per column: dweight (, dbias)
        self.row_io = make_row_io(tile)
        # the row sums (one, or LayerNorm's two): over the CTA's warps, and with a cluster
        # through the mbarrier exchange or a cluster barrier
        self.use_mbar = use_mbar = config.exchange == "mbar" and C > 1
        nval = 2 if is_ln else 1
        self.allreduce = make_allreduce(tile)
        self.allreduce_m = make_allreduce_mbar_rows(tile, nval) if use_mbar else None
        self.n_smem = reduce_smem_elems(tile, 2)
        self.tx_bytes = nval * mbar_tx_bytes(tile)
        # The persistent grid assumes ctas_per_sm CTAs fit on an SM: make ptxas honour it
        # (minctasm caps registers).
        self.bounds = launch_bounds(T, config.ctas_per_sm)
        self.fold = fold = tile.R > 1 and has_dw  # several rows per CTA: fold the row-slots' partials in smem
        self.n_fold = n_acc * tile.R * n if fold else 1

    @cute.kernel
    def kernel(self, x: cute.Tensor, w: cute.Tensor, dy: cute.Tensor, dsum: cute.Tensor, mean_in: cute.Tensor,
               rstd_in: cute.Tensor, dx: cute.Tensor, dwp: cute.Tensor, dbp: cute.Tensor):
        tile, config, x_dtype, w_dtype, n = self.tile, self.config, self.x_dtype, self.w_dtype, self.n
        T, P, C, R, KT1, V = tile.T, tile.P, tile.C, tile.R, tile.KT1, tile.vec
        has_bias, has_dsum, has_dw, is_ln, inv_n = self.has_bias, self.has_dsum, self.has_dw, self.is_ln, self.inv_n
        reload, prefetch = config.reload, config.prefetch
        use_mbar, n_smem, tx_bytes, fold, n_fold, n_acc = (self.use_mbar, self.n_smem, self.tx_bytes, self.fold,
                                                           self.n_fold, self.n_acc)
        load, store, store_scalar, _, _ = self.row_io
        allreduce, allreduce_m = self.allreduce, self.allreduce_m
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        if cutlass.const_expr(C > 1):
            if cutlass.const_expr(not use_mbar):
                cute.arch.cluster_arrive_relaxed()
            cta = cute.arch.block_idx_in_cluster()
            q = bidx // C
            n_q = gdim // C
        else:
            cta = 0
            q = bidx
            n_q = gdim
        r = tidx // P
        t = tidx % P
        g = cta * P + t
        m = x.shape[0]
        n_blocks = (m + R - 1) // R

        smem = cutlass.memory.SmemAllocator()
        buf = smem.allocate_tensor(Float32, cute.make_layout((n_smem,)), byte_alignment=16)
        sfold = smem.allocate_tensor(Float32, cute.make_layout((n_fold,)), byte_alignment=16)
        mbar = None
        if cutlass.const_expr(use_mbar):
            # two mbarriers (row parity), each armed for its first use; re-armed by thread 0
            # after every wait (make_allreduce_mbar_rows)
            mbar = smem.allocate_array(Int64, 2, byte_alignment=8)
            if tidx == 0:
                for i in cutlass.range_constexpr(2):
                    cute.arch.mbarrier_init(mbar + i, 1)
            cute.arch.mbarrier_init_fence()
            if tidx == 0:
                for i in cutlass.range_constexpr(2):
                    cute.arch.mbarrier_arrive_and_expect_tx(mbar + i, tx_bytes)
            cute.arch.cluster_arrive_relaxed()  # its wait (below) precedes the first st.async

        dwa, dba = tile.fragments(Float32, Float32)
        dwa.fill(0.0)
        dba.fill(0.0)
        xr, dyr, wr = tile.fragments(x_dtype, x_dtype, w_dtype)
        acc1 = cute.make_rmem_tensor(cute.make_layout((V,)), Float32)
        acc2 = cute.make_rmem_tensor(cute.make_layout((V,)), Float32)

        if cutlass.const_expr(prefetch):
            # the next row block's x/dy (and its row's rstd, mean) land here while the
            # current one is worked on; st holds the current row's (rstd, mean)
            xn, dyn = tile.fragments(x_dtype, x_dtype)
            st = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
            stn = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
            row0 = cutlass.min(q * R + r, m - 1)
            load(x[row0, None], xr, g)
            load(dy[row0, None], dyr, g)
            stn.fill(0.0)
            st[0] = rstd_in[row0]
            st[1] = Float32(0.0)
            if cutlass.const_expr(is_ln):
                st[1] = mean_in[row0]

        if cutlass.const_expr(config.early_weight):
            load(w, wr, g)  # held across the rows (the columns a thread covers never change)

        if cutlass.const_expr(C > 1):
            cute.arch.cluster_wait()  # every peer resident before the first DSMEM store

        for blk in cutlass.range(q, n_blocks, n_q, unroll=1):
            row = blk * R + r
            row_c = cutlass.min(row, m - 1)
            ok = row < m
            live = Float32(cutlass.select_(ok, Float32(1.0), Float32(0.0)))
            it = (blk - q) // n_q  # this CTA group's row-block count so far
            slot = it % 2
            if cutlass.const_expr(prefetch):
                nb = blk + n_q
                if nb < n_blocks:
                    nrow = cutlass.min(nb * R + r, m - 1)
                    load(x[nrow, None], xn, g)
                    load(dy[nrow, None], dyn, g)
                    stn[0] = rstd_in[nrow]
                    if cutlass.const_expr(is_ln):
                        stn[1] = mean_in[nrow]
            else:
                load(x[row_c, None], xr, g)
                load(dy[row_c, None], dyr, g)
            if cutlass.const_expr(not config.early_weight):
                load(w, wr, g)
            mean = Float32(0.0)
            if cutlass.const_expr(prefetch):
                # prefetched with x/dy: no global load on the path to the row sums
                rstd = st[0]
                if cutlass.const_expr(is_ln):
                    mean = st[1]
            else:
                rstd = rstd_in[row_c]
                if cutlass.const_expr(is_ln):
                    mean = mean_in[row_c]
            # padded slots: dy = 0, so g = 0 and they add nothing to either sum
            acc1.fill(0.0)
            acc2.fill(0.0)
            for k in cutlass.range_constexpr(KT1):
                for v in cutlass.range_constexpr(tile.width(k)):
                    xh = (xr[v, k].to(Float32) - mean) * rstd
                    gv = dyr[v, k].to(Float32) * wr[v, k].to(Float32)
                    acc1[v] = acc1[v] + gv * xh
                    if cutlass.const_expr(is_ln):
                        acc2[v] = acc2[v] + gv
            s1, s2 = fold_chains(acc1, acc2, V, is_ln)
            if cutlass.const_expr(use_mbar):
                s1, s2 = allreduce_m(s1, s2, buf, mbar, slot, (it // 2) % 2, tidx == 0, r, t, cta)
            else:
                s1, s2 = allreduce(s1, s2, 2 if is_ln else 1, buf, slot, r, t, cta)
            c1 = s1 * Float32(inv_n)
            c2 = Float32(0.0)
            if cutlass.const_expr(is_ln):
                c2 = s2 * Float32(inv_n)
            if cutlass.const_expr(reload):
                load(x[row_c, None], xr, g)
                load(dy[row_c, None], dyr, g)
                load(w, wr, g)
            if cutlass.const_expr(has_dsum):
                dsr = cute.make_rmem_tensor(cute.make_layout((V, KT1)), x_dtype)
                load(dsum[row_c, None], dsr, g)
            for k in cutlass.range_constexpr(KT1):
                for v in cutlass.range_constexpr(tile.width(k)):
                    xh = (xr[v, k].to(Float32) - mean) * rstd
                    dyv = dyr[v, k].to(Float32)
                    gv = dyv * wr[v, k].to(Float32)
                    dxv = (gv - xh * c1 - c2) * rstd
                    if cutlass.const_expr(has_dsum):
                        dxv = dxv + dsr[v, k].to(Float32)
                    dyl = dyv * live
                    dwa[v, k] = dwa[v, k] + dyl * xh
                    if cutlass.const_expr(has_bias):
                        dba[v, k] = dba[v, k] + dyl
                    xr[v, k] = dxv.to(x_dtype)
            if ok:
                store(xr, dx[row, None], g)
            if cutlass.const_expr(prefetch):
                for k in cutlass.range_constexpr(KT1):
                    for v in cutlass.range_constexpr(tile.width(k)):
                        xr[v, k] = xn[v, k]
                        dyr[v, k] = dyn[v, k]
                st[0] = stn[0]
                st[1] = stn[1]

        # ---- one fp32 partial row per CTA group
        if cutlass.const_expr(has_dw):
            if cutlass.const_expr(fold):
                for a in cutlass.range_constexpr(n_acc):
                    src = dwa if a == 0 else dba
                    for k in cutlass.range_constexpr(KT1):
                        for v in cutlass.range_constexpr(tile.width(k)):
                            col = column_of(tile, g, k, v)
                            kind_k = tile.kind(k)
                            if cutlass.const_expr(kind_k == "full"):
                                sfold[(a * R + r) * n + col] = src[v, k]
                            elif cutlass.const_expr(kind_k == "partial"):
                                if g < tile.REM:
                                    sfold[(a * R + r) * n + col] = src[v, k]
                            else:
                                if g < tile.TAIL:
                                    sfold[(a * R + r) * n + col] = src[v, k]
                cute.arch.sync_threads()
                for a in cutlass.range_constexpr(n_acc):
                    out = dwp if a == 0 else dbp
                    for i in cutlass.range_constexpr((n + T - 1) // T):
                        col = tidx + i * T
                        if col < n:
                            tot = sfold[(a * R) * n + col]
                            for rr in cutlass.range_constexpr(1, R):
                                tot = tot + sfold[(a * R + rr) * n + col]
                            out[q, col] = tot
            else:
                store_scalar(dwa, dwp[q, None], g)
                if cutlass.const_expr(has_bias):
                    store_scalar(dba, dbp[q, None], g)


class NormBackwardStaged(StagedBackward):
    """The row-staged backward (``config.stages`` > 0; module docstring). Same launch
    signature and results as ``NormBackward``. Rows of x / dy / dsum must
    start 16-byte aligned and hold a multiple of 16 bytes (``NormConfig.validate``).
    ``w_aligned`` (weight 16-byte aligned): the weight is bulk-copied into shared memory
    once and read from there, when it fits beside the stages at ``ctas_per_sm`` CTAs per
    SM; otherwise it is held in registers for the launch.

    With ``cluster_n`` = C > 1 (``exchange == "mbar"``) a row is split over the
    cluster: CTA c stages, reads and writes only its contiguous chunk
    [c N / C, (c + 1) N / C) of x, dy, dsum, dx, weight and the partial rows, and the row
    sums meet through ``make_allreduce_mbar_rows`` (two exchange mbarriers beside the stage
    mbarriers). Its wait replaces the CTA barrier the one-CTA path refills a stage after:
    a CTA passes row j + 1's wait only when every warp of the cluster sent its row j + 1
    partial, i.e. finished row j."""

    def __init__(self, kind: str, x_dtype, w_dtype, n: int, vec: int, config: NormConfig, has_bias: bool,
                 has_dsum: bool, w_aligned: bool = False, has_dw: bool = True) -> None:
        config.validate(n, x_dtype.width, backward=True)
        tile = staged_chunk(config, n, vec, "backward")
        # bf16 is widened by integer ops in the column math (common.make_widen): the row's
        # share of x and dy is widened twice per row; layer bf16 at N = 32768 / 131072 /
        # 262144 measured 90.8 / 88.0 / 82.5 -> 98.4 / 92.0 / 88.8 % of copy, RMSNorm bf16
        # within 2 points either way
        super().__init__(kind, x_dtype, w_dtype, n, config, has_bias, has_dsum, has_dw, tile)
        C, NC = self.cluster_n, self.chunk_n
        self.stages = S = staged_stages(config, n, x_dtype.width, has_dsum)
        # refill a stage right after the next row's reduction (no extra barrier), which needs
        # that reduction to order every thread's reads of the stage before it (a CTA barrier
        # for a row of several warps, the exchange's mbarrier wait with a cluster) and a second
        # stage to work on meanwhile
        self.early_refill = S >= 2 and (tile.S > 1 or C > 1)
        w_bytes = NC * w_dtype.width // 8
        smem_cta = config.smem_bytes(n, True, x_dtype.width, has_dsum) + w_bytes + 256
        self.w_smem = w_smem = bool(w_aligned and w_bytes % 16 == 0 and smem_cta <= SMEM_PER_BLOCK
                                    and (smem_cta + 1024) * config.ctas_per_sm <= SMEM_PER_SM)
        self.padded = bool(tile.REM or tile.TAIL)
        # barriers (S stages + the weight's), the weight, the first S rows; the issue
        # function: thread 0 brings the (x, dy, dsum) chunks of a row into a stage
        self.stage_start = make_stage_start(x_dtype, w_dtype, NC, C, S, self.n_rows, self.xtx, 1, w_smem)

    @cute.kernel
    def kernel(self, x: cute.Tensor, w: cute.Tensor, dy: cute.Tensor, dsum: cute.Tensor, mean_in: cute.Tensor,
               rstd_in: cute.Tensor, dx: cute.Tensor, dwp: cute.Tensor, dbp: cute.Tensor):
        C, NC, S, n_rows, n_smem, KT1 = self.cluster_n, self.chunk_n, self.stages, self.n_rows, self.n_smem, self.tile.KT1
        x_dtype, w_dtype, has_dsum, is_ln, inv_n = self.x_dtype, self.w_dtype, self.has_dsum, self.is_ln, self.inv_n
        w_smem, padded, early_refill = self.w_smem, self.padded, self.early_refill
        load_col, store_col, _part = self.load_col, self.store_col, self.chunk
        sums_col, row_sums, dx_col, reduce_row = self.sums_col, self.row_sums, self.dx_col, self.reduce_row
        _start, _issue, _refill = self.stage_start
        tidx, cta, q, n_q, m = persistent_coords(C, x)
        g = tidx
        # stage slots, reduction buffer, one "full" mbarrier per stage + the weight's, and
        # with a cluster the row sums' exchange mbarriers
        smem, srows, buf, full, xbar = staged_smem(x_dtype, NC, S * n_rows, n_smem, S + 1, C)
        sw = srows  # a stand-in unless the weight sits in shared memory
        if cutlass.const_expr(w_smem):
            sw = smem.allocate_tensor(w_dtype, cute.make_layout((NC,)), byte_alignment=128)
        _start(tidx, cta, q, n_q, m, x, dy, dsum, w, w, srows, full, xbar if cutlass.const_expr(C > 1) else full, sw, sw)

        dwa, dba, wr, xc, dyc, dsc, oc, f, (acc1, acc2) = self.fragments()
        if cutlass.const_expr(padded):
            wr.fill(0.0)
            xc.fill(0.0)
            dyc.fill(0.0)  # slots a thread does not own: dy = 0 adds nothing to any sum
            dsc.fill(0.0)
        if cutlass.const_expr(not w_smem):
            wg = _part(w, cta)
            for k in cutlass.range_constexpr(KT1):
                load_col(wg, wr, g, k)  # the weight stays in registers for the whole launch
        else:
            cute.arch.mbarrier_wait(full + S, 0)
        st, stn = self.first_row_stats(rstd_in, mean_in, q)
        wait_for_peers(C)

        for blk in cutlass.range(q, m, n_q, unroll=1):
            it = (blk - q) // n_q  # this CTA's row count so far
            stage = it % S
            rstd, mean = self.next_row_stats(st, stn, rstd_in, mean_in, blk + n_q, m)
            sx = srows[None, stage * n_rows]
            sdy = srows[None, stage * n_rows + 1]
            cute.arch.mbarrier_wait(full + stage, (it // S) % 2)
            acc1.fill(0.0)
            acc2.fill(0.0)
            for k in cutlass.range_constexpr(KT1):
                load_col(sx, xc, g, k)
                load_col(sdy, dyc, g, k)
                if cutlass.const_expr(w_smem):
                    load_col(sw, wr, g, k)
                sums_col(xc, dyc, wr, f, (acc1, acc2), mean, rstd, k)
            s1, s2 = row_sums((acc1, acc2))
            s1, s2 = reduce_row(s1, s2, buf, xbar, it, g, cta)
            if cutlass.const_expr(early_refill):
                # every thread (of every CTA of the cluster) is past this row's reduction, so
                # done with the previous row's stage: refill that stage with the row S - 1
                # ahead of this one
                if tidx == 0:
                    if it > 0:
                        nr = blk + (S - 1) * n_q
                        if nr < m:
                            _issue(x, dy, dsum, srows, full, nr, (it + S - 1) % S, cta)
            c1 = s1 * Float32(inv_n)
            c2 = Float32(0.0)
            if cutlass.const_expr(is_ln):
                c2 = s2 * Float32(inv_n)
            dxr = _part(dx[blk, None], cta)
            for k in cutlass.range_constexpr(KT1):
                load_col(sx, xc, g, k)
                load_col(sdy, dyc, g, k)
                if cutlass.const_expr(w_smem):
                    load_col(sw, wr, g, k)
                if cutlass.const_expr(has_dsum):
                    load_col(srows[None, stage * n_rows + 2], dsc, g, k)
                dx_col(xc, dyc, wr, dsc, f, mean, rstd, c1, c2, dwa, dba, oc, k)
                store_col(oc, dxr, g, k)
            if cutlass.const_expr(not early_refill):
                cute.arch.sync_threads()  # every thread is done with this stage
                _refill(tidx, x, dy, dsum, srows, full, blk, S, n_q, m, stage, cta)
            self.advance_row_stats(st, stn)

        self.store_partials(dwa, dba, dwp, dbp, q, cta, g)
