"""Row tiling shared by the norm kernels: which elements of a row a thread holds, the
predicated vector loads/stores that move them, bf16 widening, and the staged backwards'
per-column math. The row-wide reductions are in exchange.py, the bulk-copy row staging
in rows/staging.py.

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

``make_bwd_columns`` is the per-column math of both staged backwards (whole-row stages,
bwd.py, and the part ring, ring.py): one copy, so the two cannot compute differently.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Uint32
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

    def fragments(self, *dtypes) -> tuple:
        """A fresh (vec, KT1) register fragment per dtype, for a thread's share of a row
        (device code, traced inline)."""
        return tuple(cute.make_rmem_tensor(cute.make_layout((self.vec, self.KT1)), d) for d in dtypes)

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
    """The register forward's ``cp_async`` loads: @cute.jit (share, issue, fetch_col).

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
    per-row instruction stream (ncu). Other dtypes, and
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
    vec, K, REM, KT, KT1, TAIL, NV = tile.vec, tile.K, tile.REM, tile.KT, tile.KT1, tile.TAIL, tile.NV
    padded = bool(REM or TAIL)

    def _view(row: cute.Tensor) -> cute.Tensor:
        return row_view(tile, row)

    @cute.jit
    def move_col(row: cute.Tensor, frag: cute.Tensor, g, k: cutlass.Constexpr, to_row: cutlass.Constexpr):
        """Fragment column k (a Constexpr) between this thread's share of ``row`` and
        ``frag``: into frag, or with ``to_row`` out to row; only the slots it owns."""
        dt = row.element_type
        if cutlass.const_expr(k < KT):
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=vec * dt.width)
            thr = _view(row)[None, g, None]
            src, dst = thr, frag
            if cutlass.const_expr(to_row):
                src, dst = frag, thr
            if cutlass.const_expr(k < K):
                cute.copy(atom, src[None, k], dst[None, k])
            else:
                if g < REM:
                    cute.copy(atom, src[None, K], dst[None, K])
        else:
            if g < TAIL:
                if cutlass.const_expr(to_row):
                    row[NV * vec + g] = frag[0, KT]
                else:
                    frag[0, KT] = row[NV * vec + g]

    @cute.jit
    def load(row: cute.Tensor, frag: cute.Tensor, g):
        """frag (vec, KT1) <- this thread's share of `row` (zeros where it owns none)."""
        if cutlass.const_expr(padded):
            frag.fill(0.0)
        for k in cutlass.range_constexpr(KT1):
            move_col(row, frag, g, k, False)

    @cute.jit
    def store(frag: cute.Tensor, row: cute.Tensor, g):
        """row <- frag (same dtype), only the elements this thread owns."""
        for k in cutlass.range_constexpr(KT1):
            move_col(row, frag, g, k, True)

    @cute.jit
    def load_col(row: cute.Tensor, frag: cute.Tensor, g, k: cutlass.Constexpr):
        """frag[:, k] <- column k of this thread's share of `row` (``load`` one column at a
        time; slots it does not own are left as they are)."""
        move_col(row, frag, g, k, False)

    @cute.jit
    def store_col(frag: cute.Tensor, row: cute.Tensor, g, k: cutlass.Constexpr):
        """row <- frag[:, k], column k of ``store``."""
        move_col(row, frag, g, k, True)

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


@cute.jit
def fold_chains(acc1: cute.Tensor, acc2: cute.Tensor, n: cutlass.Constexpr, is_ln: cutlass.Constexpr):
    """(s1, s2): the n independent chains of the backward's row sums folded in order, s1
    from acc1 and (LayerNorm) s2 from acc2; for RMSNorm s2 stays acc2[0]."""
    s1 = acc1[0]
    s2 = acc2[0]
    for v in cutlass.range_constexpr(1, n):
        s1 = s1 + acc1[v]
        if cutlass.const_expr(is_ln):
            s2 = s2 + acc2[v]
    return s1, s2


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
    NACC = bwd_chains(tile)
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
        return fold_chains(acc[0], acc[1], NACC, is_ln)

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


def staged_chunk(config: NormConfig, n: int, vec: int, direction: str) -> Tile:
    """The tile of a row-staged kernel's CTA: its N / cluster_n chunk of a row over its
    threads (one row per CTA). Raises for a config that is not a staged one (``direction``
    names the kernel in the message)."""
    C = config.cluster_n
    if not config.stages or config.rows_per_cta != 1 or (C > 1 and config.exchange != "mbar"):
        raise ValueError(f"the staged {direction} needs stages > 0, one row per CTA and (with a cluster) the mbar "
                         f"exchange: {config}")
    return Tile(n // C, vec, config.threads, 1, config.threads)


def bwd_chains(tile: Tile) -> int:
    """Independent chains per row sum of the staged backwards (fewer registers than one per
    vector lane)."""
    return min(tile.vec, 4)
