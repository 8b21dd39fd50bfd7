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
  while the consumers run the epilogue.
- schedule: `StaticPersistentTileScheduler` over (M-tiles, N-tiles, L) in clusters,
  grouped ("swizzled") rasterization so a band of A and B stays in L2.

fp8 (`scaled`): A and B are e4m3/e5m2 (K-major only, 128-deep k-blocks, wgmma k32) and
the accumulator is multiplied by scale_a[0] * scale_b[0] (read once per CTA) before the
epilogue hook.

Out-of-range rows/columns/K need no code: TMA loads zero-fill outside the tensor and
TMA stores clip, so M, N, K need not be multiples of the tile.

The epilogue hook: `epi_fn(acc, *operands) -> value` on fp32 TensorSSA fragments, where
each operand is brought into registers in the accumulator's thread-value layout from a
tensor of kind "row" (M,), "col" (N,) or "full" (M, N, L). A preset string or a
`cuteforge.fusion.Epilogue.apply` plugs in the same way.
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

from .config import GemmConfig

WG = 128  # threads per warpgroup
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
    ) -> None:
        self.cfg = cfg
        self.scaled = scaled  # fp8: acc * scale_a[0] * scale_b[0] before the epilogue
        self.stages = stages
        self.a_layout = LayoutEnum.ROW_MAJOR if a_k_major else LayoutEnum.COL_MAJOR
        self.b_layout = LayoutEnum.ROW_MAJOR if b_k_major else LayoutEnum.COL_MAJOR
        self.c_layout = LayoutEnum.ROW_MAJOR
        self.kinds = operand_kinds
        self.epi_fn = epi_fn
        self.max_clusters = max_clusters
        self.tile = (cfg.tile_m, cfg.tile_n, cfg.tile_k)
        self.cluster = (cfg.cluster_m, cfg.cluster_n)
        self.n_consumers = cfg.consumer_wgs
        self.mma_wgs = cfg.mma_wgs
        self.pingpong = cfg.pingpong
        self.threads = WG * (1 + self.n_consumers)
        self.epi_tile = cfg.epi_tile()
        # Named barriers: 0 is __syncthreads; 1 (+1 for the second pingpong warpgroup) the
        # epilogue's; 3 and 4 hand the mainloop turn between pingpong warpgroups.
        self.epi_threads = WG * self.mma_wgs

    # ---- host side -----------------------------------------------------------------------
    @cute.jit
    def __call__(
        self, mA: cute.Tensor, mB: cute.Tensor, mD: cute.Tensor, sa: Any, sb: Any, e0: Any, e1: Any, e2: Any, stream: Any
    ) -> None:
        """mA (M, K, L), mB (N, K, L), mD (M, N, L); sa/sb: fp32 per-tensor scales (1,) or
        None; e*: epilogue operands or None. fp8 A and B may differ (e4m3 x e5m2)."""
        self.ab_dtype = mA.element_type
        self.b_dtype = mB.element_type
        self.d_dtype = mD.element_type
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
        tma_b, tB = cpasync.make_tiled_tma_atom(
            b_op, mB, cute.slice_(b_layout, (None, None, 0)), (self.tile[1], self.tile[2]), num_multicast=self.cluster[0]
        )
        tma_d, tD = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mD, cute.slice_(d_layout, (None, None, 0)), self.epi_tile
        )

        tiles_mnl = cute.zipped_divide(mD, tiler=self.tile[:2])[(0, (None, None, None))].shape
        sched = utils.PersistentTileSchedulerParams(
            tiles_mnl, (*self.cluster, 1), self.cfg.swizzle, self.cfg.raster == "m"
        )
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, self.max_clusters)

        @cute.struct
        class Storage:
            ab_barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sA: cute.struct.Align[cute.struct.MemRange[self.ab_dtype, cute.cosize(a_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.b_dtype, cute.cosize(b_layout)], 1024]
            sD: cute.struct.Align[cute.struct.MemRange[self.d_dtype, cute.cosize(d_layout)], 1024]

        self.storage = Storage
        self.kernel(
            self.tiled_mma, tma_a, tA, tma_b, tB, tma_d, tD, mD, sa, sb, e0, e1, e2, a_layout, b_layout, d_layout, sched
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
        sa: Any,
        sb: Any,
        e0: Any,
        e1: Any,
        e2: Any,
        a_layout: cute.ComposedLayout,
        b_layout: cute.ComposedLayout,
        d_layout: cute.ComposedLayout,
        sched_params: utils.PersistentTileSchedulerParams,
    ) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // WG)
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
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
        gB = cute.local_tile(mB, cute.slice_(self.tile, (0, None, None)), (None, None, None))
        gD = cute.local_tile(mD_tma, cute.slice_(self.tile, (None, None, 0)), (None, None, None))
        tAsA, tAgA = cpasync.tma_partition(
            tma_a,
            cluster_coord[1],
            cute.make_layout(cute.slice_(cta_layout, (0, None, 0)).shape),
            cute.group_modes(sA, 0, 2),
            cute.group_modes(gA, 0, 2),
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_b,
            cluster_coord[0],
            cute.make_layout(cute.slice_(cta_layout, (None, 0, 0)).shape),
            cute.group_modes(sB, 0, 2),
            cute.group_modes(gB, 0, 2),
        )
        k_tiles = cute.size(gA, mode=[3])

        pipeline.pipeline_init_wait(cluster_shape_mn=self.cluster)

        if wg == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                self.produce(ab_pipe, sched_params, tma_a, tAsA, tAgA, a_mask, tma_b, tBsB, tBgB, b_mask, k_tiles)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            self.consume(tiled_mma, ab_pipe, sched_params, sA, sB, sD, gD, tma_d, mD, sa, sb, e0, e1, e2, tidx - WG, warp, k_tiles)

    @cute.jit
    def produce(self, ab_pipe, sched_params, tma_a, tAsA, tAgA, a_mask, tma_b, tBsB, tBgB, b_mask, k_tiles) -> None:  # noqa: ANN001
        sched = utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = sched.initial_work_tile_info()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        while work.is_valid_tile:
            m, n, batch = work.tile_idx
            a_tiles = tAgA[(None, m, None, batch)]
            b_tiles = tBgB[(None, n, None, batch)]
            for k in cutlass.range(k_tiles, unroll=1):
                ab_pipe.producer_acquire(state)
                bar = ab_pipe.producer_get_barrier(state)
                cute.copy(tma_a, a_tiles[(None, k)], tAsA[(None, state.index)], tma_bar_ptr=bar, mcast_mask=a_mask)
                cute.copy(tma_b, b_tiles[(None, k)], tBsB[(None, state.index)], tma_bar_ptr=bar, mcast_mask=b_mask)
                ab_pipe.producer_commit(state)
                state.advance()
            sched.advance_to_next_work()
            work = sched.get_current_work()
        ab_pipe.producer_tail(state)

    @cute.jit
    def consume(self, tiled_mma, ab_pipe, sched_params, sA, sB, sD, gD, tma_d, mD, sa, sb, e0, e1, e2, ctidx, warp, k_tiles) -> None:  # noqa: ANN001
        # grp: which epilogue group (pingpong warpgroup) this thread belongs to.
        grp = cutlass.Int32(0)
        if cutlass.const_expr(self.pingpong):
            grp = cute.arch.make_warp_uniform(ctidx // WG)
        mtidx = ctidx - grp * WG if self.pingpong else ctidx
        epi_bar = pipeline.NamedBarrier(barrier_id=1 + grp if self.pingpong else 1, num_threads=self.epi_threads)
        thr_mma = tiled_mma.get_slice(mtidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(gD).shape[:3], cutlass.Float32)
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
        frag = cute.size(rD)
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
        work = sched.initial_work_tile_info()
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if cutlass.const_expr(self.pingpong):
            # Tiles alternate between the warpgroups: the second starts one tile (and that
            # tile's k-blocks in the ring) later; the first may start its mainloop at once.
            if grp == 1:
                sched.advance_to_next_work()
                work = sched.get_current_work()
                read.advance(cutlass.Int32(k_tiles))
                release.advance(cutlass.Int32(k_tiles))
            else:
                cute.arch.barrier_arrive(barrier_id=3, number_of_threads=2 * WG)
        while work.is_valid_tile:
            tile_m, tile_n, tile_l = work.tile_idx
            # ---- mainloop: keep one wgmma batch in flight ----
            acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            if cutlass.const_expr(self.pingpong):
                cute.arch.barrier(barrier_id=3 + grp, number_of_threads=2 * WG)  # our turn
            for k in cutlass.range(k_tiles, unroll=1):
                ab_pipe.consumer_wait(read)
                # Order this batch after the register writes before it (fill, previous
                # batch): without the fence ptxas injects its own and serializes wgmma.
                warpgroup.fence()
                for kb in cutlass.range_constexpr(k_blocks):
                    coord = (None, None, kb, read.index)
                    cute.gemm(tiled_mma, acc, tCrA[coord], tCrB[coord], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(1)
                if k > 0:
                    ab_pipe.consumer_release(release)
                    release.advance()
                read.advance()
            if cutlass.const_expr(self.pingpong):
                cute.arch.barrier_arrive(barrier_id=4 - grp, number_of_threads=2 * WG)  # their turn
            # ---- epilogue ----
            gD_tile = cute.zipped_divide(gD[(None, None, tile_m, tile_n, tile_l)], self.epi_tile)
            epi_shape = gD_tile.shape[1]
            epi_order = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
            n_epi = cute.size(epi_shape)
            # Epilogue operands are prefetched one subtile ahead (the first while the last
            # wgmma batch drains), so their global-load latency hides behind other work.
            nxt = []
            if cutlass.const_expr(self.epi_fn is not None):
                nxt = self.subtile_operands(mD, tRS_cD, epi_order, 0, tile_m, tile_n, tile_l, e0, e1, e2)
            warpgroup.wait_group(0)
            if k_tiles > 0:
                ab_pipe.consumer_release(release)
                release.advance()
            bSG_sD, bSG_gD = cpasync.tma_partition(
                tma_d, 0, cute.make_layout(1), cute.group_modes(sD, 0, 2), gD_tile
            )
            done = sched.num_tiles_executed * n_epi
            for e in cutlass.range_constexpr(n_epi):
                for v in cutlass.range_constexpr(frag):
                    if cutlass.const_expr(self.scaled):
                        rD[v] = tRS_acc[e * frag + v] * scale
                    else:
                        rD[v] = tRS_acc[e * frag + v]
                epi_coord = epi_order.get_hier_coord(e)
                if cutlass.const_expr(self.epi_fn is not None):
                    ops = nxt
                    if cutlass.const_expr(e + 1 < n_epi):
                        nxt = self.subtile_operands(mD, tRS_cD, epi_order, e + 1, tile_m, tile_n, tile_l, e0, e1, e2)
                    rD.store(self.epi_fn(rD.load(), *ops))
                rOut.store(rD.load().to(self.d_dtype))
                buf = (done + e) % n_bufs + grp * n_bufs
                cute.copy(r2s, rOut, tRS_sD[(None, None, None, buf)])
                # Make the generic-proxy smem writes visible to the TMA (async proxy).
                cute.arch.fence_proxy("async.shared", space="cta")
                epi_bar.arrive_and_wait()
                if warp == store_warp:
                    cute.copy(tma_d, bSG_sD[(None, buf)], bSG_gD[(None, epi_coord)])
                    store_pipe.producer_commit()
                    store_pipe.producer_acquire()
                epi_bar.arrive_and_wait()
            if cutlass.const_expr(self.pingpong):
                # Skip the other warpgroup's next tile and its k-blocks in the ring.
                sched.advance_to_next_work(advance_count=2)
                read.advance(cutlass.Int32(k_tiles))
                release.advance(cutlass.Int32(k_tiles))
            else:
                sched.advance_to_next_work()
            work = sched.get_current_work()
        store_pipe.producer_tail()

    @cute.jit
    def subtile_operands(self, mD, tRS_cD, epi_order, e, tile_m, tile_n, batch, e0, e1, e2) -> list:  # noqa: ANN001
        coord = epi_order.get_hier_coord(e)
        row0 = tile_m * self.tile[0] + coord[0] * self.epi_tile[0]
        col0 = tile_n * self.tile[1] + coord[1] * self.epi_tile[1]
        return self.load_operands(mD, tRS_cD, row0, col0, batch, e0, e1, e2)

    @cute.jit
    def load_operands(self, mD, tRS_cD, row0, col0, batch, e0, e1, e2) -> list:  # noqa: ANN001
        """Each epilogue operand as an fp32 fragment laid out like the accumulator's."""
        M, N = mD.shape[0], mD.shape[1]
        tensors = (e0, e1, e2)
        out = []
        for i in cutlass.range_constexpr(len(self.kinds)):
            kind = self.kinds[i]
            t = tensors[i]
            r = cute.make_rmem_tensor(tRS_cD.shape, cutlass.Float32)
            r.fill(0.0)
            for v in cutlass.range_constexpr(cute.size(r)):
                cm, cn = tRS_cD[v]
                m = row0 + cm
                n = col0 + cn
                if cutlass.const_expr(kind == "row"):
                    if m < M:
                        r[v] = t[m].to(cutlass.Float32)
                elif cutlass.const_expr(kind == "col"):
                    if n < N:
                        r[v] = t[n].to(cutlass.Float32)
                else:
                    if m < M:
                        if n < N:
                            r[v] = t[(m, n, batch)].to(cutlass.Float32)
            out.append(r.load())
        return out
