"""RMSNorm / LayerNorm forward over the last dim, optional fused residual add.

    s    = x + residual            (rounded to x's dtype, stored when has_residual)
    rms:  rstd = 1 / sqrt(mean(s^2) + eps);             y = s * rstd * w (+ b)
    ln:   mean = mean(s); rstd = 1 / sqrt(mean((s - mean)^2) + eps)
                                                        y = (s - mean) * rstd * w (+ b)

One CTA (or one cluster, cluster_n > 1) per R rows; the row stays in registers in x's
dtype (common.py), so x (and residual) are read once and y (and s) written once. The
statistics are fp32; LayerNorm's variance is the two-pass form over registers (no
E[x^2] - E[x]^2 cancellation): over a cluster each warp centres on its own mean and
one exchange merges the warps' (sum, M2) pairs (common.make_moments_fold), a padded row
takes two exchanges (sum, then the squares centred on the row mean). rstd (and mean) are
stored per row for the backward.
Rows past M (last CTA) re-read row M-1 so every lane joins the shuffles; they store
nothing.

``stages > 0`` (``NormForwardStaged``; the long-row default):
the rows come through shared memory, with the staged backward's machinery (rows/staging.py's
``make_stage_issue``): a persistent grid of Q CTA groups (clusters), thread 0 of each
CTA brings its N / cluster_n chunk of row j of x (and the residual) into stage j % S
with bulk asynchronous copies S rows ahead; the threads wait on the stage's mbarrier,
read their share of the chunk once into registers (s = x + residual formed there, so
shared memory is only ever written by the copies), reduce (with a cluster through
``make_allreduce_mbar_rows``: use u = n_red j + i of a row's i-th reduction takes slot
u % 2, phase (u // 2) % 2), refill the stage with the row S ahead right after the first
reduction (every thread has read it by then), then form the statistics' other
passes and y from registers and write y (and s) straight to global memory.

``lag`` (LayerNorm over a cluster): a CTA posts row j's moments, then
finishes row j - 1 (its exchange was in flight meanwhile) from x read again out of its
stage, and only then refills that stage; the cluster round trip no longer stalls every
warp of the SM, and x is not held in registers across it (3 CTAs of 512 threads fit).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64

from ..rows.grid import row_coords, wait_for_peers
from ..rows.staging import (
    launch_bounds,
    make_chunk,
    make_stage_start,
    persistent_coords,
    staged_smem,
)
from .common import Tile, make_row_async, make_row_io, make_widen, staged_chunk
from .config import (
    LAG_SLOTS,
    SMEM_PER_BLOCK,
    SMEM_PER_SM,
    NormConfig,
    default_register_fwd_config,
    staged_fwd_groups,
    staged_rows,
    staged_stages,
)
from .exchange import (
    make_allreduce,
    make_allreduce_mbar,
    make_allreduce_mbar_rows,
    make_moments_lagged,
    make_moments_mbar,
    make_warp_moments,
    mbar_tx_bytes,
    moments_exchange_ok,
    reduce_smem_elems,
)

KINDS = ("rms", "layer")


class NormForwardLaunch:
    """The forward's host side, shared by the register and row-staged kernels: ``__call__``
    launches the subclass's ``kernel`` (the device code over the eight tensors) on
    ``groups(M)`` CTA groups of ``cluster_n`` CTAs (a cluster when > 1) of ``threads``
    threads, with the launch ``bounds``."""

    threads: int
    cluster_n: int
    bounds: dict

    def groups(self, m):
        """CTA groups of a launch over m rows (traced inline)."""
        raise NotImplementedError

    @cute.jit
    def __call__(self, x: cute.Tensor, w: cute.Tensor, b: cute.Tensor, res: cute.Tensor, y: cute.Tensor,
                 res_out: cute.Tensor, mean_out: cute.Tensor, rstd_out: cute.Tensor, stream):
        T, C = self.threads, self.cluster_n
        q = self.groups(x.shape[0])
        if cutlass.const_expr(C > 1):
            self.kernel(x, w, b, res, y, res_out, mean_out, rstd_out).launch(
                grid=(q * C, 1, 1), block=(T, 1, 1), cluster=(C, 1, 1), stream=stream, **self.bounds
            )
        else:
            self.kernel(x, w, b, res, y, res_out, mean_out, rstd_out).launch(
                grid=(q, 1, 1), block=(T, 1, 1), stream=stream, **self.bounds
            )


def make_norm_fwd(kind: str, x_dtype, w_dtype, n: int, vec: int, config: NormConfig, eps: float, has_bias: bool,
                  has_residual: bool, rows_aligned: bool = True, w_aligned: bool = False):
    """@cute.jit norm_fwd(x, weight, bias, residual, y, residual_out, mean, rstd, stream):
    ``NormForwardStaged`` for a staged config (``config.stages`` > 0) on aligned rows, else
    ``NormForward``.

    Absent operands are passed as stand-ins and never touched: bias -> weight,
    residual -> x, residual_out -> y, mean -> rstd (rms).
    ``rows_aligned`` / ``w_aligned``: for a staged config (``config.stages`` > 0), every row
    of x and residual (resp. weight and bias) starts 16-byte aligned; without
    ``rows_aligned`` a staged config builds the register forward's default config instead
    (same results).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown norm kind {kind!r}; expected one of {KINDS}")
    if vec * max(x_dtype.width, w_dtype.width) > 128:
        raise ValueError(f"vec={vec} too wide for {x_dtype} / {w_dtype}")
    config.validate(n, x_dtype.width)
    if config.stages and rows_aligned:
        forward = NormForwardStaged(kind, x_dtype, w_dtype, n, vec, config, eps, has_bias, has_residual, w_aligned)
    else:
        if config.stages:
            config = default_register_fwd_config(n, x_dtype.width, kind)
        forward = NormForward(kind, x_dtype, w_dtype, n, vec, config, eps, has_bias, has_residual, rows_aligned,
                              w_aligned)

    # the host function the callers compile: its name is the one a call with wrong
    # arguments reports
    @cute.jit
    def norm_fwd(x: cute.Tensor, w: cute.Tensor, b: cute.Tensor, res: cute.Tensor, y: cute.Tensor,
                 res_out: cute.Tensor, mean_out: cute.Tensor, rstd_out: cute.Tensor, stream):
        forward(x, w, b, res, y, res_out, mean_out, rstd_out, stream)

    return norm_fwd


class NormForward(NormForwardLaunch):
    """The register forward (module docstring): one CTA (or cluster) per R rows, each
    thread's share of its row held in registers from load to store. ``make_norm_fwd``
    checks the operands and picks this or the staged kernel."""

    def __init__(self, kind: str, x_dtype, w_dtype, n: int, vec: int, config: NormConfig, eps: float,
                 has_bias: bool, has_residual: bool, rows_aligned: bool, w_aligned: bool) -> None:
        self.x_dtype, self.w_dtype, self.config = x_dtype, w_dtype, config
        self.eps, self.has_bias, self.has_residual = eps, has_bias, has_residual
        self.tile = tile = Tile.of(n, vec, config)
        # cp_async: the row share (level 2: weight and bias too) through shared memory,
        # for rows of 16-byte vectors that start 16-byte aligned (and a weight that does); else
        # the same config loads straight into registers (same results)
        self.use_async = use_async = bool(
            config.cp_async and rows_aligned and not tile.TAIL and vec * x_dtype.width == 128
            and config.smem_bytes(n, False, x_dtype.width, has_residual) <= SMEM_PER_BLOCK)
        self.w_async = use_async and config.cp_async == 2 and w_aligned and vec * w_dtype.width == 128
        self.row_async = make_row_async(tile) if use_async else (None, None, None)
        self.row_io = make_row_io(tile)
        self.allreduce = make_allreduce(tile)
        self.threads, self.cluster_n = T, C = tile.T, tile.C
        self.is_ln = is_ln = kind == "layer"
        self.inv_n = 1.0 / n
        self.n_smem = reduce_smem_elems(tile, 2)
        self.use_mbar = use_mbar = config.exchange == "mbar" and C > 1
        # LayerNorm over a cluster: mean and variance in one exchange (per-warp moments, Chan's
        # merge) rather than two round trips; padded rows keep the two-reduction form.
        self.moments = moments = is_ln and use_mbar and moments_exchange_ok(tile)
        self.n_red = 2 if is_ln and not moments else 1  # reductions per launch (mbar: one slot and mbarrier each)
        self.allreduce_m = make_allreduce_mbar(tile) if use_mbar and not moments else None
        self.moments_m = make_moments_mbar(tile) if moments else None
        self.warp_moments = make_warp_moments(tile, tile.vec, tile.S / n) if moments else None
        self.tx_bytes = mbar_tx_bytes(tile) * (2 if moments else 1)
        # With a bias on a one-CTA row, y is formed column by column (weight and bias column
        # k loaded, y column k stored) instead of loading both whole rows and storing the
        # whole row at the end. The whole-row form gets 65-80 registers from ptxas 13.0 for
        # many of these kernels (layer_norm bf16 at N = 2048..16384: 77-79, 16-bit x with fp32
        # weight: 80, fp32 layer_norm: 68-79), past the 64 that 1024 resident threads per SM
        # allow (one 512-thread CTA per SM instead of two, three 256-thread CTAs instead of
        # four); column by column the same kernels get <= 64, no spill, same arithmetic
        # Cluster rows fit either way and keep the whole-row form.
        self.stream_y = (has_bias and C == 1) or use_async
        self.padded = bool(tile.REM or tile.TAIL)
        # cp_async: ctas_per_sm is a register budget for ptxas (65536 / (threads x ctas_per_sm)
        # per thread), so that it reads weight and bias back column by column instead of all at
        # once (LayerNorm: 63 -> 48 at 32 elements per thread, 5 CTAs of 256 per SM); one CTA
        # fewer with the residual, whose share and sum take registers (16 bytes of spill at 5)
        budget = config.ctas_per_sm - (1 if has_residual else 0)
        self.bounds = launch_bounds(T, budget if use_async else 1)

    def groups(self, m):
        return cute.ceil_div(m, self.tile.R)

    @cute.jit
    def row_statistics(self, xr: cute.Tensor, buf: cute.Tensor, mbar, g, r, t, cta):
        """(mean, rstd) of the row whose share xr holds (traced inline): vec independent fp32
        chains per thread, then the row all-reduce over the exchange's buffer ``buf`` (and
        mbarriers ``mbar``); LayerNorm's variance centred on the row mean (module docstring).
        mean stays 0 for RMSNorm."""
        tile, KT1, is_ln, inv_n, eps = self.tile, self.tile.KT1, self.is_ln, self.inv_n, self.eps
        moments, use_mbar, warp_moments, moments_m = self.moments, self.use_mbar, self.warp_moments, self.moments_m
        allreduce, allreduce_m = self.allreduce, self.allreduce_m
        acc = cute.make_rmem_tensor(cute.make_layout((tile.vec,)), Float32)
        acc.fill(0.0)
        for k in cutlass.range_constexpr(KT1):
            for v in cutlass.range_constexpr(tile.width(k)):
                xv = xr[v, k].to(Float32)
                if cutlass.const_expr(is_ln):
                    acc[v] = acc[v] + xv
                else:
                    acc[v] = acc[v] + xv * xv
        tot = acc[0]
        for v in cutlass.range_constexpr(1, tile.vec):
            tot = tot + acc[v]
        mean = Float32(0.0)
        if cutlass.const_expr(moments):
            # the warp's sum, then its squares centred on the warp's own mean, one exchange
            tot, m2 = moments_m(*warp_moments(xr, tot, acc), buf, mbar, r, t, cta)
            mean, tot = tot * Float32(inv_n), m2
        elif cutlass.const_expr(use_mbar):
            tot = allreduce_m(tot, buf, mbar, 0, r, t, cta)
        else:
            tot, _unused = allreduce(tot, tot, 1, buf, 0, r, t, cta)
        if cutlass.const_expr(is_ln and not moments):
            mean = tot * Float32(inv_n)
            acc.fill(0.0)
            for k in cutlass.range_constexpr(KT1):
                for v in cutlass.range_constexpr(tile.width(k)):
                    d = xr[v, k].to(Float32) - mean
                    kind_k = tile.kind(k)
                    if cutlass.const_expr(kind_k == "partial"):
                        d = Float32(cutlass.select_(g < tile.REM, d, Float32(0.0)))
                    elif cutlass.const_expr(kind_k == "tail"):
                        d = Float32(cutlass.select_(g < tile.TAIL, d, Float32(0.0)))
                    acc[v] = acc[v] + d * d
            tot = acc[0]
            for v in cutlass.range_constexpr(1, tile.vec):
                tot = tot + acc[v]
            if cutlass.const_expr(use_mbar):
                tot = allreduce_m(tot, buf, mbar, 1, r, t, cta)
            else:
                tot, _unused = allreduce(tot, tot, 1, buf, 1, r, t, cta)
        rstd = cute.math.rsqrt(tot * Float32(inv_n) + Float32(eps))
        return mean, rstd

    @cute.kernel
    def kernel(self, x: cute.Tensor, w: cute.Tensor, b: cute.Tensor, res: cute.Tensor, y: cute.Tensor,
               res_out: cute.Tensor, mean_out: cute.Tensor, rstd_out: cute.Tensor):
        tile, config, x_dtype, w_dtype = self.tile, self.config, self.x_dtype, self.w_dtype
        P, C, R, KT1 = tile.P, tile.C, tile.R, tile.KT1
        has_bias, has_residual, is_ln = self.has_bias, self.has_residual, self.is_ln
        use_async, w_async, stream_y, padded = self.use_async, self.w_async, self.stream_y, self.padded
        use_mbar, n_red, n_smem, tx_bytes = self.use_mbar, self.n_red, self.n_smem, self.tx_bytes
        share, issue, fetch_col = self.row_async
        load, store, _, load_col, store_col = self.row_io

        tidx, cta, r, t, g, row_block = row_coords(C, P, R, arrive=not use_mbar)
        m = x.shape[0]
        row = row_block * R + r
        row_c = cutlass.min(row, m - 1)
        ok = row < m

        smem = cutlass.memory.SmemAllocator()
        buf = smem.allocate_tensor(Float32, cute.make_layout((n_smem,)), byte_alignment=16)
        mbar = None
        if cutlass.const_expr(use_mbar):
            mbar = smem.allocate_array(Int64, n_red, byte_alignment=8)
            if tidx == 0:
                for i in cutlass.range_constexpr(n_red):
                    cute.arch.mbarrier_init(mbar + i, 1)
            cute.arch.mbarrier_init_fence()
            if tidx == 0:
                for i in cutlass.range_constexpr(n_red):
                    cute.arch.mbarrier_arrive_and_expect_tx(mbar + i, tx_bytes)
            cute.arch.cluster_arrive_relaxed()  # its wait (below) precedes the first st.async

        xr, rr = tile.fragments(x_dtype, x_dtype)
        sw = None
        sb = None
        if cutlass.const_expr(use_async):
            # every load issued up front: x (and the residual) in commit group 0, weight (and
            # bias) in group 1, each thread's slots its own (it reads back only those)
            sx = share(smem, x_dtype, tidx)
            issue(x[row_c, None], sx, g)
            if cutlass.const_expr(has_residual):
                sr = share(smem, x_dtype, tidx)
                issue(res[row_c, None], sr, g)
            cute.arch.cp_async_commit_group()
            if cutlass.const_expr(w_async):
                sw = share(smem, w_dtype, tidx)
                issue(w, sw, g)
                if cutlass.const_expr(has_bias):
                    sb = share(smem, w_dtype, tidx)
                    issue(b, sb, g)
                cute.arch.cp_async_commit_group()
                cute.arch.cp_async_wait_group(1)
            else:
                cute.arch.cp_async_wait_group(0)
            if cutlass.const_expr(padded):
                xr.fill(0.0)
                rr.fill(0.0)
            for k in cutlass.range_constexpr(KT1):
                fetch_col(sx, xr, g, k)
                if cutlass.const_expr(has_residual):
                    fetch_col(sr, rr, g, k)
        else:
            load(x[row_c, None], xr, g)
            if cutlass.const_expr(has_residual):
                load(res[row_c, None], rr, g)
        if cutlass.const_expr(has_residual):
            for k in cutlass.range_constexpr(KT1):
                for v in cutlass.range_constexpr(tile.width(k)):
                    xr[v, k] = (xr[v, k].to(Float32) + rr[v, k].to(Float32)).to(x_dtype)
            if ok:
                store(xr, res_out[row, None], g)

        wr, br = tile.fragments(w_dtype, w_dtype)
        if cutlass.const_expr(config.early_weight):
            load(w, wr, g)
            if cutlass.const_expr(has_bias):
                load(b, br, g)

        if cutlass.const_expr(C > 1):
            cute.arch.cluster_wait()  # every peer resident before the first DSMEM store

        # ---- statistics
        mean, rstd = self.row_statistics(xr, buf, mbar, g, r, t, cta)

        leader = ok & (t == 0)
        if cutlass.const_expr(C > 1):
            leader = leader & (cta == 0)
        if leader:
            rstd_out[row] = rstd
            if cutlass.const_expr(is_ln):
                mean_out[row] = mean

        # ---- y = (s - mean) * rstd * w (+ b), written back over the row fragment
        if cutlass.const_expr(w_async):
            cute.arch.cp_async_wait_group(0)  # weight and bias
        if cutlass.const_expr(not config.early_weight):
            if cutlass.const_expr(stream_y):
                if cutlass.const_expr(padded):
                    wr.fill(0.0)  # as `load` leaves them: slots this thread does not own
                    br.fill(0.0)
            else:
                load(w, wr, g)
                if cutlass.const_expr(has_bias):
                    load(b, br, g)
        for k in cutlass.range_constexpr(KT1):
            if cutlass.const_expr(w_async):
                fetch_col(sw, wr, g, k)
                if cutlass.const_expr(has_bias):
                    fetch_col(sb, br, g, k)
            elif cutlass.const_expr(stream_y and not config.early_weight):
                load_col(w, wr, g, k)
                if cutlass.const_expr(has_bias):
                    load_col(b, br, g, k)
            for v in cutlass.range_constexpr(tile.width(k)):
                yv = (xr[v, k].to(Float32) - mean) * rstd * wr[v, k].to(Float32)
                if cutlass.const_expr(has_bias):
                    yv = yv + br[v, k].to(Float32)
                xr[v, k] = yv.to(x_dtype)
            if cutlass.const_expr(stream_y):
                if ok:
                    store_col(xr, y[row, None], g, k)
        if cutlass.const_expr(not stream_y):
            if ok:
                store(xr, y[row, None], g)


_H200_MAX_CLUSTERS = {4: 30, 8: 15, 16: 7}


def device_fwd_groups(config: NormConfig) -> int:
    """``staged_fwd_groups`` for the current CUDA device (its SM count and, with a cluster,
    the clusters it runs at once). When no device can be asked (CPU compiles, and the
    autotune pool's workers, which never touch CUDA): 132 SMs and the H200's measured
    cluster occupancy (30 clusters of 4, 15 of 8, 7 of 16; 2 not
    measured, uncapped)."""
    sms, cap = 132, _H200_MAX_CLUSTERS.get(config.cluster_n)
    try:
        import torch

        if torch.cuda.is_available():
            idx = torch.cuda.current_device()
            sms = torch.cuda.get_device_properties(idx).multi_processor_count
            if config.cluster_n > 1:
                from cutlass.utils import HardwareInfo

                cap = int(HardwareInfo(idx).get_max_active_clusters(config.cluster_n)) or None
    except Exception:  # no driver: the sm_90 default
        pass
    return staged_fwd_groups(config, sms, cap)




class NormForwardStaged(NormForwardLaunch):
    """The row-staged forward (``config.stages`` > 0; module docstring). Same launch
    signature and results as ``NormForward``. Rows of x / residual must
    start 16-byte aligned; each CTA's N / cluster_n chunk holds a multiple of 16 bytes
    (``NormConfig.validate``). Persistent: the grid is min(M, ``groups``) CTA groups
    (default ``device_fwd_groups``), group q visits rows q, q + Q, ...

    Weight and bias (``w_aligned``): bulk-copied into shared memory once per launch when
    they fit beside the stages at ``ctas_per_sm`` CTAs per SM, else read per row column by
    column from global memory (L1 / L2 hits). Each thread reads its share of a staged row
    once, into registers, so with a multi-warp row (or a cluster) the stage is
    refilled with the row S ahead right after the row's first reduction (its barrier, or
    the exchange's mbarrier wait: a CTA passes it only when every warp of the cluster has
    read its share); otherwise after an explicit CTA barrier at the end of the row."""

    def __init__(self, kind: str, x_dtype, w_dtype, n: int, vec: int, config: NormConfig, eps: float,
                 has_bias: bool, has_residual: bool, w_aligned: bool = False, groups: int | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown norm kind {kind!r}; expected one of {KINDS}")
        config.validate(n, x_dtype.width)
        self.x_dtype, self.w_dtype, self.eps = x_dtype, w_dtype, eps
        self.has_bias, self.has_residual = has_bias, has_residual
        C, T = config.cluster_n, config.threads
        self.tile = tile = staged_chunk(config, n, vec, "forward")
        self.chunk_n = NC = tile.n  # this CTA's chunk of the row
        _, _, _, self.load_col, self.store_col = make_row_io(tile)
        KT1, V = tile.KT1, tile.vec
        self.is_ln = is_ln = kind == "layer"
        self.inv_n = 1.0 / n
        # config.short_chains: shorter dependent chains per row, set by the 16-bit
        # N = 262144 default only: the moments in one shuffle chain,
        # y's normalisation as one FFMA for 16-bit x, and the CTA's rows counted instead of a
        # division per row
        self.short_chains = SHORT = bool(config.short_chains)
        self.fold_shift = SHORT and is_ln and x_dtype.width == 16
        moments = False
        warp_moments = None
        if C > 1:
            xtile = Tile(n, vec, T, C, T)  # the whole row over the cluster: the exchange's slots
            # LayerNorm: mean and variance in one exchange (per-warp moments, Chan's merge)
            moments = is_ln and moments_exchange_ok(xtile)
            if moments:  # the chunk's warps each hold n / xtile.S elements
                warp_moments = make_warp_moments(tile, min(vec, 4), xtile.S / n, merge=SHORT)
            allreduce_m = make_allreduce_mbar_rows(xtile, 2 if moments else 1, moments=moments, merge=SHORT)
            xtx = mbar_tx_bytes(xtile) * (2 if moments else 1)
            allreduce = None
        else:
            allreduce = make_allreduce(tile)
            allreduce_m = None
            xtx = 0
        self.moments, self.warp_moments, self.allreduce, self.allreduce_m = moments, warp_moments, allreduce, allreduce_m
        self.reductions = 2 if is_ln and not moments else 1  # row reductions (exchange uses) per row
        self.stages = S = staged_stages(config, n, x_dtype.width, has_residual, backward=False)
        # the lagged form (config.lag): one moments exchange per row and a second stage to
        # bring the next row into
        self.lagged = LAG = bool(config.lag) and moments and S >= 2
        self.exchange_slots = n_xbar = LAG_SLOTS if LAG else 2  # exchange slots (mbarriers, buffer parts)
        self.n_smem = reduce_smem_elems(xtile if C > 1 else tile, n_xbar)
        self.lag_send, self.lag_recv = make_moments_lagged(xtile, merge=SHORT) if LAG else (None, None)
        self.rows_per_stage = n_rows = staged_rows(False, has_residual)  # x (, residual) per stage
        self.chunk = _part = make_chunk(NC, C)
        # the first reduction syncs every thread of the CTA (a multi-warp row, or the cluster
        # exchange), after which the row is in registers: its stage is refilled there
        self.early_refill = tile.S > 1 or C > 1
        n_w = 2 if has_bias else 1
        w_bytes = NC * w_dtype.width // 8
        smem_cta = config.smem_bytes(n, False, x_dtype.width, has_residual) + n_w * w_bytes + 256
        self.w_smem = w_smem = bool(w_aligned and w_bytes % 16 == 0 and smem_cta <= SMEM_PER_BLOCK
                                    and (smem_cta + 1024) * config.ctas_per_sm <= SMEM_PER_SM)
        self.padded = bool(tile.REM or tile.TAIL)
        self.chains = min(V, 4)  # independent chains per row sum (as warp_moments')
        # A 16-bit weight (and bias) widened to fp32 once per launch and held in registers across
        # rows, instead of a shared-memory load and a widen per element per row, where a thread
        # has >= 128 registers (<= 512 threads per SM) and those take at most half of them (a
        # quarter with a fused residual, which needs its own). No staged forward candidate then
        # spills (ptxas survey; LayerNorm bf16 262144 takes 251 registers at 256
        # threads, 65536 127 at 512); 1024-thread CTAs keep the weight per row (64 registers:
        # the 16-CTA 262144 candidate spilled 36 bytes with it). H100 A/B: LayerNorm bf16 65536
        # / 262144 +2.0 / +0.5 points of copy (32768 on 1024 threads +1.9, not taken). An fp32
        # weight (nothing to widen) that fits in shared memory beside the stages measured level to
        # -0.6, so it stays per row there; one that does not fit (LayerNorm fp32 at N = 262144:
        # 64 KiB chunks of x, weight and bias) is held within half the registers, residual or not,
        # rather than read from L2 for every row (73 -> 93 % of copy; with the residual,
        # 128 registers at 512 threads, no spill).
        budget = 65536 // (T * config.ctas_per_sm)
        w_elems = V * KT1 * n_w  # fp32 registers the held weight (and bias) take
        w_share = budget // (4 if has_residual else 2)
        self.hoist_weight = HOIST_W = budget >= 128 and (
            (w_dtype.width == 16 and w_elems <= w_share)
            or (w_dtype.width == 32 and not w_smem and w_elems <= budget // 2))
        # In the lagged form (x is not held across the exchange), a 16-bit weight (and
        # bias) whose fp32 copies would take more than that share but whose 16-bit values fit it
        # (half the registers), with no room in shared memory, is held as loaded and widened
        # column by column when y is formed, instead of read from L2 for every row: the shapes
        # that fill every SM at N = 262144 (2 CTAs per SM, or 8-CTA clusters of 64 KiB chunks)
        # read 59-77 % of copy on the H200 with the weight per row. ptxas,
        # sm_90a, at 128 registers: 28 bytes of spill (84-96 registers before); the unlagged
        # form, which holds x too, spills 348 and is left as it was, as is a fused residual (the
        # 256-thread 16-CTA lagged shape reached 255 registers and spilled with it). Not measured
        # yet; no default takes it.
        self.hold_weight16 = (LAG and not has_residual and not HOIST_W and budget >= 128 and w_dtype.width == 16
                              and not w_smem and w_elems // 2 <= w_share)
        # bf16 widened by integer ops (common.make_widen) on 8- and 16-CTA clusters only: LayerNorm
        # bf16 at N = 262144 (16 CTAs) 80.0 -> 84.7 % of copy, 131072 (8) level, but 65536 (4 CTAs
        # of 512 threads) 92.4 -> 88.6 and 32768 (2) level, in two interleaved rounds
        self.widen_x = make_widen(x_dtype, V, pairs=C >= 8)
        self.widen_w = make_widen(w_dtype, V, pairs=C >= 8)
        # barriers (S stages + the weight's and bias'), weight and bias, the first S rows
        self.stage_start = make_stage_start(x_dtype, w_dtype, NC, C, S, n_rows, xtx, n_w, w_smem, n_xbar)
        self.max_groups = int(groups) if groups else device_fwd_groups(config)
        self.threads, self.cluster_n, self.bounds = T, C, launch_bounds(T, config.ctas_per_sm)

    def groups(self, m):
        return cutlass.min(m, self.max_groups)

    def _reduce(self, a, buf: cute.Tensor, xbar, u, tidx, cta):
        """Row sum of a (traced inline); u: the CTA's count of reductions so far (slot u % 2;
        with a cluster phase (u // 2) % 2 of the exchange mbarriers, thread 0 re-arming)."""
        if self.cluster_n > 1:
            a, _unused = self.allreduce_m(a, a, buf, xbar, u % 2, (u // 2) % 2, tidx == 0, 0, tidx, cta)
        else:
            a, _unused = self.allreduce(a, a, 1, buf, u % 2, 0, tidx, 0)
        return a

    def _moments(self, s, m2, buf: cute.Tensor, xbar, u, tidx, cta):
        """(row sum, row M2) from the warp's sum and centred sum of squares (traced inline;
        u as in ``_reduce``)."""
        return self.allreduce_m(s, m2, buf, xbar, u % 2, (u // 2) % 2, tidx == 0, 0, tidx, cta)

    def _weight_col(self, weight, wregs, g, k):
        """Column k of this thread's weight (and bias) share, widened to fp32 in wf (bf)
        (traced inline): from shared memory (sw, sb) when staged there, else global memory
        (wg, bg). weight: (sw, sb, wg, bg); wregs: (wr, br, wf, bf), the share as loaded
        and widened."""
        sw, sb, wg, bg = weight
        wr, br, wf, bf = wregs
        w_smem, has_bias, load_col, widen_w = self.w_smem, self.has_bias, self.load_col, self.widen_w
        if cutlass.const_expr(w_smem):
            load_col(sw, wr, g, k)
            if cutlass.const_expr(has_bias):
                load_col(sb, br, g, k)
        else:
            load_col(wg, wr, g, k)
            if cutlass.const_expr(has_bias):
                load_col(bg, br, g, k)
        widen_w(wr, wf, k)
        if cutlass.const_expr(has_bias):
            widen_w(br, bf, k)

    def _sum_col(self, stage, xregs, g, k):
        """Column k of this thread's share of s from the stage's chunks (sx, sr), widened to
        fp32 in xf (traced inline): x, or with a residual (x + residual) rounded to x's
        dtype, left in xc. xregs: (xc, rc, xf, rf), x and the residual as loaded and widened."""
        sx, sr = stage
        xc, rc, xf, rf = xregs
        load_col, widen_x, tile, x_dtype, has_residual = self.load_col, self.widen_x, self.tile, self.x_dtype, self.has_residual
        load_col(sx, xc, g, k)
        if cutlass.const_expr(has_residual):
            load_col(sr, rc, g, k)
        widen_x(xc, xf, k)
        if cutlass.const_expr(has_residual):
            widen_x(rc, rf, k)
            for v in range(tile.width(k)):  # a plain function: Python unrolls it when tracing
                xc[v, k] = (xf[v, k] + rf[v, k]).to(x_dtype)
            widen_x(xc, xf, k)

    def _row(self, i, q, n_q):
        """(row, the CTA's row count so far) of loop index i (traced inline)."""
        if self.short_chains:
            return q + i * n_q, i
        return i, (i - q) // n_q

    def _y_col(self, weight, wregs, xf, oc, yo, mean, rstd, g, k):
        """Pass 3 for column k (traced inline): y = (s - mean) * rstd * w (+ b) from s in xf,
        stored to this row's chunk yo. With FOLD, (s * rstd + shift) * w (+ b), shift =
        -mean * rstd (formed once a row by the compiler): an FADD and an FMUL fewer per
        element. The fold rounds s * rstd and mean * rstd, each to fp32's 2^-24 relative:
        an absolute error in y of about 2^-23 (|s| + |mean|) rstd |w|, which for data a
        16-bit dtype can hold (|mean| / std <= 2^8, else the values round to a few levels)
        stays below 2^-14 |w|, under the half-ulp (2^-9 relative) of any output of
        magnitude >= |w| / 32; outputs that cancel to near 0 (bias against w * x_hat) can
        differ from the unfolded form's by a few of their own ulps."""
        HOLD_W16, HOIST_W, FOLD = self.hold_weight16, self.hoist_weight, self.fold_shift
        widen_w, has_bias, tile, x_dtype, store_col = self.widen_w, self.has_bias, self.tile, self.x_dtype, self.store_col
        wr, br, wf, bf = wregs
        if cutlass.const_expr(HOLD_W16):
            widen_w(wr, wf, k)
            if cutlass.const_expr(has_bias):
                widen_w(br, bf, k)
        elif cutlass.const_expr(not HOIST_W):
            self._weight_col(weight, wregs, g, k)
        shift = -mean * rstd if FOLD else None  # a plain function: Python resolves FOLD here
        for v in range(tile.width(k)):
            if cutlass.const_expr(FOLD):
                yv = (xf[v, k] * rstd + shift) * wf[v, k]
            else:
                yv = (xf[v, k] - mean) * rstd * wf[v, k]
            if cutlass.const_expr(has_bias):
                yv = yv + bf[v, k]
            oc[v, k] = yv.to(x_dtype)
        store_col(oc, yo, g, k)

    @cute.jit
    def _finish_lagged(self, outputs, srows: cute.Tensor, exchange, weight, wregs, xregs, oc: cute.Tensor, blk, it,
                       tidx, cta):
        """The lagged forward's second half for the CTA's it-th row ``blk``: its statistics
        from the exchange posted one row earlier, then y from x read again from its stage
        (with a residual, s = x + residual formed again, as pass 1 rounded it). outputs:
        (y, mean, rstd); exchange: (buffer, mbarriers) of the moments' exchange; weight, wregs,
        xregs as ``_weight_col`` and ``_sum_col`` take them."""
        y, mean_out, rstd_out = outputs
        buf, xbar = exchange
        xf = xregs[2]
        lag_recv, inv_n, eps, S, n_rows, _part, KT1 = (self.lag_recv, self.inv_n, self.eps, self.stages,
                                                        self.rows_per_stage, self.chunk, self.tile.KT1)
        tot, m2 = lag_recv(buf, xbar, it % LAG_SLOTS, (it // LAG_SLOTS) % 2, tidx == 0, tidx)
        mean = tot * Float32(inv_n)
        rstd = cute.math.rsqrt(m2 * Float32(inv_n) + Float32(eps))
        if (tidx == 0) & (cta == 0):
            rstd_out[blk] = rstd
            mean_out[blk] = mean
        sx = srows[None, (it % S) * n_rows]
        sr = srows[None, (it % S) * n_rows + (n_rows - 1)]
        yo = _part(y[blk, None], cta)
        for k in cutlass.range_constexpr(KT1):
            self._sum_col((sx, sr), xregs, tidx, k)
            self._y_col(weight, wregs, xf, oc, yo, mean, rstd, tidx, k)

    @cute.kernel
    def kernel(self, x: cute.Tensor, w: cute.Tensor, b: cute.Tensor, res: cute.Tensor, y: cute.Tensor,
               res_out: cute.Tensor, mean_out: cute.Tensor, rstd_out: cute.Tensor):
        tile, C, NC, KT1, NACC = self.tile, self.cluster_n, self.chunk_n, self.tile.KT1, self.chains
        S, n_rows, n_smem, n_xbar = self.stages, self.rows_per_stage, self.n_smem, self.exchange_slots
        x_dtype, w_dtype, has_bias, has_residual = self.x_dtype, self.w_dtype, self.has_bias, self.has_residual
        is_ln, inv_n, eps, padded, early_refill = self.is_ln, self.inv_n, self.eps, self.padded, self.early_refill
        SHORT, LAG, HOIST_W, HOLD_W16 = self.short_chains, self.lagged, self.hoist_weight, self.hold_weight16
        w_smem, moments, warp_moments, lag_send, n_red = (self.w_smem, self.moments, self.warp_moments, self.lag_send,
                                                          self.reductions)
        load_col, store_col, _part = self.load_col, self.store_col, self.chunk
        _start, _issue, _refill = self.stage_start
        _row, _reduce, _moments = self._row, self._reduce, self._moments
        _sum_col, _y_col, _weight_col, _finish_lagged = self._sum_col, self._y_col, self._weight_col, self._finish_lagged
        tidx, cta, q, n_q, m = persistent_coords(C, x)
        g = tidx
        # stage slots, reduction buffer, one "full" mbarrier per stage + the weight's, and
        # with a cluster the row sums' exchange mbarriers
        smem, srows, buf, full, xbar = staged_smem(x_dtype, NC, S * n_rows, n_smem, S + 1, C, n_xbar)
        sw = srows  # stand-ins unless weight and bias sit in shared memory
        sb = srows
        if cutlass.const_expr(w_smem):
            sw = smem.allocate_tensor(w_dtype, cute.make_layout((NC,)), byte_alignment=128)
            if cutlass.const_expr(has_bias):
                sb = smem.allocate_tensor(w_dtype, cute.make_layout((NC,)), byte_alignment=128)
        _start(tidx, cta, q, n_q, m, x, res, res, w, b, srows, full, xbar if cutlass.const_expr(C > 1) else full, sw, sb)

        xc, rc, wr, br, oc = tile.fragments(x_dtype, x_dtype, w_dtype, w_dtype, x_dtype)
        # fp32 copies, widened once per row (x) or per column (weight, bias)
        xf, rf, wf, bf = tile.fragments(Float32, Float32, Float32, Float32)
        if cutlass.const_expr(padded):
            xc.fill(0.0)  # slots a thread does not own: zeros (masked in LayerNorm's centred sum)
            rc.fill(0.0)
            wr.fill(0.0)
            br.fill(0.0)
        if cutlass.const_expr(w_smem):
            cute.arch.mbarrier_wait(full + S, 0)
        wg = _part(w, cta)
        bg = _part(b, cta)
        weight, wregs, xregs = (sw, sb, wg, bg), (wr, br, wf, bf), (xc, rc, xf, rf)
        if cutlass.const_expr(HOIST_W):
            for k in cutlass.range_constexpr(KT1):
                _weight_col(weight, wregs, g, k)
        if cutlass.const_expr(HOLD_W16):  # loaded once, widened per column in _y_col
            for k in cutlass.range_constexpr(KT1):
                load_col(wg, wr, g, k)
                if cutlass.const_expr(has_bias):
                    load_col(bg, br, g, k)
        acc = cute.make_rmem_tensor(cute.make_layout((NACC,)), Float32)
        wait_for_peers(C)

        # the CTA group's rows q, q + n_q, ... (with SHORT counted: one division here, not one a row)
        lo, hi, step = q, m, n_q
        if cutlass.const_expr(SHORT):
            lo, hi, step = 0, (m - q + n_q - 1) // n_q, 1
        if cutlass.const_expr(LAG):
            # row it: pass 1 and its moments posted, then row it - 1 finished (its exchange
            # was in flight meanwhile) and its stage refilled with the row S ahead of it
            for i in cutlass.range(lo, hi, step, unroll=1):
                blk, it = _row(i, q, n_q)
                stage = it % S
                sx = srows[None, stage * n_rows]
                sr = srows[None, stage * n_rows + (n_rows - 1)]  # the residual's chunk (x's when unfused)
                cute.arch.mbarrier_wait(full + stage, (it // S) % 2)
                ro = _part(res_out[blk, None], cta)
                acc.fill(0.0)
                for k in cutlass.range_constexpr(KT1):
                    _sum_col((sx, sr), xregs, g, k)
                    if cutlass.const_expr(has_residual):
                        store_col(xc, ro, g, k)
                    for v in cutlass.range_constexpr(tile.width(k)):
                        acc[v % NACC] = acc[v % NACC] + xf[v, k]
                tot = acc[0]
                for v in cutlass.range_constexpr(1, NACC):
                    tot = tot + acc[v]
                wsum, wm2 = warp_moments(xf, tot, acc)
                lag_send(wsum, wm2, buf, xbar, it % LAG_SLOTS, tidx, cta)
                if it > 0:
                    _finish_lagged((y, mean_out, rstd_out), srows, (buf, xbar), weight, wregs, xregs, oc,
                                   blk - n_q, it - 1, tidx, cta)
                    cute.arch.sync_threads()  # every thread is done with row it - 1's stage
                    if tidx == 0:
                        nr = blk + (S - 1) * n_q
                        if nr < m:
                            _issue(x, res, res, srows, full, nr, (it - 1) % S, cta)
            # the CTA's last row (the grid is at most m groups)
            if cutlass.const_expr(SHORT):
                last = hi - 1
            else:
                last = (m - 1 - q) // n_q
            _finish_lagged((y, mean_out, rstd_out), srows, (buf, xbar), weight, wregs, xregs, oc,
                           q + last * n_q, last, tidx, cta)
        else:
            for i in cutlass.range(lo, hi, step, unroll=1):
                blk, it = _row(i, q, n_q)  # it: this CTA's row count so far
                stage = it % S
                sx = srows[None, stage * n_rows]
                sr = srows[None, stage * n_rows + (n_rows - 1)]  # the residual's chunk (x's when unfused)
                cute.arch.mbarrier_wait(full + stage, (it // S) % 2)

                # ---- pass 1: sum s (layer) or s^2 (rms); s = x + residual also goes out
                ro = _part(res_out[blk, None], cta)
                acc.fill(0.0)
                for k in cutlass.range_constexpr(KT1):
                    _sum_col((sx, sr), xregs, g, k)  # xc holds s from here on
                    for v in cutlass.range_constexpr(tile.width(k)):
                        sv = xf[v, k]
                        if cutlass.const_expr(is_ln):
                            acc[v % NACC] = acc[v % NACC] + sv
                        else:
                            acc[v % NACC] = acc[v % NACC] + sv * sv
                    if cutlass.const_expr(has_residual):
                        store_col(xc, ro, g, k)
                tot = acc[0]
                for v in cutlass.range_constexpr(1, NACC):
                    tot = tot + acc[v]
                mean = Float32(0.0)
                if cutlass.const_expr(moments):
                    # pass 2 before the exchange: squares centred on the warp's own mean
                    wsum, wm2 = warp_moments(xf, tot, acc)
                    tot, m2 = _moments(wsum, wm2, buf, xbar, it, tidx, cta)
                    mean = tot * Float32(inv_n)
                    tot = m2
                else:
                    tot = _reduce(tot, buf, xbar, it * n_red, tidx, cta)
                if cutlass.const_expr(early_refill):
                    # every thread of this CTA is past this row's first reduction, so done reading
                    # this row's stage (the row now lives in registers): refill it with the row S
                    # ahead, while this row's statistics and output are still being formed
                    _refill(tidx, x, res, res, srows, full, blk, S, n_q, m, stage, cta)
                if cutlass.const_expr(is_ln and not moments):
                    # ---- pass 2: the centred sum of squares (exact two-pass variance)
                    mean = tot * Float32(inv_n)
                    acc.fill(0.0)
                    for k in cutlass.range_constexpr(KT1):
                        for v in cutlass.range_constexpr(tile.width(k)):
                            d = xf[v, k] - mean
                            kind_k = tile.kind(k)
                            if cutlass.const_expr(kind_k == "partial"):
                                d = Float32(cutlass.select_(g < tile.REM, d, Float32(0.0)))
                            elif cutlass.const_expr(kind_k == "tail"):
                                d = Float32(cutlass.select_(g < tile.TAIL, d, Float32(0.0)))
                            acc[v % NACC] = acc[v % NACC] + d * d
                    tot = acc[0]
                    for v in cutlass.range_constexpr(1, NACC):
                        tot = tot + acc[v]
                    tot = _reduce(tot, buf, xbar, it * n_red + 1, tidx, cta)
                rstd = cute.math.rsqrt(tot * Float32(inv_n) + Float32(eps))
                leader = tidx == 0
                if cutlass.const_expr(C > 1):
                    leader = leader & (cta == 0)
                if leader:
                    rstd_out[blk] = rstd
                    if cutlass.const_expr(is_ln):
                        mean_out[blk] = mean

                # ---- pass 3: y = (s - mean) * rstd * w (+ b)
                yo = _part(y[blk, None], cta)
                for k in cutlass.range_constexpr(KT1):
                    _y_col(weight, wregs, xf, oc, yo, mean, rstd, g, k)
                if cutlass.const_expr(not early_refill):
                    cute.arch.sync_threads()  # every thread is done with this stage
                    _refill(tidx, x, res, res, srows, full, blk, S, n_q, m, stage, cta)
