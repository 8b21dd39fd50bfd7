"""RMSNorm / LayerNorm backward: dx in one pass over (x, dy), dweight/dbias partials.

With xhat = (x - mean) * rstd (mean = 0 for rms) and g = dy * w:

    dx = rstd * (g - xhat * mean(g * xhat) - mean(g))       (the mean(g) term: ln only)
    dx += dsum                    (fused residual: the gradient of the returned x + res)
    dweight = sum_rows dy * xhat;  dbias = sum_rows dy

Persistent: the grid is Q CTA groups (Q = dwp.shape[0], chosen by the caller as
sm_count * ctas_per_sm / cluster_n, at most the number of row blocks); group q visits
row blocks q, q + Q, ... and keeps dweight/dbias sums for the columns its threads own
in fp32 registers. At the end each group writes one fp32 partial row, so
dweight = dwp.sum(0) (a small torch.sum over Q x N, done by the caller). With several
rows per CTA (short rows) the R row-slots are first folded through shared memory.

``reload`` re-reads x and dy after the row reduction instead of holding them in
registers across it (they come from L2: the CTA group read them microseconds before),
leaving the register file to the accumulators at huge N.

``exchange == "mbar"`` (cluster_n > 1): the row reductions go through
``common.make_allreduce_mbar_rows`` instead of a full cluster barrier per row: each
warp's lanes l < C ``st.async`` the partial sums into CTA l, counted on CTA l's
mbarrier, and each CTA waits on its own. Two mbarriers and two buffer halves alternate
over the CTA's rows (row j: slot j % 2, phase (j // 2) % 2); exchange.py argues why that
is race-free for a persistent loop.

``stages > 0`` (``make_norm_bwd_staged``): the rows come through shared memory.
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

``parts >= 2`` (ring.py ``make_norm_bwd_ring``): the staged chunks move through a
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
    make_chunk,
    make_stage_start,
    persistent_coords,
    staged_smem,
)
from .common import (
    Tile,
    advance_row_stats,
    bwd_fragments,
    column_of,
    first_row_stats,
    fold_chains,
    make_bwd_columns,
    make_row_io,
    next_row_stats,
    staged_chunk,
    store_partial_rows,
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
    make_chunk_allreduce,
    mbar_tx_bytes,
    reduce_smem_elems,
)
from .fwd import KINDS
from .ring import make_norm_bwd_ring, ring_fit


def make_norm_bwd(kind: str, x_dtype, w_dtype, n: int, vec: int, config: NormConfig, has_bias: bool, has_dsum: bool,
                  rows_aligned: bool = True, w_aligned: bool = False, has_dw: bool = True):
    """@cute.jit f(x, weight, dy, dsum, mean, rstd, dx, dwp, dbp, stream).

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
    if config.stages:
        if rows_aligned:
            if config.parts:
                if ring_fit(config, n, x_dtype, w_dtype, has_dsum, w_aligned):
                    return make_norm_bwd_ring(kind, x_dtype, w_dtype, n, vec, config, has_bias, has_dsum, w_aligned,
                                              _launcher, has_dw)
                # no room for parts + 1 slots beside the weight (dsum's third operand), or a
                # misaligned weight: whole-row stages, as many as fit (the staged kernel fits
                # them to dsum itself)
                config = next((c for c in (replace(config, parts=0, stages=s) for s in range(config.stages, 0, -1))
                               if c.smem_bytes(n, True, x_dtype.width) <= SMEM_PER_BLOCK), replace(config, parts=0, stages=1))
            return make_norm_bwd_staged(kind, x_dtype, w_dtype, n, vec, config, has_bias, has_dsum, w_aligned, has_dw)
        config = default_register_config(n, x_dtype.width)
    tile = Tile.of(n, vec, config)
    load, store, store_scalar, _, _ = make_row_io(tile)
    allreduce = make_allreduce(tile)
    T, P, C, R, KT1, V = tile.T, tile.P, tile.C, tile.R, tile.KT1, tile.vec
    is_ln = kind == "layer"
    inv_n = 1.0 / n
    reload = config.reload
    prefetch = config.prefetch
    n_smem = reduce_smem_elems(tile, 2)
    n_acc = 2 if has_bias else 1
    use_mbar = config.exchange == "mbar" and C > 1
    nval = 2 if is_ln else 1
    allreduce_m = make_allreduce_mbar_rows(tile, nval) if use_mbar else None
    tx_bytes = nval * mbar_tx_bytes(tile)
    # The persistent grid assumes ctas_per_sm CTAs fit on an SM: make ptxas honour it
    # (minctasm caps registers).
    _bounds = launch_bounds(T, config.ctas_per_sm)
    fold = R > 1 and has_dw  # several rows per CTA: fold the row-slots' partials in smem
    n_fold = n_acc * R * n if fold else 1

    @cute.jit
    def _body(x, w, dy, dsum, mean_in, rstd_in, dx, dwp, dbp):
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

    return _launcher(_body, T, C, _bounds)


def _launcher(body, T: int, C: int, bounds: dict):
    """@cute.jit norm_bwd(x, weight, dy, dsum, mean, rstd, dx, dweight_partial,
    dbias_partial, stream): the backward kernel on one CTA group of C CTAs (a cluster when
    C > 1) of T threads per row of the partials (the persistent grid's Q groups), with the
    launch ``bounds``. Its device code is ``body``, a @cute.jit of the nine tensors traced
    inline: the register, row-staged and part-ring backwards share this entry and differ
    only in their body."""

    @cute.kernel
    def kernel(x: cute.Tensor, w: cute.Tensor, dy: cute.Tensor, dsum: cute.Tensor, mean_in: cute.Tensor,
               rstd_in: cute.Tensor, dx: cute.Tensor, dwp: cute.Tensor, dbp: cute.Tensor):
        body(x, w, dy, dsum, mean_in, rstd_in, dx, dwp, dbp)

    @cute.jit
    def norm_bwd(x: cute.Tensor, w: cute.Tensor, dy: cute.Tensor, dsum: cute.Tensor, mean_in: cute.Tensor,
                 rstd_in: cute.Tensor, dx: cute.Tensor, dwp: cute.Tensor, dbp: cute.Tensor, stream):
        n_q = dwp.shape[0]
        if cutlass.const_expr(C > 1):
            kernel(x, w, dy, dsum, mean_in, rstd_in, dx, dwp, dbp).launch(
                grid=(n_q * C, 1, 1), block=(T, 1, 1), cluster=(C, 1, 1), stream=stream, **bounds
            )
        else:
            kernel(x, w, dy, dsum, mean_in, rstd_in, dx, dwp, dbp).launch(
                grid=(n_q, 1, 1), block=(T, 1, 1), stream=stream, **bounds
            )

    return norm_bwd



def make_norm_bwd_staged(kind: str, x_dtype, w_dtype, n: int, vec: int, config: NormConfig, has_bias: bool,
                         has_dsum: bool, w_aligned: bool = False, has_dw: bool = True):
    """The row-staged backward (``config.stages`` > 0; module docstring). Same launch
    signature and results as ``make_norm_bwd``'s register path. Rows of x / dy / dsum must
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
    config.validate(n, x_dtype.width, backward=True)
    C, T = config.cluster_n, config.threads
    tile = staged_chunk(config, n, vec, "backward")
    NC = tile.n  # this CTA's chunk of the row
    _, _, store_scalar, load_col, store_col = make_row_io(tile)
    KT1 = tile.KT1
    is_ln = kind == "layer"
    nval = 2 if is_ln else 1
    inv_n = 1.0 / n
    reduce_row, xtx, n_smem = make_chunk_allreduce(tile, n, C, nval)
    S = staged_stages(config, n, x_dtype.width, has_dsum)
    n_rows = 3 if has_dsum else 2  # x, dy (, dsum) per stage
    # refill a stage right after the next row's reduction (no extra barrier), which needs
    # that reduction to order every thread's reads of the stage before it (a CTA barrier
    # for a row of several warps, the exchange's mbarrier wait with a cluster) and a second
    # stage to work on meanwhile
    early_refill = S >= 2 and (tile.S > 1 or C > 1)
    w_bytes = NC * w_dtype.width // 8
    smem_cta = config.smem_bytes(n, True, x_dtype.width, has_dsum) + w_bytes + 256
    w_smem = bool(w_aligned and w_bytes % 16 == 0 and smem_cta <= SMEM_PER_BLOCK
                  and (smem_cta + 1024) * config.ctas_per_sm <= SMEM_PER_SM)
    padded = bool(tile.REM or tile.TAIL)
    # the column math, shared with the part ring (common.make_bwd_columns). bf16 is widened
    # by integer ops (common.make_widen): the row's share of x and dy is widened twice per
    # row; layer bf16 at N = 32768 / 131072 / 262144 measured 90.8 / 88.0 / 82.5 -> 98.4 /
    # 92.0 / 88.8 % of copy, RMSNorm bf16 within 2 points either way
    sums_col, row_sums, dx_col = make_bwd_columns(tile, x_dtype, w_dtype, is_ln, has_bias, has_dsum)
    # barriers (S stages + the weight's), the weight, the first S rows
    # _issue: thread 0 brings the (x, dy, dsum) chunks of a row into a stage
    _start, _issue, _refill = make_stage_start(x_dtype, w_dtype, NC, C, S, n_rows, xtx, 1, w_smem)
    _bounds = launch_bounds(T, config.ctas_per_sm)

    _part = make_chunk(NC, C)  # this CTA's chunk of a row (the whole row without a cluster)

    @cute.jit
    def _body(x, w, dy, dsum, mean_in, rstd_in, dx, dwp, dbp):
        tidx, cta, q, n_q, m = persistent_coords(C, x)
        g = tidx
        # stage slots, reduction buffer, one "full" mbarrier per stage + the weight's, and
        # with a cluster the row sums' exchange mbarriers
        smem, srows, buf, full, xbar = staged_smem(x_dtype, NC, S * n_rows, n_smem, S + 1, C)
        sw = srows  # a stand-in unless the weight sits in shared memory
        if cutlass.const_expr(w_smem):
            sw = smem.allocate_tensor(w_dtype, cute.make_layout((NC,)), byte_alignment=128)
        _start(tidx, cta, q, n_q, m, x, dy, dsum, w, w, srows, full, xbar if cutlass.const_expr(C > 1) else full, sw, sw)

        dwa, dba, wr, xc, dyc, dsc, oc, f, (acc1, acc2) = bwd_fragments(tile, x_dtype, w_dtype)
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
        st, stn = first_row_stats(rstd_in, mean_in, q, is_ln)
        wait_for_peers(C)

        for blk in cutlass.range(q, m, n_q, unroll=1):
            it = (blk - q) // n_q  # this CTA's row count so far
            stage = it % S
            rstd, mean = next_row_stats(st, stn, rstd_in, mean_in, blk + n_q, m, is_ln)
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
            advance_row_stats(st, stn)

        store_partial_rows(store_scalar, _part, dwa, dba, dwp, dbp, q, cta, g, has_dw, has_bias)

    return _launcher(_body, T, C, _bounds)
