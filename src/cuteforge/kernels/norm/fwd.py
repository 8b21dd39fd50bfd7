"""RMSNorm / LayerNorm forward over the last dim, optional fused residual add.

    s    = x + residual            (rounded to x's dtype, stored when has_residual)
    rms:  rstd = 1 / sqrt(mean(s^2) + eps);             y = s * rstd * w (+ b)
    ln:   mean = mean(s); rstd = 1 / sqrt(mean((s - mean)^2) + eps)
                                                        y = (s - mean) * rstd * w (+ b)

One CTA (or one cluster, cluster_n > 1) per R rows; the row stays in registers in x's
dtype (common.py), so x (and residual) are read once and y (and s) written once. The
statistics are fp32; LayerNorm's variance is the exact two-pass form over registers
(no E[x^2] - E[x]^2 cancellation). rstd (and mean) are stored per row for the backward.
Rows past M (last CTA) re-read row M-1 so every lane joins the shuffles; they store
nothing.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64

from .common import (
    Tile,
    make_allreduce,
    make_allreduce_mbar,
    make_row_io,
    mbar_tx_bytes,
    reduce_smem_elems,
)
from .config import NormConfig

KINDS = ("rms", "layer")


def make_norm_fwd(
    kind: str,
    x_dtype,
    w_dtype,
    n: int,
    vec: int,
    config: NormConfig,
    eps: float,
    has_bias: bool,
    has_residual: bool,
):
    """@cute.jit f(x, weight, bias, residual, y, residual_out, mean, rstd, stream).

    Absent operands are passed as stand-ins and never touched: bias -> weight,
    residual -> x, residual_out -> y, mean -> rstd (rms).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown norm kind {kind!r}; expected one of {KINDS}")
    if vec * max(x_dtype.width, w_dtype.width) > 128:
        raise ValueError(f"vec={vec} too wide for {x_dtype} / {w_dtype}")
    config.validate(n, x_dtype.width)
    tile = Tile.of(n, vec, config)
    load, store, _, load_col, store_col = make_row_io(tile)
    allreduce = make_allreduce(tile)
    T, P, C, R, KT1 = tile.T, tile.P, tile.C, tile.R, tile.KT1
    is_ln = kind == "layer"
    inv_n = 1.0 / n
    n_smem = reduce_smem_elems(tile, 2)
    use_mbar = config.exchange == "mbar" and C > 1
    n_red = 2 if is_ln else 1  # reductions per launch (mbar: one slot and mbarrier each)
    allreduce_m = make_allreduce_mbar(tile) if use_mbar else None
    tx_bytes = mbar_tx_bytes(tile)
    # With a bias on a one-CTA row, y is formed column by column (weight and bias column
    # k loaded, y column k stored) instead of loading both whole rows and storing the
    # whole row at the end. The whole-row form gets 65-80 registers from ptxas 13.0 for
    # many of these kernels (layer_norm bf16 at N = 2048..16384: 77-79, 16-bit x with fp32
    # weight: 80, fp32 layer_norm: 68-79), past the 64 that 1024 resident threads per SM
    # allow (one 512-thread CTA per SM instead of two, three 256-thread CTAs instead of
    # four); column by column the same kernels get <= 64, no spill, same arithmetic
    # (docs/kernels/norm.md v2.3). Cluster rows fit either way and keep the whole-row form.
    stream_y = has_bias and C == 1
    padded = bool(tile.REM or tile.TAIL)

    @cute.kernel
    def _kernel(
        x: cute.Tensor,
        w: cute.Tensor,
        b: cute.Tensor,
        res: cute.Tensor,
        y: cute.Tensor,
        res_out: cute.Tensor,
        mean_out: cute.Tensor,
        rstd_out: cute.Tensor,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if cutlass.const_expr(C > 1):
            if cutlass.const_expr(not use_mbar):
                cute.arch.cluster_arrive_relaxed()
            cta = cute.arch.block_idx_in_cluster()
            row_block = bidx // C
        else:
            cta = 0
            row_block = bidx
        r = tidx // P
        t = tidx % P
        g = cta * P + t
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

        xr = cute.make_rmem_tensor(cute.make_layout((tile.vec, KT1)), x_dtype)
        load(x[row_c, None], xr, g)
        if cutlass.const_expr(has_residual):
            rr = cute.make_rmem_tensor(cute.make_layout((tile.vec, KT1)), x_dtype)
            load(res[row_c, None], rr, g)
            for k in cutlass.range_constexpr(KT1):
                for v in cutlass.range_constexpr(tile.width(k)):
                    xr[v, k] = (xr[v, k].to(Float32) + rr[v, k].to(Float32)).to(x_dtype)
            if ok:
                store(xr, res_out[row, None], g)

        wr = cute.make_rmem_tensor(cute.make_layout((tile.vec, KT1)), w_dtype)
        br = cute.make_rmem_tensor(cute.make_layout((tile.vec, KT1)), w_dtype)
        if cutlass.const_expr(config.early_weight):
            load(w, wr, g)
            if cutlass.const_expr(has_bias):
                load(b, br, g)

        if cutlass.const_expr(C > 1):
            cute.arch.cluster_wait()  # every peer resident before the first DSMEM store

        # ---- statistics: vec independent fp32 chains per thread, then the row all-reduce
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
        if cutlass.const_expr(use_mbar):
            tot = allreduce_m(tot, buf, mbar, 0, r, t, cta)
        else:
            tot, _unused = allreduce(tot, tot, 1, buf, 0, r, t, cta)
        mean = Float32(0.0)
        if cutlass.const_expr(is_ln):
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

        leader = ok & (t == 0)
        if cutlass.const_expr(C > 1):
            leader = leader & (cta == 0)
        if leader:
            rstd_out[row] = rstd
            if cutlass.const_expr(is_ln):
                mean_out[row] = mean

        # ---- y = (s - mean) * rstd * w (+ b), written back over the row fragment
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
            if cutlass.const_expr(stream_y and not config.early_weight):
                load_col(w, wr, g, k)
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

    @cute.jit
    def norm_fwd(
        x: cute.Tensor,
        w: cute.Tensor,
        b: cute.Tensor,
        res: cute.Tensor,
        y: cute.Tensor,
        res_out: cute.Tensor,
        mean_out: cute.Tensor,
        rstd_out: cute.Tensor,
        stream,
    ):
        n_blocks = cute.ceil_div(x.shape[0], R)
        if cutlass.const_expr(C > 1):
            _kernel(x, w, b, res, y, res_out, mean_out, rstd_out).launch(
                grid=(n_blocks * C, 1, 1), block=(T, 1, 1), cluster=(C, 1, 1), stream=stream,
                max_number_threads=[T, 1, 1],
            )
        else:
            _kernel(x, w, b, res, y, res_out, mean_out, rstd_out).launch(
                grid=(n_blocks, 1, 1), block=(T, 1, 1), stream=stream, max_number_threads=[T, 1, 1]
            )

    return norm_fwd
