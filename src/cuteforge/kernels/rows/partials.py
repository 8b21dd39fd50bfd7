"""A row's partial results over the warps that share it and the CTAs of its cluster
(device code, traced inline). The lanes of a warp have combined their values already;
each warp then posts its partial (a value, or a pair such as (max, sum) or (value,
index)) into slot ``cta * W + warp`` of row r of an (R, S) shared-memory buffer of every
CTA of the row, S = W * C slots a row, and every lane folds the slots it reads with the
family's own merge."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


def make_post_partials(pair: bool, W: int, G: int, C: int, S: int):
    """@cute.jit post(a, b, s_a, s_b, r, t, cta): lane 0 of each of the row's G-lane groups
    writes a (and, with ``pair``, b) into slot cta * W + warp of row r of s_a (s_b) in
    every CTA of the cluster (DSMEM stores, between the cluster barrier's waits), or of
    its own CTA (C = 1, then a CTA barrier). t: the thread in the row, r: its row."""

    @cute.jit
    def post(a, b, s_a: cute.Tensor, s_b: cute.Tensor, r, t, cta):
        slot = cta * W + t // 32
        writer = t % G == 0
        if cutlass.const_expr(C > 1):
            cute.arch.cluster_wait()  # all peers resident before DSMEM stores
            if writer:
                off = r * S + slot
                for peer in cutlass.range_constexpr(C):
                    # st.shared::cluster into the peer CTA's buffer
                    cute.arch.map_dsmem_ptr(s_a.iterator + off, peer).store(a)
                    if cutlass.const_expr(pair):
                        cute.arch.map_dsmem_ptr(s_b.iterator + off, peer).store(b)
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        else:
            if writer:
                s_a[r, slot] = a
                if cutlass.const_expr(pair):
                    s_b[r, slot] = b
            cute.arch.sync_threads()

    return post


def make_fold_partials(merge, pair: bool, S: int, G: int, a_type, a_start, b_type, b_start):
    """@cute.jit fold(s_a, s_b, r, lane) -> (a, b): the S posted slots of row r merged by
    lane ``lane`` (< G) of the row's lane group: slots lane, lane + G, ..., each through
    ``merge(a, b, slot_a, slot_b) -> (a, b)``, from (a_type(a_start), b_type(b_start)),
    which slots past S stand in for. Without ``pair`` only s_a is read (b passes through
    merge as it is)."""

    @cute.jit
    def fold(s_a: cute.Tensor, s_b: cute.Tensor, r, lane):
        a = a_type(a_start)
        b = b_type(b_start)
        for i in cutlass.range_constexpr((S + G - 1) // G):
            if cutlass.const_expr((i + 1) * G <= S):
                j = lane + i * G
                ob = b
                if cutlass.const_expr(pair):
                    ob = s_b[r, j]
                a, b = merge(a, b, s_a[r, j], ob)
            else:
                j = cutlass.min(lane + i * G, S - 1)
                ok = lane + i * G < S
                oa = a_type(cutlass.select_(ok, s_a[r, j], a_type(a_start)))
                ob = b
                if cutlass.const_expr(pair):
                    ob = b_type(cutlass.select_(ok, s_b[r, j], b_type(b_start)))
                a, b = merge(a, b, oa, ob)
        return a, b

    return fold
