"""The row-wide reductions of the norm kernels: sums over the threads and CTAs that share
a row, and LayerNorm's (sum, M2) statistics.

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
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .common import Tile


@cute.jit
def lane_sum(val, group: cutlass.Constexpr):
    """Sum of val over each aligned group of ``group`` lanes (a power of 2), handed to every
    lane of the group (butterfly)."""
    for step in cutlass.range_constexpr(int(math.log2(group))):
        val = val + cute.arch.shuffle_sync_bfly(val, offset=group >> (step + 1))
    return val


@cute.jit
def fold_partials(buf: cute.Tensor, base, lane, S: cutlass.Constexpr, G: cutlass.Constexpr):
    """The sum of the S partials buf[base .. base + S), on every one of the G lanes that
    share a row: lane ``lane`` adds partials lane, lane + G, ... (lanes past S add zeros),
    then a butterfly over the G lanes."""
    tot = Float32(0.0)
    for i in cutlass.range_constexpr((S + G - 1) // G):
        if cutlass.const_expr((i + 1) * G <= S):
            tot = tot + buf[base + lane + i * G]
        else:
            j = cutlass.min(lane + i * G, S - 1)
            tot = tot + Float32(cutlass.select_(lane + i * G < S, buf[base + j], Float32(0.0)))
    return lane_sum(tot, G)


def _mbarrier(mbar, slot):
    """mbarrier ``slot`` of the array at ``mbar``; slot None: ``mbar`` itself."""
    return mbar if slot is None else mbar + slot


@cute.jit
def send_to_cluster(a, b, nval: cutlass.Constexpr, buf: cute.Tensor, base_a, base_b, mbar, slot, t, cta,
                    W: cutlass.Constexpr, C: cutlass.Constexpr):
    """The warp's partial a (and, ``nval`` 2, b) into slot cta * W + warp of buf[base_a ..]
    (buf[base_b ..]) of every CTA of the cluster: lane l < C ``st.async``s them into CTA l,
    the bytes counted on CTA l's mbarrier ``slot`` of ``mbar`` (slot None: ``mbar``)."""
    words = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
    words[0] = a
    words[1] = b
    iw = cute.recast_tensor(words, Int32)
    mine = cta * W + t // 32
    if t % 32 < C:
        cute.arch.store_async_dsmem(buf.iterator + (base_a + mine), iw[0], _mbarrier(mbar, slot), t % 32)
        if cutlass.const_expr(nval > 1):
            cute.arch.store_async_dsmem(buf.iterator + (base_b + mine), iw[1], _mbarrier(mbar, slot), t % 32)


def make_allreduce(tile: Tile):
    """@cute.jit allreduce(a, b, buf, slot, r, t, cta) -> (sum a, sum b) over the row.

    ``nval`` (1 or 2, Constexpr) says whether b takes part. ``buf`` is a flat fp32
    smem tensor of n_slots * 2 * R * S elements (see ``reduce_smem_elems``); ``slot``
    may be dynamic. Must be reached by every thread of the CTA (and cluster).
    """
    G, W, S, C, R = tile.G, tile.W, tile.S, tile.C, tile.R

    @cute.jit
    def allreduce(a, b, nval: cutlass.Constexpr, buf: cute.Tensor, slot, r, t, cta):
        a = lane_sum(a, G)
        if cutlass.const_expr(nval > 1):
            b = lane_sum(b, G)
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
            a = lane_sum(a, G)
            if cutlass.const_expr(nval > 1):
                b = lane_sum(b2, G)
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
    def allreduce(a, buf: cute.Tensor, mbar, slot: cutlass.Constexpr, r, t, cta):
        a = lane_sum(a, G)
        base = (slot * R + r) * S
        one = cute.make_rmem_tensor(cute.make_layout((1,)), Float32)
        one[0] = a
        word = cute.recast_tensor(one, Int32)
        if t % 32 < C:  # lane l sends the warp's partial to CTA l
            cute.arch.store_async_dsmem(buf.iterator + (base + cta * W + t // 32), word[0], mbar + slot, t % 32)
        cute.arch.mbarrier_wait(mbar + slot, 0)
        return fold_partials(buf, base, t % G, S, G)

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
        send_to_cluster(s, m2, 2, buf, base_s, base_m2, mbar, None, t, cta, W, C)
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
    def allreduce(a, b, buf: cute.Tensor, mbar, slot, phase, arm, r, t, cta):
        if cutlass.const_expr(not moments):
            a = lane_sum(a, G)
            if cutlass.const_expr(nval > 1):
                b = lane_sum(b, G)
        bar = mbar + slot
        base_a = ((slot * nval) * R + r) * S
        base_b = base_a + R * S
        send_to_cluster(a, b, nval, buf, base_a, base_b, bar, None, t, cta, W, C)
        cute.arch.mbarrier_wait(bar, phase)
        if arm:
            cute.arch.mbarrier_arrive_and_expect_tx(bar, tx)
        lane = t % G
        if cutlass.const_expr(moments):
            a, b = fold_moments(buf, base_a, base_b, lane)
        else:
            a = fold_partials(buf, base_a, lane, S, G)
            if cutlass.const_expr(nval > 1):
                b = fold_partials(buf, base_b, lane, S, G)
        return a, b

    return allreduce


def make_moments_lagged(tile: Tile, merge: bool = False):
    """LayerNorm's moments exchange split in two, for the staged forward that finishes each
    row one row late (``NormConfig.lag``): @cute.jit send(s, m2, buf, mbar, slot, t,
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
        send_to_cluster(s, m2, 2, buf, base_s, base_s + S, mbar, slot, t, cta, W, C)

    @cute.jit
    def recv(buf: cute.Tensor, mbar, slot, phase, arm, t):
        cute.arch.mbarrier_wait(mbar + slot, phase)
        if arm:
            cute.arch.mbarrier_arrive_and_expect_tx(mbar + slot, tx)
        return fold(buf, 2 * slot * S, 2 * slot * S + S, t % 32)

    return send, recv


def make_chunk_allreduce(chunk: Tile, n: int, C: int, nval: int):
    """The row sums of a persistent kernel whose CTA holds a chunk of each row (``chunk``:
    that chunk over the CTA's threads, one row per CTA) of a row split over C CTAs:
    (reduce, tx, n_smem). ``reduce(a, b, buf, xbar, it, tidx, cta) -> (sum a, sum b)`` (a
    plain function, traced inline) for the CTA's it-th row: over the cluster through
    ``make_allreduce_mbar_rows`` (exchange mbarriers ``xbar``, slot it % 2, phase
    (it // 2) % 2, thread 0 re-arming), else over the CTA (``make_allreduce``, buffer slot
    it % 2); b takes part when ``nval`` is 2. ``tx``: the bytes each exchange mbarrier is
    armed with (0 without a cluster); ``n_smem``: the fp32 elements of ``buf``."""
    if C > 1:
        xtile = Tile(n, chunk.vec, chunk.T, C, chunk.T)  # the whole row over the cluster: the exchange's slots
        allreduce_m = make_allreduce_mbar_rows(xtile, nval)

        def reduce_cluster(a, b, buf: cute.Tensor, xbar, it, tidx, cta):
            return allreduce_m(a, b, buf, xbar, it % 2, (it // 2) % 2, tidx == 0, 0, tidx, cta)

        return reduce_cluster, nval * mbar_tx_bytes(xtile), reduce_smem_elems(xtile, 2)
    allreduce = make_allreduce(chunk)

    def reduce_cta(a, b, buf: cute.Tensor, xbar, it, tidx, cta):
        return allreduce(a, b, nval, buf, it % 2, 0, tidx, 0)

    return reduce_cta, 0, reduce_smem_elems(chunk, 2)
