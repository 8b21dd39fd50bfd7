"""The sm_90a GEMM device code: D = epilogue(A @ B) over a batch, on Hopper.

Structure (one persistent CTA per SM slot, `1 + consumer_wgs` warpgroups):
- warpgroup 0, warp 0 (producer): walks the tile schedule and streams A/B k-blocks
  with TMA into a `stages`-deep shared-memory ring guarded by mbarriers
  (`PipelineTmaAsync`: full barriers count TMA bytes, empty barriers count consumer
  warps of every CTA that received the multicast). It gives up registers (setmaxnreg).
- consumer warpgroups (cooperative: both on one tile, split along M; pingpong: each
  owns alternate tiles and the two take turns in the mainloop, handing over through
  named barriers, so one's epilogue overlaps the other's MMA): same schedule; WGMMA
  from shared memory into fp32 registers
  (one wgmma batch in flight while the next stage's barrier is awaited), then the
  epilogue: per (epi_m x epi_n) subtile, copy the accumulator fragment, apply the fused
  elementwise epilogue in fp32, convert, st.matrix into a staged smem buffer, one
  thread issues the TMA store. The producer already fills the ring for the next tile
  while the consumers run the epilogue. With `cfg.store_overlap` (cooperative, 16-bit
  out) the converted tile stays in registers instead, and its subtiles are stored one
  per k-block under the next tile's first wgmma batches (the first n_epi k-blocks of
  every mainloop are unrolled for it; the last tile's are stored after the loop).
- schedule: the linear cluster order of `StaticPersistentTileScheduler` over (M-tiles,
  N-tiles, L), grouped ("swizzled") rasterization so a band of A and B stays in L2;
  cluster c runs tiles c, c + clusters, ... Each cluster walks its work as a sequence
  of segments (tile, first k-block, end k-block); without stream-K every segment is a
  whole tile.
- stream-K (`cfg.stream_k`): a last wave of tiles at most half full is instead cut
  along K into equal runs of k-blocks, s per tile on consecutive clusters (`sk_plan`,
  mirrored by `config.stream_k_split`), after every cluster's whole tiles. A run that starts
  inside a tile is its cluster's first stream-K segment: it stores its fp32 partial
  sums to the workspace and raises a flag. The run that holds a tile's first k-block
  (always its cluster's last segment) waits for those flags, adds the partials and
  runs the epilogue. A flag is raised after whole tiles and one run only, neither of
  which waits on anything, so no cycle of waits can form (all clusters are resident:
  the grid is one persistent wave). With `cfg.stream_k_ends` a fuller last wave is cut
  too (`config.stream_k_ends_len`): each tile's owner runs its first k-blocks, and the
  clusters that wave leaves idle run the tiles' ends, each end published into the slot
  of its tile after whole tiles and other ends, none of which wait; the owner adds that
  one partial (the 16-bit default where the ends are long). The flags come
  first in the workspace, one per SM for every config (`config.stream_k_flag_words`):
  configs share a stream's workspace.

fp8 (`scaled`): A and B are e4m3/e5m2 (K-major only, 128-deep k-blocks, wgmma k32) and
the accumulator is multiplied by scale_a[0] * scale_b[0] (read once per CTA) before the
epilogue hook.

Gated (`gate_fn`, e.g. SwiGLU's silu(gate) * up): B is two K-major weights of N rows
each; every B stage holds tile_n / 2 rows of the gate weight, then as many of the up
weight (two TMA copies into halves of the stage), so the accumulator's left half is the
gate and its right half the up of the same tile_n / 2 output columns. The schedule tiles
the (M, N) output by (tile_m, tile_n / 2); the epilogue pairs subtile j of the left half
with subtile j of the right, stores gate_fn of the two, and neither half reaches memory.

Out-of-range rows/columns/K need no code: TMA loads zero-fill outside the tensor and
TMA stores clip, so M, N, K need not be multiples of the tile.

The epilogue hook: `epi_fn(acc, *operands) -> value` on fp32 TensorSSA fragments, where
each operand is brought into registers in the accumulator's thread-value layout from a
tensor of kind "row" (M,), "col" (N,) or "full" (M, N, L), unconverted until used; a
tile's row / col operands while its mainloop runs (`cfg.early_operands`), the others one
subtile ahead. A preset string or a `cuteforge.fusion.Epilogue.apply` plugs in the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from .config import (
    SK_END_COST,
    SK_MAX_SPLIT,
    SK_MIN_ITERS,
    GemmConfig,
    stream_k_flag_words,
)

WG = 128  # threads per warpgroup
SK_LOAD_CHUNK = 32  # partial sums loaded ahead of their adds (registers: acc + this)
PRODUCER_REGS = 40
CONSUMER_REGS = 232


class Sm90Gemm:
    """Trace-time object: static choices (dtypes, majors, config) live on `self`."""

    def __init__(
        self,
        cfg: GemmConfig,
        stages: int,
        a_k_major: bool,
        b_k_major: bool,
        operand_kinds: tuple[str, ...],
        epi_fn: Callable[..., Any] | None,
        max_clusters: int,
        scaled: bool = False,
        *,
        sms: int,
        gate_fn: Callable[..., Any] | None = None,
    ) -> None:
        self.cfg = cfg
        # gate_fn(gate, up) (e.g. silu(gate) * up): B is two (N, K) weights, gate and up,
        # each filling half of every B tile, and the output tile is half the MMA's width.
        self.gate_fn = gate_fn
        self.gated = gate_fn is not None
        self.scaled = scaled  # fp8: acc * scale_a[0] * scale_b[0] before the epilogue
        self.stages = stages
        self.a_layout = LayoutEnum.ROW_MAJOR if a_k_major else LayoutEnum.COL_MAJOR
        self.b_layout = LayoutEnum.ROW_MAJOR if b_k_major else LayoutEnum.COL_MAJOR
        self.c_layout = LayoutEnum.ROW_MAJOR
        self.kinds = operand_kinds
        # Row / col operands (a bias) of a whole tile are loaded while its mainloop runs
        # (`cfg.early_operands`); the rest, full tiles (C, a residual), one subtile ahead.
        vector = tuple(k in ("row", "col") for k in operand_kinds)
        self.early = vector if cfg.loads_operands_early else (False,) * len(operand_kinds)
        self.epi_fn = epi_fn
        self.max_clusters = max_clusters
        self.tile = (cfg.tile_m, cfg.tile_n, cfg.tile_k)
        self.out_tile = (cfg.tile_m, cfg.tile_n // 2 if self.gated else cfg.tile_n)
        self.cluster = (cfg.cluster_m, cfg.cluster_n)
        self.n_consumers = cfg.consumer_wgs
        self.mma_wgs = cfg.mma_wgs
        self.pingpong = cfg.pingpong
        self.threads = WG * (1 + self.n_consumers)
        self.epi_tile = (cfg.epi_tile()[0], min(cfg.epi_n, self.out_tile[1]))
        # Named barriers: 0 is __syncthreads; 1 (+1 for the second pingpong warpgroup) the
        # epilogue's; 3 and 4 hand the mainloop turn between pingpong warpgroups.
        self.epi_threads = WG * self.mma_wgs
        # Stream-K workspace (int32 words): a flag per SM (any CTA slot), then fp32 partial tiles.
        self.cluster_size = cfg.cluster_m * cfg.cluster_n
        self.flag_words = stream_k_flag_words(sms)
        self.slot_words = cfg.tile_m * cfg.tile_n

    # ---- host side -----------------------------------------------------------------------
    @cute.jit
    def __call__(
        self, mA: cute.Tensor, mB: cute.Tensor, mD: cute.Tensor, work: cute.Tensor, sa: Any, sb: Any, e0: Any, e1: Any,
        e2: Any, mB_up: Any, stream: Any,
    ) -> None:
        """mA (M, K, L), mB (N, K, L), mD (M, N, L); work: int32 stream-K workspace (flags
        zero at launch, left zero; shorter than the split needs means whole tiles only);
        sa/sb: fp32 per-tensor scales (1,) or None; e*: epilogue operands or None. fp8 A
        and B may differ (e4m3 x e5m2). Gated: mB is the gate weight and mB_up (N, K, L)
        the up weight, both K-major; otherwise mB_up is None."""
        self.ab_dtype = mA.element_type
        self.b_dtype = mB.element_type
        self.d_dtype = mD.element_type
        # Held converted tiles cost tile_m * tile_n / (2 * threads) registers at 16 bits;
        # pingpong already runs its epilogue under the other warpgroup's mainloop.
        self.overlap = self.cfg.holds_stores(self.d_dtype.width // 8)
        self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.ab_dtype,
            self.b_dtype,
            self.a_layout.sm90_mma_major_mode(),
            self.b_layout.sm90_mma_major_mode(),
            cutlass.Float32,
            (self.mma_wgs, 1, 1),
            tiler_mn=(64, self.cfg.tile_n),
        )
        a_layout = sm90_utils.make_smem_layout_a(self.a_layout, self.tile, self.ab_dtype, self.stages)
        b_layout = sm90_utils.make_smem_layout_b(self.b_layout, self.tile, self.b_dtype, self.stages)
        epi_stages = self.cfg.epi_stages(self.d_dtype.width // 8) * self.cfg.epi_groups
        d_layout = sm90_utils.make_smem_layout_epi(self.d_dtype, self.c_layout, self.epi_tile, epi_stages)

        # A is shared by the CTAs of a cluster row (same M, different N): multicast along N.
        a_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if self.cluster[1] > 1 else cpasync.CopyBulkTensorTileG2SOp()
        b_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if self.cluster[0] > 1 else cpasync.CopyBulkTensorTileG2SOp()
        tma_a, tA = cpasync.make_tiled_tma_atom(
            a_op, mA, cute.slice_(a_layout, (None, None, 0)), (self.tile[0], self.tile[2]), num_multicast=self.cluster[1]
        )
        # Gated: each B stage is two half-tiles (gate rows, then up rows), one TMA copy each.
        # A k-block is one 128-byte swizzle row, so a K-major stage is its rows in order and
        # half-stages 2s and 2s + 1 of a ring twice as deep are exactly stage s's halves.
        bh_layout = None
        tma_b_up, tB_up = None, None
        if cutlass.const_expr(self.gated):
            half = (self.tile[0], self.out_tile[1], self.tile[2])
            bh_layout = sm90_utils.make_smem_layout_b(self.b_layout, half, self.b_dtype, 2 * self.stages)
            tma_b, tB = cpasync.make_tiled_tma_atom(
                b_op, mB, cute.slice_(bh_layout, (None, None, 0)), (half[1], half[2]), num_multicast=self.cluster[0]
            )
            tma_b_up, tB_up = cpasync.make_tiled_tma_atom(
                b_op, mB_up, cute.slice_(bh_layout, (None, None, 0)), (half[1], half[2]), num_multicast=self.cluster[0]
            )
        else:
            tma_b, tB = cpasync.make_tiled_tma_atom(
                b_op, mB, cute.slice_(b_layout, (None, None, 0)), (self.tile[1], self.tile[2]), num_multicast=self.cluster[0]
            )
        tma_d, tD = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mD, cute.slice_(d_layout, (None, None, 0)), self.epi_tile
        )

        tiles_mnl = cute.zipped_divide(mD, tiler=self.out_tile)[(0, (None, None, None))].shape
        sched = utils.PersistentTileSchedulerParams(
            tiles_mnl, (*self.cluster, 1), self.cfg.swizzle, self.cfg.raster == "m"
        )
        if cutlass.const_expr(self.cfg.stream_k):
            # every cluster slot, even when there are fewer tiles: they share the k-blocks
            grid = (*self.cluster, self.max_clusters)
        else:
            grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, self.max_clusters)

        @cute.struct
        class Storage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(a_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.b_dtype, cute.cosize(b_layout)], 1024]
            sD: cute.struct.Align[cute.struct.MemRange[self.d_dtype, cute.cosize(d_layout)], 1024]

        self.storage = Storage
        self.kernel(
            self.tiled_mma, tma_a, tA, tma_b, tB, tma_d, tD, mD, work, sa, sb, e0, e1, e2, a_layout, b_layout, d_layout,
            sched, tma_b_up, tB_up, bh_layout,
        ).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(*self.cluster, 1), min_blocks_per_mp=1, stream=stream
        )

    # ---- device side ---------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        tiled_mma: cute.TiledMma,
        tma_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_b: cute.CopyAtom,
        mB: cute.Tensor,
        tma_d: cute.CopyAtom,
        mD_tma: cute.Tensor,
        mD: cute.Tensor,
        work: cute.Tensor,
        sa: Any,
        sb: Any,
        e0: Any,
        e1: Any,
        e2: Any,
        a_layout: cute.ComposedLayout,
        b_layout: cute.ComposedLayout,
        d_layout: cute.ComposedLayout,
        sched_params: utils.PersistentTileSchedulerParams,
        tma_b_up: Any,
        mB_up: Any,
        bh_layout: Any,
    ) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // WG)
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            if cutlass.const_expr(self.gated):
                cpasync.prefetch_descriptor(tma_b_up)
            cpasync.prefetch_descriptor(tma_d)

        cta_layout = cute.make_layout((*self.cluster, 1))
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord = cta_layout.get_flat_coord(rank)
        a_mask = cute.make_layout_image_mask(cta_layout, cluster_coord, mode=1) if self.cluster[1] > 1 else 0
        b_mask = cute.make_layout_image_mask(cta_layout, cluster_coord, mode=0) if self.cluster[0] > 1 else 0

        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        stage_bytes = cute.size_in_bytes(self.ab_dtype, cute.slice_(a_layout, (None, None, 0))) + cute.size_in_bytes(
            self.b_dtype, cute.slice_(b_layout, (None, None, 0))
        )
        # Every consumer warp of every CTA that a stage was multicast into releases it.
        n_mcast = self.cluster[0] + self.cluster[1] - 1
        ab_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.ab_barriers.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, n_mcast * self.mma_wgs * 4),
            tx_count=stage_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout.shape)),
            defer_sync=True,
        )
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.cluster, is_relaxed=True)

        sA = st.sA.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        sB = st.sB.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        sD = st.sD.get_tensor(d_layout.outer, swizzle=d_layout.inner)

        # (bM, bK, tiles_m, tiles_k, L) etc.
        gA = cute.local_tile(mA, cute.slice_(self.tile, (None, 0, None)), (None, None, None))
        b_tile = (self.out_tile[1], self.tile[2])  # gated: a half-tile of each weight
        gB = cute.local_tile(mB, b_tile, (None, None, None))
        gD = cute.local_tile(mD_tma, self.out_tile, (None, None, None))
        tAsA, tAgA = cpasync.tma_partition(
            tma_a,
            cluster_coord[1],
            cute.make_layout(cute.slice_(cta_layout, (0, None, 0)).shape),
            cute.group_modes(sA, 0, 2),
            cute.group_modes(gA, 0, 2),
        )
        # the TMA's view of the B ring: gated, the half-stages of `bh_layout`
        sB_tma = sB
        if cutlass.const_expr(self.gated):
            sB_tma = st.sB.get_tensor(bh_layout.outer, swizzle=bh_layout.inner)

        def partition_b(tma: cute.CopyAtom, g: cute.Tensor) -> tuple[cute.Tensor, cute.Tensor]:
            cta_m = cute.make_layout(cute.slice_(cta_layout, (None, 0, 0)).shape)  # B multicast along M
            return cpasync.tma_partition(tma, cluster_coord[0], cta_m, cute.group_modes(sB_tma, 0, 2),
                                         cute.group_modes(g, 0, 2))

        tBsB, tBgB = partition_b(tma_b, gB)
        tBgB_up = None
        if cutlass.const_expr(self.gated):
            _, tBgB_up = partition_b(tma_b_up, cute.local_tile(mB_up, b_tile, (None, None, None)))
        k_tiles = cute.size(gA, mode=[3])

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster)

        if wg == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                self.produce(ab_pipe, sched_params, tma_a, tAsA, tAgA, a_mask, tma_b, tBsB, tBgB, b_mask, k_tiles, work,
                             tma_b_up, tBgB_up)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            self.consume(
                tiled_mma, ab_pipe, sched_params, sA, sB, sD, gD, tma_d, mD, work, sa, sb, e0, e1, e2, tidx - WG, warp, rank,
                k_tiles,
            )

    # ---- the schedule: segments of (tile, first k-block, end k-block) ---------------------
    @cute.jit
    def sk_plan(self, sched, k_tiles, work):  # noqa: ANN001, ANN201
        """This cluster's share of the work (device mirror of `config.stream_k_split` and
        `config.stream_k_ends_len`): (worker, workers, dp_tiles, n_dp, sk_begin, v_end,
        base, extra, sk, ends). Tiles below `dp_tiles` run whole, `n_dp` of them here (this
        worker + i * workers); the k-blocks of the rest, numbered tile by tile, are cut
        into runs of `base` (+1 for the first `extra` workers), this worker's starting at
        `sk_begin`; `v_end` counts the k-blocks this cluster runs in all. `sk`: the tiles
        cut; `ends` > 0 (`cfg.stream_k_ends`): they are instead cut at k_tiles - ends, see
        `segment`."""
        workers = sched.num_persistent_clusters
        worker = cute.arch.block_idx()[2]  # the cluster's index: grid (cm, cn, clusters)
        tiles = cute.size(sched.params.problem_layout_ncluster_mnl)
        sk = cutlass.Int32(0)
        w = cutlass.Int32(1)
        ends = cutlass.Int32(0)
        if cutlass.const_expr(self.cfg.stream_k):
            rem = tiles % workers
            if rem > 0:
                split = cutlass.min(cutlass.min(workers // rem, k_tiles // SK_MIN_ITERS), SK_MAX_SPLIT)
                # the workspace must hold a partial tile per CTA of the sharing clusters
                need = self.flag_words + split * rem * self.cluster_size * self.slot_words
                if (split >= 2) & (cute.size(work) >= need):
                    sk = rem
                    w = split * rem
                if cutlass.const_expr(self.cfg.stream_k_ends):
                    if split < 2:
                        per_idle = (rem + workers - rem - 1) // (workers - rem)
                        e = (k_tiles - (per_idle - 1) * SK_END_COST) // (per_idle + 1)
                        # one partial tile per CTA of each cut tile
                        need_e = self.flag_words + rem * self.cluster_size * self.slot_words
                        if (per_idle <= SK_MAX_SPLIT) & (e >= SK_MIN_ITERS) & (cute.size(work) >= need_e):
                            sk = rem
                            ends = e
        dp_tiles = tiles - sk
        n_dp = cutlass.Int32(0)
        if worker < dp_tiles:
            n_dp = (dp_tiles - worker + workers - 1) // workers
        total = sk * k_tiles
        base = total // w
        extra = total % w
        sk_begin = worker * base + cutlass.min(worker, extra)
        sk_len = cutlass.Int32(0)
        if worker < w:
            sk_len = base + cutlass.Int32(cutlass.select_(worker < extra, 1, 0))
        if cutlass.const_expr(self.cfg.stream_k_ends):
            if ends > 0:
                if worker < sk:
                    sk_len = k_tiles - ends  # the owner: its tile's first k-blocks
                else:
                    idle = workers - sk  # idle cluster i: the ends of tiles i, i + idle, ...
                    sk_len = ((sk - (worker - sk) + idle - 1) // idle) * ends
        v_end = n_dp * k_tiles + sk_len
        return worker, workers, dp_tiles, n_dp, sk_begin, v_end, base, extra, sk, ends

    @cute.jit
    def segment(self, v, k_tiles, worker, workers, dp_tiles, n_dp, sk_begin, v_end, sk, ends):  # noqa: ANN001, ANN201
        """(linear tile index, first k-block, end k-block) of this cluster's k-block `v`.
        With `ends` > 0 the cut tiles are dp_tiles + t: owner t (< sk) runs k-blocks [0,
        k_tiles - ends) of tile t, idle cluster i = worker - sk the ends [k_tiles - ends,
        k_tiles) of tiles i, i + idle, ... in turn."""
        tile = cutlass.Int32(0)
        kb = cutlass.Int32(0)
        ke = k_tiles
        if cutlass.const_expr(self.cfg.stream_k):
            dp_iters = n_dp * k_tiles
            if v < dp_iters:
                tile = worker + (v // k_tiles) * workers
            else:
                g = sk_begin + (v - dp_iters)
                t = g // k_tiles
                kb = g - t * k_tiles
                ke = cutlass.min(k_tiles, kb + (v_end - v))
                tile = dp_tiles + t
                if cutlass.const_expr(self.cfg.stream_k_ends):
                    if ends > 0:
                        if worker < sk:
                            tile = dp_tiles + worker
                            kb = cutlass.Int32(0)
                            ke = k_tiles - ends
                        else:
                            idle = workers - sk
                            tile = dp_tiles + (worker - sk) + ((v - dp_iters) // ends) * idle
                            kb = k_tiles - ends
                            ke = k_tiles
        else:
            tile = worker + (v // k_tiles) * workers
        return tile, kb, ke

    @cute.jit
    def produce(self, ab_pipe, sched_params, tma_a, tAsA, tAgA, a_mask, tma_b, tBsB, tBgB, b_mask, k_tiles, work,  # noqa: ANN001
                tma_b_up, tBgB_up) -> None:
        sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        worker, workers, dp_tiles, n_dp, sk_begin, v_end, _, _, sk, ends = self.sk_plan(sched, k_tiles, work)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        v = cutlass.Int32(0)
        while v < v_end:
            tile, kb, ke = self.segment(v, k_tiles, worker, workers, dp_tiles, n_dp, sk_begin, v_end, sk, ends)
            m, n, batch = sched._get_current_work_for_linear_idx(tile).tile_idx
            a_tiles = tAgA[(None, m, None, batch)]
            b_tiles = tBgB[(None, n, None, batch)]
            for k in cutlass.range(ke - kb, unroll=1):
                ab_pipe.producer_acquire(state)
                bar = ab_pipe.producer_get_barrier(state)
                cute.copy(tma_a, a_tiles[(None, kb + k)], tAsA[(None, state.index)], tma_bar_ptr=bar, mcast_mask=a_mask)
                if cutlass.const_expr(self.gated):
                    up_tiles = tBgB_up[(None, n, None, batch)]
                    cute.copy(tma_b, b_tiles[(None, kb + k)], tBsB[(None, 2 * state.index)], tma_bar_ptr=bar,
                              mcast_mask=b_mask)
                    cute.copy(tma_b_up, up_tiles[(None, kb + k)], tBsB[(None, 2 * state.index + 1)], tma_bar_ptr=bar,
                              mcast_mask=b_mask)
                else:
                    cute.copy(tma_b, b_tiles[(None, kb + k)], tBsB[(None, state.index)], tma_bar_ptr=bar, mcast_mask=b_mask)
                ab_pipe.producer_commit(state)
                state.advance()
            v += ke - kb
        ab_pipe.producer_tail(state)

    @cute.jit
    def consume(self, tiled_mma, ab_pipe, sched_params, sA, sB, sD, gD, tma_d, mD, work, sa, sb, e0, e1, e2, ctidx, warp, rank,  # noqa: ANN001
                k_tiles) -> None:
        # grp: which epilogue group (pingpong warpgroup) this thread belongs to.
        grp = cutlass.Int32(0)
        if cutlass.const_expr(self.pingpong):
            grp = cute.arch.make_warp_uniform(ctidx // WG)
        mtidx = ctidx - grp * WG if self.pingpong else ctidx
        epi_bar = pipeline.NamedBarrier(barrier_id=1 + grp if self.pingpong else 1, num_threads=self.epi_threads)
        thr_mma = tiled_mma.get_slice(mtidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc_shape = thr_mma.partition_C(gD).shape[:3]
        if cutlass.const_expr(self.gated):  # gD's tiles are the output's, half the MMA's width
            acc_shape = thr_mma.partition_C(cute.make_identity_tensor(self.tile[:2])).shape
        acc = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
        k_blocks = cute.size(tCrA, mode=[2])

        # Epilogue: registers -> smem with st.matrix (16-bit) or plain stores (fp32).
        store_atom = sm90_utils.get_smem_store_op(self.c_layout, self.d_dtype, cutlass.Float32)
        c_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), cutlass.Float16)  # source layout only
        r2s = cute.make_tiled_copy_S(store_atom, cute.make_tiled_copy_C_atom(c_atom, tiled_mma))
        thr_r2s = r2s.get_slice(mtidx)
        tRS_sD = thr_r2s.partition_D(sD)
        tRS_acc = r2s.retile(acc)
        # Coordinates (within one epilogue subtile) of each value a thread holds.
        tRS_cD = thr_r2s.partition_S(cute.make_identity_tensor(self.epi_tile))
        frag_shape = tRS_cD.shape
        rD = cute.make_rmem_tensor(frag_shape, cutlass.Float32)
        rOut = cute.make_rmem_tensor(frag_shape, self.d_dtype)
        n_bufs = cute.size(tRS_sD, mode=[3]) // self.cfg.epi_groups  # staging buffers per group
        # Bulk-store groups are per thread: each group's store warp tracks its own buffers.
        store_pipe = pipeline.PipelineTmaStore.create(
            num_stages=n_bufs,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.epi_threads),
        )
        store_warp = 4 + 4 * grp  # the group's first warp issues its TMA stores
        # Per-tensor dequantization scales (fp8): one product, read once per CTA.
        scale = cutlass.Float32(1.0)
        if cutlass.const_expr(self.scaled):
            scale = sa[0] * sb[0]

        sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        worker, workers, dp_tiles, n_dp, sk_begin, v_end, base, extra, sk, ends = self.sk_plan(sched, k_tiles, work)
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        v = cutlass.Int32(0)
        if cutlass.const_expr(self.pingpong):
            # Tiles alternate between the warpgroups: the second starts one tile (and that
            # tile's k-blocks in the ring) later; the first may start its mainloop at once.
            if grp == 1:
                v += k_tiles
                read.advance(cutlass.Int32(k_tiles))
                release.advance(cutlass.Int32(k_tiles))
            else:
                cute.arch.barrier_arrive(barrier_id=3, number_of_threads=2 * WG)
        tiles_done = cutlass.Int32(0)  # tiles stored: the staging buffers rotate with it
        # store_overlap: the last tile's converted subtiles, stored under the next mainloop.
        n_epi = (self.out_tile[0] // self.epi_tile[0]) * (self.out_tile[1] // self.epi_tile[1])
        held = [cute.make_rmem_tensor(frag_shape, self.d_dtype) for _ in range(n_epi if self.overlap else 0)]
        pending = cutlass.Int32(0)  # 1 while `held` waits for its stores
        held_m = cutlass.Int32(0)
        held_n = cutlass.Int32(0)
        held_l = cutlass.Int32(0)
        # the subtiles' order, as the epilogue walks them
        epi_grid = (self.out_tile[0] // self.epi_tile[0], self.out_tile[1] // self.epi_tile[1])
        epi_order = cute.make_layout(epi_grid, stride=(epi_grid[1], 1))
        while v < v_end:
            tile, kb, ke = self.segment(v, k_tiles, worker, workers, dp_tiles, n_dp, sk_begin, v_end, sk, ends)
            tile_m, tile_n, tile_l = sched._get_current_work_for_linear_idx(tile).tile_idx
            early = []  # per subtile, the operands loaded while the mainloop runs
            if cutlass.const_expr(self.epi_fn is not None and any(self.early) and not self.overlap):
                early = self.tile_operands(mD, tRS_cD, epi_order, tile_m, tile_n, tile_l, e0, e1, e2)
            # ---- mainloop: keep one wgmma batch in flight ----
            acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            if cutlass.const_expr(self.pingpong):
                cute.arch.barrier(barrier_id=3 + grp, number_of_threads=2 * WG)  # our turn
            k_first = 0
            if cutlass.const_expr(self.overlap):
                # The first n_epi k-blocks, unrolled (a subtile's registers need a static
                # index): each stores one subtile of the held tile while its wgmma batch
                # runs. A segment shorter than n_epi k-blocks still stores them all.
                for e in cutlass.range_constexpr(n_epi):
                    if e < ke - kb:
                        ab_pipe.consumer_wait(read)
                        self.mma_batch(tiled_mma, acc, tCrA, tCrB, read.index, k_blocks)
                    if pending > 0:
                        self.store_subtile(held[e], e, held_m, held_n, held_l, tiles_done, n_bufs, grp, warp, store_warp, r2s,
                                           tRS_sD, sD, tma_d, gD, store_pipe, epi_bar)
                    if e < ke - kb:
                        warpgroup.wait_group(1)
                        if cutlass.const_expr(e > 0):
                            ab_pipe.consumer_release(release)
                            release.advance()
                        read.advance()
                if pending > 0:
                    tiles_done += 1
                pending = cutlass.Int32(0)
                k_first = n_epi
                # after the held tile is out: its registers are free for the operands
                if cutlass.const_expr(self.epi_fn is not None and any(self.early)):
                    early = self.tile_operands(mD, tRS_cD, epi_order, tile_m, tile_n, tile_l, e0, e1, e2)
            for k in cutlass.range(k_first, ke - kb, unroll=1):
                ab_pipe.consumer_wait(read)
                self.mma_batch(tiled_mma, acc, tCrA, tCrB, read.index, k_blocks)
                warpgroup.wait_group(1)
                if k > 0:
                    ab_pipe.consumer_release(release)
                    release.advance()
                read.advance()
            if cutlass.const_expr(self.pingpong):
                cute.arch.barrier_arrive(barrier_id=4 - grp, number_of_threads=2 * WG)  # their turn
            if cutlass.const_expr(self.cfg.stream_k):
                warpgroup.wait_group(0)
                ab_pipe.consumer_release(release)
                release.advance()
                if kb > 0:
                    # a run that starts inside the tile: hand its partial sums to the owner
                    # (an end of a cut tile: in its tile's slot, one cluster runs several)
                    slot = worker * self.cluster_size + rank
                    if cutlass.const_expr(self.cfg.stream_k_ends):
                        if ends > 0:
                            slot = (tile - dp_tiles) * self.cluster_size + rank
                    self.publish(acc, work, slot, ctidx, epi_bar)
                else:
                    if ke < k_tiles:
                        if cutlass.const_expr(self.cfg.stream_k_ends):
                            if ends > 0:
                                self.add_partial(acc, work, (tile - dp_tiles) * self.cluster_size + rank, ctidx, epi_bar)
                            else:
                                self.fixup(acc, work, worker, rank, ke, base, extra, k_tiles, ctidx, epi_bar)
                        else:
                            self.fixup(acc, work, worker, rank, ke, base, extra, k_tiles, ctidx, epi_bar)
                    self.epilogue(
                        acc, tRS_acc, rD, rOut, r2s, sD, tRS_sD, tRS_cD, tma_d, gD, mD, e0, e1, e2, store_pipe, epi_bar, scale,
                        tile_m, tile_n, tile_l, tiles_done, n_bufs, grp, warp, store_warp, ab_pipe, release,
                        False, held, early,
                    )
                    if cutlass.const_expr(self.overlap):
                        pending = cutlass.Int32(1)
                        held_m, held_n, held_l = tile_m, tile_n, tile_l
                    else:
                        tiles_done += 1
            else:
                self.epilogue(
                    acc, tRS_acc, rD, rOut, r2s, sD, tRS_sD, tRS_cD, tma_d, gD, mD, e0, e1, e2, store_pipe, epi_bar, scale,
                    tile_m, tile_n, tile_l, tiles_done, n_bufs, grp, warp, store_warp, ab_pipe, release, True, held,
                    early,
                )
                if cutlass.const_expr(self.overlap):
                    pending = cutlass.Int32(1)
                    held_m, held_n, held_l = tile_m, tile_n, tile_l
                else:
                    tiles_done += 1
            if cutlass.const_expr(self.pingpong):
                # Skip the other warpgroup's next tile and its k-blocks in the ring.
                v += k_tiles
                read.advance(cutlass.Int32(k_tiles))
                release.advance(cutlass.Int32(k_tiles))
            v += ke - kb
        if cutlass.const_expr(self.overlap):
            if pending > 0:  # the last tile's subtiles
                for e in cutlass.range_constexpr(n_epi):
                    self.store_subtile(held[e], e, held_m, held_n, held_l, tiles_done, n_bufs, grp, warp, store_warp, r2s,
                                       tRS_sD, sD, tma_d, gD, store_pipe, epi_bar)
        store_pipe.producer_tail()

    @cute.jit
    def mma_batch(self, tiled_mma, acc, tCrA, tCrB, stage, k_blocks) -> None:  # noqa: ANN001
        """Issue one ring stage's wgmma batch into `acc` and commit it."""
        # Order this batch after the register writes before it (fill, previous batch):
        # without the fence ptxas injects its own and serializes wgmma.
        warpgroup.fence()
        for kblk in cutlass.range_constexpr(k_blocks):
            coord = (None, None, kblk, stage)
            cute.gemm(tiled_mma, acc, tCrA[coord], tCrB[coord], acc)
        warpgroup.commit_group()

    @cute.jit
    def epilogue(self, acc, tRS_acc, rD, rOut, r2s, sD, tRS_sD, tRS_cD, tma_d, gD, mD, e0, e1, e2, store_pipe, epi_bar, scale,  # noqa: ANN001
                 tile_m, tile_n, tile_l, tiles_done, n_bufs, grp, warp, store_warp, ab_pipe, release, drain, held,
                 early) -> None:
        """Per (epi_m x epi_n) subtile: the fused function on the accumulator, convert, then
        either keep it in `held` (store_overlap: stored under the next mainloop) or store it
        now (`store_subtile`). `drain`: the last wgmma batch is still in flight (wait for
        it and free its stage here, after issuing the first subtile's operand loads, so
        their latency hides behind the MMAs). `early`: per subtile, the operands loaded
        during the mainloop (`cfg.early_operands`); the others are loaded here."""
        epi_shape = cute.zipped_divide(gD[(None, None, tile_m, tile_n, tile_l)], self.epi_tile).shape[1]
        epi_order = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
        n_epi = cute.size(epi_shape)
        frag = cute.size(rD)
        # gated: output subtile (i, j) is gate_fn(acc subtile (i, j), acc subtile (i, j + half)),
        # half = the output tile's subtiles per row (the accumulator's are walked row-major too)
        half = self.out_tile[1] // self.epi_tile[1]
        rUp = None
        if cutlass.const_expr(self.gated):
            rUp = cute.make_rmem_tensor(rD.layout, cutlass.Float32)
        # The operands not loaded early are prefetched one subtile ahead (the first while
        # the last wgmma batch drains), so their global-load latency hides behind other work.
        late = tuple(not x for x in self.early)
        nxt = []
        if cutlass.const_expr(self.epi_fn is not None):
            nxt = self.subtile_operands(mD, tRS_cD, epi_order, 0, tile_m, tile_n, tile_l, e0, e1, e2, late)
        if cutlass.const_expr(drain):
            warpgroup.wait_group(0)
            ab_pipe.consumer_release(release)
            release.advance()
        for e in cutlass.range_constexpr(n_epi):
            if cutlass.const_expr(self.gated):
                gate = (e // half) * 2 * half + e % half
                for v in cutlass.range_constexpr(frag):
                    rD[v] = tRS_acc[gate * frag + v]
                    rUp[v] = tRS_acc[(gate + half) * frag + v]
                if cutlass.const_expr(self.scaled):
                    rD.store(rD.load() * scale)
                    rUp.store(rUp.load() * scale)
                rD.store(self.gate_fn(rD.load(), rUp.load()))
            else:
                for v in cutlass.range_constexpr(frag):
                    if cutlass.const_expr(self.scaled):
                        rD[v] = tRS_acc[e * frag + v] * scale
                    else:
                        rD[v] = tRS_acc[e * frag + v]
            if cutlass.const_expr(self.epi_fn is not None):
                ops = []
                for i in cutlass.range_constexpr(len(self.kinds)):
                    if cutlass.const_expr(self.early[i]):
                        ops.append(self.from_raw(early[e][i], (e0, e1, e2)[i]))
                    else:
                        ops.append(self.from_raw(nxt[i], (e0, e1, e2)[i]))
                if cutlass.const_expr(e + 1 < n_epi):
                    nxt = self.subtile_operands(mD, tRS_cD, epi_order, e + 1, tile_m, tile_n, tile_l, e0, e1, e2, late)
                rD.store(self.epi_fn(rD.load(), *ops))
            if cutlass.const_expr(self.overlap):
                held[e].store(rD.load().to(self.d_dtype))
            else:
                rOut.store(rD.load().to(self.d_dtype))
                self.store_subtile(rOut, e, tile_m, tile_n, tile_l, tiles_done, n_bufs, grp, warp, store_warp, r2s, tRS_sD,
                                   sD, tma_d, gD, store_pipe, epi_bar)

    @cute.jit
    def store_subtile(self, frag, e, tile_m, tile_n, tile_l, tiles_done, n_bufs, grp, warp, store_warp, r2s, tRS_sD, sD,  # noqa: ANN001
                      tma_d, gD, store_pipe, epi_bar) -> None:
        """Subtile `e` of tile (tile_m, tile_n, tile_l) from registers `frag`: st.matrix into
        the next staging buffer, then the group's store warp issues the TMA store and waits
        until the oldest buffer has been read (so the next subtile may overwrite it)."""
        gD_tile = cute.zipped_divide(gD[(None, None, tile_m, tile_n, tile_l)], self.epi_tile)
        epi_shape = gD_tile.shape[1]
        epi_order = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
        bSG_sD, bSG_gD = cpasync.tma_partition(tma_d, 0, cute.make_layout(1), cute.group_modes(sD, 0, 2), gD_tile)
        buf = (tiles_done * cute.size(epi_shape) + e) % n_bufs + grp * n_bufs
        cute.copy(r2s, frag, tRS_sD[(None, None, None, buf)])
        # Make the generic-proxy smem writes visible to the TMA (async proxy).
        cute.arch.fence_proxy("async.shared", space="cta")
        epi_bar.arrive_and_wait()
        if warp == store_warp:
            cute.copy(tma_d, bSG_sD[(None, buf)], bSG_gD[(None, epi_order.get_hier_coord(e))])
            store_pipe.producer_commit()
            store_pipe.producer_acquire()
        epi_bar.arrive_and_wait()

    # ---- stream-K fixup through the workspace ----------------------------------------------
    @cute.jit
    def publish(self, acc, work, slot, ctidx, epi_bar) -> None:  # noqa: ANN001
        """Store this CTA's partial accumulator in workspace slot `slot` (value v of
        thread t at v * threads + t: each store instruction of a warp is one coalesced
        128-byte line), then raise the slot's flag (release: every thread's stores are
        ordered before it by the barrier and thread 0's gpu-scope fence)."""
        parts = cute.recast_ptr(work.iterator + self.flag_words, dtype=cutlass.Float32)
        dst = parts + (slot * self.slot_words + ctidx)
        for i in cutlass.range_constexpr(cute.size(acc)):
            (dst + i * self.epi_threads).store(acc[i])
        epi_bar.arrive_and_wait()
        if ctidx == 0:
            cute.arch.fence_acq_rel_gpu()
            cute.arch.store(work.iterator + slot, cutlass.Int32(1), sem="relaxed", scope="gpu")

    @cute.jit
    def fixup(self, acc, work, worker, rank, covered, base, extra, k_tiles, ctidx, epi_bar) -> None:  # noqa: ANN001
        """Add the partial sums of the runs after this one in the tile (workers + 1, + 2,
        ... until the tile's k-blocks are covered), each through `add_partial`."""
        peer = worker + 1
        while covered < k_tiles:
            self.add_partial(acc, work, peer * self.cluster_size + rank, ctidx, epi_bar)
            run = base + cutlass.Int32(cutlass.select_(peer < extra, 1, 0))
            covered = covered + cutlass.min(k_tiles - covered, run)
            peer = peer + 1

    @cute.jit
    def add_partial(self, acc, work, slot, ctidx, epi_bar) -> None:  # noqa: ANN001
        """Add workspace slot `slot`'s partial sums to `acc` once its flag is raised. Thread
        0 waits for the flag (acquire) and clears it for the next launch; the barrier then
        orders every thread's loads after the acquire."""
        parts = cute.recast_ptr(work.iterator + self.flag_words, dtype=cutlass.Float32)
        if ctidx == 0:
            flag = cute.arch.load(work.iterator + slot, cutlass.Int32, sem="acquire", scope="gpu")
            while flag == 0:
                flag = cute.arch.load(work.iterator + slot, cutlass.Int32, sem="acquire", scope="gpu")
            cute.arch.store(work.iterator + slot, cutlass.Int32(0), sem="relaxed", scope="gpu")
        epi_bar.arrive_and_wait()
        src = parts + (slot * self.slot_words + ctidx)
        # Weak loads (strong ones are not overlapped: 128 of them in a row cost ~100 us),
        # issued a chunk at a time ahead of their adds; `.cg` reads L2, never an L1 line
        # left over from before the flag was raised.
        n_acc = cute.size(acc)
        for c in cutlass.range_constexpr(0, n_acc, SK_LOAD_CHUNK):
            vals = [
                cute.arch.load(src + i * self.epi_threads, cutlass.Float32, cop="cg")
                for i in range(c, min(c + SK_LOAD_CHUNK, n_acc))
            ]
            for j in cutlass.range_constexpr(len(vals)):
                acc[c + j] = acc[c + j] + vals[j]

    @cute.jit
    def tile_operands(self, mD, tRS_cD, epi_order, tile_m, tile_n, batch, e0, e1, e2) -> list:  # noqa: ANN001
        """The early operands (`self.early`) of every subtile of a tile, unconverted
        (`load_operand`): the mainloop goes on while they load."""
        out = []
        for e in cutlass.range_constexpr(cute.size(epi_order)):
            out.append(self.subtile_operands(mD, tRS_cD, epi_order, e, tile_m, tile_n, batch, e0, e1, e2, self.early))
        return out

    @cute.jit
    def subtile_operands(self, mD, tRS_cD, epi_order, e, tile_m, tile_n, batch, e0, e1, e2, which) -> list:  # noqa: ANN001
        coord = epi_order.get_hier_coord(e)
        row0 = tile_m * self.tile[0] + coord[0] * self.epi_tile[0]
        col0 = tile_n * self.tile[1] + coord[1] * self.epi_tile[1]
        return self.load_operands(mD, tRS_cD, row0, col0, batch, e0, e1, e2, which)

    @cute.jit
    def load_operands(self, mD, tRS_cD, row0, col0, batch, e0, e1, e2, which) -> list:  # noqa: ANN001
        """Each epilogue operand `which` selects as a fragment laid out like the
        accumulator's, unconverted (`load_operand`); None for the others."""
        M, N = mD.shape[0], mD.shape[1]
        tensors = (e0, e1, e2)
        # A thread's values sit at its base coordinate plus offsets known when tracing
        # (e.g. rows r, r + 8 x column pairs): a row (col) operand is loaded once per distinct
        # row (column) offset, not once per value (half the loads and predicates for a bias
        # per column on the 64xN wgmma layout).
        cm0, cn0 = tRS_cD[0]
        offsets = [tRS_cD.layout(v) for v in range(cute.size(tRS_cD))]
        out = []
        for i in cutlass.range_constexpr(len(self.kinds)):
            if cutlass.const_expr(which[i]):
                out.append(self.load_operand(self.kinds[i], tensors[i], tRS_cD, offsets, row0 + cm0, col0 + cn0, M, N,
                                             batch))
            else:
                out.append(None)
        return out

    @cute.jit
    def load_operand(self, kind, t, tRS_cD, offsets, row0, col0, M, N, batch):  # noqa: ANN001, ANN201
        """Operand `t` of `kind` at the thread's values of the subtile whose thread-base
        coordinate is (row0, col0), zero outside (M, N), unconverted: fp32 as it is, a
        16-bit value zero-extended in an Int32 word. Converted where it is used
        (`from_raw`): ptxas places a conversion (or the packing of two 16-bit registers)
        next to its load, where it waits for the load; an early tile's loads would stall
        the mainloop, a subtile ahead's the epilogue."""
        r = cute.make_rmem_tensor(tRS_cD.shape, cutlass.Int32 if t.element_type.width == 16 else t.element_type)
        r.fill(0)
        if cutlass.const_expr(kind in ("row", "col")):
            axis = 0 if kind == "row" else 1
            first: dict[int, int] = {}  # offset along the operand's axis -> first value there
            for v in cutlass.range_constexpr(cute.size(r)):
                off = offsets[v][axis]
                if cutlass.const_expr(off in first):
                    r[v] = r[first[off]]
                else:
                    first[off] = v
                    if cutlass.const_expr(kind == "row"):
                        m = row0 + off
                        if m < M:
                            r[v] = self.raw(t[m])
                    else:
                        n = col0 + off
                        if n < N:
                            r[v] = self.raw(t[n])
        else:
            for v in cutlass.range_constexpr(cute.size(r)):
                m = row0 + offsets[v][0]
                n = col0 + offsets[v][1]
                if m < M:
                    if n < N:
                        r[v] = self.raw(t[(m, n, batch)])
        return r.load()

    @staticmethod
    def raw(x):  # noqa: ANN001, ANN205
        """A loaded value as `load_operand` keeps it: 16 bits zero-extended into an Int32."""
        return x.bitcast(cutlass.Uint16).to(cutlass.Int32) if x.width == 16 else x

    @staticmethod
    def from_raw(v, t):  # noqa: ANN001, ANN205
        """`load_operand`'s fragment of operand `t` as fp32."""
        if t.element_type.width == 16:
            return v.to(cutlass.Uint16).bitcast(t.element_type).reshape(v.shape).to(cutlass.Float32)
        return v.to(cutlass.Float32)
