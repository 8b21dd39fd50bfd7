"""Column reductions: reduce the middle dim of a 3-D view (CuTe DSL, sm_90 first).

``out[o, i] = op(x[o, :, i])`` for x of shape (O, R, I) with strides
(sO, sR, 1): any reduction over a non-last dim of a contiguous-ish tensor is
this problem (O = product of the dims before, I = product of the dims after),
so no transpose copy is ever made. O, R, I and both outer strides are dynamic:
one compiled kernel per (op, dtypes, alignment, config) serves every shape.

Work decomposition
------------------
Each thread owns one ``vec``-element vector of the inner dim (16 bytes at the
widest) and walks down R, so every load is a 16-byte ``ld.global.v4`` and the
``threads_x`` (TX) threads of a row segment read TX*16 contiguous bytes. A CTA
of T threads is TX columns-of-vectors x TY = T/TX row lanes; row lane ``gy``
takes rows gy, gy + TY*C, ... (C = ``cluster_n`` CTAs split R through an sm_90
cluster, so narrow problems still fill the GPU). The R loop issues ``unroll``
independent loads before accumulating them; the last partial round clamps the
row (every load is in bounds) and only accumulates rows < R.

A partial last vector (I % vec != 0 with a vec-aligned view) falls back to
scalar loads for that thread only; threads past I only join the barriers.

Combining: ``vec`` fp32 chains per thread -> butterfly shuffles over the lanes
of a warp that share a column (when TX < 32) -> a shared-memory buffer of one
row per warp -> thread c < TX*vec folds column c -> with C > 1 that value goes
to rank 0's buffer through DSMEM and rank 0 stores. Argmax keeps an Int32 row
index beside each value and merges with torch's rule (first NaN, else first
maximum), exactly as the row kernel.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ..rows.grid import cluster_block
from .combine import SENTINEL, ReduceOp, select
from .config import ColReduceConfig, candidate_col_configs, default_col_config

__all__ = ["ColReduce", "ColReduceConfig", "default_col_config", "candidate_col_configs", "make_col_reduce"]


class ColReduce(ReduceOp):
    """The column reduction (module docstring) for one (op, dtypes, vector width, config):
    the tiling in ``__init__``, the host launch in ``__call__``, the device ``kernel``."""

    def __init__(self, op: str, in_dtype, out_dtype, vec: int, config: ColReduceConfig) -> None:
        super().__init__(op)
        self.check_operands(in_dtype, out_dtype, vec)
        config.validate(in_dtype.width)
        self.in_dtype, self.out_dtype, self.vec = in_dtype, out_dtype, vec
        self.threads, self.threads_x = config.threads, config.threads_x
        self.unroll, self.cluster_n = config.unroll, config.cluster_n
        self.lanes_y = self.threads // self.threads_x  # TY: row lanes of a CTA
        self.cluster_lanes_y = self.lanes_y * self.cluster_n  # PY: row lanes over the whole cluster
        self.cta_cols = self.threads_x * vec  # CW: inner elements per CTA
        self.smem_row_threads = max(self.threads_x, 32)  # WX: threads sharing one shared-memory row
        self.smem_rows = self.threads // self.smem_row_threads  # SR: one per warp, or per TX-wide group
        self.col_lanes = 32 // self.threads_x if self.threads_x < 32 else 1  # SH: lanes of a warp sharing a column
        self.copy_bits = vec * in_dtype.width

    @cute.kernel
    def kernel(self, x: cute.Tensor, out: cute.Tensor):
        TX, U, C, vec = self.threads_x, self.unroll, self.cluster_n, self.vec
        TY, PY, CW, WX, SR, SH = (self.lanes_y, self.cluster_lanes_y, self.cta_cols, self.smem_row_threads,
                                  self.smem_rows, self.col_lanes)
        op, in_dtype, out_dtype, is_arg, init, copy_bits = (self.op, self.in_dtype, self.out_dtype, self.is_arg,
                                                            self.init, self.copy_bits)
        tidx, cta, cb = cluster_block(C)
        n_r = x.shape[1]
        n_i = x.shape[2]
        ncb_i = (n_i + CW - 1) // CW
        o = cb // ncb_i
        ci = cb - o * ncb_i
        tx = tidx % TX
        ty = tidx // TX
        gy = cta * TY + ty
        cvi = ci * TX + tx  # this thread's vector of the inner dim
        col0 = cvi * vec

        acc = cute.make_rmem_tensor(cute.make_layout((vec,)), Float32)
        acc.fill(init)
        aidx = cute.make_rmem_tensor(cute.make_layout((vec,)), Int32)
        aidx.fill(SENTINEL)
        xo = x[o, None, None]  # (R, I) : (sR, 1)

        if col0 + vec <= n_i:
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), in_dtype, num_bits_per_copy=copy_bits)
            ncv = (n_i + vec - 1) // vec
            # (vec, vector of the row, row): unit inner stride, vector stride vec -> aligned loads
            g = cute.make_tensor(
                xo.iterator, cute.make_layout((vec, ncv, n_r), stride=(1, vec, x.layout.stride[1]))
            )
            frag = cute.make_rmem_tensor(cute.make_layout((vec, U)), in_dtype)
            n_full = n_r // (PY * U)
            for it in cutlass.range(n_full, unroll=1):
                rb = it * (PY * U) + gy
                for u in cutlass.range_constexpr(U):
                    cute.copy(atom, g[None, cvi, rb + u * PY], frag[None, u])
                for u in cutlass.range_constexpr(U):
                    for v in cutlass.range_constexpr(vec):
                        self.accumulate(acc, aidx, v, frag[v, u], rb + u * PY)
            if n_full * (PY * U) < n_r:  # uniform: a partial round is left
                rb = n_full * (PY * U) + gy
                for u in cutlass.range_constexpr(U):
                    # clamped row: every load is in bounds, only rows < R count
                    cute.copy(atom, g[None, cvi, cutlass.min(rb + u * PY, n_r - 1)], frag[None, u])
                for u in cutlass.range_constexpr(U):
                    if rb + u * PY < n_r:
                        for v in cutlass.range_constexpr(vec):
                            self.accumulate(acc, aidx, v, frag[v, u], rb + u * PY)
        elif col0 < n_i:
            # partial last vector of a vec-aligned view: scalar loads, this thread only
            for r in cutlass.range(gy, n_r, PY, unroll=1):
                for v in cutlass.range_constexpr(vec):
                    if col0 + v < n_i:
                        self.accumulate(acc, aidx, v, xo[r, col0 + v], r)

        # ---- lanes of a warp that share this thread's columns
        if cutlass.const_expr(SH > 1):
            for step in cutlass.range_constexpr(int(math.log2(SH))):
                lane_off = TX << step
                for v in cutlass.range_constexpr(vec):
                    oval = cute.arch.shuffle_sync_bfly(acc[v], offset=lane_off)
                    oidx = aidx[v]
                    if cutlass.const_expr(is_arg):
                        oidx = cute.arch.shuffle_sync_bfly(aidx[v], offset=lane_off)
                    nv, ni = self.merge(acc[v], aidx[v], oval, oidx)
                    acc[v] = nv
                    aidx[v] = ni

        smem = cutlass.memory.SmemAllocator()
        s_val = smem.allocate_tensor(Float32, cute.make_layout((SR, CW), stride=(CW, 1)), byte_alignment=16)
        s_idx = smem.allocate_tensor(Int32, cute.make_layout((SR, CW), stride=(CW, 1)), byte_alignment=16)
        srow = tidx // WX
        if tidx % WX < TX:
            for v in cutlass.range_constexpr(vec):
                s_val[srow, tx * vec + v] = acc[v]
                if cutlass.const_expr(is_arg):
                    s_idx[srow, tx * vec + v] = aidx[v]
        cute.arch.sync_threads()

        val = Float32(init)
        idx = Int32(SENTINEL)
        c = cutlass.min(tidx, CW - 1)
        for j in cutlass.range_constexpr(SR):
            oidx = idx
            if cutlass.const_expr(is_arg):
                oidx = s_idx[j, c]
            val, idx = self.merge(val, idx, s_val[j, c], oidx)

        if cutlass.const_expr(C > 1):
            s_cl = smem.allocate_tensor(Float32, cute.make_layout((C, CW), stride=(CW, 1)), byte_alignment=16)
            s_cli = smem.allocate_tensor(Int32, cute.make_layout((C, CW), stride=(CW, 1)), byte_alignment=16)
            cute.arch.cluster_wait()  # all peers resident before DSMEM stores
            if tidx < CW:
                slot = cta * CW + tidx
                cute.arch.map_dsmem_ptr(s_cl.iterator + slot, 0).store(val)
                if cutlass.const_expr(is_arg):
                    cute.arch.map_dsmem_ptr(s_cli.iterator + slot, 0).store(idx)
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            val = Float32(init)
            idx = Int32(SENTINEL)
            for j in cutlass.range_constexpr(C):
                oidx = idx
                if cutlass.const_expr(is_arg):
                    oidx = s_cli[j, c]
                val, idx = self.merge(val, idx, s_cl[j, c], oidx)

        col = ci * CW + tidx
        store = (tidx < CW) & (col < n_i)
        if cutlass.const_expr(C > 1):
            store = store & (cta == 0)
        if store:
            if cutlass.const_expr(is_arg):
                out[o, col] = Int64(select(idx == SENTINEL, Int32(0), idx, Int32))
            elif cutlass.const_expr(op == "mean"):
                out[o, col] = (val / Float32(n_r)).to(out_dtype)
            else:
                out[o, col] = val.to(out_dtype)

    @cute.jit
    def __call__(self, x: cute.Tensor, out: cute.Tensor, stream):
        C, CW = self.cluster_n, self.cta_cols
        n_o = x.shape[0]
        n_blocks = n_o * cute.ceil_div(x.shape[2], CW)
        if cutlass.const_expr(C > 1):
            self.kernel(x, out).launch(grid=(n_blocks * C, 1, 1), block=(self.threads, 1, 1), cluster=(C, 1, 1),
                                       stream=stream)
        else:
            self.kernel(x, out).launch(grid=(n_blocks, 1, 1), block=(self.threads, 1, 1), stream=stream)


def make_col_reduce(op: str, in_dtype, out_dtype, vec: int, config: ColReduceConfig):
    """A @cute.jit f(x: (O, R, I) : (sO, sR, 1), out: (O, I) : (sOo, 1), stream)."""
    reduce = ColReduce(op, in_dtype, out_dtype, vec, config)

    @cute.jit
    def col_reduce(x: cute.Tensor, out: cute.Tensor, stream):
        reduce(x, out, stream)

    return col_reduce
