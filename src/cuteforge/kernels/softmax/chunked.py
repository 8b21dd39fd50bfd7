"""Forward softmax / log-softmax for long rows (``SoftmaxConfig.path`` != "regs").

What differs from the register kernel (device.py), all aimed at 16-bit rows of N >= 32768,
where that one reaches only 67-82 % of copy bandwidth on the H200:

* **Contiguous chunks.** CTA c of a cluster of C owns the vectors
  [c*CB, (c+1)*CB) of the row (CB = ceil(NV / C), in KT = ceil(CB / P) rounds of its P
  threads; `_chunks`); thread t owns vectors c*CB + k*P + t. Every warp access is still
  32 consecutive 16-byte vectors; rounds that may pass the chunk's end are predicated
  (runtime, per CTA).
* **mbarrier exchange.** Thread 0 initialises one mbarrier per CTA and arms it with the
  bytes every CTA of the cluster will send (R rows x W warps x C CTAs x 8 bytes); the
  relaxed cluster arrive after ``fence.mbarrier_init`` is waited on only right before
  the first remote store, so it overlaps the loads. Lanes l < C of each warp then write
  the warp's (max, sum) pair into CTA l's slot with ``st.async`` (transaction bytes
  counted on CTA l's mbarrier), and each CTA waits on its own mbarrier only: no full
  cluster barrier, no release/acquire round over every thread of the cluster.
  A CTA leaves only after its mbarrier saw every peer's bytes, so no remote store can
  reach a CTA that has exited.
* **Staging** (path async / smem, 16-byte vectors only; narrower vectors, e.g. odd N,
  fall back to register loads): the chunk arrives through ``cp.async.cg`` into shared
  memory, so the loads hold no registers. Each thread reads back only the vectors it
  copied itself, so ``cp.async.wait_group 0`` suffices (no CTA barrier).
  ``async`` converts the chunk into registers once and keeps the exponentials there
  (the register kernel's arithmetic); ``smem`` never holds the row: one pass for the max, one for the sum
  of exponentials, one for the output (exponentials recomputed), a 16-byte vector at a
  time, so a CTA needs few registers and shared memory bounds the CTAs per SM.

Math as in device.py (log2 domain, online (max, sum) merge, torch's -inf / NaN rules).
Rows past M (last CTA) re-read row M-1 and store nothing.

Backward (``make_softmax_chunked_bwd``, path "mbar" only, modes softmax_bwd /
log_softmax_bwd): the same chunking and exchange for the one fp32 row sum the backward
needs (softmax: sum(dy y), dx = y (dy - sum); log_softmax: sum(dy),
dx = dy - exp(y) sum). Each thread holds its share of y and dy in registers of the
input dtype (16-bit stays packed), reduces, then converts again for dx; one 4-byte
value per warp and row goes to every peer (R x W x C x 4 transaction bytes per CTA).
Padding past N reads as 0 in both inputs (adds nothing to either sum).
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from ..rows.grid import clamped_row, row_coords
from ..rows.split import load_left, move, operand, realigned, split, store_left
from .config import STAGED_PATHS, SoftmaxConfig
from .device import check_operands
from .online import NEG_INF, make_lane_reduce, merge_max_sum

__all__ = [
    "ChunkedRowSoftmax",
    "SoftmaxChunkedBackward",
    "SoftmaxChunkedForward",
    "make_softmax_chunked",
    "make_softmax_chunked_bwd",
]

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
# CTAs per SM that the 16-bit forward's register budget is set for at 64 elements a
# thread (make_softmax_chunked; 0: no launch bound, for an A/B)
FWD_MIN_CTAS = 3


def _sel(cond, a, b):
    return Float32(cutlass.select_(cond, a, b))


@cute.jit
def _arm_exchange(mbar, tidx, tx_bytes: cutlass.Constexpr):
    """The row exchange's mbarrier (count 1) armed for the ``tx_bytes`` a row brings, then
    the relaxed cluster arrive whose wait precedes the first ``st.async`` into a peer."""
    if tidx == 0:
        cute.arch.mbarrier_init(mbar, 1)
    cute.arch.mbarrier_init_fence()
    if tidx == 0:
        cute.arch.mbarrier_arrive_and_expect_tx(mbar, tx_bytes)
    cute.arch.cluster_arrive_relaxed()


def _chunks(nv: int, p: int, c: int) -> tuple[int, int, int]:
    """(KT, CB, KF): CTA i of the cluster owns vectors [i * CB, min((i + 1) * CB, nv)) of
    the row, CB = ceil(nv / c), in KT rounds of its p threads; rounds below KF are whole
    in every CTA (no predicate). Balanced: with chunks of KT * p vectors instead, a row
    that does not fill them (nv = 6281 16-byte vectors at N = 50257, 8 CTAs of 256
    threads: chunks of 1024) left the last CTAs with a sliver or nothing, and the
    cluster's other CTAs carried the row."""
    cb = -(-nv // c)
    kt = -(-cb // p)
    last = nv - (c - 1) * cb  # the last CTA's vectors (may be <= 0)
    return kt, cb, max(0, min(kt, last // p))


def _chunk_has(base, t, k: int, cb: int, p: int, nv: int):
    """Round k's vector of thread t lies in its CTA's chunk (`_chunks`; base = the vector
    index of its round 0): inside the chunk and the row. Trace-time helper."""
    if cb % p:
        return (k * p + t < cb) & (base + k * p < nv)
    return base + k * p < nv


def _chunk_lacks(base, t, k: int, cb: int, p: int, nv: int):
    """The negation of `_chunk_has`."""
    if cb % p:
        return (k * p + t >= cb) | (base + k * p >= nv)
    return base + k * p >= nv


class _Rows:
    """Trace-time helpers for the row split of the chunked kernels (``rows.split``): the
    vectors of CTA c's chunk, and the leftover elements of a realigned row on the last
    CTA's threads (slot i on thread i % P)."""

    def __init__(self, bv, nv, tail, lc, p, c, bits, realign):
        self.bv, self.nv, self.tail, self.lc, self.p, self.c = bv, nv, tail, lc, p, c
        self.bytes, self.realign = bits // 8, realign

    def head(self, row):
        """(vectors' start, h) of the reference row."""
        if self.realign:
            return realigned(row, self.bytes)
        return row.iterator, Int32(0)

    def operand(self, row, h):
        """(vectors, elements, same): another operand's row through the reference's split
        (`same` is None where the rows are not realigned: always the vectors)."""
        if self.realign:
            return operand(row, h, self.bytes)
        return row.iterator, row.iterator, None

    def _who(self, t, cta):
        # a thread of another CTA owns no slot: an index past the leftovers
        if self.c == 1:
            return t
        return Int32(cutlass.select_(cta == self.c - 1, t, Int32(self.tail)))

    def load_left(self, row, h, dst, t, cta, pad):
        load_left(row, h, dst, self._who(t, cta), pad, self.lc, self.p, self.tail, self.nv * self.bv)

    def store_left(self, src, row, h, t, cta):
        store_left(src, row, h, self._who(t, cta), self.lc, self.p, self.tail, self.nv * self.bv)


class ChunkedRowSoftmax:
    """What both chunked kernels share (module docstring): the row's split into per-CTA
    chunks (`_chunks`) in ``__init__``, a thread's view of its chunk; `SoftmaxChunkedForward`
    and `SoftmaxChunkedBackward` add their device ``kernel`` and host ``__call__``.
    ``same_heads`` as device.py's `RowSoftmax`."""

    def __init__(self, dtype, n: int, vec: int, config: SoftmaxConfig, same_heads: bool, backward: bool) -> None:
        self.dtype = dtype
        self.bits = bits = dtype.width
        config.validate(n, bits, backward)
        self.threads, self.threads_per_row, self.cluster_n = T, P, C = config.threads, config.threads_per_row, config.cluster_n
        self.rows_per_cta = T // P  # R
        BV, NV, TAIL, LC = split(n, vec, bits, P)  # leftovers: the last CTA's threads
        self.vector, self.vectors, self.tail, self.left_slots = BV, NV, TAIL, LC
        self.realign = realign = BV > vec
        self.fallback = realign and not same_heads  # see device.RowSoftmax
        self.rounds, self.chunk_vectors, self.whole_rounds = _chunks(NV, P, C)  # KT, CB, KF
        self.copy_bits = BV * bits
        self.rows = _Rows(BV, NV, TAIL, LC, P, C, bits, realign)

    def in_chunk(self, base, t, k):
        return _chunk_has(base, t, k, self.chunk_vectors, self.threads_per_row, self.vectors)

    def chunk_view(self, ptr, t, cta):
        # (BV, KT) slice of the row's vectors (starting at ptr) owned by thread t of CTA cta
        BV, P, KT, C, CB = self.vector, self.threads_per_row, self.rounds, self.cluster_n, self.chunk_vectors
        full = cute.make_tensor(ptr, cute.make_layout((BV, P, KT, C), stride=(1, BV, BV * P, CB * BV)))
        return full[None, t, None, cta]


class SoftmaxChunkedForward(ChunkedRowSoftmax):
    """Mode "softmax" / "log_softmax" on a long-row path: ``__call__(x, y, stream)``."""

    def __init__(self, mode: str, dtype, n: int, vec: int, config: SoftmaxConfig, same_heads: bool = False) -> None:
        if mode not in ("softmax", "log_softmax"):
            raise ValueError(f"unknown softmax mode {mode!r}")
        self.log = log = mode == "log_softmax"
        super().__init__(dtype, n, vec, config, same_heads, False)
        P, C, bits, BV = self.threads_per_row, self.cluster_n, self.bits, self.vector
        T, KT = self.threads, self.rounds
        self.lanes = min(P, 32)  # G
        self.warps_per_row = max(P // 32, 1)  # W
        self.slots = self.warps_per_row * C  # S
        CV = KT * P  # vectors a CTA's chunk has room for
        if C > 1 and KT < 1:
            raise ValueError(f"cluster_n={C}: n={n} gives a CTA no vector")
        self.staged = staged = config.path in STAGED_PATHS and BV * bits == 128
        self.recompute = recompute = staged and config.path == "smem"
        # log_softmax's output x - lse needs x, not the exponentials: a staged chunk is read
        # back from shared memory for it, so no fp32 copy of the row stays live across the
        # exchange (at 64 elements per thread the held copy cost resident CTAs: bf16 131072 /
        # 262144 at 84.5 / 80.2 % of copy against softmax's 96.6 / 91.3)
        self.reread_out = reread_out = recompute or (staged and log)
        self.chunk_elems = CV * BV  # CHUNK: elements of a CTA's chunk of one row (its room in shared memory)
        self.tx_bytes = self.rows_per_cta * self.slots * 8
        self.lane_reduce = make_lane_reduce(merge_max_sum, True)
        # A 16-bit forward that holds 64 values a thread in fp32 across the exchange (softmax's
        # exponentials; on `mbar` either mode's row; N = 262144-class rows on 16 CTAs): ptxas
        # takes 80 registers on an aligned row but 96-100 for softmax on a realigned one (the
        # leftovers, the head), so 2 CTAs per SM instead of 3. A budget of FWD_MIN_CTAS gives the
        # realigned async build 80 registers and no spill (same_heads builds at 262143; the
        # fallback kernels spill under it and keep their own). log_softmax on a staged path
        # rereads its chunk and holds nothing. Only at 64: a larger share (the kernel API allows
        # 128) needs its registers, and under this budget it spills.
        self.bounds: dict = {}
        if (FWD_MIN_CTAS and bits == 16 and not reread_out and not self.fallback and BV * KT == 64
                and T * FWD_MIN_CTAS * 80 <= 65536):
            self.bounds = {"max_number_threads": [T, 1, 1], "min_blocks_per_mp": FWD_MIN_CTAS,
                           "preferred_smem_carveout": -1}

    @cute.jit
    def fold(self, red_f: cute.Tensor, r, lane_g):
        """Every lane of the row: merge of the S (max, sum) slots of row r."""
        S, G, combine = self.slots, self.lanes, merge_max_sum
        a = Float32(NEG_INF)
        b = Float32(0.0)
        for i in cutlass.range_constexpr((S + G - 1) // G):
            if cutlass.const_expr((i + 1) * G <= S):
                j = lane_g + i * G
                a, b = combine(a, b, red_f[r, j, 0], red_f[r, j, 1])
            else:
                j = cutlass.min(lane_g + i * G, S - 1)
                ok = lane_g + i * G < S
                a, b = combine(a, b, _sel(ok, red_f[r, j, 0], Float32(NEG_INF)), _sel(ok, red_f[r, j, 1], Float32(0.0)))
        return self.lane_reduce(a, b, G)

    def smem_view(self, srow: cute.Tensor, t):
        BV, P, KT = self.vector, self.threads_per_row, self.rounds
        full = cute.make_tensor(srow.iterator, cute.make_layout((BV, P, KT), stride=(1, BV, BV * P)))
        return full[None, t, None]

    @cute.jit
    def write_y(self, gy: cute.Tensor, sxv: cute.Tensor, out: cute.Tensor, base, t, lse, m_row, s_row,
                by_elem: cutlass.Constexpr):
        """The thread's vectors of y: from `out` (held), or computed again from the staged
        chunk `sxv` (reread_out); by_elem: element by element (rows.split.move)."""
        dtype, BV, KT, KF, log = self.dtype, self.vector, self.rounds, self.whole_rounds, self.log
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=self.copy_bits)
        vr2 = cute.make_rmem_tensor(cute.make_layout((BV,)), dtype)
        vo = cute.make_rmem_tensor(cute.make_layout((BV,)), dtype)
        inv = Float32(1.0) / s_row
        for k in cutlass.range_constexpr(KT):
            src = out[None, k]
            if cutlass.const_expr(self.reread_out):
                cute.autovec_copy(sxv[None, k], vr2)
                xk = vr2.load().to(Float32) * LOG2E
                if cutlass.const_expr(log):
                    vo.store(((xk - lse) * LN2).to(dtype))
                else:
                    vo.store((cute.math.exp2(xk - m_row, fastmath=True) * inv).to(dtype))
                src = vo
            if cutlass.const_expr(k < KF):
                move(atom, src, gy[None, k], by_elem, BV)
            else:
                if self.in_chunk(base, t, k):
                    move(atom, src, gy[None, k], by_elem, BV)

    @cute.jit
    def read_chunk(self, smem, x_row: cute.Tensor, h, body, r, t, cta):
        """(base, frag, sxv, xl): the vector index of the thread's round 0, its vectors of
        the chunk, in registers (frag) and, on a staged path, in shared memory (sxv; else
        its view of x), and its leftover elements xl in the log2 domain; rounds past the row
        read -inf."""
        dtype, BV, KT, KF, R = self.dtype, self.vector, self.rounds, self.whole_rounds, self.rows_per_cta
        CB, P, NV, LC, CHUNK = self.chunk_vectors, self.threads_per_row, self.vectors, self.left_slots, self.chunk_elems
        staged, recompute = self.staged, self.recompute
        _in_chunk = self.in_chunk
        gx = self.chunk_view(body, t, cta)
        base = cta * CB + t  # vector index of round 0
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=self.copy_bits)
        frag = cute.make_rmem_tensor(cute.make_layout((BV, KT)), dtype)
        sxv = gx  # replaced below when staged
        if cutlass.const_expr(staged):
            sx = smem.allocate_tensor(dtype, cute.make_layout((R, CHUNK), stride=(CHUNK, 1)), byte_alignment=128)
            sxv = self.smem_view(sx[r, None], t)
            g2s = cute.make_copy_atom(
                cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=128
            )
            for k in cutlass.range_constexpr(KT):
                if cutlass.const_expr(k < KF):
                    cute.copy(g2s, gx[None, k], sxv[None, k])
                else:
                    if _in_chunk(base, t, k):
                        cute.copy(g2s, gx[None, k], sxv[None, k])
            cute.arch.cp_async_commit_group()
        else:
            for k in cutlass.range_constexpr(KT):
                if cutlass.const_expr(k < KF):
                    cute.copy(atom, gx[None, k], frag[None, k])
                else:
                    for v in cutlass.range_constexpr(BV):
                        frag[v, k] = dtype(NEG_INF)
                    if _in_chunk(base, t, k):
                        cute.copy(atom, gx[None, k], frag[None, k])
        # the realigned row's leftover elements, in registers (module comment)
        xl = None
        if cutlass.const_expr(LC > 0):
            lf = cute.make_rmem_tensor(cute.make_layout((LC,)), dtype)
            self.rows.load_left(x_row, h, lf, t, cta, NEG_INF)
            xl = lf.load().to(Float32) * LOG2E
        if cutlass.const_expr(staged):
            cute.arch.cp_async_wait_group(0)
            # the thread's own slots past N read as -inf in every pass below
            for k in cutlass.range_constexpr(KF, KT):
                if _chunk_lacks(base, t, k, CB, P, NV):
                    for v in cutlass.range_constexpr(BV):
                        sxv[v, k] = dtype(NEG_INF)
            if cutlass.const_expr(not recompute):
                for k in cutlass.range_constexpr(KT):
                    cute.autovec_copy(sxv[None, k], frag[None, k])
        return base, frag, sxv, xl

    @cute.jit
    def thread_partial(self, frag: cute.Tensor, sxv: cute.Tensor, xl):
        """(m_t, s_t, shift, xs, e): the thread's (max, sum) in the log2 domain, the shift
        its exponentials were taken at, and (held paths) its values and exponentials."""
        dtype, BV, KT, LC, recompute = self.dtype, self.vector, self.rounds, self.left_slots, self.recompute
        m_t = Float32(NEG_INF)
        s_t = Float32(0.0)
        xs = None
        e = None
        vr = None
        if cutlass.const_expr(recompute):
            vr = cute.make_rmem_tensor(cute.make_layout((BV,)), dtype)
            for k in cutlass.range_constexpr(KT):
                cute.autovec_copy(sxv[None, k], vr)
                m_t = cute.arch.fmax(m_t, (vr.load().to(Float32) * LOG2E).reduce(cute.ReductionOp.MAX, NEG_INF, 0))
        else:
            xs = frag.load().to(Float32) * LOG2E
            m_t = xs.reduce(cute.ReductionOp.MAX, NEG_INF, 0)
        if cutlass.const_expr(LC > 0):
            m_t = cute.arch.fmax(m_t, xl.reduce(cute.ReductionOp.MAX, NEG_INF, 0))
        shift = _sel(m_t == Float32(NEG_INF), Float32(0.0), m_t)
        if cutlass.const_expr(recompute):
            for k in cutlass.range_constexpr(KT):
                cute.autovec_copy(sxv[None, k], vr)
                ek = cute.math.exp2(vr.load().to(Float32) * LOG2E - shift, fastmath=True)
                s_t = s_t + ek.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        else:
            e = cute.math.exp2(xs - shift, fastmath=True)
            s_t = e.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        if cutlass.const_expr(LC > 0):
            s_t = s_t + cute.math.exp2(xl - shift, fastmath=True).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        return m_t, s_t, shift, xs, e

    @cute.jit
    def merge_row(self, m_t, s_t, red, red_f: cute.Tensor, mbar, tidx, r, t, cta):
        """The row's (max, sum) in every thread of it: lanes, then warps / CTAs through the
        (max, sum) slots."""
        C, S, W, G = self.cluster_n, self.slots, self.warps_per_row, self.lanes
        m_row, s_row = self.lane_reduce(m_t, s_t, G)
        if cutlass.const_expr(C > 1):
            lane = tidx % 32
            slot = r * S + cta * W + t // 32
            pair = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
            pair[0] = m_row
            pair[1] = s_row
            bits_ = cute.recast_tensor(pair, Int32)
            cute.arch.cluster_wait()  # every peer's mbarrier initialised and armed
            if lane < C:
                cute.arch.store_async_dsmem(red.iterator + slot, (bits_[0], bits_[1]), mbar, lane)
            cute.arch.mbarrier_wait(mbar, 0)
            m_row, s_row = self.fold(red_f, r, tidx % G)
        elif cutlass.const_expr(S > 1):
            if t % G == 0:
                red_f[r, t // 32, 0] = m_row
                red_f[r, t // 32, 1] = s_row
            cute.arch.sync_threads()
            m_row, s_row = self.fold(red_f, r, tidx % G)
        return m_row, s_row

    @cute.jit
    def write_row(self, y: cute.Tensor, row, m_rows, h, sxv: cute.Tensor, xs, e, xl, m_t, shift, m_row, s_row,
                  base, t, cta):
        """y's vectors as x's where its rows have x's head, else element by element, then the
        leftover elements; rows past M store nothing."""
        dtype, BV, KT, LC, log = self.dtype, self.vector, self.rounds, self.left_slots, self.log
        ok = row < m_rows
        y_row = y[row, None]
        y_vec, y_el, same = self.rows.operand(y_row, h)
        lse = m_row + cute.math.log2(s_row, fastmath=True)
        ms = _sel(m_row == Float32(NEG_INF), Float32(0.0), m_row)
        out = cute.make_rmem_tensor(cute.make_layout((BV, KT)), dtype)
        if cutlass.const_expr(not self.reread_out):
            if cutlass.const_expr(log):
                out.store(((xs - lse) * LN2).to(dtype))
            else:
                scale = _sel(m_t == Float32(NEG_INF), Float32(0.0), cute.math.exp2(shift - ms, fastmath=True))
                out.store((e * (scale / s_row)).to(dtype))
        if ok:
            if cutlass.const_expr(self.fallback):
                if same:
                    self.write_y(self.chunk_view(y_vec, t, cta), sxv, out, base, t, lse, m_row, s_row, False)
                else:
                    self.write_y(self.chunk_view(y_el, t, cta), sxv, out, base, t, lse, m_row, s_row, True)
            else:
                self.write_y(self.chunk_view(y_vec, t, cta), sxv, out, base, t, lse, m_row, s_row, False)
        if cutlass.const_expr(LC > 0):
            out_l = cute.make_rmem_tensor(cute.make_layout((LC,)), dtype)
            if cutlass.const_expr(log):
                out_l.store(((xl - lse) * LN2).to(dtype))
            else:
                out_l.store((cute.math.exp2(xl - ms, fastmath=True) / s_row).to(dtype))
            if ok:
                self.rows.store_left(out_l, y_row, h, t, cta)

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor):
        C, P, R, S = self.cluster_n, self.threads_per_row, self.rows_per_cta, self.slots
        tidx, cta, r, t, _, row_block = row_coords(C, P, R, arrive=False)
        row, m_rows, row_c = clamped_row(row_block * R + r, x)

        smem = cutlass.memory.SmemAllocator()
        red = smem.allocate_tensor(Int64, cute.make_layout((R, S), stride=(S, 1)), byte_alignment=16)
        red_f = cute.make_tensor(cute.recast_ptr(red.iterator, dtype=Float32), cute.make_layout((R, S, 2), stride=(2 * S, 2, 1)))
        mbar = smem.allocate_array(Int64, 1, byte_alignment=8)
        if cutlass.const_expr(C > 1):
            _arm_exchange(mbar, tidx, self.tx_bytes)

        x_row = x[row_c, None]
        body, h = self.rows.head(x_row)
        base, frag, sxv, xl = self.read_chunk(smem, x_row, h, body, r, t, cta)
        m_t, s_t, shift, xs, e = self.thread_partial(frag, sxv, xl)
        m_row, s_row = self.merge_row(m_t, s_t, red, red_f, mbar, tidx, r, t, cta)
        self.write_row(y, row, m_rows, h, sxv, xs, e, xl, m_t, shift, m_row, s_row, base, t, cta)

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, stream):
        C, T = self.cluster_n, self.threads
        grid = (cute.ceil_div(x.shape[0], self.rows_per_cta) * C, 1, 1)
        if cutlass.const_expr(C > 1):
            self.kernel(x, y).launch(grid=grid, block=(T, 1, 1), cluster=(C, 1, 1), stream=stream, **self.bounds)
        else:
            self.kernel(x, y).launch(grid=grid, block=(T, 1, 1), stream=stream, **self.bounds)


def make_softmax_chunked(mode: str, dtype, n: int, vec: int, config: SoftmaxConfig, same_heads: bool = False):
    """@cute.jit f(x, y, stream) for mode "softmax" / "log_softmax" and a long-row path
    (`SoftmaxChunkedForward`); for "softmax_bwd" / "log_softmax_bwd" (path "mbar" only)
    f(dy, y, dx, stream), see ``make_softmax_chunked_bwd``."""
    if mode in ("softmax_bwd", "log_softmax_bwd"):
        return make_softmax_chunked_bwd(mode, dtype, n, vec, config, same_heads)
    forward = SoftmaxChunkedForward(mode, dtype, n, vec, config, same_heads)

    @cute.jit
    def softmax_fwd_v2(x: cute.Tensor, y: cute.Tensor, stream):
        forward(x, y, stream)

    return softmax_fwd_v2


class SoftmaxChunkedBackward(ChunkedRowSoftmax):
    """Mode "softmax_bwd" / "log_softmax_bwd", path "mbar" (a cluster of C >= 2 CTAs,
    contiguous chunks, st.async + mbarrier exchange of one fp32 sum per warp and row):
    ``__call__(dy, y, dx, stream)``, arguments as device.py's backward."""

    def __init__(self, mode: str, dtype, n: int, vec: int, config: SoftmaxConfig, same_heads: bool = False) -> None:
        if mode not in ("softmax_bwd", "log_softmax_bwd"):
            raise ValueError(f"make_softmax_chunked_bwd: mode must be softmax_bwd or log_softmax_bwd, got {mode!r}")
        if config.path != "mbar":
            raise ValueError(f"path={config.path!r} is forward-only; the backward has paths 'regs' and 'mbar'")
        check_operands(dtype, n, vec)
        self.log = log = mode == "log_softmax_bwd"
        super().__init__(dtype, n, vec, config, same_heads, True)
        T, P, C, KT, BV = self.threads, self.threads_per_row, self.cluster_n, self.rounds, self.vector
        self.lanes = 32  # G; validate: P is a multiple of 32 with a cluster
        self.warps_per_row = P // 32  # W
        self.slots = self.warps_per_row * C  # S
        if KT < 1:
            raise ValueError(f"cluster_n={C}: n={n} gives a CTA no vector")
        self.tx_bytes = self.rows_per_cta * self.slots * 4  # one fp32 per warp of every CTA of the cluster, per row
        # bf16: the partial (sum(dy y), or sum(dy) for log_softmax) widens bf16 pairs with
        # integer shifts, not the conversion dx uses after the exchange, so the compiler
        # cannot merge the two and keep fp32 copies of both inputs live across the exchange:
        # the inputs stay packed, two per register (ptxas, softmax_bwd: 78 -> 63 registers at
        # 32 elements per input, 142 -> 127 at 64). fp16 has no such cheap exact widening
        # (subnormals) and keeps the plain conversion (78 / 142).
        self.packed = dtype is cutlass.BFloat16 and (BV * KT) % 2 == 0
        self.packed_words = BV * KT // 2  # NW
        # fp16 softmax_bwd at 64 elements per input (N = 262144): ptxas takes 142 registers, one
        # 256-thread CTA per SM (75 % of copy); a budget of two CTAs per SM (128 registers) keeps
        # two rows in flight per SM, as bf16 (127 registers, 99 %) and log_softmax_bwd (127) do.
        # Only there: elsewhere ptxas would fill a budget it does not need.
        self.bounds: dict = {}
        if dtype is cutlass.Float16 and not log and BV * KT > 32 and T * 2 * 128 <= 65536:
            self.bounds = {"max_number_threads": [T, 1, 1], "min_blocks_per_mp": 2, "preferred_smem_carveout": -1}

    @cute.jit
    def dot_bf16(self, fa: cute.Tensor, fb: cute.Tensor):
        BV, KT = self.vector, self.rounds
        wa = cute.recast_tensor(cute.make_tensor(fa.iterator, cute.make_layout((BV * KT,))), Uint32)
        wb = cute.recast_tensor(cute.make_tensor(fb.iterator, cute.make_layout((BV * KT,))), Uint32)
        tmp = cute.make_rmem_tensor(cute.make_layout((4,)), Uint32)
        tf = cute.recast_tensor(tmp, Float32)
        acc0 = Float32(0.0)
        acc1 = Float32(0.0)
        for i in cutlass.range_constexpr(self.packed_words):
            a = wa[i]
            b = wb[i]
            tmp[0] = a << 16
            tmp[1] = a & Uint32(0xFFFF0000)
            v = tf[0] + tf[1]  # log_softmax_bwd: sum(dy)
            if cutlass.const_expr(not self.log):  # softmax_bwd: sum(dy y)
                tmp[2] = b << 16
                tmp[3] = b & Uint32(0xFFFF0000)
                v = tf[0] * tf[2] + tf[1] * tf[3]
            if cutlass.const_expr(i % 2 == 0):
                acc0 = acc0 + v
            else:
                acc1 = acc1 + v
        return acc0 + acc1

    @cute.jit
    def bfly(self, a):
        G = self.lanes
        for step in cutlass.range_constexpr(int(math.log2(G))):
            a = a + cute.arch.shuffle_sync_bfly(a, offset=G >> (step + 1))
        return a

    @cute.jit
    def move_rounds(self, src: cute.Tensor, dst: cute.Tensor, base, t, by_elem: cutlass.Constexpr,
                    load: cutlass.Constexpr):
        """The thread's rounds of its chunk from src to dst: loaded into a register fragment
        (``load``: rounds the chunk lacks are zeroed) or stored from one; whole rounds below
        KF, the others where the chunk has them."""
        dtype, BV, KT, KF = self.dtype, self.vector, self.rounds, self.whole_rounds
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=self.copy_bits)
        for k in cutlass.range_constexpr(KT):
            if cutlass.const_expr(k < KF):
                move(atom, src[None, k], dst[None, k], by_elem, BV)
            else:
                if cutlass.const_expr(load):
                    for v in cutlass.range_constexpr(BV):
                        dst[v, k] = dtype(0.0)
                if self.in_chunk(base, t, k):
                    move(atom, src[None, k], dst[None, k], by_elem, BV)

    @cute.jit
    def read_rows(self, dy_row: cute.Tensor, y_row: cute.Tensor, base, t, cta):
        """(h, f_dy, f_y, dyl, yl): the thread's share of dy and y (the reference row of the
        split), vectors as the input dtype and (realigned rows) leftover elements in fp32;
        dy goes through y's split as vectors where its rows have y's head, else element by
        element."""
        dtype, BV, KT, LC = self.dtype, self.vector, self.rounds, self.left_slots
        y_vec, h = self.rows.head(y_row)
        dy_vec, dy_el, dy_same = self.rows.operand(dy_row, h)
        f_dy = cute.make_rmem_tensor(cute.make_layout((BV, KT)), dtype)
        f_y = cute.make_rmem_tensor(cute.make_layout((BV, KT)), dtype)
        if cutlass.const_expr(self.fallback):
            if dy_same:
                self.move_rounds(self.chunk_view(dy_vec, t, cta), f_dy, base, t, False, True)
            else:
                self.move_rounds(self.chunk_view(dy_el, t, cta), f_dy, base, t, True, True)
        else:
            self.move_rounds(self.chunk_view(dy_vec, t, cta), f_dy, base, t, False, True)
        self.move_rounds(self.chunk_view(y_vec, t, cta), f_y, base, t, False, True)
        dyl = None
        yl = None
        if cutlass.const_expr(LC > 0):
            l_dy = cute.make_rmem_tensor(cute.make_layout((LC,)), dtype)
            l_y = cute.make_rmem_tensor(cute.make_layout((LC,)), dtype)
            self.rows.load_left(dy_row, h, l_dy, t, cta, 0.0)
            self.rows.load_left(y_row, h, l_y, t, cta, 0.0)
            dyl = l_dy.load().to(Float32)
            yl = l_y.load().to(Float32)
        return h, f_dy, f_y, dyl, yl

    @cute.jit
    def thread_partial(self, f_dy: cute.Tensor, f_y: cute.Tensor, dyl, yl):
        """The thread's share of the row sum (softmax: sum(dy y), log_softmax: sum(dy)),
        summed over its warp's lanes."""
        log, LC = self.log, self.left_slots
        part = Float32(0.0)
        if cutlass.const_expr(self.packed):
            part = self.dot_bf16(f_dy, f_y)
        elif cutlass.const_expr(log):
            part = f_dy.load().to(Float32).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        else:
            part = (f_dy.load().to(Float32) * f_y.load().to(Float32)).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        if cutlass.const_expr(LC > 0):
            if cutlass.const_expr(log):
                part = part + dyl.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            else:
                part = part + (dyl * yl).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        return self.bfly(part)

    @cute.jit
    def exchange(self, part, red: cute.Tensor, mbar, tidx, r, t, cta):
        """The row sum in every thread of it: each warp's partial to every CTA of the
        cluster (lane l sends to CTA l), then the S slots of row r added up."""
        C, S, W, G = self.cluster_n, self.slots, self.warps_per_row, self.lanes
        one = cute.make_rmem_tensor(cute.make_layout((1,)), Float32)
        one[0] = part
        word = cute.recast_tensor(one, Int32)
        lane = tidx % 32
        cute.arch.cluster_wait()  # every peer's mbarrier initialised and armed
        if lane < C:  # lane l sends the warp's partial to CTA l
            cute.arch.store_async_dsmem(red.iterator + (r * S + cta * W + t // 32), word[0], mbar, lane)
        cute.arch.mbarrier_wait(mbar, 0)
        tot = Float32(0.0)
        for i in cutlass.range_constexpr((S + G - 1) // G):
            if cutlass.const_expr((i + 1) * G <= S):
                tot = tot + red[r, lane + i * G]
            else:
                j = cutlass.min(lane + i * G, S - 1)
                tot = tot + _sel(lane + i * G < S, red[r, j], Float32(0.0))
        return self.bfly(tot)

    @cute.jit
    def write_rows(self, dx: cute.Tensor, row, m_rows, h, f_dy: cute.Tensor, f_y: cute.Tensor, dyl, yl, tot, base,
                   t, cta):
        """dx from the held inputs, converted again; rows past M store nothing."""
        dtype, BV, KT, LC, log = self.dtype, self.vector, self.rounds, self.left_slots, self.log
        out = cute.make_rmem_tensor(cute.make_layout((BV, KT)), dtype)
        dyv = f_dy.load().to(Float32)
        yv = f_y.load().to(Float32)
        if cutlass.const_expr(log):
            out.store((dyv - cute.math.exp2(yv * LOG2E, fastmath=True) * tot).to(dtype))
        else:
            out.store((yv * (dyv - tot)).to(dtype))
        if row < m_rows:
            dx_row = dx[row, None]
            dx_vec, dx_el, dx_same = self.rows.operand(dx_row, h)
            if cutlass.const_expr(self.fallback):
                if dx_same:
                    self.move_rounds(out, self.chunk_view(dx_vec, t, cta), base, t, False, False)
                else:
                    self.move_rounds(out, self.chunk_view(dx_el, t, cta), base, t, True, False)
            else:
                self.move_rounds(out, self.chunk_view(dx_vec, t, cta), base, t, False, False)
            if cutlass.const_expr(LC > 0):
                out_l = cute.make_rmem_tensor(cute.make_layout((LC,)), dtype)
                if cutlass.const_expr(log):
                    out_l.store((dyl - cute.math.exp2(yl * LOG2E, fastmath=True) * tot).to(dtype))
                else:
                    out_l.store((yl * (dyl - tot)).to(dtype))
                self.rows.store_left(out_l, dx_row, h, t, cta)

    @cute.kernel
    def kernel(self, dy: cute.Tensor, y: cute.Tensor, dx: cute.Tensor):
        C, P, R, S, CB = self.cluster_n, self.threads_per_row, self.rows_per_cta, self.slots, self.chunk_vectors
        tidx, cta, r, t, _, row_block = row_coords(C, P, R, arrive=False)
        row, m_rows, row_c = clamped_row(row_block * R + r, dy)

        smem = cutlass.memory.SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout((R, S), stride=(S, 1)), byte_alignment=16)
        mbar = smem.allocate_array(Int64, 1, byte_alignment=8)
        _arm_exchange(mbar, tidx, self.tx_bytes)

        base = cta * CB + t  # vector index of round 0
        # y (the forward's output) is the reference row of the split
        y_row = y[row_c, None]
        dy_row = dy[row_c, None]
        h, f_dy, f_y, dyl, yl = self.read_rows(dy_row, y_row, base, t, cta)
        part = self.thread_partial(f_dy, f_y, dyl, yl)
        tot = self.exchange(part, red, mbar, tidx, r, t, cta)
        self.write_rows(dx, row, m_rows, h, f_dy, f_y, dyl, yl, tot, base, t, cta)

    @cute.jit
    def __call__(self, dy: cute.Tensor, y: cute.Tensor, dx: cute.Tensor, stream):
        C, T = self.cluster_n, self.threads
        grid = (cute.ceil_div(dy.shape[0], self.rows_per_cta) * C, 1, 1)
        self.kernel(dy, y, dx).launch(grid=grid, block=(T, 1, 1), cluster=(C, 1, 1), stream=stream, **self.bounds)


def make_softmax_chunked_bwd(mode: str, dtype, n: int, vec: int, config: SoftmaxConfig, same_heads: bool = False):
    """@cute.jit f(dy, y, dx, stream) for mode "softmax_bwd" / "log_softmax_bwd", path
    "mbar" (`SoftmaxChunkedBackward`)."""
    backward = SoftmaxChunkedBackward(mode, dtype, n, vec, config, same_heads)

    @cute.jit
    def softmax_bwd_mbar(dy: cute.Tensor, y: cute.Tensor, dx: cute.Tensor, stream):
        backward(dy, y, dx, stream)

    return softmax_bwd_mbar
