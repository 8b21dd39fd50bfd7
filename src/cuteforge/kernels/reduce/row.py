"""Row reductions over the last dim of a 2-D tensor (CuTe DSL, sm_90 first).

``out[i] = op(x[i, :])`` for x of shape (M, N) with rows contiguous (stride
``(row_stride, 1)``). Ops: ``sum``, ``mean``, ``amax``, ``amin`` (fp32
accumulation, result cast to ``out_dtype``) and ``argmax`` (Int64 index).

Compile-time vs run-time
------------------------
* N (row length), the dtypes, ``vec`` and the :class:`RowReduceConfig` are
  baked in. Every loop over the row therefore has a compile-time trip count
  and the head/tail split below is resolved in Python while tracing.
* M and ``row_stride`` are dynamic (``cute.sym_int()`` /
  ``cute.sym_int64(divisibility=vec)``). The row offset ``row * row_stride``
  is formed in 64-bit (the stride is an i64 symbol), so M*N > 2**31 is safe;
  offsets inside a row stay 32-bit (N < 2**31).

Work decomposition
------------------
A CTA of ``threads`` threads owns ``rows_per_cta = threads // threads_per_row``
consecutive rows; ``threads_per_row`` (P) threads cooperate on one row. With
``cluster_n`` = C > 1 a row is split over the C CTAs of an sm_90 thread block
cluster, so P*C "virtual threads" share it (g = cta_rank*P + t).

The row is viewed as NV = N // vec vectors of ``vec`` elements (vec*bits <=
128, so one ``ld.global.v4``/``v2``/scalar per vector; the runtime guarantees
every row start is vec-aligned). Vector j belongs to virtual thread j % (P*C),
so every warp reads 32 consecutive vectors (512 contiguous bytes at vec*4B=16B)
and all loads are fully coalesced. Per thread:

* K = NV // (P*C) full rounds. These run as ``K // unroll`` iterations of a
  loop (a real loop only when that count is > 1), each issuing ``unroll``
  independent 16-byte loads into a register fragment *before* any arithmetic,
  so ``unroll`` x 16 B are in flight per thread; then the ``K % unroll``
  leftover rounds, unrolled.
* one predicated vector when NV % (P*C) != 0 (threads g < that remainder);
* the N % vec trailing scalars, one per thread g < N % vec (several per thread
  when the row has fewer threads) -- this is how any N works with any vec.
* rows not 16-byte aligned (vec below 16 bytes) read their body from the first
  16-byte boundary through a pointer realigned at run time (v3), the head before it
  and the tail after it as scalars.

Accumulation keeps ``vec`` independent fp32 chains per thread (ILP; bf16/fp16
are widened per element). The per-thread result is then reduced with a
butterfly over the min(P, 32) lanes of the row, and -- when the row spans
several warps or CTAs -- through a tiny shared-memory buffer of
``rows_per_cta x (warps_per_row * C)`` partials (fp32, plus Int32 indices for
argmax). With C > 1 each warp leader writes its partial straight into every
peer CTA's buffer (DSMEM, ``mapa`` + st.shared::cluster) and a cluster
barrier (arrive.release / wait.acquire) publishes it; a relaxed cluster
arrive at kernel start, waited on before the first remote store, guarantees
all peers are resident. Rank 0 of the cluster stores the result.

Rows past M (last CTA when M % rows_per_cta != 0) re-read row M-1 (clamped)
so every lane takes part in the shuffles/barriers; only in-range rows store.

Semantics (torch parity)
------------------------
* sum: fp32 accumulate, cast to out_dtype. mean: fp32 sum * float32(1/N)
  (torch's CUDA mean also multiplies by a precomputed factor).
* amax/amin: NaN-propagating (``max.NaN.f32`` / ``min.NaN.f32``), like
  torch.amax/amin. The max of values of the input dtype is exactly
  representable, so the cast back is exact.
* argmax: torch's CUDA rule (``GreaterOrNan``): any NaN beats every number,
  the *first* NaN wins among NaNs, among equal values the lowest index wins;
  so the result is the first NaN's index if a NaN exists, else the index of
  the first maximum. If every element is -inf the answer is 0 (first max).
  Per-thread chains see indices in increasing order, so they only need
  "strictly greater or first NaN"; cross-lane/warp/CTA merges compare
  indices explicitly (order of merging does not matter: the rule is a total
  order on (value, index) pairs).

Configs (autotuning knobs)
--------------------------
``threads`` (CTA size), ``threads_per_row`` (P; P < 32 puts several rows in
one warp for small N), ``unroll`` (16-byte loads in flight per thread per
iteration), ``cluster_n`` (CTAs per row; sm_90 clusters; useful when M is too
small to fill 132 SMs with whole rows, or to cut the tail of large-N shapes),
``load_hint`` (cache qualifiers of the 16-byte loads: ``""`` plain
``ld.global``, ``"nc"`` read-only path ``ld.global.nc``, ``"no_alloc"``
``L1::no_allocate``, ``"l2_256"`` ``L2::256B`` prefetch, ``"no_alloc_l2_256"``
both, ``"cs"`` streaming ``ld.global.cs``). :func:`default_config` picks P so that each thread
owns about 4-8 vectors of a row, then the CTA size. Sizes of the idea: at
N=4096 fp32 (1024 16-B vectors) P=256, unroll=4: one round of four 16-B loads
per thread, 256-thread CTAs (8 resident per SM); at N=65536 P=1024 and 4
iterations of 4 loads.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ..rows.grid import row_coords
from ..rows.partials import make_fold_partials, make_post_partials
from ..rows.split import realigned, row_vectors
from .combine import SENTINEL, ReduceOp, select
from .config import LOAD_HINTS, OPS, RowReduceConfig, candidate_configs, default_config

__all__ = [
    "OPS",
    "LOAD_HINTS",
    "RowReduceConfig",
    "default_config",
    "candidate_configs",
    "RowReduce",
    "make_row_reduce",
]

# ----------------------------------------------------------------------------
# device helpers
# ----------------------------------------------------------------------------


def _load_hint_kwargs(hint: str) -> dict:
    evict = cute.nvgpu.CacheEvictionPriority
    l2 = cute.nvgpu.L2PrefetchSize
    return {
        "": {},
        "nc": {"invariant": True},
        "no_alloc": {"l1c_evict_priority": evict.NO_ALLOCATE},
        "l2_256": {"l2_prefetch_size": l2.SIZE_256B},
        "no_alloc_l2_256": {
            "l1c_evict_priority": evict.NO_ALLOCATE,
            "l2_prefetch_size": l2.SIZE_256B,
        },
        "cs": {"load_cache_mode": cute.nvgpu.LoadCacheMode.STREAMING},
    }[hint]


class RowReduce(ReduceOp):
    """The row reduction (module docstring) for one (op, dtypes, N, vector width, config):
    the tiling in ``__init__``, the host launch in ``__call__``, the device ``kernel``.

    x: (M, n) with stride (row_stride, 1), row starts vec*elem_bytes aligned.
    out: (M,) of out_dtype (Int64 for argmax). N need not be a multiple of vec.
    """

    def __init__(self, op: str, in_dtype, out_dtype, n: int, vec: int, config: RowReduceConfig) -> None:
        super().__init__(op)
        self.check_operands(in_dtype, out_dtype, vec)
        if op != "argmax" and out_dtype not in (Float32, cutlass.BFloat16, cutlass.Float16):
            raise ValueError(f"unsupported output dtype {out_dtype}")
        bits = in_dtype.width
        config.validate(n, bits)
        self.in_dtype, self.out_dtype, self.n, self.vec = in_dtype, out_dtype, n, vec
        self.threads = config.threads  # T
        self.threads_per_row = P = config.threads_per_row  # P
        self.cluster_n = C = config.cluster_n  # C
        self.rows_per_cta = config.threads // P  # R
        self.lanes = min(P, 32)  # G: lanes of one row inside a warp
        self.warps_per_row = W = max(P // 32, 1)  # W
        self.slots = W * C  # S: partial slots per row
        self.row_threads = PT = P * C  # PT: virtual threads per row
        BV, NV = row_vectors(n, vec, bits)  # vectors of BV elements, NV full ones per row
        self.vector, self.vectors = BV, NV
        self.realign = BV > vec  # rows not on 16 bytes: a head of h < BV scalars before the body
        self.tail = n - NV * BV  # TAIL: trailing (< vec), or realigned head + tail (< 2 BV) scalars
        self.rounds = K = NV // PT  # K: full rounds
        self.rem = NV - K * PT  # REM: leftover vectors (virtual threads g < REM)
        self.rounds_all = K + (1 if self.rem > 0 else 0)  # KT: rounds incl. the partial one
        self.unroll = U = max(1, min(config.unroll, K)) if K > 0 else 1  # U
        self.outer = K // U  # N_OUTER
        self.left = K - self.outer * U  # K_LEFT
        self.inv_n = 1.0 / n
        self.use_smem = self.slots > 1
        # the row's warps / cluster CTAs: (value, index) partials through shared memory
        self.post_partials = make_post_partials(self.is_arg, W, self.lanes, C, self.slots)
        self.fold_partials = make_fold_partials(self.merge, self.is_arg, self.slots, self.lanes, Float32, self.init,
                                                Int32, SENTINEL)
        self.load_hint = config.load_hint
        self.hint_kw = _load_hint_kwargs(config.load_hint)
        self.copy_bits = BV * bits
        self.bits = bits

    @cute.jit
    def group_reduce(self, val, idx, group: cutlass.Constexpr):
        for step in cutlass.range_constexpr(int(math.log2(group))):
            off = group >> (step + 1)
            oval = cute.arch.shuffle_sync_bfly(val, offset=off)
            oidx = idx
            if cutlass.const_expr(self.is_arg):
                oidx = cute.arch.shuffle_sync_bfly(idx, offset=off)
            val, idx = self.merge(val, idx, oval, oidx)
        return val, idx

    @cute.kernel
    def kernel(self, x: cute.Tensor, out: cute.Tensor):
        op, in_dtype, out_dtype, vec, bits = self.op, self.in_dtype, self.out_dtype, self.vec, self.bits
        P, C, R, G, S, PT = self.threads_per_row, self.cluster_n, self.rows_per_cta, self.lanes, self.slots, self.row_threads
        BV, NV, realign, TAIL = self.vector, self.vectors, self.realign, self.tail
        K, REM, KT, U, N_OUTER, K_LEFT = self.rounds, self.rem, self.rounds_all, self.unroll, self.outer, self.left
        inv_n, use_smem, hint_kw, copy_bits = self.inv_n, self.use_smem, self.hint_kw, self.copy_bits
        load_hint = self.load_hint
        is_arg, init = self.is_arg, self.init
        _accum_elem, _merge_pair, _group_reduce = self.accumulate, self.merge, self.group_reduce
        _post, _fold = self.post_partials, self.fold_partials
        tidx, cta, r, t, g, row_block = row_coords(C, P, R)
        m_rows = x.shape[0]
        row = row_block * R + r
        row_c = cutlass.min(row, m_rows - 1)
        g_row = x[row_c, None]

        acc = cute.make_rmem_tensor(cute.make_layout((BV,)), Float32)
        acc.fill(init)
        aidx = cute.make_rmem_tensor(cute.make_layout((BV,)), Int32)
        aidx.fill(SENTINEL)
        body = g_row.iterator  # where the vectors start
        h = Int32(0)  # elements before it
        if cutlass.const_expr(realign):
            body, h = realigned(g_row, bits // 8)
            # the head first: argmax's chains must see indices in increasing order
            for c in cutlass.range_constexpr((BV - 1 + PT - 1) // PT):
                i = g + c * PT
                if i < h:
                    _accum_elem(acc, aidx, 0, g_row[i], i)

        if cutlass.const_expr(KT > 0):
            if cutlass.const_expr(load_hint != ""):
                atom = cute.make_copy_atom(
                    cute.nvgpu.CopyG2ROp(), in_dtype, num_bits_per_copy=copy_bits, **hint_kw
                )
            else:
                atom = cute.make_copy_atom(
                    cute.nvgpu.CopyUniversalOp(), in_dtype, num_bits_per_copy=copy_bits
                )
            # (vec, virtual thread, round) view of the vectorised part of the row
            g_vec = cute.make_tensor(
                body,
                cute.make_layout((BV, PT, KT), stride=(1, BV, BV * PT)),
            )
            g_thr = g_vec[None, g, None]  # (vec, KT) : (1, vec*PT)
            frag = cute.make_rmem_tensor(cute.make_layout((BV, U)), in_dtype)
            base_idx = h + g * BV

            if cutlass.const_expr(N_OUTER > 1):
                for o in cutlass.range(N_OUTER, unroll=1):
                    for u in cutlass.range_constexpr(U):
                        cute.copy(atom, g_thr[None, o * U + u], frag[None, u])
                    for u in cutlass.range_constexpr(U):
                        for v in cutlass.range_constexpr(BV):
                            _accum_elem(
                                acc, aidx, v, frag[v, u], base_idx + (o * U + u) * (PT * BV) + v
                            )
            elif cutlass.const_expr(N_OUTER == 1):
                for u in cutlass.range_constexpr(U):
                    cute.copy(atom, g_thr[None, u], frag[None, u])
                for u in cutlass.range_constexpr(U):
                    for v in cutlass.range_constexpr(BV):
                        _accum_elem(acc, aidx, v, frag[v, u], base_idx + u * (PT * BV) + v)
            if cutlass.const_expr(K_LEFT > 0):
                for u in cutlass.range_constexpr(K_LEFT):
                    cute.copy(atom, g_thr[None, N_OUTER * U + u], frag[None, u])
                for u in cutlass.range_constexpr(K_LEFT):
                    k = N_OUTER * U + u
                    for v in cutlass.range_constexpr(BV):
                        _accum_elem(acc, aidx, v, frag[v, u], base_idx + k * (PT * BV) + v)
            if cutlass.const_expr(REM > 0):
                if g < REM:
                    cute.copy(atom, g_thr[None, K], frag[None, 0])
                    for v in cutlass.range_constexpr(BV):
                        _accum_elem(acc, aidx, v, frag[v, 0], base_idx + K * (PT * BV) + v)
        if cutlass.const_expr(TAIL > 0 and not realign):
            # TAIL < vec scalars; a row of fewer threads than that (P = 1 or 2 at tiny N)
            # takes several each (before v3 it took one: the rest were dropped)
            for c in cutlass.range_constexpr((TAIL + PT - 1) // PT):
                i = g + c * PT
                if i < TAIL:
                    _accum_elem(acc, aidx, 0, g_row[NV * vec + i], NV * vec + i)
        if cutlass.const_expr(realign):
            # the tail: leftover i in [h, TAIL) is element NV * BV + i
            for c in cutlass.range_constexpr((TAIL + PT - 1) // PT):
                i = g + c * PT
                if (i >= h) & (i < TAIL):
                    _accum_elem(acc, aidx, 0, g_row[NV * BV + i], NV * BV + i)

        # ---- thread-local chains -> one value
        val = acc[0]
        idx = aidx[0]
        for v in cutlass.range_constexpr(1, BV):
            val, idx = _merge_pair(val, idx, acc[v], aidx[v])
        # ---- lanes of the row inside the warp
        val, idx = _group_reduce(val, idx, G)

        # ---- warps of the row / CTAs of the cluster
        if cutlass.const_expr(use_smem):
            smem = cutlass.memory.SmemAllocator()
            s_val = smem.allocate_tensor(
                Float32, cute.make_layout((R, S), stride=(S, 1)), byte_alignment=16
            )
            s_idx = smem.allocate_tensor(
                Int32, cute.make_layout((R, S), stride=(S, 1)), byte_alignment=16
            )
            _post(val, idx, s_val, s_idx, r, t, cta)
            val, idx = _fold(s_val, s_idx, r, t % G)
            # slots were spread over lanes [0, min(S, G)): fold just those
            val, idx = _group_reduce(val, idx, min(S, G))

        is_leader = (t == 0) & (row < m_rows)
        if cutlass.const_expr(C > 1):
            is_leader = is_leader & (cta == 0)
        if is_leader:
            if cutlass.const_expr(is_arg):
                res = select(idx == SENTINEL, Int32(0), idx, Int32)
                out[row] = Int64(res)
            elif cutlass.const_expr(op == "mean"):
                out[row] = (val * Float32(inv_n)).to(out_dtype)
            else:
                out[row] = val.to(out_dtype)

    @cute.jit
    def __call__(self, x: cute.Tensor, out: cute.Tensor, stream):
        C, R = self.cluster_n, self.rows_per_cta
        m_rows = x.shape[0]
        n_blocks = cute.ceil_div(m_rows, R)
        if cutlass.const_expr(C > 1):
            self.kernel(x, out).launch(
                grid=(n_blocks * C, 1, 1), block=(self.threads, 1, 1), cluster=(C, 1, 1), stream=stream
            )
        else:
            self.kernel(x, out).launch(grid=(n_blocks, 1, 1), block=(self.threads, 1, 1), stream=stream)


def make_row_reduce(op: str, in_dtype, out_dtype, n: int, vec: int, config: RowReduceConfig):
    """Return a @cute.jit callable f(x: cute.Tensor, out: cute.Tensor, stream) (`RowReduce`)."""
    reduce = RowReduce(op, in_dtype, out_dtype, n, vec, config)

    @cute.jit
    def row_reduce(x: cute.Tensor, out: cute.Tensor, stream):
        reduce(x, out, stream)

    return row_reduce
