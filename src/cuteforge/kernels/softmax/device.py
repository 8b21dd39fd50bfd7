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
odd N such as 50257, or a view), the rows are realigned (``rows.split``): NV 16-byte
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

__all__ = ["RowSoftmax", "SoftmaxForward", "SoftmaxBackward", "make_softmax"]

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


class RowSoftmax:
    """What the register kernels of both directions share (module docstring): the row's
    tiling in ``__init__``, where a thread stands, its vectors' loads and stores, the
    row-wide reduction; `SoftmaxForward` and `SoftmaxBackward` add their device ``kernel``
    and host ``__call__``.

    Every tensor is (M, n) with stride (row_stride, 1) and rows vec-aligned; n % vec == 0.
    Below 16-byte vectors the rows are realigned at run time (module comment);
    ``same_heads``: the caller guarantees every operand's rows start at the same offset
    from a 16-byte boundary as the reference's, so no element-by-element fallback is built.
    """

    def __init__(self, mode: str, dtype, n: int, vec: int, config: SoftmaxConfig, same_heads: bool = False) -> None:
        self.backward = bwd = is_backward(mode)
        self.log = mode.startswith("log")
        check_operands(dtype, n, vec)
        self.dtype = dtype
        self.bits = bits = dtype.width
        config.validate(n, bits, bwd)

        self.threads = config.threads  # T
        self.threads_per_row = P = config.threads_per_row  # P
        self.cluster_n = C = config.cluster_n  # C
        self.rows_per_cta = config.threads // P  # R
        self.lanes = G = min(P, 32)  # G: lanes of one row inside a warp
        W = max(P // 32, 1)  # warps per row
        self.slots = S = W * C  # S: partial slots per row
        self.row_threads = PT = P * C  # PT: virtual threads per row
        BV, NV = row_vectors(n, vec, bits)
        # a cluster needs a full round in every CTA: else the rows keep their vec
        self.realign = BV > vec and (C == 1 or NV >= PT)
        if not self.realign:
            BV, NV = vec, n // vec
        self.vector, self.vectors = BV, NV  # BV, NV
        # operands whose heads may differ: element by element
        self.fallback = self.realign and not same_heads
        self.tail = TAIL = n - NV * BV  # TAIL: leftover elements (realigned rows only)
        self.left_slots = -(-TAIL // PT)  # LC: leftover slots per virtual thread
        self.rounds = K = NV // PT  # K: full rounds
        self.rem = NV - K * PT  # REM: virtual threads g < REM own one more vector
        self.rounds_all = K + (1 if self.rem > 0 else 0)  # KT
        if C > 1 and K < 1:
            raise ValueError(f"cluster_n={C}: n={n} at vec={vec} gives a CTA of the cluster no full round")
        self.copy_bits = BV * bits

        self.lane_reduce = make_lane_reduce(self.combine, not bwd)
        # the row's warps / cluster CTAs: (max, sum) pairs (backward: sums) through shared memory
        self.post_partials = make_post_partials(not bwd, W, G, C, S)
        self.fold_partials = make_fold_partials(self.combine, not bwd, S, G, Float32, 0.0 if bwd else NEG_INF,
                                                Float32, 0.0)

    def combine(self, a1, b1, a2, b2):
        # bwd: plain sum in a1 (b unused); fwd: online-softmax merge of (max, sum) pairs.
        if self.backward:
            return a1 + a2, b1
        return merge_max_sum(a1, b1, a2, b2)

    @cute.jit
    def row_reduce(self, a, b, r, t, cta):
        """Merge every thread's partial of a row; all threads of the row get the result."""
        R, S, G = self.rows_per_cta, self.slots, self.lanes
        a, b = self.lane_reduce(a, b, G)
        if cutlass.const_expr(S > 1):
            smem = cutlass.memory.SmemAllocator()
            s_a = smem.allocate_tensor(Float32, cute.make_layout((R, S), stride=(S, 1)), byte_alignment=16)
            s_b = smem.allocate_tensor(Float32, cute.make_layout((R, S), stride=(S, 1)), byte_alignment=16)
            self.post_partials(a, b, s_a, s_b, r, t, cta)
            a, b = self.fold_partials(s_a, s_b, r, t % G)
            # every lane needs the total (unlike a plain reduction, where one writer
            # does): fold all G lanes; lanes >= S hold the identity
            a, b = self.lane_reduce(a, b, G)
        return a, b

    def thread_view(self, ptr, g):
        # (BV, KT) : (1, BV*PT) slice of the row's vectors (starting at ptr) owned by virtual thread g
        BV, PT = self.vector, self.row_threads
        full = cute.make_tensor(ptr, cute.make_layout((BV, PT, self.rounds_all), stride=(1, BV, BV * PT)))
        return full[None, g, None]

    @cute.jit
    def load(self, atom, src: cute.Tensor, frag: cute.Tensor, g, pad: cutlass.Constexpr,
             by_elem: cutlass.Constexpr = False):
        K, REM, BV = self.rounds, self.rem, self.vector
        for k in cutlass.range_constexpr(K):
            move(atom, src[None, k], frag[None, k], by_elem, BV)
        if cutlass.const_expr(REM > 0):
            for v in cutlass.range_constexpr(BV):
                frag[v, K] = frag.element_type(pad)
            if g < REM:
                move(atom, src[None, K], frag[None, K], by_elem, BV)

    @cute.jit
    def store(self, atom, frag: cute.Tensor, dst: cute.Tensor, g, by_elem: cutlass.Constexpr = False):
        K, REM, BV = self.rounds, self.rem, self.vector
        for k in cutlass.range_constexpr(K):
            move(atom, frag[None, k], dst[None, k], by_elem, BV)
        if cutlass.const_expr(REM > 0):
            if g < REM:
                move(atom, frag[None, K], dst[None, K], by_elem, BV)

    @cute.jit
    def load_operand(self, atom, row_t: cute.Tensor, h, frag: cute.Tensor, g, pad: cutlass.Constexpr):
        """An operand's vectors into frag, split as the reference row (head h): as vectors
        where its own head is h too, else element by element (one branch for the row)."""
        if cutlass.const_expr(self.fallback):
            body, at_h, same = operand(row_t, h, self.bits // 8)
            if same:
                self.load(atom, self.thread_view(body, g), frag, g, pad)
            else:
                self.load(atom, self.thread_view(at_h, g), frag, g, pad, True)
        else:
            self.load(atom, self.thread_view(self.head(row_t)[0], g), frag, g, pad)

    @cute.jit
    def store_operand(self, atom, frag: cute.Tensor, row_t: cute.Tensor, h, g):
        if cutlass.const_expr(self.fallback):
            body, at_h, same = operand(row_t, h, self.bits // 8)
            if same:
                self.store(atom, frag, self.thread_view(body, g), g)
            else:
                self.store(atom, frag, self.thread_view(at_h, g), g, True)
        else:
            self.store(atom, frag, self.thread_view(self.head(row_t)[0], g), g)

    @cute.jit
    def write_row(self, atom, out: cute.Tensor, out_l, dst: cute.Tensor, row, m_rows, h, g):
        """The thread's vectors (out) and leftover elements (out_l) of row ``row`` of dst;
        rows past M store nothing."""
        if row < m_rows:
            dst_row = dst[row, None]
            self.store_operand(atom, out, dst_row, h, g)
            if cutlass.const_expr(self.left_slots > 0):
                self.store_left(out_l, dst_row, h, g)

    def head(self, row_t: cute.Tensor):
        """(vectors' start, h) of the reference row."""
        if self.realign:
            return realigned(row_t, self.bits // 8)
        return row_t.iterator, cutlass.Int32(0)

    def load_left(self, row_t: cute.Tensor, h, dst: cute.Tensor, g, pad):
        """The realigned row's leftover elements of virtual thread g into dst."""
        load_left(row_t, h, dst, g, pad, self.left_slots, self.row_threads, self.tail, self.vectors * self.vector)

    def store_left(self, src: cute.Tensor, row_t: cute.Tensor, h, g):
        store_left(src, row_t, h, g, self.left_slots, self.row_threads, self.tail, self.vectors * self.vector)

    @cute.jit
    def coords(self):
        """(r, t, cta, row, g): the thread's row slot in the CTA, its thread in the row, its
        CTA's rank in the cluster, its row, its virtual thread."""
        C, P, R = self.cluster_n, self.threads_per_row, self.rows_per_cta
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

    def launch(self, kernel, m_rows, stream):
        """The kernel (a call of a ``kernel`` method) on ceil(m_rows / R) row blocks of
        cluster_n CTAs each."""
        C = self.cluster_n
        grid = (cute.ceil_div(m_rows, self.rows_per_cta) * C, 1, 1)
        if C > 1:
            kernel.launch(grid=grid, block=(self.threads, 1, 1), cluster=(C, 1, 1), stream=stream)
        else:
            kernel.launch(grid=grid, block=(self.threads, 1, 1), stream=stream)

    def copy_atom(self):
        return cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=self.copy_bits)

    def rows_fragment(self):
        """The thread's (BV, KT) register fragment of a row."""
        return cute.make_rmem_tensor(cute.make_layout((self.vector, self.rounds_all)), self.dtype)

    def output_fragments(self):
        """(out, out_l): the thread's registers for its outputs, its vectors and (realigned
        rows) its leftover elements."""
        out = self.rows_fragment()
        out_l = self.left_fragment() if self.left_slots > 0 else None
        return out, out_l

    def left_fragment(self):
        """The thread's register slots for the realigned row's leftover elements."""
        return cute.make_rmem_tensor(cute.make_layout((self.left_slots,)), self.dtype)


class SoftmaxForward(RowSoftmax):
    """softmax / log_softmax of every row: ``__call__(x, y, stream)``."""

    @cute.jit
    def read_row(self, x_row: cute.Tensor, g):
        """(h, atom, xs, xl): the thread's share of the row in the log2 domain, its vectors
        xs and (realigned rows) its leftover elements xl, every load issued first."""
        body, h = self.head(x_row)
        atom = self.copy_atom()
        frag = self.rows_fragment()
        self.load(atom, self.thread_view(body, g), frag, g, NEG_INF)
        xl = None
        if cutlass.const_expr(self.left_slots > 0):
            lf = self.left_fragment()
            self.load_left(x_row, h, lf, g, NEG_INF)
            xl = lf.load().to(Float32) * LOG2E
        xs = frag.load().to(Float32) * LOG2E  # log2 domain
        return h, atom, xs, xl

    @cute.jit
    def thread_partial(self, xs, xl):
        """(m_t, shift, e, s_t): the thread's max, the shift its exponentials e were taken
        at (0 where every element is -inf), and their sum."""
        LC = self.left_slots
        m_t = xs.reduce(cute.ReductionOp.MAX, NEG_INF, 0)
        if cutlass.const_expr(LC > 0):
            m_t = cute.arch.fmax(m_t, xl.reduce(cute.ReductionOp.MAX, NEG_INF, 0))
        shift = _sel(m_t == Float32(NEG_INF), Float32(0.0), m_t)
        e = cute.math.exp2(xs - shift, fastmath=True)
        s_t = e.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        if cutlass.const_expr(LC > 0):
            s_t = s_t + cute.math.exp2(xl - shift, fastmath=True).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        return m_t, shift, e, s_t

    @cute.jit
    def outputs(self, xs, xl, e, m_t, shift, m_row, s_row):
        """(out, out_l): the thread's y, vectors and leftover elements, from the row's
        (max, sum)."""
        LC, dtype = self.left_slots, self.dtype
        out, out_l = self.output_fragments()
        if cutlass.const_expr(self.log):
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
        return out, out_l

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor):
        r, t, cta, row, g = self.coords()
        m_rows = x.shape[0]
        row_c = cutlass.min(row, m_rows - 1)
        x_row = x[row_c, None]
        h, atom, xs, xl = self.read_row(x_row, g)
        m_t, shift, e, s_t = self.thread_partial(xs, xl)
        m_row, s_row = self.row_reduce(m_t, s_t, r, t, cta)
        out, out_l = self.outputs(xs, xl, e, m_t, shift, m_row, s_row)
        self.write_row(atom, out, out_l, y, row, m_rows, h, g)

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, stream):
        self.launch(self.kernel(x, y), x.shape[0], stream)


class SoftmaxBackward(RowSoftmax):
    """The gradient of softmax / log_softmax from its output: ``__call__(dy, y, dx, stream)``."""

    @cute.jit
    def read_rows(self, dy_row: cute.Tensor, y_row: cute.Tensor, g):
        """(h, atom, dyv, yv, dyl, yl): the thread's share of dy and y (the reference row of
        the split), vectors and (realigned rows) leftover elements, every load issued first."""
        LC = self.left_slots
        body, h = self.head(y_row)
        atom = self.copy_atom()
        f_dy = self.rows_fragment()
        f_y = self.rows_fragment()
        self.load_operand(atom, dy_row, h, f_dy, g, 0.0)
        self.load(atom, self.thread_view(body, g), f_y, g, 0.0)
        dyl = None
        yl = None
        if cutlass.const_expr(LC > 0):
            l_dy = self.left_fragment()
            l_y = self.left_fragment()
            self.load_left(dy_row, h, l_dy, g, 0.0)
            self.load_left(y_row, h, l_y, g, 0.0)
            dyl = l_dy.load().to(Float32)
            yl = l_y.load().to(Float32)
        dyv = f_dy.load().to(Float32)
        yv = f_y.load().to(Float32)
        return h, atom, dyv, yv, dyl, yl

    @cute.jit
    def thread_partial(self, dyv, yv, dyl, yl):
        """The thread's share of the row sum the gradient needs: sum(dy y) (softmax),
        sum(dy) (log_softmax)."""
        LC = self.left_slots
        if cutlass.const_expr(self.log):
            part = dyv.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            if cutlass.const_expr(LC > 0):
                part = part + dyl.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        else:
            part = (dyv * yv).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            if cutlass.const_expr(LC > 0):
                part = part + (dyl * yl).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        return part

    @cute.jit
    def outputs(self, dyv, yv, dyl, yl, tot):
        """(out, out_l): the thread's dx, vectors and leftover elements, from the row sum."""
        LC, dtype = self.left_slots, self.dtype
        out, out_l = self.output_fragments()
        if cutlass.const_expr(self.log):
            out.store((dyv - cute.math.exp2(yv * LOG2E, fastmath=True) * tot).to(dtype))
            if cutlass.const_expr(LC > 0):
                out_l.store((dyl - cute.math.exp2(yl * LOG2E, fastmath=True) * tot).to(dtype))
        else:
            out.store((yv * (dyv - tot)).to(dtype))
            if cutlass.const_expr(LC > 0):
                out_l.store((yl * (dyl - tot)).to(dtype))
        return out, out_l

    @cute.kernel
    def kernel(self, dy: cute.Tensor, y: cute.Tensor, dx: cute.Tensor):
        r, t, cta, row, g = self.coords()
        m_rows = dy.shape[0]
        row_c = cutlass.min(row, m_rows - 1)
        y_row = y[row_c, None]
        dy_row = dy[row_c, None]
        h, atom, dyv, yv, dyl, yl = self.read_rows(dy_row, y_row, g)
        part = self.thread_partial(dyv, yv, dyl, yl)
        tot, _ = self.row_reduce(part, Float32(0.0), r, t, cta)
        out, out_l = self.outputs(dyv, yv, dyl, yl, tot)
        self.write_row(atom, out, out_l, dx, row, m_rows, h, g)

    @cute.jit
    def __call__(self, dy: cute.Tensor, y: cute.Tensor, dx: cute.Tensor, stream):
        self.launch(self.kernel(dy, y, dx), dy.shape[0], stream)


def make_softmax(mode: str, dtype, n: int, vec: int, config: SoftmaxConfig, same_heads: bool = False):
    """Return a @cute.jit callable: forward f(x, y, stream) (`SoftmaxForward`), backward
    f(dy, y, dx, stream) (`SoftmaxBackward`); arguments as `RowSoftmax`."""
    if is_backward(mode):
        backward = SoftmaxBackward(mode, dtype, n, vec, config, same_heads)

        @cute.jit
        def softmax_bwd(dy: cute.Tensor, y: cute.Tensor, dx: cute.Tensor, stream):
            backward(dy, y, dx, stream)

        return softmax_bwd
    forward = SoftmaxForward(mode, dtype, n, vec, config, same_heads)

    @cute.jit
    def softmax_fwd(x: cute.Tensor, y: cute.Tensor, stream):
        forward(x, y, stream)

    return softmax_fwd
