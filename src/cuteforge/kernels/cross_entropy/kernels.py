"""Cross-entropy over the rows of logits (M, N), forward and backward, in one pass each.

Forward: ``lse[i] = logsumexp(x[i, :])`` and ``loss[i] = lse[i] - x[i, t_i]`` (fp32), read
in one streaming pass; the softmax is never written. Backward: ``dx[i, j] = (exp(x[i, j] -
lse[i]) - [j == t_i]) * g[i]``, reading x once and writing dx once, in x's dtype.

Work decomposition: the row kernel's (``reduce/row.py``): P = ``threads_per_row`` threads
share a row, each owning the 16-byte vectors j = t, t + P, ... (compile-time N, so the
full rounds, the predicated partial round and the scalar tail are resolved while
tracing), ``unroll`` vectors loaded before any arithmetic. No cluster: cross-entropy rows
come in thousands (one per token), which fills the GPU.

Online logsumexp: each thread keeps a running (max m, sum s of exp(x - m)). A chunk of
``unroll * vec`` elements is folded with one rescale: m' = max(m, max(chunk)),
s' = s * 2^((m - m') log2 e) + sum 2^((x - m') log2 e), i.e. one ex2 per element. Lanes,
then warps (shared memory), merge their (m, s) pairs the same way. A max of -inf (all
inputs -inf so far) is replaced by 0 in the exponents so that no inf - inf appears; NaN
inputs propagate to the row's lse and loss.

Targets: ``t == ignore_index`` gives loss 0 (its lse is still written) and a zero gradient
row. A target outside [0, N) gives loss NaN and a NaN gradient row: nothing is clamped or
silently read out of bounds; the ops layer can also check targets on the host.

Configs: :func:`ce_config`: one row per CTA (unless a row takes under a warp), about 4
vectors per thread (8 for rows of 1025-2048 vectors), at most 1024 threads per row.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ..reduce.row import RowReduceConfig, _pow2_ceil

__all__ = ["ce_config", "make_ce_fwd", "make_ce_bwd"]

_LOG2E = math.log2(math.e)
_FLOATS = (Float32, cutlass.BFloat16, cutlass.Float16)


def ce_config(n: int, dtype_bits: int) -> RowReduceConfig:
    """One row per CTA from 64 threads per row up (a CTA holding several long rows makes
    each wait for the others at the cross-warp merge: the forward lost 10-30 % that way
    on the H200), 4 vectors per thread, 8 for rows of 1025-2048 vectors (measured:
    docs/kernels/cross_entropy.md), at most 1024 threads looping over longer rows."""
    nv = -(-n // (128 // dtype_bits))
    per = 8 if 1024 < nv <= 2048 else 4
    p = min(1024, _pow2_ceil(max(1, -(-nv // per))))
    cfg = RowReduceConfig(256 if p <= 32 else p, p, max(1, min(per, -(-nv // p))))
    cfg.validate(n, dtype_bits)
    return cfg


def _plan(n: int, vec: int, config: RowReduceConfig) -> dict:
    if config.cluster_n != 1:
        raise ValueError("cross-entropy kernels do not split rows over clusters (cluster_n must be 1)")
    P = config.threads_per_row
    NV = n // vec
    K = NV // P
    U = max(1, min(config.unroll, K)) if K > 0 else 1
    return {
        "T": config.threads,
        "P": P,
        "R": config.threads // P,
        "G": min(P, 32),
        "W": max(P // 32, 1),
        "NV": NV,
        "TAIL": n - NV * vec,
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


def make_ce_fwd(in_dtype, n: int, vec: int, config: RowReduceConfig, ignore_index: int):
    """@cute.jit f(logits (M, n), target (M,) i64, loss (M,) f32, lse (M,) f32, stream)."""
    _check(in_dtype, n, vec, config)
    p = _plan(n, vec, config)
    T, P, R, G, W = p["T"], p["P"], p["R"], p["G"], p["W"]
    NV, TAIL, K, REM, U, N_OUTER, K_LEFT = (p[k] for k in ("NV", "TAIL", "K", "REM", "U", "N_OUTER", "K_LEFT"))
    L = _LOG2E
    hint = {"num_bits_per_copy": vec * in_dtype.width}

    def fmax(a, b):
        return cute.arch.fmax(a, b, nan=True)

    # Plain Python helpers: traced inline, so they may take lists of DSL values.
    def _fold(m, s, vals):
        """Fold a chunk of values (a Python list of Float32) into the running (m, s)."""
        m_new = fmax(m, _tree(list(vals), fmax))
        m_use = Float32(cutlass.select_(m_new == -math.inf, Float32(0.0), m_new))
        ml = m_use * Float32(L)
        parts = [cute.math.exp2(v * Float32(L) - ml, fastmath=True) for v in vals]
        csum = _tree(parts, lambda a, b: a + b)
        s = s * cute.math.exp2(m * Float32(L) - ml, fastmath=True) + csum
        return m_new, s

    def _fold_frag(m, s, frag, nu):
        return _fold(m, s, [frag[v, u].to(Float32) for u in range(nu) for v in range(vec)])

    def _merge(m, s, om, os):
        m_new = fmax(m, om)
        m_use = Float32(cutlass.select_(m_new == -math.inf, Float32(0.0), m_new))
        ml = m_use * Float32(L)
        s_new = s * cute.math.exp2(m * Float32(L) - ml, fastmath=True) + os * cute.math.exp2(
            om * Float32(L) - ml, fastmath=True
        )
        return m_new, s_new

    def _group(m, s, group):
        for step in range(int(math.log2(group))):
            off = group >> (step + 1)
            om = cute.arch.shuffle_sync_bfly(m, offset=off)
            os = cute.arch.shuffle_sync_bfly(s, offset=off)
            m, s = _merge(m, s, om, os)
        return m, s

    @cute.kernel
    def _kernel(x: cute.Tensor, target: cute.Tensor, loss: cute.Tensor, lse: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        r = tidx // P
        t = tidx % P
        m_rows = x.shape[0]
        row = bidx * R + r
        row_c = cutlass.min(row, m_rows - 1)
        g_row = x[row_c, None]
        # issued first, needed last: its latency hides behind the row's loads
        tgt = target[row_c]
        m = Float32(-math.inf)
        s = Float32(0.0)
        if cutlass.const_expr(K + (1 if REM else 0) > 0):
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), in_dtype, **hint)
            KT = K + (1 if REM else 0)
            g_thr = cute.make_tensor(g_row.iterator, cute.make_layout((vec, P, KT), stride=(1, vec, vec * P)))[
                None, t, None
            ]
            frag = cute.make_rmem_tensor(cute.make_layout((vec, U)), in_dtype)
            if cutlass.const_expr(N_OUTER > 0):
                for o in cutlass.range(N_OUTER, unroll=1):
                    for u in cutlass.range_constexpr(U):
                        cute.copy(atom, g_thr[None, o * U + u], frag[None, u])
                    m, s = _fold_frag(m, s, frag, U)
            if cutlass.const_expr(K_LEFT > 0):
                for u in cutlass.range_constexpr(K_LEFT):
                    cute.copy(atom, g_thr[None, N_OUTER * U + u], frag[None, u])
                m, s = _fold_frag(m, s, frag, K_LEFT)
            if cutlass.const_expr(REM > 0):
                if t < REM:
                    cute.copy(atom, g_thr[None, K], frag[None, 0])
                    m, s = _fold_frag(m, s, frag, 1)
        if cutlass.const_expr(TAIL > 0):
            if t < TAIL:
                m, s = _fold(m, s, [g_row[NV * vec + t].to(Float32)])

        # the target logit (a scalar load, usually an L2 hit by now) overlaps the merges below
        in_range = (tgt >= Int64(0)) & (tgt < Int64(n))
        tc = Int32(cutlass.min(cutlass.max(tgt, Int64(0)), Int64(n - 1)))
        xt = g_row[tc].to(Float32)

        m, s = _group(m, s, G)
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
            m, s = _group(m, s, min(W, 32))

        if (t == 0) & (row < m_rows):
            log_s = cute.math.log(s)
            lse_v = m + log_s
            # log(s) + (m - x_t): exact when x_t is the max, unlike (m + log s) - x_t
            lv = Float32(cutlass.select_(in_range, log_s + (m - xt), Float32(math.nan)))
            loss[row] = Float32(cutlass.select_(tgt == Int64(ignore_index), Float32(0.0), lv))
            lse[row] = lse_v

    @cute.jit
    def ce_fwd(x: cute.Tensor, target: cute.Tensor, loss: cute.Tensor, lse: cute.Tensor, stream):
        _kernel(x, target, loss, lse).launch(
            grid=(cute.ceil_div(x.shape[0], R), 1, 1), block=(T, 1, 1), stream=stream
        )

    return ce_fwd


def make_ce_bwd(in_dtype, n: int, vec: int, config: RowReduceConfig, ignore_index: int):
    """@cute.jit f(logits (M, n), target (M,) i64, lse (M,) f32, dloss (M,) f32,
    dlogits (M, n), stream): dlogits = (softmax - onehot) * dloss per row; rows whose
    target is ignore_index get zeros, rows whose target is outside [0, n) NaN."""
    _check(in_dtype, n, vec, config)
    p = _plan(n, vec, config)
    T, P, R = p["T"], p["P"], p["R"]
    NV, TAIL, K, REM, U, N_OUTER, K_LEFT = (p[k] for k in ("NV", "TAIL", "K", "REM", "U", "N_OUTER", "K_LEFT"))
    L = _LOG2E
    bits = vec * in_dtype.width

    @cute.jit
    def _grad(xv, j, ml, g, tgt):
        pv = cute.math.exp2(xv.to(Float32) * Float32(L) - ml, fastmath=True)
        one = Float32(cutlass.select_(j == tgt, Float32(1.0), Float32(0.0)))
        return ((pv - one) * g).to(in_dtype)

    @cute.kernel
    def _kernel(x: cute.Tensor, target: cute.Tensor, lse: cute.Tensor, gs: cute.Tensor, dx: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        r = tidx // P
        t = tidx % P
        row = bidx * R + r
        if row < x.shape[0]:
            g_row = x[row, None]
            d_row = dx[row, None]
            ml = lse[row] * Float32(L)
            tgt64 = target[row]
            in_range = (tgt64 >= Int64(0)) & (tgt64 < Int64(n))
            g = Float32(cutlass.select_(in_range, gs[row], Float32(math.nan)))
            g = Float32(cutlass.select_(tgt64 == Int64(ignore_index), Float32(0.0), g))
            # an out-of-range target matches no column (and its row is NaN through g)
            tgt = Int32(Int64(cutlass.select_(in_range, tgt64, Int64(-1))))
            if cutlass.const_expr(K + (1 if REM else 0) > 0):
                ld = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), in_dtype, num_bits_per_copy=bits)
                st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), in_dtype, num_bits_per_copy=bits)
                KT = K + (1 if REM else 0)
                lay = cute.make_layout((vec, P, KT), stride=(1, vec, vec * P))
                g_thr = cute.make_tensor(g_row.iterator, lay)[None, t, None]
                d_thr = cute.make_tensor(d_row.iterator, lay)[None, t, None]
                frag = cute.make_rmem_tensor(cute.make_layout((vec, U)), in_dtype)
                fout = cute.make_rmem_tensor(cute.make_layout((vec, U)), in_dtype)
                base = t * vec
                if cutlass.const_expr(N_OUTER > 0):
                    for o in cutlass.range(N_OUTER, unroll=1):
                        for u in cutlass.range_constexpr(U):
                            cute.copy(ld, g_thr[None, o * U + u], frag[None, u])
                        for u in cutlass.range_constexpr(U):
                            for v in cutlass.range_constexpr(vec):
                                fout[v, u] = _grad(frag[v, u], base + (o * U + u) * (P * vec) + v, ml, g, tgt)
                            cute.copy(st, fout[None, u], d_thr[None, o * U + u])
                if cutlass.const_expr(K_LEFT > 0):
                    for u in cutlass.range_constexpr(K_LEFT):
                        cute.copy(ld, g_thr[None, N_OUTER * U + u], frag[None, u])
                    for u in cutlass.range_constexpr(K_LEFT):
                        k = N_OUTER * U + u
                        for v in cutlass.range_constexpr(vec):
                            fout[v, u] = _grad(frag[v, u], base + k * (P * vec) + v, ml, g, tgt)
                        cute.copy(st, fout[None, u], d_thr[None, k])
                if cutlass.const_expr(REM > 0):
                    if t < REM:
                        cute.copy(ld, g_thr[None, K], frag[None, 0])
                        for v in cutlass.range_constexpr(vec):
                            fout[v, 0] = _grad(frag[v, 0], base + K * (P * vec) + v, ml, g, tgt)
                        cute.copy(st, fout[None, 0], d_thr[None, K])
            if cutlass.const_expr(TAIL > 0):
                if t < TAIL:
                    j = NV * vec + t
                    d_row[j] = _grad(g_row[j], j, ml, g, tgt)

    @cute.jit
    def ce_bwd(x: cute.Tensor, target: cute.Tensor, lse: cute.Tensor, gs: cute.Tensor, dx: cute.Tensor, stream):
        _kernel(x, target, lse, gs, dx).launch(
            grid=(cute.ceil_div(x.shape[0], R), 1, 1), block=(T, 1, 1), stream=stream
        )

    return ce_bwd
