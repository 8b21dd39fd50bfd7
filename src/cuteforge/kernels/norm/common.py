"""Row tiling shared by the norm kernels: which elements of a row a thread holds, the
predicated vector loads/stores that move them, and the row-wide all-reduce.

Tiling (all of it resolved in Python while tracing; N is static)
---------------------------------------------------------------
A row of N elements is NV = N // vec vectors of ``vec`` elements plus TAIL = N % vec
trailing scalars. PT = threads_per_row * cluster_n "virtual threads" share a row;
virtual thread g = cta_rank * P + t owns vectors g, g + PT, g + 2 PT, ... (so a warp's
32 loads of one round are 32 consecutive vectors: fully coalesced 16-byte accesses).
That is K = NV // PT full rounds, one partial round when REM = NV % PT > 0 (threads
g < REM), and one tail scalar for threads g < TAIL (configs keep PT >= 8 >= vec).

A thread's share lives in a register fragment of shape (vec, KT1): column k < K is a
full round, column K the partial one, the last column the tail scalar (element 0).
Slots a thread does not own hold zero, which every sum the kernels form tolerates
(except LayerNorm's centred sum of squares, which masks them with ``valid``).

All-reduce
----------
Butterfly shuffles over the G = min(P, 32) lanes of a row, then -- when the row spans
W warps or C CTAs -- one partial per (warp, CTA) into a small shared buffer (for a
cluster: stored straight into every peer CTA's buffer, DSMEM), one barrier, and each
lane folds the S = W * C partials. Every thread of the row ends with the total.
Buffers are indexed by a ``slot`` so that back-to-back reductions never overwrite a
partial a slower thread (or peer CTA) has yet to read: a slot is reused only after a
later barrier, which every reader passes only after reading.

With ``NormConfig.exchange == "mbar"`` (forward, cluster_n > 1; ``make_allreduce_mbar``)
the cluster step has no barrier: lanes l < C of each warp ``st.async`` the warp's partial
into CTA l's slot, the bytes counted on CTA l's mbarrier for that reduction, and each CTA
waits on its own mbarrier (armed once per launch with R * S * 4 bytes). Each reduction of
a launch has its own slot and mbarrier (phase 0), so nothing is reused.

The persistent backward (``make_allreduce_mbar_rows``) reduces a row per loop iteration:
two mbarriers and two buffer halves alternate by row parity, thread 0 re-arms a
mbarrier after each wait, and the phase parity advances every second row (the argument
for why that is race-free is in its docstring).

Row staging (the staged backward, v2.4 / v2.5, and the staged forward, v2.6)
----------------------------------------------------------------------------
``make_chunk`` cuts a CTA's contiguous N / C chunk out of a row (the whole row without a
cluster); ``make_stage_issue`` is thread 0's refill of one stage: arm the stage's
mbarrier with the stage's bytes and bring the chunk of one row of each staged operand
into the stage's slots with ``cp.async.bulk`` global -> shared (completing on that
mbarrier). Row j of a CTA lives in stage j % S and is waited for with parity (j // S) % 2.
``make_bwd_columns`` is the per-column math of both staged backwards (whole-row stages,
bwd.py, and the part ring, ring.py): one copy, so the two cannot compute differently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cute.nvgpu import cpasync

from .config import NormConfig


@dataclass(frozen=True)
class Tile:
    n: int
    vec: int
    P: int  # threads per row (in one CTA)
    C: int  # CTAs per row (cluster)
    T: int  # CTA size

    @classmethod
    def of(cls, n: int, vec: int, cfg: NormConfig) -> Tile:
        return cls(n, vec, cfg.threads_per_row, cfg.cluster_n, cfg.threads)

    @property
    def R(self) -> int:
        return self.T // self.P

    @property
    def G(self) -> int:
        return min(self.P, 32)

    @property
    def W(self) -> int:
        return max(self.P // 32, 1)

    @property
    def S(self) -> int:
        return self.W * self.C

    @property
    def PT(self) -> int:
        return self.P * self.C

    @property
    def NV(self) -> int:
        return self.n // self.vec

    @property
    def TAIL(self) -> int:
        return self.n - self.NV * self.vec

    @property
    def K(self) -> int:
        return self.NV // self.PT

    @property
    def REM(self) -> int:
        return self.NV - self.K * self.PT

    @property
    def KT(self) -> int:
        return self.K + (1 if self.REM else 0)

    @property
    def KT1(self) -> int:
        return self.KT + (1 if self.TAIL else 0)

    def width(self, k: int) -> int:
        """Elements used in fragment column k (the tail column holds one)."""
        return 1 if (self.TAIL and k == self.KT) else self.vec

    def kind(self, k: int) -> str:
        if k < self.K:
            return "full"
        if self.REM and k == self.K:
            return "partial"
        return "tail"


def row_view(tile: Tile, row: cute.Tensor) -> cute.Tensor:
    """(vec, virtual thread, round) view of the vectorised part of a row."""
    v, pt = tile.vec, tile.PT
    return cute.make_tensor(row.iterator, cute.make_layout((v, pt, tile.KT), stride=(1, v, v * pt)))


def make_row_async(tile: Tile):
    """The register forward's ``cp_async`` loads (v2.8): @cute.jit (share, issue, fetch_col).

    ``share(smem, dtype, tidx)`` allocates a (vec, T, KT) shared-memory tensor (16-byte slot
    (v, t, k) of thread t, round k: a warp's 32 slots of one round are 512 consecutive
    bytes) and returns the calling thread's (vec, KT) slice; ``issue(row, sv, g)`` copies
    virtual thread g's share of ``row`` (as ``make_row_io``'s ``load`` would read it) into
    ``sv`` with 16-byte ``cp.async.cg`` (the caller commits and waits); ``fetch_col(sv,
    frag, g, k)`` moves column k into the register fragment (slots g does not own are left
    as they are). Rows of whole 16-byte vectors only (no tail scalar)."""
    vec, K, REM, KT, T = tile.vec, tile.K, tile.REM, tile.KT, tile.T
    if tile.TAIL:
        raise ValueError(f"cp_async loads need rows of whole vectors ({tile})")

    def share(smem, dtype, tidx) -> cute.Tensor:
        if vec * dtype.width != 128:
            raise ValueError(f"cp_async loads move 16-byte vectors: vec={vec} x {dtype.width} bits")
        buf = smem.allocate_tensor(dtype, cute.make_layout((vec, T, KT), stride=(1, vec, vec * T)), byte_alignment=128)
        return buf[None, tidx, None]

    @cute.jit
    def issue(row: cute.Tensor, sv: cute.Tensor, g):
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), row.element_type,
                                   num_bits_per_copy=128)
        thr = row_view(tile, row)[None, g, None]
        for k in cutlass.range_constexpr(K):
            cute.copy(atom, thr[None, k], sv[None, k])
        if cutlass.const_expr(REM > 0):
            if g < REM:
                cute.copy(atom, thr[None, K], sv[None, K])

    @cute.jit
    def fetch_col(sv: cute.Tensor, frag: cute.Tensor, g, k: cutlass.Constexpr):
        if cutlass.const_expr(k < K):
            cute.autovec_copy(sv[None, k], frag[None, k])
        else:
            if g < REM:
                cute.autovec_copy(sv[None, K], frag[None, K])

    return share, issue, fetch_col


def make_widen(dtype, vec: int, pairs: bool = True):
    """@cute.jit widen(frag, out, k): out[v, k] = fp32 of frag[v, k] for every v < vec (frag a
    compact column-major (vec, KT1) register fragment, as the kernels make them, so column k
    starts at element k * vec; out an fp32 one of the same shape; k a Constexpr). With ``pairs``, bf16
    pairs widen with one integer op per element (the low half shifted up 16 bits, the high
    half masked: a bf16 is the top half of an fp32), where ptxas lowers ``cvt.f32.bf16`` of a
    high half to two (PRMT + SHF): the long-row LayerNorm kernels are latency-bound on their
    per-row instruction stream (ncu, docs/kernels/norm.md v2.9). Other dtypes, and
    ``pairs=False``, convert."""
    pairs = pairs and dtype is cutlass.BFloat16 and vec % 2 == 0

    @cute.jit
    def widen(frag: cute.Tensor, out: cute.Tensor, k: cutlass.Constexpr):
        if cutlass.const_expr(pairs):
            words = cute.recast_tensor(cute.make_tensor(frag.iterator + k * vec, cute.make_layout((vec,))), Uint32)
            tmp = cute.make_rmem_tensor(cute.make_layout((2,)), Uint32)
            tf = cute.recast_tensor(tmp, Float32)
            for i in cutlass.range_constexpr(vec // 2):
                word = words[i]
                tmp[0] = word << 16
                tmp[1] = word & Uint32(0xFFFF0000)
                out[2 * i, k] = tf[0]
                out[2 * i + 1, k] = tf[1]
        else:
            for v in cutlass.range_constexpr(vec):
                out[v, k] = frag[v, k].to(Float32)

    return widen


def make_row_io(tile: Tile):
    """@cute.jit helpers (load, store, store_scalar, load_col, store_col) for one Tile;
    load_col / store_col move one fragment column k (a Constexpr) of what load / store move."""
    vec, K, REM, KT, TAIL, NV = tile.vec, tile.K, tile.REM, tile.KT, tile.TAIL, tile.NV
    padded = bool(REM or TAIL)

    def _view(row: cute.Tensor) -> cute.Tensor:
        return row_view(tile, row)

    @cute.jit
    def load(row: cute.Tensor, frag: cute.Tensor, g):
        """frag (vec, KT1) <- this thread's share of `row` (zeros where it owns none)."""
        dt = row.element_type
        if cutlass.const_expr(padded):
            frag.fill(0.0)
        if cutlass.const_expr(KT > 0):
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=vec * dt.width)
            thr = _view(row)[None, g, None]
            for k in cutlass.range_constexpr(K):
                cute.copy(atom, thr[None, k], frag[None, k])
            if cutlass.const_expr(REM > 0):
                if g < REM:
                    cute.copy(atom, thr[None, K], frag[None, K])
        if cutlass.const_expr(TAIL > 0):
            if g < TAIL:
                frag[0, KT] = row[NV * vec + g]

    @cute.jit
    def store(frag: cute.Tensor, row: cute.Tensor, g):
        """row <- frag (same dtype), only the elements this thread owns."""
        dt = row.element_type
        if cutlass.const_expr(KT > 0):
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=vec * dt.width)
            thr = _view(row)[None, g, None]
            for k in cutlass.range_constexpr(K):
                cute.copy(atom, frag[None, k], thr[None, k])
            if cutlass.const_expr(REM > 0):
                if g < REM:
                    cute.copy(atom, frag[None, K], thr[None, K])
        if cutlass.const_expr(TAIL > 0):
            if g < TAIL:
                row[NV * vec + g] = frag[0, KT]

    @cute.jit
    def load_col(row: cute.Tensor, frag: cute.Tensor, g, k: cutlass.Constexpr):
        """frag[:, k] <- column k of this thread's share of `row` (``load`` one column at a
        time; slots it does not own are left as they are)."""
        dt = row.element_type
        if cutlass.const_expr(k < KT):
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=vec * dt.width)
            thr = _view(row)[None, g, None]
            if cutlass.const_expr(k < K):
                cute.copy(atom, thr[None, k], frag[None, k])
            else:
                if g < REM:
                    cute.copy(atom, thr[None, K], frag[None, K])
        else:
            if g < TAIL:
                frag[0, KT] = row[NV * vec + g]

    @cute.jit
    def store_col(frag: cute.Tensor, row: cute.Tensor, g, k: cutlass.Constexpr):
        """row <- frag[:, k], column k of ``store``."""
        dt = row.element_type
        if cutlass.const_expr(k < KT):
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=vec * dt.width)
            thr = _view(row)[None, g, None]
            if cutlass.const_expr(k < K):
                cute.copy(atom, frag[None, k], thr[None, k])
            else:
                if g < REM:
                    cute.copy(atom, frag[None, K], thr[None, K])
        else:
            if g < TAIL:
                row[NV * vec + g] = frag[0, KT]

    @cute.jit
    def store_scalar(frag: cute.Tensor, row: cute.Tensor, g):
        """Like store, element by element (fp32 partial rows whose vec*32 may exceed 128 bits)."""
        if cutlass.const_expr(KT > 0):
            thr = _view(row)[None, g, None]
            for k in cutlass.range_constexpr(K):
                for v in cutlass.range_constexpr(vec):
                    thr[v, k] = frag[v, k]
            if cutlass.const_expr(REM > 0):
                if g < REM:
                    for v in cutlass.range_constexpr(vec):
                        thr[v, K] = frag[v, K]
        if cutlass.const_expr(TAIL > 0):
            if g < TAIL:
                row[NV * vec + g] = frag[0, KT]

    return load, store, store_scalar, load_col, store_col


def column_of(tile: Tile, g, k: int, v: int):
    """Row index of fragment element (v, k) of virtual thread g."""
    if tile.TAIL and k == tile.KT:
        return tile.NV * tile.vec + g
    return (g + k * tile.PT) * tile.vec + v


def make_allreduce(tile: Tile):
    """@cute.jit allreduce(a, b, buf, slot, r, t, cta) -> (sum a, sum b) over the row.

    ``nval`` (1 or 2, Constexpr) says whether b takes part. ``buf`` is a flat fp32
    smem tensor of n_slots * 2 * R * S elements (see ``reduce_smem_elems``); ``slot``
    may be dynamic. Must be reached by every thread of the CTA (and cluster).
    """
    G, W, S, C, R = tile.G, tile.W, tile.S, tile.C, tile.R

    @cute.jit
    def _bfly(val, group: cutlass.Constexpr):
        for step in cutlass.range_constexpr(int(math.log2(group))):
            val = val + cute.arch.shuffle_sync_bfly(val, offset=group >> (step + 1))
        return val

    @cute.jit
    def allreduce(a, b, nval: cutlass.Constexpr, buf: cute.Tensor, slot, r, t, cta):
        a = _bfly(a, G)
        if cutlass.const_expr(nval > 1):
            b = _bfly(b, G)
        if cutlass.const_expr(S > 1):
            base_a = ((slot * 2) * R + r) * S
            base_b = ((slot * 2 + 1) * R + r) * S
            mine = cta * W + t // 32
            if t % G == 0:
                if cutlass.const_expr(C > 1):
                    for peer in cutlass.range_constexpr(C):
                        cute.arch.map_dsmem_ptr(buf.iterator + (base_a + mine), peer).store(a)
                        if cutlass.const_expr(nval > 1):
                            cute.arch.map_dsmem_ptr(buf.iterator + (base_b + mine), peer).store(b)
                else:
                    buf[base_a + mine] = a
                    if cutlass.const_expr(nval > 1):
                        buf[base_b + mine] = b
            if cutlass.const_expr(C > 1):
                cute.arch.cluster_arrive()
                cute.arch.cluster_wait()
            else:
                cute.arch.sync_threads()
            lane = t % G
            a = Float32(0.0)
            b2 = Float32(0.0)
            for i in cutlass.range_constexpr((S + G - 1) // G):
                if cutlass.const_expr((i + 1) * G <= S):
                    a = a + buf[base_a + lane + i * G]
                    if cutlass.const_expr(nval > 1):
                        b2 = b2 + buf[base_b + lane + i * G]
                else:
                    j = cutlass.min(lane + i * G, S - 1)
                    ok = lane + i * G < S
                    a = a + Float32(cutlass.select_(ok, buf[base_a + j], Float32(0.0)))
                    if cutlass.const_expr(nval > 1):
                        b2 = b2 + Float32(cutlass.select_(ok, buf[base_b + j], Float32(0.0)))
            # lanes past S hold zeros: a butterfly over all G lanes hands every lane the total
            a = _bfly(a, G)
            if cutlass.const_expr(nval > 1):
                b = _bfly(b2, G)
        return a, b

    return allreduce


def make_allreduce_mbar(tile: Tile):
    """@cute.jit allreduce(a, buf, mbar, slot, r, t, cta) -> sum of a over the row, for
    a cluster (C > 1, P a multiple of 32). ``buf``: flat fp32 smem of n_slots * R * S
    elements; ``mbar``: n_slots mbarriers, slot's initialised with count 1 and armed
    with R * S * 4 transaction bytes (``mbar_tx_bytes``), followed by a cluster
    arrive whose wait precedes the first call. ``slot`` is a compile-time constant."""
    G, W, S, C, R = tile.G, tile.W, tile.S, tile.C, tile.R
    if C < 2 or G != 32:
        raise ValueError(f"the mbarrier exchange needs a cluster and whole warps per row (C={C}, P={tile.P})")

    @cute.jit
    def _bfly(val, group: cutlass.Constexpr):
        for step in cutlass.range_constexpr(int(math.log2(group))):
            val = val + cute.arch.shuffle_sync_bfly(val, offset=group >> (step + 1))
        return val

    @cute.jit
    def allreduce(a, buf: cute.Tensor, mbar, slot: cutlass.Constexpr, r, t, cta):
        a = _bfly(a, G)
        base = (slot * R + r) * S
        one = cute.make_rmem_tensor(cute.make_layout((1,)), Float32)
        one[0] = a
        word = cute.recast_tensor(one, Int32)
        if t % 32 < C:  # lane l sends the warp's partial to CTA l
            cute.arch.store_async_dsmem(buf.iterator + (base + cta * W + t // 32), word[0], mbar + slot, t % 32)
        cute.arch.mbarrier_wait(mbar + slot, 0)
        lane = t % G
        tot = Float32(0.0)
        for i in cutlass.range_constexpr((S + G - 1) // G):
            if cutlass.const_expr((i + 1) * G <= S):
                tot = tot + buf[base + lane + i * G]
            else:
                j = cutlass.min(lane + i * G, S - 1)
                tot = tot + Float32(cutlass.select_(lane + i * G < S, buf[base + j], Float32(0.0)))
        return _bfly(tot, G)

    return allreduce


@cute.jit
def warp_sum(val):
    """Sum of val over the 32 lanes of a warp, handed to every lane (butterfly)."""
    for step in cutlass.range_constexpr(5):
        val = val + cute.arch.shuffle_sync_bfly(val, offset=16 >> step)
    return val


def warp_merge_moments(s, m2, count: float, lanes: int = 32):
    """(sum, M2) over groups of ``lanes`` lanes (a power of 2 <= 32) of per-lane (sum, sum of
    squares centred on the lane's own mean) pairs, each over ``count`` elements, handed to
    every lane: Chan et al.'s pairwise merge for equal counts, level by level of a butterfly,

        M2 = M2_a + M2_b + (s_a - s_b)^2 / (2 c),   s = s_a + s_b,   c -> 2 c

    Both shuffles of a level are in flight together, so the merge is one chain of log2(lanes)
    shuffle latencies where a warp sum followed by a sum of squares centred on its result is
    two. Symmetric in a and b ((s_b - s_a)^2 == (s_a - s_b)^2 exactly), so every lane ends
    with the same bits. A plain function: Python unrolls the levels when tracing."""
    for step in range(lanes.bit_length() - 1):
        off = (lanes // 2) >> step
        so = cute.arch.shuffle_sync_bfly(s, offset=off)
        mo = cute.arch.shuffle_sync_bfly(m2, offset=off)
        d = s - so
        m2 = d * (d * Float32(0.5 / (count * (1 << step)))) + (m2 + mo)
        s = s + so
    return s, m2


def make_warp_moments(tile: Tile, nacc: int, inv_nw: float, merge: bool = False):
    """@cute.jit moments(frag, tot, acc) -> (the warp's sum, the warp's squares centred on its
    own mean), the inputs of ``make_moments_mbar`` / ``make_allreduce_mbar_rows(moments=True)``:
    ``tot`` is the thread's sum of its fragment ``frag`` ((vec, KT1) of ``tile``, every slot
    owned: ``moments_exchange_ok``), ``acc`` an fp32 register scratch of ``nacc`` chains,
    ``inv_nw`` 1 / (elements per warp). ``merge`` (``NormConfig.short_chains``): each thread
    centres its squares on its own mean and the warp merges the pairs
    (``warp_merge_moments``), one shuffle chain that starts as soon as the thread's squares
    are summed, where centring on the warp's mean waits for a warp sum first."""
    n_t = 1.0 / (inv_nw * 32)  # elements per thread
    if merge and n_t != int(n_t):
        raise ValueError(f"merged warp moments need the same element count in every thread ({tile})")

    def centred_squares(frag: cute.Tensor, centre, acc: cute.Tensor):
        """The thread's sum of (frag - centre)^2 over ``nacc`` chains (traced inline: a plain
        function, so Python unrolls its loops)."""
        acc.fill(0.0)
        for k in range(tile.KT1):
            for v in range(tile.width(k)):
                d = frag[v, k].to(Float32) - centre
                acc[v % nacc] = acc[v % nacc] + d * d
        m2 = acc[0]
        for v in range(1, nacc):
            m2 = m2 + acc[v]
        return m2

    @cute.jit
    def merged(frag: cute.Tensor, tot, acc: cute.Tensor):
        return warp_merge_moments(tot, centred_squares(frag, tot * Float32(1.0 / n_t), acc), n_t)

    @cute.jit
    def moments(frag: cute.Tensor, tot, acc: cute.Tensor):
        wsum = warp_sum(tot)
        return wsum, warp_sum(centred_squares(frag, wsum * Float32(inv_nw), acc))

    return merged if merge else moments


def moments_exchange_ok(tile: Tile) -> bool:
    """Whether LayerNorm's statistics may go through one moments exchange
    (``make_moments_mbar``) on this tile: whole warps per row and no padded slots, so
    every warp of the row holds exactly n / S elements."""
    return tile.G == 32 and not (tile.REM or tile.TAIL)


def make_moments_fold(tile: Tile, merge: bool = False):
    """@cute.jit fold(buf, base_s, base_m2, lane) -> (row sum, row M2) from the S = W * C
    per-warp (sum, centred sum of squares) pairs of one row in ``buf`` (sums at base_s..,
    M2s at base_m2..), combined as Chan et al.'s parallel variance:

        M2 = sum_w M2_w + sum_w (s_w - n_w mean)^2 / n_w,   n_w = n / S,  mean = sum_w s_w / n

    Each term is a sum of squares, so nothing cancels beyond the (s_w - n_w mean) of the
    between-warp term, whose share of M2 is ~S / n: the variance keeps the two-pass
    form's accuracy (a plain E[x^2] - E[x]^2 loses it when |mean| >> std).

    ``merge`` (``NormConfig.short_chains``), S a power of 2: lane l folds the pairs l % L,
    l % L + 32, ... (L = min(S, 32)) centred on their own mean, then the L lanes merge
    (``warp_merge_moments``): one shuffle chain instead of the sum's and then the squares'."""
    G, S = tile.G, tile.S
    if not moments_exchange_ok(tile):
        raise ValueError(f"the moments exchange needs whole warps per row and an unpadded row ({tile})")
    inv_nw = S / tile.n  # 1 / n_w
    inv_s = 1.0 / S
    if merge and S & (S - 1) == 0:
        L = min(S, 32)
        K = max(S // 32, 1)  # pairs per lane

        @cute.jit
        def fold_merged(buf: cute.Tensor, base_s, base_m2, lane):
            j0 = lane % L
            s = Float32(0.0)
            for i in cutlass.range_constexpr(K):
                s = s + buf[base_s + j0 + i * 32]
            m2 = Float32(0.0)
            if cutlass.const_expr(K > 1):
                nw_mean = s * Float32(1.0 / K)  # n_w * the lane's mean
                for i in cutlass.range_constexpr(K):
                    d = buf[base_s + j0 + i * 32] - nw_mean
                    m2 = m2 + (buf[base_m2 + j0 + i * 32] + d * d * Float32(inv_nw))
            else:
                m2 = buf[base_m2 + j0]
            return warp_merge_moments(s, m2, K * tile.n / S, L)

        return fold_merged

    @cute.jit
    def fold(buf: cute.Tensor, base_s, base_m2, lane):
        tot = Float32(0.0)
        for i in cutlass.range_constexpr((S + G - 1) // G):
            j = cutlass.min(lane + i * G, S - 1)
            tot = tot + Float32(cutlass.select_(lane + i * G < S, buf[base_s + j], Float32(0.0)))
        tot = warp_sum(tot)
        nw_mean = tot * Float32(inv_s)  # n_w * mean
        m2 = Float32(0.0)
        for i in cutlass.range_constexpr((S + G - 1) // G):
            j = cutlass.min(lane + i * G, S - 1)
            d = buf[base_s + j] - nw_mean
            term = buf[base_m2 + j] + d * d * Float32(inv_nw)
            m2 = m2 + Float32(cutlass.select_(lane + i * G < S, term, Float32(0.0)))
        return tot, warp_sum(m2)

    return fold


def make_moments_mbar(tile: Tile):
    """@cute.jit moments(s, m2, buf, mbar, r, t, cta) -> (row sum, row M2) for a cluster
    row (C > 1): LayerNorm's mean and variance in one mbarrier exchange instead of two
    (the forward's only cross-CTA round trip, as RMSNorm's). ``s`` and ``m2`` are the
    warp's sum and its sum of squares centred on the warp's own mean s / n_w (each already
    summed over the warp, ``warp_sum``). Lanes l < C ``st.async`` the pair into CTA l's
    slots; ``buf`` holds 2 * R * S fp32, ``mbar`` is one mbarrier (count 1) armed with
    2 * ``mbar_tx_bytes`` before the cluster arrive whose wait precedes the call."""
    W, S, C, R = tile.W, tile.S, tile.C, tile.R
    if C < 2:
        raise ValueError(f"the moments exchange runs over a cluster (C={C})")
    fold = make_moments_fold(tile)

    @cute.jit
    def moments(s, m2, buf: cute.Tensor, mbar, r, t, cta):
        base_s = r * S
        base_m2 = (R + r) * S
        words = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
        words[0] = s
        words[1] = m2
        iw = cute.recast_tensor(words, Int32)
        mine = cta * W + t // 32
        if t % 32 < C:  # lane l sends the warp's pair to CTA l
            cute.arch.store_async_dsmem(buf.iterator + (base_s + mine), iw[0], mbar, t % 32)
            cute.arch.store_async_dsmem(buf.iterator + (base_m2 + mine), iw[1], mbar, t % 32)
        cute.arch.mbarrier_wait(mbar, 0)
        return fold(buf, base_s, base_m2, t % 32)

    return moments


def mbar_tx_bytes(tile: Tile) -> int:
    """Bytes every CTA of the cluster receives per mbarrier reduction."""
    return tile.R * tile.S * 4


def reduce_smem_elems(tile: Tile, n_slots: int) -> int:
    return max(1, n_slots * 2 * tile.R * tile.S)


def make_allreduce_mbar_rows(tile: Tile, nval: int, moments: bool = False, merge: bool = False):
    """The mbarrier exchange for a loop over rows (the persistent backward, C > 1):
    @cute.jit allreduce(a, b, buf, mbar, slot, phase, arm, r, t, cta) -> (sum a, sum b).

    ``moments`` (nval 2; the staged LayerNorm forward): a and b are a warp's sum and its
    centred sum of squares, already summed over the warp (``make_moments_mbar``), and the
    result is (row sum, row M2) through ``make_moments_fold`` (with ``merge``, its merged form).

    ``nval`` (1 or 2) says whether b takes part; both values travel to the same mbarrier
    (two 4-byte ``st.async`` per sending lane). ``buf``: flat fp32 smem of
    2 * nval * R * S elements (``reduce_smem_elems(tile, 2)`` is enough); ``mbar``: two
    mbarriers, each initialised with count 1 and armed once with ``nval * mbar_tx_bytes``
    before the cluster arrive whose wait precedes the first call. ``slot`` and ``phase``
    are dynamic: the CTA's j-th row (j = 0, 1, ... over its row loop) uses slot j % 2
    (buffer half and mbarrier) in phase (j // 2) % 2. ``arm`` (thread 0 of the CTA)
    re-arms the slot's mbarrier for its next use right after the wait.

    Why two slots suffice (every CTA of the cluster visits the same rows in the same
    order; a peer sends row j + 1 only after its own wait for row j completed):
    * bytes of row j + 1 cannot be counted in row j's phase: they go to the other
      mbarrier. A single mbarrier would not do: a peer may finish row j (all of row j's
      bytes reached *it*) while bytes of row j still fly to this CTA, and its row j + 1
      bytes could then complete this CTA's row-j phase with a partial missing.
    * slot j % 2 is written again only with row j + 2, by a peer that completed row
      j + 1, which needs every warp of this CTA to have sent its row j + 1 partial, which
      each warp does after reading (and shuffling: a data dependence, in-order issue) its
      row j partials from that slot. So no row-j read can see a row-(j + 2) write.
    * the re-arm for use k + 1 (thread 0, after its wait on use k) precedes thread 0's
      own row j + 1 send, and any byte of use k + 1 (row j + 2) arrives only after that
      send; a slower thread of this CTA still waiting on use k (parity k % 2) sees that
      phase complete, because phase k + 1 cannot complete before that thread's warp has
      sent row j + 1.
    * the last rows leave both mbarriers armed with nothing to come: harmless at exit,
      and a CTA may exit as soon as its own last wait completed (every byte sent to it
      has landed; it only reads its own shared memory).
    """
    G, W, S, C, R = tile.G, tile.W, tile.S, tile.C, tile.R
    if C < 2 or G != 32:
        raise ValueError(f"the mbarrier exchange needs a cluster and whole warps per row (C={C}, P={tile.P})")
    if nval not in (1, 2):
        raise ValueError(f"nval={nval}: 1 or 2 values per reduction")
    if moments and nval != 2:
        raise ValueError("the moments exchange carries two values (nval=2)")
    tx = nval * mbar_tx_bytes(tile)
    fold_moments = make_moments_fold(tile, merge) if moments else None

    @cute.jit
    def _bfly(val, group: cutlass.Constexpr):
        for step in cutlass.range_constexpr(int(math.log2(group))):
            val = val + cute.arch.shuffle_sync_bfly(val, offset=group >> (step + 1))
        return val

    @cute.jit
    def _fold(buf: cute.Tensor, base, lane):
        tot = Float32(0.0)
        for i in cutlass.range_constexpr((S + G - 1) // G):
            if cutlass.const_expr((i + 1) * G <= S):
                tot = tot + buf[base + lane + i * G]
            else:
                j = cutlass.min(lane + i * G, S - 1)
                tot = tot + Float32(cutlass.select_(lane + i * G < S, buf[base + j], Float32(0.0)))
        return _bfly(tot, G)

    @cute.jit
    def allreduce(a, b, buf: cute.Tensor, mbar, slot, phase, arm, r, t, cta):
        if cutlass.const_expr(not moments):
            a = _bfly(a, G)
            if cutlass.const_expr(nval > 1):
                b = _bfly(b, G)
        bar = mbar + slot
        base_a = ((slot * nval) * R + r) * S
        base_b = base_a + R * S
        mine = cta * W + t // 32
        words = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
        words[0] = a
        words[1] = b
        iw = cute.recast_tensor(words, Int32)
        if t % 32 < C:  # lane l sends the warp's partial(s) to CTA l
            cute.arch.store_async_dsmem(buf.iterator + (base_a + mine), iw[0], bar, t % 32)
            if cutlass.const_expr(nval > 1):
                cute.arch.store_async_dsmem(buf.iterator + (base_b + mine), iw[1], bar, t % 32)
        cute.arch.mbarrier_wait(bar, phase)
        if arm:
            cute.arch.mbarrier_arrive_and_expect_tx(bar, tx)
        lane = t % G
        if cutlass.const_expr(moments):
            a, b = fold_moments(buf, base_a, base_b, lane)
        else:
            a = _fold(buf, base_a, lane)
            if cutlass.const_expr(nval > 1):
                b = _fold(buf, base_b, lane)
        return a, b

    return allreduce


def make_moments_lagged(tile: Tile, merge: bool = False):
    """LayerNorm's moments exchange split in two, for the staged forward that finishes each
    row one row late (``NormConfig.lag``, v2.17): @cute.jit send(s, m2, buf, mbar, slot, t,
    cta) posts the warp's (sum, centred M2) pair of row j (slot j % 4) to every CTA of the
    cluster, and @cute.jit recv(buf, mbar, slot, phase, arm, t) -> (row sum, row M2) waits
    for row j's pairs and folds them (``make_moments_fold``, merged with ``merge``), one row later. In between the
    CTA reads and sends row j + 1, so the cluster round trip runs under that work instead of
    stalling every warp. One row per CTA (R = 1); ``buf`` holds 2 * 4 * S fp32, ``mbar``
    four mbarriers (count 1; four is ``config.LAG_SLOTS``), each armed once with
    2 * ``mbar_tx_bytes`` before the cluster arrive whose wait precedes the first send;
    ``arm`` (thread 0) re-arms after the wait.

    Why four slots: a CTA in its iteration j has sent rows <= j and folded rows <= j - 2.
    A peer finishes row k only when every CTA has sent row k, so a peer has finished at
    most row j and sent at most row j + 2 (its iteration j + 2 sends, then waits for
    row j + 1). Rows j - 1 .. j + 2 are then in flight into this CTA: four slots, and
    row j + 3 (slot (j - 1) % 4) waits on this CTA's send of row j + 1, which each warp
    issues after folding row j - 1 (a data dependence through its shuffles). The mbarrier
    argument of ``make_allreduce_mbar_rows`` carries over with four in place of two:
    use k + 1 of a slot (row j + 4) is sent only after every warp here sent row j + 2,
    after thread 0's wait on use k and its re-arm."""
    W, S, C, R = tile.W, tile.S, tile.C, tile.R
    if C < 2 or R != 1:
        raise ValueError(f"the lagged exchange runs one row per CTA over a cluster (C={C}, R={R})")
    fold = make_moments_fold(tile, merge)
    tx = 2 * mbar_tx_bytes(tile)

    @cute.jit
    def send(s, m2, buf: cute.Tensor, mbar, slot, t, cta):
        base_s = 2 * slot * S
        words = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
        words[0] = s
        words[1] = m2
        iw = cute.recast_tensor(words, Int32)
        mine = cta * W + t // 32
        if t % 32 < C:  # lane l sends the warp's pair to CTA l
            cute.arch.store_async_dsmem(buf.iterator + (base_s + mine), iw[0], mbar + slot, t % 32)
            cute.arch.store_async_dsmem(buf.iterator + (base_s + S + mine), iw[1], mbar + slot, t % 32)

    @cute.jit
    def recv(buf: cute.Tensor, mbar, slot, phase, arm, t):
        cute.arch.mbarrier_wait(mbar + slot, phase)
        if arm:
            cute.arch.mbarrier_arrive_and_expect_tx(mbar + slot, tx)
        return fold(buf, 2 * slot * S, 2 * slot * S + S, t % 32)

    return send, recv


def launch_bounds(threads: int, ctas_per_sm: int) -> dict:
    """Launch keywords: ``threads`` per CTA and, with ctas_per_sm > 1, ptxas's register budget
    for that many CTAs per SM (nvvm.minctasm). ptxas then uses up to that budget, so it must
    be the occupancy wanted, not a bound above it. The carveout is given (the driver's
    default, -1) so that the DSL does not ask a device for one: it compiles without a GPU."""
    out: dict = {"max_number_threads": [threads, 1, 1]}
    if ctas_per_sm > 1:
        out.update(min_blocks_per_mp=ctas_per_sm, preferred_smem_carveout=-1)
    return out


def make_chunk(nc: int, c: int):
    """part(row, cta): this CTA's contiguous chunk [cta nc, (cta + 1) nc) of a row (the row
    itself when c == 1); a plain function, traced inline."""

    def part(row: cute.Tensor, cta):
        return cute.local_tile(row, (nc,), (cta,)) if c > 1 else row

    return part


def make_stage_issue(dtype, nc: int, c: int, n_rows: int):
    """@cute.jit issue(a, b, d, srows, full, row, stage, cta) for thread 0 of a staged kernel:
    arm mbarrier ``full + stage`` with n_rows chunks' bytes and bulk-copy this CTA's chunk
    (``make_chunk``) of row ``row`` of the first ``n_rows`` (1..3) of a, b, d into stage
    slots ``stage * n_rows + i`` of ``srows`` ((nc, S * n_rows) shared memory, 16-byte
    aligned chunks of a multiple of 16 bytes; unused operands are stand-ins, never read)."""
    if n_rows not in (1, 2, 3):
        raise ValueError(f"n_rows={n_rows}: 1..3 staged operands")
    part = make_chunk(nc, c)
    row_bytes = nc * dtype.width // 8
    tx_bytes = n_rows * row_bytes

    @cute.jit
    def issue(a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, srows: cute.Tensor, full, row, stage, cta):
        atom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), dtype, num_bits_per_copy=row_bytes * 8)
        bar = full + stage
        cute.arch.mbarrier_arrive_and_expect_tx(bar, tx_bytes)
        cute.copy(atom, part(a[row, None], cta), srows[None, stage * n_rows], mbar_ptr=bar)
        if cutlass.const_expr(n_rows > 1):
            cute.copy(atom, part(b[row, None], cta), srows[None, stage * n_rows + 1], mbar_ptr=bar)
        if cutlass.const_expr(n_rows > 2):
            cute.copy(atom, part(d[row, None], cta), srows[None, stage * n_rows + 2], mbar_ptr=bar)

    return issue


def make_stage_start(x_dtype, w_dtype, nc: int, c: int, stages: int, n_rows: int, xtx: int, n_w: int,
                     w_smem: bool, n_xbar: int = 2):
    """@cute.jit start(tidx, cta, q, n_q, m, a, b, d, w, bias, srows, full, xbar, sw, sb): the
    staged kernels' prologue once their shared memory is allocated (``staged_smem``): the
    mbarriers (``make_stage_barrier_init``); with ``w_smem`` thread 0 bulk-copies this CTA's
    chunk of the weight (and, n_w == 2, the bias) into sw (sb), completing on mbarrier
    ``full + stages``; then it issues the CTA group's first ``stages`` rows (q, q + n_q, ...)
    of a, b, d into the stages (``make_stage_issue``). Stand-ins for what a kernel lacks (xbar
    without a cluster, sw / sb without ``w_smem``, bias with n_w == 1) are never touched.
    ``n_xbar``: the cluster's exchange mbarriers (2; 4 for the lagged LayerNorm forward)."""
    init = make_stage_barrier_init(stages + 1, c, xtx, n_xbar=n_xbar)
    issue = make_stage_issue(x_dtype, nc, c, n_rows)
    part = make_chunk(nc, c)
    w_bytes = nc * w_dtype.width // 8

    @cute.jit
    def start(tidx, cta, q, n_q, m, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, w: cute.Tensor,
              bias: cute.Tensor, srows: cute.Tensor, full, xbar, sw: cute.Tensor, sb: cute.Tensor):
        init(tidx, full, xbar)
        if cutlass.const_expr(w_smem):
            if tidx == 0:
                watom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), w_dtype, num_bits_per_copy=w_bytes * 8)
                cute.arch.mbarrier_arrive_and_expect_tx(full + stages, n_w * w_bytes)
                cute.copy(watom, part(w, cta), sw, mbar_ptr=full + stages)
                if cutlass.const_expr(n_w > 1):
                    cute.copy(watom, part(bias, cta), sb, mbar_ptr=full + stages)
        if tidx == 0:
            for i in cutlass.range_constexpr(stages):
                if q + i * n_q < m:
                    issue(a, b, d, srows, full, q + i * n_q, i, cta)

    return start


def persistent_group(c: int):
    """(cta, q, n_q) of the calling CTA in a persistent grid of CTA groups (one cluster of
    c CTAs per group when c > 1): its rank in the cluster, its group, and the number of
    groups. A plain function, traced inline by the staged kernels."""
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    if c > 1:
        return cute.arch.block_idx_in_cluster(), bidx // c, gdim // c
    return 0, bidx, gdim


def staged_smem(smem, dtype, nc: int, slots: int, n_smem: int, n_full: int, c: int, n_xbar: int = 2):
    """The staged kernels' shared memory, in allocation order: the stage slots ((nc, slots)
    of dtype, 128-byte aligned for the bulk copies), the fp32 reduction buffer (n_smem),
    n_full "full" mbarriers (one per stage, plus the weight's) and, with a cluster, the
    ``n_xbar`` mbarriers of the row sums' exchange (else None)."""
    srows = smem.allocate_tensor(dtype, cute.make_layout((nc, slots), stride=(1, nc)), byte_alignment=128)
    buf = smem.allocate_tensor(Float32, cute.make_layout((n_smem,)), byte_alignment=16)
    full = smem.allocate_array(Int64, n_full, byte_alignment=8)
    xbar = smem.allocate_array(Int64, n_xbar, byte_alignment=8) if c > 1 else None
    return srows, buf, full, xbar


def make_stage_barrier_init(n_full: int, c: int, xtx: int, n_empty: int = 0, empty_count: int = 1, n_xbar: int = 2):
    """@cute.jit init(tidx, full, xbar) for the staged kernels' prologue: thread 0
    initialises the n_full "full" mbarriers (one arrival each: the expect_tx of the thread
    issuing the copies), then ``n_empty`` "empty" mbarriers right after them (``full +
    n_full + i``, ``empty_count`` arrivals each: the part-ring backward's per-warp releases)
    and, with a cluster (c > 1), the ``n_xbar`` exchange mbarriers, armed for
    their first rows' xtx bytes; then the init fence, the relaxed cluster arrive whose wait
    (before the row loop) precedes the first remote st.async, and a CTA barrier. Without a
    cluster xbar is a stand-in, never touched."""

    @cute.jit
    def init(tidx, full, xbar):
        if tidx == 0:
            for i in cutlass.range_constexpr(n_full):
                cute.arch.mbarrier_init(full + i, 1)
            for i in cutlass.range_constexpr(n_empty):
                cute.arch.mbarrier_init(full + n_full + i, empty_count)
            if cutlass.const_expr(c > 1):
                for i in cutlass.range_constexpr(n_xbar):
                    cute.arch.mbarrier_init(xbar + i, 1)
        cute.arch.mbarrier_init_fence()
        if cutlass.const_expr(c > 1):
            if tidx == 0:
                for i in cutlass.range_constexpr(n_xbar):
                    cute.arch.mbarrier_arrive_and_expect_tx(xbar + i, xtx)
            cute.arch.cluster_arrive_relaxed()
        cute.arch.sync_threads()

    return init


def make_bwd_columns(tile: Tile, x_dtype, w_dtype, is_ln: bool, has_bias: bool, has_dsum: bool):
    """The staged backwards' per-column math: @cute.jit (sums_col, row_sums, dx_col).

    Shared by bwd.py ``make_norm_bwd_staged`` (whole-row stages) and ring.py
    ``make_norm_bwd_ring`` (part slots) so that their numerics cannot drift apart: the two
    differ only in where a column of x / dy (/ dsum) is read from and when its shared memory
    is released, not in what is computed from it (bwd.py's module docstring has the
    formulas). Each works on fragment column k (a Constexpr) of the kernel's compact
    (vec, KT1) register fragments, only ``tile.width(k)`` lanes (padded slots hold zero):

    - ``sums_col(xc, dyc, wr, f, acc, mean, rstd, k)``: widen column k of x, dy and the
      weight (``make_widen``) into the fp32 fragments f = (xf, dyf, wf), then add g xhat
      (and, LayerNorm, g) into the NACC = min(vec, 4) independent chains of acc = (acc1,
      acc2) (fewer registers than one chain per vector lane);
    - ``row_sums(acc) -> (s1, s2)``: the chains folded (s2 stays acc2[0] for RMSNorm), the
      CTA's partial row sums before the row's all-reduce;
    - ``dx_col(xc, dyc, wr, dsc, f, mean, rstd, c1, c2, dwa, dba, oc, k)``: widen as above,
      dx = (g - xhat c1 - c2) rstd (+ dsum) into oc (x's dtype) and dy xhat (, dy) added to
      the dweight (, dbias) accumulators dwa (, dba); c1 = mean(g xhat), c2 = mean(g).
    """
    V = tile.vec
    NACC = min(V, 4)
    widen_x = make_widen(x_dtype, V)
    widen_w = make_widen(w_dtype, V)

    @cute.jit
    def sums_col(xc: cute.Tensor, dyc: cute.Tensor, wr: cute.Tensor, f, acc, mean, rstd, k: cutlass.Constexpr):
        xf, dyf, wf = f
        acc1, acc2 = acc
        widen_x(xc, xf, k)
        widen_x(dyc, dyf, k)
        widen_w(wr, wf, k)
        for v in cutlass.range_constexpr(tile.width(k)):
            xh = (xf[v, k] - mean) * rstd
            gv = dyf[v, k] * wf[v, k]
            acc1[v % NACC] = acc1[v % NACC] + gv * xh
            if cutlass.const_expr(is_ln):
                acc2[v % NACC] = acc2[v % NACC] + gv

    @cute.jit
    def row_sums(acc):
        acc1, acc2 = acc
        s1 = acc1[0]
        s2 = acc2[0]
        for v in cutlass.range_constexpr(1, NACC):
            s1 = s1 + acc1[v]
            if cutlass.const_expr(is_ln):
                s2 = s2 + acc2[v]
        return s1, s2

    @cute.jit
    def dx_col(xc: cute.Tensor, dyc: cute.Tensor, wr: cute.Tensor, dsc: cute.Tensor, f, mean, rstd, c1, c2,
               dwa: cute.Tensor, dba: cute.Tensor, oc: cute.Tensor, k: cutlass.Constexpr):
        xf, dyf, wf = f
        widen_x(xc, xf, k)
        widen_x(dyc, dyf, k)
        widen_w(wr, wf, k)
        for v in cutlass.range_constexpr(tile.width(k)):
            xh = (xf[v, k] - mean) * rstd
            dyv = dyf[v, k]
            gv = dyv * wf[v, k]
            dxv = (gv - xh * c1 - c2) * rstd
            if cutlass.const_expr(has_dsum):
                dxv = dxv + dsc[v, k].to(Float32)
            dwa[v, k] = dwa[v, k] + dyv * xh
            if cutlass.const_expr(has_bias):
                dba[v, k] = dba[v, k] + dyv
            oc[v, k] = dxv.to(x_dtype)

    return sums_col, row_sums, dx_col
