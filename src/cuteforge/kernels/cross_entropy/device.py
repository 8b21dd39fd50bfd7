"""Cross-entropy over the rows of logits (M, N), forward and backward, in one pass each.

Forward: ``lse[i] = logsumexp(x[i, :])`` and ``loss[i] = lse[i] - x[i, t_i]`` (fp32), read
in one streaming pass; the softmax is never written. Backward: ``dx[i, j] = (exp(x[i, j] -
lse[i]) - [j == t_i]) * g[i]``, reading x once and writing dx once, in x's dtype.

Work decomposition: the row kernel's (``reduce/row.py``): P = ``threads_per_row`` threads
share a row, each owning the 16-byte vectors j = t, t + P, ... (compile-time N, so the
full rounds, the predicated partial round and the scalar tail are resolved while
tracing), ``unroll`` vectors in flight per thread. No cluster: cross-entropy rows come in
thousands (one per token), which fills the GPU. The forward moves 16-byte vectors
through a per-thread cp.async ring in shared memory: the next ``unroll`` vectors are
copied while the current ones are folded; the backward loads ``unroll`` vectors into
registers before any arithmetic.

Online logsumexp: each thread keeps a running (max m, sum s of exp(x - m)). A chunk of
values (FOLD_VALUES through the ring; ``unroll * vec`` in the register loop) is folded
with one rescale: m' = max(m, max(chunk)), s' = s * 2^((m - m') log2 e) + sum 2^((x - m')
log2 e), i.e. one ex2 per element and one per chunk. Lanes, then warps (shared memory),
merge their (m, s) pairs the same way. A max of -inf (all
inputs -inf so far) is replaced by 0 in the exponents so that no inf - inf appears; NaN
inputs propagate to the row's lse and loss.

Targets: ``t == ignore_index`` gives loss 0 (its lse is still written) and a zero gradient
row. A target outside [0, N) gives loss NaN and a NaN gradient row: nothing is clamped or
silently read out of bounds; the ops layer can also check targets on the host.

Configs: :func:`ce_config`: one row per CTA (unless a row takes under a warp), a few
vectors per thread, at most 512 (forward) / 1024 (backward) threads per row.

Reduced forward (`CrossEntropyForwardReduce`): the same row work, and the mean or sum of
the losses in the same launch, deterministically (no float atomics): each CTA writes one
partial (fp32 sum, int32 count) to a workspace and takes a ticket with one acq_rel atomic
add; the last CTA of each group of :func:`reduce_group` CTAs adds the group's partials
in a fixed order, and with several groups the last group adds the group partials the
same way, writes the scalar, and every last CTA resets the counter it drew from. The
rounding order depends on M only (through the grid), so an input gives the same bits on
every run.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync

from ..reduce.config import RowReduceConfig
from ..rows.split import realigned, row_vectors
from .config import (  # noqa: F401  (also this module's names: the op and older code import them from here)
    GROUP_MAX,
    REDUCE_CHUNK,
    WORK_CNT1,
    WORK_GCNT,
    WORK_GSUM,
    WORK_PART,
    WORK_TOP,
    WORK_ZERO,
    ce_config,
    reduce_fits,
    reduce_group,
    work_words,
)

__all__ = [
    "CrossEntropyBackward",
    "CrossEntropyForward",
    "CrossEntropyForwardReduce",
    "CrossEntropyRows",
    "CrossEntropyTiling",
    "ce_config",
    "make_ce_bwd",
    "make_ce_fwd",
    "make_ce_fwd_reduce",
    "reduce_fits",
    "work_words",
]

_LOG2E = math.log2(math.e)
# The forward's row loop: 16-byte vectors go through a per-thread cp.async ring in
# shared memory (two buffers of `unroll` vectors; one when the row takes one chunk), the
# next chunk copied while the current one is folded FOLD_VALUES values at a time. Rows of
# narrower vectors, and rings over RING_MAX_BYTES a CTA, keep the register loop (load `unroll`
# vectors into registers, then fold them as one chunk); PIPELINE = False builds the register loop
# everywhere (the CPU register test compares the two).
PIPELINE = True
FOLD_VALUES = 16
RING_MAX_BYTES = 96 * 1024
_FLOATS = (Float32, cutlass.BFloat16, cutlass.Float16)


def _plan(n: int, vec: int, config: RowReduceConfig, dtype_bits: int = 0) -> dict:
    """The row's split over P threads: NV vectors of BV elements and TAIL scalars. With
    ``dtype_bits`` rows that do not start on 16 bytes are realigned (`row_vectors`: BV >
    vec, and the scalars are the head and the tail); without, BV = vec."""
    if config.cluster_n != 1:
        raise ValueError("cross-entropy kernels do not split rows over clusters (cluster_n must be 1)")
    P = config.threads_per_row
    BV, NV = row_vectors(n, vec, dtype_bits) if dtype_bits else (vec, n // vec)
    K = NV // P
    U = max(1, min(config.unroll, K)) if K > 0 else 1
    return {
        "T": config.threads,
        "P": P,
        "R": config.threads // P,
        "G": min(P, 32),
        "W": max(P // 32, 1),
        "BV": BV,
        "NV": NV,
        "TAIL": n - NV * BV,
        "K": K,
        "REM": NV - K * P,
        "U": U,
        "N_OUTER": K // U,
        "K_LEFT": K - (K // U) * U,
    }


def _check(in_dtype, n: int, vec: int, config: RowReduceConfig) -> None:
    if in_dtype not in _FLOATS:
        raise ValueError(f"unsupported logits dtype {in_dtype}")
    if vec not in (1, 2, 4, 8) or vec * in_dtype.width > 128:
        raise ValueError(f"vec={vec} invalid for {in_dtype.width}-bit logits")
    config.validate(n, in_dtype.width)


def _tree(vals: list, fn):
    while len(vals) > 1:
        nxt = [fn(vals[k], vals[k + 1]) for k in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0]


class CrossEntropyTiling:
    """A row's split over its P threads (`_plan`), what every cross-entropy kernel starts
    from. Rows that do not start on 16 bytes (vec below 16 bytes: N = 50257, or a view) are
    read from each row's first 16-byte boundary in 16-byte vectors through a pointer
    realigned at run time, the h < BV elements before it and the tail after the body as
    scalars (`row_vectors`, as reduce/row.py): the forward's ring and both directions' wide
    loads then serve them too."""

    def __init__(self, in_dtype, n: int, vec: int, config: RowReduceConfig, ignore_index: int) -> None:
        _check(in_dtype, n, vec, config)
        p = _plan(n, vec, config, in_dtype.width)
        self.in_dtype, self.n, self.ignore_index = in_dtype, n, ignore_index
        self.vector = BV = p["BV"]  # elements of one vector of the loop
        self.realign = BV > vec
        self.threads = p["T"]
        self.threads_per_row, self.rows_per_cta, self.lanes, self.warps_per_row = p["P"], p["R"], p["G"], p["W"]
        self.vectors, self.tail, self.rounds, self.rem = p["NV"], p["TAIL"], p["K"], p["REM"]
        self.unroll, self.outer, self.left = p["U"], p["N_OUTER"], p["K_LEFT"]
        self.copy_bits = BV * in_dtype.width


class CrossEntropyRows(CrossEntropyTiling):
    """The forward's per-row work, shared by the per-row (`CrossEntropyForward`) and the
    reduced (`CrossEntropyForwardReduce`) kernels, both of which inline it: ``block_row``
    places a thread (its row slot r of the CTA's R, its thread t in the row) and gives
    ``row_stats`` of its row, which reads the row with the P threads of row slot r and
    returns ``(m, s, xt, tgt, in_range)``: the row's max and sum of 2^((x - m) log2 e)
    (valid in every thread of the row after the merges), the target logit, the target and
    whether it is in [0, n); ``row_loss`` gives (lse, loss) from those."""

    def __init__(self, in_dtype, n: int, vec: int, config: RowReduceConfig, ignore_index: int) -> None:
        super().__init__(in_dtype, n, vec, config, ignore_index)
        BV = self.vector
        self.fold_vectors = max(1, FOLD_VALUES // BV)  # FV: vectors folded at once from the cp.async ring
        self.ring_buffers = NB = 2 if self.outer > 1 else 1  # NB: ring buffers of U vectors a thread
        self.ring = bool(PIPELINE and self.outer > 0 and BV * in_dtype.width == 128
                         and NB * self.unroll * 16 * config.threads <= RING_MAX_BYTES)

    @staticmethod
    def fmax(a, b):
        return cute.arch.fmax(a, b, nan=True)

    # Plain Python helpers: traced inline, so they may take lists of DSL values.
    def fold(self, m, s, vals):
        """Fold a chunk of values (a Python list of Float32) into the running (m, s)."""
        L = _LOG2E
        m_new = self.fmax(m, _tree(list(vals), self.fmax))
        m_use = Float32(cutlass.select_(m_new == -math.inf, Float32(0.0), m_new))
        ml = m_use * Float32(L)
        parts = [cute.math.exp2(v * Float32(L) - ml, fastmath=True) for v in vals]
        csum = _tree(parts, lambda a, b: a + b)
        s = s * cute.math.exp2(m * Float32(L) - ml, fastmath=True) + csum
        return m_new, s

    def fold_slots(self, m, s, frag, lo, hi):
        """Fold the fragment's vectors [lo, hi)."""
        return self.fold(m, s, [frag[v, u].to(Float32) for u in range(lo, hi) for v in range(self.vector)])

    def merge(self, m, s, om, os):
        L = _LOG2E
        m_new = self.fmax(m, om)
        m_use = Float32(cutlass.select_(m_new == -math.inf, Float32(0.0), m_new))
        ml = m_use * Float32(L)
        s_new = s * cute.math.exp2(m * Float32(L) - ml, fastmath=True) + os * cute.math.exp2(
            om * Float32(L) - ml, fastmath=True
        )
        return m_new, s_new

    def group(self, m, s, group):
        for step in range(int(math.log2(group))):
            off = group >> (step + 1)
            om = cute.arch.shuffle_sync_bfly(m, offset=off)
            os = cute.arch.shuffle_sync_bfly(s, offset=off)
            m, s = self.merge(m, s, om, os)
        return m, s

    @cute.jit
    def fold_row(self, g_row: cute.Tensor, r, t):
        """(m, s) of thread t's elements of the row: the realigned head, the vectors, the
        tail."""
        in_dtype, realign, T = self.in_dtype, self.realign, self.threads
        BV, P, NV, TAIL = self.vector, self.threads_per_row, self.vectors, self.tail
        K, REM, U, N_OUTER, K_LEFT = self.rounds, self.rem, self.unroll, self.outer, self.left
        FV, NB, ring = self.fold_vectors, self.ring_buffers, self.ring
        _fold, _fold_slots = self.fold, self.fold_slots
        m = Float32(-math.inf)
        s = Float32(0.0)
        body = g_row.iterator  # where the vectors start
        h = Int32(0)  # elements before it
        if cutlass.const_expr(realign):
            body, h = realigned(g_row, in_dtype.width // 8)
            for c in cutlass.range_constexpr((BV - 1 + P - 1) // P):
                i = t + c * P
                if i < h:
                    m, s = _fold(m, s, [g_row[i].to(Float32)])
        if cutlass.const_expr(K + (1 if REM else 0) > 0):
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), in_dtype, num_bits_per_copy=self.copy_bits)
            KT = K + (1 if REM else 0)
            g_thr = cute.make_tensor(body, cute.make_layout((BV, P, KT), stride=(1, BV, BV * P)))[
                None, t, None
            ]
            frag = cute.make_rmem_tensor(cute.make_layout((BV, U)), in_dtype)
            if cutlass.const_expr(N_OUTER > 0 and not ring):
                for o in cutlass.range(N_OUTER, unroll=1):
                    for u in cutlass.range_constexpr(U):
                        cute.copy(atom, g_thr[None, o * U + u], frag[None, u])
                    m, s = _fold_slots(m, s, frag, 0, U)
            if cutlass.const_expr(N_OUTER > 0 and ring):
                # cp.async ring: chunk o + 1's U vectors are copied into shared memory
                # while chunk o is folded from there FV vectors at a time, so U vectors stay
                # in flight while the thread computes and no register waits on a load
                # (plain loads: ptxas sinks them to their use, or, folded as one chunk, the
                # chunk's fp32 copies take 120-154 registers at 8-16 vectors of bf16). Each
                # thread reads back only its own slots, so no barrier; a buffer is refilled
                # one iteration after the thread's own reads of it were issued.
                smem = cutlass.memory.SmemAllocator()
                buf = smem.allocate_tensor(
                    in_dtype, cute.make_layout((BV, T, U, NB), stride=(1, BV, BV * T, BV * T * U)), byte_alignment=128
                )
                mine = buf[None, r * P + t, None, None]
                cp = cute.make_copy_atom(
                    cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), in_dtype, num_bits_per_copy=128
                )
                for u in cutlass.range_constexpr(U):
                    cute.copy(cp, g_thr[None, u], mine[None, u, 0])
                cute.arch.cp_async_commit_group()
                for o in cutlass.range(N_OUTER, unroll=1):
                    if cutlass.const_expr(NB > 1):
                        if o + 1 < N_OUTER:
                            for u in cutlass.range_constexpr(U):
                                cute.copy(cp, g_thr[None, (o + 1) * U + u], mine[None, u, (o + 1) % NB])
                        cute.arch.cp_async_commit_group()  # possibly empty: wait_group(1) stays uniform
                        cute.arch.cp_async_wait_group(1)
                    else:
                        cute.arch.cp_async_wait_group(0)
                    for j in cutlass.range_constexpr(0, U, FV):
                        for u in cutlass.range_constexpr(j, min(j + FV, U)):
                            cute.autovec_copy(mine[None, u, o % NB], frag[None, u])
                        m, s = _fold_slots(m, s, frag, j, min(j + FV, U))
            if cutlass.const_expr(K_LEFT > 0):
                for u in cutlass.range_constexpr(K_LEFT):
                    cute.copy(atom, g_thr[None, N_OUTER * U + u], frag[None, u])
                m, s = _fold_slots(m, s, frag, 0, K_LEFT)
            if cutlass.const_expr(REM > 0):
                if t < REM:
                    cute.copy(atom, g_thr[None, K], frag[None, 0])
                    m, s = _fold_slots(m, s, frag, 0, 1)
        if cutlass.const_expr(TAIL > 0):
            # TAIL < vec scalars (realigned: head + tail, the head taken above); rows of
            # fewer threads (P = 1 or 2 at tiny N) take several each
            for c in cutlass.range_constexpr((TAIL + P - 1) // P):
                i = t + c * P
                if (i >= h) & (i < TAIL):
                    m, s = _fold(m, s, [g_row[NV * BV + i].to(Float32)])
        return m, s

    @cute.jit
    def merge_row(self, m, s, r, t):
        """The row's (m, s) in every thread of it: its lanes', then its warps' through
        shared memory."""
        R, W = self.rows_per_cta, self.warps_per_row
        m, s = self.group(m, s, self.lanes)
        if cutlass.const_expr(W > 1):
            smem = cutlass.memory.SmemAllocator()
            s_m = smem.allocate_tensor(Float32, cute.make_layout((R, W), stride=(W, 1)), byte_alignment=16)
            s_s = smem.allocate_tensor(Float32, cute.make_layout((R, W), stride=(W, 1)), byte_alignment=16)
            if t % 32 == 0:
                s_m[r, t // 32] = m
                s_s[r, t // 32] = s
            cute.arch.sync_threads()
            lane = cutlass.min(t % 32, W - 1)
            ok = t % 32 < W
            m = Float32(cutlass.select_(ok, s_m[r, lane], Float32(-math.inf)))
            s = Float32(cutlass.select_(ok, s_s[r, lane], Float32(0.0)))
            m, s = self.group(m, s, min(W, 32))
        return m, s

    @cute.jit
    def row_stats(self, x: cute.Tensor, target: cute.Tensor, row_c, r, t):
        """(m, s, xt, tgt, in_range) of row ``row_c`` (class docstring)."""
        n = self.n
        g_row = x[row_c, None]
        # issued first, needed last: its latency hides behind the row's loads
        tgt = target[row_c]
        m, s = self.fold_row(g_row, r, t)
        # the target logit (a scalar load, usually an L2 hit by now) overlaps the merges below
        in_range = (tgt >= Int64(0)) & (tgt < Int64(n))
        tc = Int32(cutlass.min(cutlass.max(tgt, Int64(0)), Int64(n - 1)))
        xt = g_row[tc].to(Float32)
        m, s = self.merge_row(m, s, r, t)
        return m, s, xt, tgt, in_range

    def row_loss(self, m, s, xt, tgt, in_range):
        """(lse, loss) of a row from row_stats: loss 0 on ignore_index, NaN when the
        target is out of range."""
        log_s = cute.math.log(s)
        lse_v = m + log_s
        # log(s) + (m - x_t): exact when x_t is the max, unlike (m + log s) - x_t
        lv = Float32(cutlass.select_(in_range, log_s + (m - xt), Float32(math.nan)))
        return lse_v, Float32(cutlass.select_(tgt == Int64(self.ignore_index), Float32(0.0), lv))

    def block_row(self, x: cute.Tensor, target: cute.Tensor, tidx, bidx):
        """(t, row, m_rows, stats) of thread tidx of CTA bidx: its thread in its row, its
        row, the row count, and ``row_stats`` of the row (a row past the end, in the last
        CTA, reads row m_rows - 1 and must store nothing)."""
        P, R = self.threads_per_row, self.rows_per_cta
        r = tidx // P
        t = tidx % P
        m_rows = x.shape[0]
        row = bidx * R + r
        row_c = cutlass.min(row, m_rows - 1)
        return t, row, m_rows, self.row_stats(x, target, row_c, r, t)

    def grid(self, x: cute.Tensor):
        return (cute.ceil_div(x.shape[0], self.rows_per_cta), 1, 1)


class CrossEntropyForward(CrossEntropyRows):
    """lse and loss of every row: ``__call__(logits (M, n), target (M,) i64, loss (M,) f32,
    lse (M,) f32, stream)``."""

    @cute.kernel
    def kernel(self, x: cute.Tensor, target: cute.Tensor, loss: cute.Tensor, lse: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        t, row, m_rows, stats = self.block_row(x, target, tidx, bidx)
        if (t == 0) & (row < m_rows):
            lse_v, loss_v = self.row_loss(*stats)
            loss[row] = loss_v
            lse[row] = lse_v

    @cute.jit
    def __call__(self, x: cute.Tensor, target: cute.Tensor, loss: cute.Tensor, lse: cute.Tensor, stream):
        self.kernel(x, target, loss, lse).launch(grid=self.grid(x), block=(self.threads, 1, 1), stream=stream)


def make_ce_fwd(in_dtype, n: int, vec: int, config: RowReduceConfig, ignore_index: int):
    """@cute.jit f(logits (M, n), target (M,) i64, loss (M,) f32, lse (M,) f32, stream)
    (`CrossEntropyForward`)."""
    forward = CrossEntropyForward(in_dtype, n, vec, config, ignore_index)

    @cute.jit
    def ce_fwd(x: cute.Tensor, target: cute.Tensor, loss: cute.Tensor, lse: cute.Tensor, stream):
        forward(x, target, loss, lse, stream)

    return ce_fwd


# --- mean / sum in the forward's launch --------------------------------------------------

# The workspace's layout (the WORK_ words, `reduce_group`, `work_words`) is config.py's:
# the op sizes and zeroes the workspace by it without importing this module.


class CrossEntropyForwardReduce(CrossEntropyRows):
    """The sum of the row losses (``mean``: divided by the number of rows whose target is
    not ``ignore_index``; 0 / 0 = NaN when all are ignored), rounded once from fp32, in one
    launch: ``__call__(logits (M, n), target (M,) i64, out (1,) of ``out_dtype``, lse (L,) f32,
    work (>= work_words(G),) i32, stream)``, 1 <= M and G = ceil(M / rows per CTA) within
    reduce_fits. With ``with_lse`` (L = M + 1) also lse[i] per row and lse[M] = that count
    (for the backward); else lse is untouched. Words [0, WORK_ZERO) of ``work`` must be 0 at
    the start; the launch leaves them 0.

    Each CTA does the per-row forward's work on one row block (the same code, so the same
    registers and occupancy), sums its rows' losses and counts over its threads in a fixed
    order, and writes them to ``work``. Then two levels of ``last one adds up``: thread 0
    takes a ticket on its group's counter (atom.add.acq_rel.gpu, after its partial's
    stores); the CTA that draws the group's last ticket reads the group's partials
    (ld.relaxed.gpu) and adds them in a fixed order. With one group it writes out[0];
    with several it writes the group's partial and takes a ticket on the top counter, and
    the last group does the same over the group partials. Each last CTA resets the counter
    it drew from. A grid of one CTA writes out[0] directly. The rounding order depends
    only on M, so an input gives the same bits on every run."""

    def __init__(self, in_dtype, n: int, vec: int, config: RowReduceConfig, ignore_index: int, mean: bool,
                 with_lse: bool, out_dtype=None) -> None:
        super().__init__(in_dtype, n, vec, config, ignore_index)
        T = self.threads
        if T % 32:
            raise ValueError(f"threads={T} must be a multiple of 32")
        if out_dtype is not None and out_dtype not in _FLOATS:
            raise ValueError(f"unsupported out dtype {out_dtype}")
        self.mean, self.with_lse = mean, with_lse
        self.out_dtype = in_dtype if out_dtype is None else out_dtype
        self.group_ctas = S = reduce_group(T)  # S: CTAs per group
        self.chunks = S // T // REDUCE_CHUNK  # NCH: chunks of REDUCE_CHUNK partials per thread
        self.warps = T // 32  # NW

    @cute.jit
    def cta_sum(self, v, c, s_v, s_c, tidx):
        """(sum of v, sum of c) over the CTA in a fixed order; valid in thread 0."""
        NW = self.warps
        for k in cutlass.range_constexpr(5):
            v = v + cute.arch.shuffle_sync_bfly(v, offset=16 >> k)
            c = c + cute.arch.shuffle_sync_bfly(c, offset=16 >> k)
        if cutlass.const_expr(NW > 1):
            # s_v, s_c reuse: warp 0's reads of an earlier call precede the barrier that
            # publishes the ticket (s_last) before any later call
            warp = tidx // 32
            lane = tidx % 32
            if lane == 0:
                s_v[warp] = v
                s_c[warp] = c
            cute.arch.sync_threads()
            if warp == 0:
                ok = lane < NW
                li = cutlass.min(lane, NW - 1)
                v = Float32(cutlass.select_(ok, s_v[li], Float32(0.0)))
                c = Int32(cutlass.select_(ok, s_c[li], Int32(0)))
                for k in cutlass.range_constexpr(5):
                    v = v + cute.arch.shuffle_sync_bfly(v, offset=16 >> k)
                    c = c + cute.arch.shuffle_sync_bfly(c, offset=16 >> k)
        return v, c

    @cute.jit
    def sum_parts(self, p_sum, p_cnt, count, tidx, s_v, s_c):
        """Sum of the `count` (<= S) partials at p_sum[i], p_cnt[i] in a fixed order
        (thread t adds t, t + T, ... in turn, then cta_sum); valid in thread 0."""
        T = self.threads
        tot = Float32(0.0)
        num = Int32(0)
        for ch in cutlass.range_constexpr(self.chunks):
            base = ch * REDUCE_CHUNK * T
            if count > base:
                vs = []
                cs = []
                for j in cutlass.range_constexpr(REDUCE_CHUNK):
                    i = tidx + (base + j * T)
                    vs.append(cute.arch.load(p_sum + i, Float32, sem="relaxed", scope="gpu"))
                    cs.append(cute.arch.load(p_cnt + i, Int32, sem="relaxed", scope="gpu"))
                for j in cutlass.range_constexpr(REDUCE_CHUNK):
                    ok = tidx + (base + j * T) < count
                    tot = tot + Float32(cutlass.select_(ok, vs[j], Float32(0.0)))
                    num = num + Int32(cutlass.select_(ok, cs[j], Int32(0)))
        return self.cta_sum(tot, num, s_v, s_c, tidx)

    @cute.jit
    def finish(self, total, count, out, lse, m_rows):
        if cutlass.const_expr(self.mean):
            res = total / count.to(Float32)  # IEEE fp32 division, like torch's
        else:
            res = total
        out[0] = res.to(self.out_dtype)
        if cutlass.const_expr(self.with_lse):
            lse[m_rows] = count.to(Float32)

    @cute.jit
    def ticket(self, counter, s_last):
        """Thread 0: count this CTA in (release of its earlier stores, acquire of the
        others'), the old count to shared memory for the CTA."""
        s_last[0] = cute.arch.atomic_add(counter, Int32(1), sem="acq_rel", scope="gpu")

    @cute.jit
    def add_up(self, acc, cnt, out: cute.Tensor, lse: cute.Tensor, work: cute.Tensor, s_v, s_c, s_last, tidx, bidx,
               grid, m_rows):
        """The CTA's partial (acc, cnt, valid in thread 0) into ``work``, and the last CTA of
        each level adds the level's partials (class docstring)."""
        S = self.group_ctas
        if grid == 1:
            if tidx == 0:
                self.finish(acc, cnt, out, lse, m_rows)
        else:
            w = work.iterator
            p_sum = cute.recast_ptr(w + WORK_PART, dtype=Float32)
            p_cnt = w + WORK_PART + grid
            q = bidx // S
            first = q * S
            in_group = cutlass.min(grid - first, S)
            n_groups = (grid + (S - 1)) // S
            if tidx == 0:
                (p_sum + bidx).store(acc)
                (p_cnt + bidx).store(cnt)
                self.ticket(w + (WORK_CNT1 + q), s_last)
            cute.arch.sync_threads()
            if s_last[0] == in_group - 1:
                # the group's last CTA: the group's partials happen-before this point
                # (thread 0 acquired, then the barrier); strong loads bypass a stale L1
                tot, num = self.sum_parts(p_sum + first, p_cnt + first, in_group, tidx, s_v, s_c)
                if n_groups == 1:
                    if tidx == 0:
                        self.finish(tot, num, out, lse, m_rows)
                        cute.arch.store(w + (WORK_CNT1 + q), Int32(0), sem="relaxed", scope="gpu")
                else:
                    g_sum = cute.recast_ptr(w + WORK_GSUM, dtype=Float32)
                    g_cnt = w + WORK_GCNT
                    if tidx == 0:
                        cute.arch.store(w + (WORK_CNT1 + q), Int32(0), sem="relaxed", scope="gpu")
                        (g_sum + q).store(tot)
                        (g_cnt + q).store(num)
                        self.ticket(w + WORK_TOP, s_last)
                    cute.arch.sync_threads()
                    if s_last[0] == n_groups - 1:
                        tot2, num2 = self.sum_parts(g_sum, g_cnt, n_groups, tidx, s_v, s_c)
                        if tidx == 0:
                            self.finish(tot2, num2, out, lse, m_rows)
                            cute.arch.store(w + WORK_TOP, Int32(0), sem="relaxed", scope="gpu")

    @cute.kernel
    def kernel(self, x: cute.Tensor, target: cute.Tensor, out: cute.Tensor, lse: cute.Tensor, work: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        t, row, m_rows, (m, s, xt, tgt, in_range) = self.block_row(x, target, tidx, bidx)
        acc = Float32(0.0)
        cnt = Int32(0)
        if (t == 0) & (row < m_rows):
            lse_v, loss_v = self.row_loss(m, s, xt, tgt, in_range)
            if cutlass.const_expr(self.with_lse):
                lse[row] = lse_v
            acc = loss_v
            cnt = Int32(cutlass.select_(tgt == Int64(self.ignore_index), Int32(0), Int32(1)))

        smem = cutlass.memory.SmemAllocator()
        s_v = smem.allocate_tensor(Float32, cute.make_layout(self.warps), byte_alignment=16)
        s_c = smem.allocate_tensor(Int32, cute.make_layout(self.warps), byte_alignment=16)
        s_last = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=16)
        acc, cnt = self.cta_sum(acc, cnt, s_v, s_c, tidx)
        self.add_up(acc, cnt, out, lse, work, s_v, s_c, s_last, tidx, bidx, grid, m_rows)

    @cute.jit
    def __call__(self, x: cute.Tensor, target: cute.Tensor, out: cute.Tensor, lse: cute.Tensor, work: cute.Tensor,
                 stream):
        self.kernel(x, target, out, lse, work).launch(grid=self.grid(x), block=(self.threads, 1, 1), stream=stream)


def make_ce_fwd_reduce(in_dtype, n: int, vec: int, config: RowReduceConfig, ignore_index: int, mean: bool,
                       with_lse: bool, out_dtype=None):
    """@cute.jit f(logits, target, out, lse, work, stream) (`CrossEntropyForwardReduce`)."""
    forward = CrossEntropyForwardReduce(in_dtype, n, vec, config, ignore_index, mean, with_lse, out_dtype)

    @cute.jit
    def ce_fwd_reduce(x: cute.Tensor, target: cute.Tensor, out: cute.Tensor, lse: cute.Tensor, work: cute.Tensor,
                      stream):
        forward(x, target, out, lse, work, stream)

    return ce_fwd_reduce


class CrossEntropyBackward(CrossEntropyTiling):
    """dlogits = (softmax - onehot) * dloss per row: ``__call__(logits (M, n), target (M,)
    i64, lse (M,) f32, dloss (M,) f32, dlogits (M, n), stream)``; rows whose target is
    ignore_index get zeros, rows whose target is outside [0, n) NaN.

    Realigned rows (`CrossEntropyTiling`) go in 16-byte vectors where dlogits' row has the
    same head as the logits' row (a contiguous dlogits and contiguous logits: every row); a
    row whose heads differ (logits a shifted view) runs element by element."""

    def __init__(self, in_dtype, n: int, vec: int, config: RowReduceConfig, ignore_index: int) -> None:
        super().__init__(in_dtype, n, vec, config, ignore_index)
        self.elem_bytes = in_dtype.width // 8

    @cute.jit
    def grad(self, xv, j, ml, g, tgt):
        pv = cute.math.exp2(xv.to(Float32) * Float32(_LOG2E) - ml, fastmath=True)
        one = Float32(cutlass.select_(j == tgt, Float32(1.0), Float32(0.0)))
        return ((pv - one) * g).to(self.in_dtype)

    @cute.jit
    def row_gradient(self, g_row, d_row, xb, db, h, t, ml, g, tgt):
        """The row's gradient: the head (h elements before the vectors at xb / db), the
        vectors, then the tail."""
        in_dtype, realign, bits, _grad = self.in_dtype, self.realign, self.copy_bits, self.grad
        BV, P, NV, TAIL = self.vector, self.threads_per_row, self.vectors, self.tail
        K, REM, U, N_OUTER, K_LEFT = self.rounds, self.rem, self.unroll, self.outer, self.left
        if cutlass.const_expr(realign):
            for c in cutlass.range_constexpr((BV - 1 + P - 1) // P):
                i = t + c * P
                if i < h:
                    d_row[i] = _grad(g_row[i], i, ml, g, tgt)
        if cutlass.const_expr(K + (1 if REM else 0) > 0):
            ld = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), in_dtype, num_bits_per_copy=bits)
            st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), in_dtype, num_bits_per_copy=bits)
            KT = K + (1 if REM else 0)
            lay = cute.make_layout((BV, P, KT), stride=(1, BV, BV * P))
            g_thr = cute.make_tensor(xb, lay)[None, t, None]
            d_thr = cute.make_tensor(db, lay)[None, t, None]
            frag = cute.make_rmem_tensor(cute.make_layout((BV, U)), in_dtype)
            fout = cute.make_rmem_tensor(cute.make_layout((BV, U)), in_dtype)
            base = h + t * BV
            if cutlass.const_expr(N_OUTER > 0):
                for o in cutlass.range(N_OUTER, unroll=1):
                    for u in cutlass.range_constexpr(U):
                        cute.copy(ld, g_thr[None, o * U + u], frag[None, u])
                    for u in cutlass.range_constexpr(U):
                        for v in cutlass.range_constexpr(BV):
                            fout[v, u] = _grad(frag[v, u], base + (o * U + u) * (P * BV) + v, ml, g, tgt)
                        cute.copy(st, fout[None, u], d_thr[None, o * U + u])
            if cutlass.const_expr(K_LEFT > 0):
                for u in cutlass.range_constexpr(K_LEFT):
                    cute.copy(ld, g_thr[None, N_OUTER * U + u], frag[None, u])
                for u in cutlass.range_constexpr(K_LEFT):
                    k = N_OUTER * U + u
                    for v in cutlass.range_constexpr(BV):
                        fout[v, u] = _grad(frag[v, u], base + k * (P * BV) + v, ml, g, tgt)
                    cute.copy(st, fout[None, u], d_thr[None, k])
            if cutlass.const_expr(REM > 0):
                if t < REM:
                    cute.copy(ld, g_thr[None, K], frag[None, 0])
                    for v in cutlass.range_constexpr(BV):
                        fout[v, 0] = _grad(frag[v, 0], base + K * (P * BV) + v, ml, g, tgt)
                    cute.copy(st, fout[None, 0], d_thr[None, K])
        if cutlass.const_expr(TAIL > 0):
            # TAIL < vec scalars (realigned: head + tail, the head taken above); rows of
            # fewer threads (P = 1 or 2 at tiny N) take several each
            for c in cutlass.range_constexpr((TAIL + P - 1) // P):
                i = t + c * P
                if (i >= h) & (i < TAIL):
                    j = NV * BV + i
                    d_row[j] = _grad(g_row[j], j, ml, g, tgt)

    @cute.kernel
    def kernel(self, x: cute.Tensor, target: cute.Tensor, lse: cute.Tensor, gs: cute.Tensor, dx: cute.Tensor):
        n, P, R, nbytes = self.n, self.threads_per_row, self.rows_per_cta, self.elem_bytes
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        r = tidx // P
        t = tidx % P
        row = bidx * R + r
        if row < x.shape[0]:
            g_row = x[row, None]
            d_row = dx[row, None]
            ml = lse[row] * Float32(_LOG2E)
            tgt64 = target[row]
            in_range = (tgt64 >= Int64(0)) & (tgt64 < Int64(n))
            g = Float32(cutlass.select_(in_range, gs[row], Float32(math.nan)))
            g = Float32(cutlass.select_(tgt64 == Int64(self.ignore_index), Float32(0.0), g))
            # an out-of-range target matches no column (and its row is NaN through g)
            tgt = Int32(Int64(cutlass.select_(in_range, tgt64, Int64(-1))))
            if cutlass.const_expr(self.realign):
                xb, h = realigned(g_row, nbytes)
                db, h_d = realigned(d_row, nbytes)
                if h == h_d:
                    self.row_gradient(g_row, d_row, xb, db, h, t, ml, g, tgt)
                else:
                    for j in cutlass.range(t, n, P, unroll=1):
                        d_row[j] = self.grad(g_row[j], j, ml, g, tgt)
            else:
                self.row_gradient(g_row, d_row, g_row.iterator, d_row.iterator, Int32(0), t, ml, g, tgt)

    @cute.jit
    def __call__(self, x: cute.Tensor, target: cute.Tensor, lse: cute.Tensor, gs: cute.Tensor, dx: cute.Tensor,
                 stream):
        self.kernel(x, target, lse, gs, dx).launch(
            grid=(cute.ceil_div(x.shape[0], self.rows_per_cta), 1, 1), block=(self.threads, 1, 1), stream=stream
        )


def make_ce_bwd(in_dtype, n: int, vec: int, config: RowReduceConfig, ignore_index: int):
    """@cute.jit f(logits (M, n), target (M,) i64, lse (M,) f32, dloss (M,) f32,
    dlogits (M, n), stream) (`CrossEntropyBackward`)."""
    backward = CrossEntropyBackward(in_dtype, n, vec, config, ignore_index)

    @cute.jit
    def ce_bwd(x: cute.Tensor, target: cute.Tensor, lse: cute.Tensor, gs: cute.Tensor, dx: cute.Tensor, stream):
        backward(x, target, lse, gs, dx, stream)

    return ce_bwd
