"""Softmax / log-softmax over the last dim, forward and backward (CuTe DSL, sm_90 first).

One pass over memory each way: the forward reads x once and writes y once, the backward
reads y and dy once and writes dx once. The whole row stays in registers between the
read and the write.

Work decomposition (the same tiling as ``kernels/reduce/row.py``)
-----------------------------------------------------------------
N, the dtype, the vector width ``vec`` and the :class:`SoftmaxConfig` are compile-time;
M and every row stride are dynamic (one kernel for every batch size and every 2-D view).
Row offsets are 64-bit. ``threads_per_row`` (P) threads of a CTA share a row, a CTA
holds ``threads // P`` rows, and with ``cluster_n`` (C) > 1 a row is split over the C
CTAs of an sm_90 thread-block cluster: P*C "virtual threads" g = cta_rank*P + t.

The row is NV vectors of BV elements. Where the rows' alignment allows 16-byte vectors,
BV = vec (the op lowers vec until it divides N) and NV = N / vec. Where it does not (an
odd N such as 50257, or a view), the rows are realigned (``row_split``): NV 16-byte
vectors from each row's first 16-byte boundary on, and TAIL < 2 BV leftover elements
(the head before it and the tail after the vectors) one by one, slot i to virtual
thread i % (P*C). The other operands are read / written through the same split when
their rows have the same head (contiguous rows of one shape do); a row of one that has
not goes element by element from the same registers. Vector j belongs to virtual
thread j % (P*C): every warp load is 32 consecutive vectors, fully coalesced. A thread
owns K = NV // (P*C) full rounds plus one predicated round when NV % (P*C) != 0; all of
its loads are issued before any arithmetic, so they are all in flight together.

Math (fp32)
-----------
Forward, in the log2 domain (``exp2``, one FMA per element): each thread takes the max
of its elements m_t (scaled by log2 e), e_i = 2^(x_i log2e - m_t) and s_t = sum e_i.
The pairs (m_t, s_t) are merged across lanes (butterfly shuffles), warps (shared
memory) and CTAs (distributed shared memory) with the online-softmax rule
(m, s) = (max(m1, m2), s1 2^(m1-m) + s2 2^(m2-m)), so the row needs ONE cross-thread
reduction, not two. Then softmax y_i = e_i * 2^(m_t - M) / S (one multiply per element:
the exponentials are kept) and log_softmax y_i = x_i - (M + log2 S) ln 2.
Rows of -inf only give NaN like torch; a thread whose elements are all -inf (padding)
contributes (-inf, 0) without producing NaN.

Backward: softmax dx = y (dy - sum(dy y)); log_softmax dx = dy - exp(y) sum(dy).

Cross-CTA exchange (cluster_n > 1): a relaxed cluster arrive at kernel start, waited
on before the first remote store (all peers resident), then each warp leader writes its
partial into every peer's shared-memory slot (``mapa`` + st.shared::cluster) and a
cluster barrier (arrive.release / wait.acquire) publishes them. Every CTA then reduces
the same slots in the same order, so all CTAs of a row agree bit for bit.

Rows past M (last CTA) re-read row M-1 so every lane joins the shuffles and barriers;
only rows < M store.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from ..rows.partials import make_fold_partials, make_post_partials
from ..rows.split import load_left, move, operand, realigned, row_vectors, store_left
from .config import SoftmaxConfig, is_backward
from .online import NEG_INF, make_lane_reduce, merge_max_sum

__all__ = ["make_softmax"]

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def _sel(cond, a, b):
    return Float32(cutlass.select_(cond, a, b))


def check_operands(dtype, n: int, vec: int) -> None:
    """What every softmax kernel takes: fp32 / bf16 / fp16 rows of n elements, in vectors
    of vec elements (at most 16 bytes) that divide n."""
    if dtype not in (Float32, cutlass.BFloat16, cutlass.Float16):
        raise ValueError(f"unsupported dtype {dtype}")
    bits = dtype.width
    if vec not in (1, 2, 4, 8) or vec * bits > 128:
        raise ValueError(f"vec={vec} invalid for a {bits}-bit dtype (vec*bits must be <= 128)")
    if n % vec != 0:
        raise ValueError(f"n={n} must be a multiple of vec={vec}")


def make_softmax(mode: str, dtype, n: int, vec: int, config: SoftmaxConfig, same_heads: bool = False):
    """Return a @cute.jit callable: forward f(x, y, stream), backward f(dy, y, dx, stream).

    Every tensor is (M, n) with stride (row_stride, 1) and rows vec-aligned; n % vec == 0.
    Below 16-byte vectors the rows are realigned at run time (module comment);
    ``same_heads``: the caller guarantees every operand's rows start at the same offset
    from a 16-byte boundary as the reference's, so no element-by-element fallback is built.
    """
    bwd = is_backward(mode)
    log = mode.startswith("log")
    check_operands(dtype, n, vec)
    bits = dtype.width
    config.validate(n, bits, bwd)

    T = config.threads
    P = config.threads_per_row
    C = config.cluster_n
    R = T // P  # rows per CTA
    G = min(P, 32)  # lanes of one row inside a warp
    W = max(P // 32, 1)  # warps per row
    S = W * C  # partial slots per row
    PT = P * C  # virtual threads per row
    BV, NV = row_vectors(n, vec, bits)
    # a cluster needs a full round in every CTA: else the rows keep their vec
    realign = BV > vec and (C == 1 or NV >= PT)
    if not realign:
        BV, NV = vec, n // vec
    FALLBACK = realign and not same_heads  # operands whose heads may differ: element by element
    TAIL = n - NV * BV  # leftover elements (realigned rows only)
    LC = -(-TAIL // PT)  # leftover slots per virtual thread
    K = NV // PT  # full rounds
    REM = NV - K * PT  # virtual threads g < REM own one more vector
    KT = K + (1 if REM > 0 else 0)
    if C > 1 and K < 1:
        raise ValueError(f"cluster_n={C}: n={n} at vec={vec} gives a CTA of the cluster no full round")
    copy_bits = BV * bits

    def combine(a1, b1, a2, b2):
        # bwd: plain sum in a1 (b unused); fwd: online-softmax merge of (max, sum) pairs.
        if bwd:
            return a1 + a2, b1
        return merge_max_sum(a1, b1, a2, b2)

    _lane_reduce = make_lane_reduce(combine, not bwd)

    # the row's warps / cluster CTAs: (max, sum) pairs (backward: sums) through shared memory
    _post = make_post_partials(not bwd, W, G, C, S)
    _fold = make_fold_partials(combine, not bwd, S, G, Float32, 0.0 if bwd else NEG_INF, Float32, 0.0)

    @cute.jit
    def _row_reduce(a, b, r, t, cta):
        """Merge every thread's partial of a row; all threads of the row get the result."""
        a, b = _lane_reduce(a, b, G)
        if cutlass.const_expr(S > 1):
            smem = cutlass.memory.SmemAllocator()
            s_a = smem.allocate_tensor(Float32, cute.make_layout((R, S), stride=(S, 1)), byte_alignment=16)
            s_b = smem.allocate_tensor(Float32, cute.make_layout((R, S), stride=(S, 1)), byte_alignment=16)
            _post(a, b, s_a, s_b, r, t, cta)
            a, b = _fold(s_a, s_b, r, t % G)
            # every lane needs the total (unlike a plain reduction, where one writer
            # does): fold all G lanes; lanes >= S hold the identity
            a, b = _lane_reduce(a, b, G)
        return a, b

    def _thread_view(ptr, g):
        # (BV, KT) : (1, BV*PT) slice of the row's vectors (starting at ptr) owned by virtual thread g
        full = cute.make_tensor(ptr, cute.make_layout((BV, PT, KT), stride=(1, BV, BV * PT)))
        return full[None, g, None]

    @cute.jit
    def _load(atom, src: cute.Tensor, frag: cute.Tensor, g, pad: cutlass.Constexpr, by_elem: cutlass.Constexpr = False):
        for k in cutlass.range_constexpr(K):
            move(atom, src[None, k], frag[None, k], by_elem, BV)
        if cutlass.const_expr(REM > 0):
            for v in cutlass.range_constexpr(BV):
                frag[v, K] = frag.element_type(pad)
            if g < REM:
                move(atom, src[None, K], frag[None, K], by_elem, BV)

    @cute.jit
    def _store(atom, frag: cute.Tensor, dst: cute.Tensor, g, by_elem: cutlass.Constexpr = False):
        for k in cutlass.range_constexpr(K):
            move(atom, frag[None, k], dst[None, k], by_elem, BV)
        if cutlass.const_expr(REM > 0):
            if g < REM:
                move(atom, frag[None, K], dst[None, K], by_elem, BV)

    @cute.jit
    def _load_operand(atom, row_t: cute.Tensor, h, frag: cute.Tensor, g, pad: cutlass.Constexpr):
        """An operand's vectors into frag, split as the reference row (head h): as vectors
        where its own head is h too, else element by element (one branch for the row)."""
        if cutlass.const_expr(FALLBACK):
            body, at_h, same = operand(row_t, h, bits // 8)
            if same:
                _load(atom, _thread_view(body, g), frag, g, pad)
            else:
                _load(atom, _thread_view(at_h, g), frag, g, pad, True)
        else:
            _load(atom, _thread_view(_head(row_t)[0], g), frag, g, pad)

    @cute.jit
    def _store_operand(atom, frag: cute.Tensor, row_t: cute.Tensor, h, g):
        if cutlass.const_expr(FALLBACK):
            body, at_h, same = operand(row_t, h, bits // 8)
            if same:
                _store(atom, frag, _thread_view(body, g), g)
            else:
                _store(atom, frag, _thread_view(at_h, g), g, True)
        else:
            _store(atom, frag, _thread_view(_head(row_t)[0], g), g)

    def _head(row_t: cute.Tensor):
        """(vectors' start, h) of the reference row."""
        if realign:
            return realigned(row_t, bits // 8)
        return row_t.iterator, cutlass.Int32(0)

    @cute.jit
    def _coords():
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        cta = 0
        row_block = bidx
        if cutlass.const_expr(C > 1):
            cute.arch.cluster_arrive_relaxed()
            cta = cute.arch.block_idx_in_cluster()
            row_block = bidx // C
        r = tidx // P
        t = tidx % P
        return r, t, cta, row_block * R + r, cta * P + t

    @cute.kernel
    def _fwd(x: cute.Tensor, y: cute.Tensor):
        r, t, cta, row, g = _coords()
        m_rows = x.shape[0]
        row_c = cutlass.min(row, m_rows - 1)
        x_row = x[row_c, None]
        body, h = _head(x_row)
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=copy_bits)
        frag = cute.make_rmem_tensor(cute.make_layout((BV, KT)), dtype)
        _load(atom, _thread_view(body, g), frag, g, NEG_INF)
        xl = None
        if cutlass.const_expr(LC > 0):
            lf = cute.make_rmem_tensor(cute.make_layout((LC,)), dtype)
            load_left(x_row, h, lf, g, NEG_INF, LC, PT, TAIL, NV * BV)
            xl = lf.load().to(Float32) * LOG2E
        xs = frag.load().to(Float32) * LOG2E  # log2 domain
        m_t = xs.reduce(cute.ReductionOp.MAX, NEG_INF, 0)
        if cutlass.const_expr(LC > 0):
            m_t = cute.arch.fmax(m_t, xl.reduce(cute.ReductionOp.MAX, NEG_INF, 0))
        shift = _sel(m_t == Float32(NEG_INF), Float32(0.0), m_t)
        e = cute.math.exp2(xs - shift, fastmath=True)
        s_t = e.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        if cutlass.const_expr(LC > 0):
            s_t = s_t + cute.math.exp2(xl - shift, fastmath=True).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        m_row, s_row = _row_reduce(m_t, s_t, r, t, cta)
        out = cute.make_rmem_tensor(cute.make_layout((BV, KT)), dtype)
        out_l = None
        if cutlass.const_expr(LC > 0):
            out_l = cute.make_rmem_tensor(cute.make_layout((LC,)), dtype)
        if cutlass.const_expr(log):
            lse = m_row + cute.math.log2(s_row, fastmath=True)
            out.store(((xs - lse) * LN2).to(dtype))
            if cutlass.const_expr(LC > 0):
                out_l.store(((xl - lse) * LN2).to(dtype))
        else:
            ms = _sel(m_row == Float32(NEG_INF), Float32(0.0), m_row)
            scale = _sel(m_t == Float32(NEG_INF), Float32(0.0), cute.math.exp2(shift - ms, fastmath=True))
            out.store((e * (scale / s_row)).to(dtype))
            if cutlass.const_expr(LC > 0):
                out_l.store((cute.math.exp2(xl - ms, fastmath=True) / s_row).to(dtype))
        if row < m_rows:
            y_row = y[row, None]
            _store_operand(atom, out, y_row, h, g)
            if cutlass.const_expr(LC > 0):
                store_left(out_l, y_row, h, g, LC, PT, TAIL, NV * BV)

    @cute.kernel
    def _bwd(dy: cute.Tensor, y: cute.Tensor, dx: cute.Tensor):
        r, t, cta, row, g = _coords()
        m_rows = dy.shape[0]
        row_c = cutlass.min(row, m_rows - 1)
        # y (the forward's output) is the reference row of the split
        y_row = y[row_c, None]
        dy_row = dy[row_c, None]
        body, h = _head(y_row)
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=copy_bits)
        f_dy = cute.make_rmem_tensor(cute.make_layout((BV, KT)), dtype)
        f_y = cute.make_rmem_tensor(cute.make_layout((BV, KT)), dtype)
        _load_operand(atom, dy_row, h, f_dy, g, 0.0)
        _load(atom, _thread_view(body, g), f_y, g, 0.0)
        dyl = None
        yl = None
        if cutlass.const_expr(LC > 0):
            l_dy = cute.make_rmem_tensor(cute.make_layout((LC,)), dtype)
            l_y = cute.make_rmem_tensor(cute.make_layout((LC,)), dtype)
            load_left(dy_row, h, l_dy, g, 0.0, LC, PT, TAIL, NV * BV)
            load_left(y_row, h, l_y, g, 0.0, LC, PT, TAIL, NV * BV)
            dyl = l_dy.load().to(Float32)
            yl = l_y.load().to(Float32)
        dyv = f_dy.load().to(Float32)
        yv = f_y.load().to(Float32)
        if cutlass.const_expr(log):
            part = dyv.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            if cutlass.const_expr(LC > 0):
                part = part + dyl.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        else:
            part = (dyv * yv).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            if cutlass.const_expr(LC > 0):
                part = part + (dyl * yl).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        tot, _ = _row_reduce(part, Float32(0.0), r, t, cta)
        out = cute.make_rmem_tensor(cute.make_layout((BV, KT)), dtype)
        out_l = None
        if cutlass.const_expr(LC > 0):
            out_l = cute.make_rmem_tensor(cute.make_layout((LC,)), dtype)
        if cutlass.const_expr(log):
            out.store((dyv - cute.math.exp2(yv * LOG2E, fastmath=True) * tot).to(dtype))
            if cutlass.const_expr(LC > 0):
                out_l.store((dyl - cute.math.exp2(yl * LOG2E, fastmath=True) * tot).to(dtype))
        else:
            out.store((yv * (dyv - tot)).to(dtype))
            if cutlass.const_expr(LC > 0):
                out_l.store((yl * (dyl - tot)).to(dtype))
        if row < m_rows:
            dx_row = dx[row, None]
            _store_operand(atom, out, dx_row, h, g)
            if cutlass.const_expr(LC > 0):
                store_left(out_l, dx_row, h, g, LC, PT, TAIL, NV * BV)

    def _grid(m_rows):
        return (cute.ceil_div(m_rows, R) * C, 1, 1)

    if bwd:

        @cute.jit
        def softmax_bwd(dy: cute.Tensor, y: cute.Tensor, dx: cute.Tensor, stream):
            if cutlass.const_expr(C > 1):
                _bwd(dy, y, dx).launch(grid=_grid(dy.shape[0]), block=(T, 1, 1), cluster=(C, 1, 1), stream=stream)
            else:
                _bwd(dy, y, dx).launch(grid=_grid(dy.shape[0]), block=(T, 1, 1), stream=stream)

        return softmax_bwd

    @cute.jit
    def softmax_fwd(x: cute.Tensor, y: cute.Tensor, stream):
        if cutlass.const_expr(C > 1):
            _fwd(x, y).launch(grid=_grid(x.shape[0]), block=(T, 1, 1), cluster=(C, 1, 1), stream=stream)
        else:
            _fwd(x, y).launch(grid=_grid(x.shape[0]), block=(T, 1, 1), stream=stream)

    return softmax_fwd
