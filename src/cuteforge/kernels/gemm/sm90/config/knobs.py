"""`GemmConfig`: one tile / pipeline choice of the sm_90a GEMM and whether the device can
run it.

Shared memory per CTA is `stages * (tile_m + tile_n) * tile_k * in_bytes` for the A/B
ring, plus `epi_stages * epi_m * epi_n * out_bytes` for the TMA-store staging buffers,
plus a few hundred bytes of mbarriers. sm_90 lets a block opt in to 227 KiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from .....arch import DeviceLimits, limits_for

RASTER_ORDERS = ("m", "n")
K_BLOCK_BYTES = 128  # a k-block is one 128-byte swizzle row: 64 bf16/fp16, 128 fp8
BARRIER_BYTES = 1024  # mbarriers + alignment slack of the shared-storage struct
MAX_ACC_REGS = 192  # fp32 accumulators a consumer thread holds (validate)


@dataclass(frozen=True)
class GemmConfig:
    """One tile/pipeline choice. `stages=0` takes as many A/B stages as shared memory holds.

    tile_m: 64 (one consumer warpgroup), 128 or 256 (two consumer warpgroups, split
      along M); tile_n: multiple of 16 up to 256; tile_k: one 128-byte swizzle row of K,
      64 for bf16/fp16 and 128 for fp8 (4 wgmma k-steps either way).
    cluster_m/cluster_n: CTAs per cluster along M/N; A is multicast across the N
      direction, B across M, so a 2x1 cluster halves B's L2->SM traffic.
    raster: "m" walks down M first inside a group of `swizzle` tile columns, "n" the
      transpose; grouping keeps a band of A and B tiles hot in L2.
    pingpong: two consumer warpgroups own alternate tiles (tile_m 64 or 128, one
      warpgroup's MMA each); their mainloops take turns, so one's epilogue runs under
      the other's mainloop. Default (False) is cooperative: both split one tile.
    stream_k: (cooperative only) when the last wave of tiles is at most half full, its
      tiles are cut along K into runs that the idle clusters share (`stream_k_split`);
      a cut tile is finished by the cluster holding its first k-block, which adds the
      others' fp32 partial sums from a global workspace (`stream_k_workspace_words`)
      before the epilogue. Sub-wave problems (fewer tiles than clusters, e.g. small M)
      become split-K. The kernel decides per launch from the runtime extents and runs
      whole tiles where no split applies.
    stream_k_ends: (with stream_k) a last wave more than half full, which `stream_k_split`
      leaves whole, is cut too: each of its tiles runs its first k-blocks on its own
      cluster and its last `stream_k_ends_len` k-blocks on one of the clusters that wave
      leaves idle, every idle cluster taking the ends of a few tiles in turn. The owners
      all start at k-block 0 and the idle clusters' first ends at the cut, so those stay
      in step in L2 as whole tiles do (an idle cluster's later ends follow one another).
      Ahead with long ends (8192^3, ends of 42 k-blocks: +0.8 %), behind with short ones
      (4096^3, 5: -9 %): the heuristic sets it where the ends are at least
      `SK_ENDS_DEFAULT` k-blocks (16-bit, a full wave before the last, both counted over
      the whole batch); it is a tuner candidate too.
    store_overlap: (cooperative tiles with a 16-bit output) the epilogue math runs as soon
      as a tile's accumulator is complete, but the converted tile stays in registers and
      its subtiles go out (st.matrix, barrier, TMA store) one per k-block under the next
      tile's first MMAs, so the tensor cores wait only for the math. False: the subtiles
      are stored before the next mainloop starts. Tiles of more than 128
      accumulators per thread (256x192, pingpong 128x192) store as with False: the held
      tile would not fit beside them.
    epi_bufs: TMA-store staging buffers per epilogue group (each epi_m x epi_n); 0 takes
      4 for a 16-bit output and 2 for fp32. Fewer buffers leave room for another A/B
      stage: pingpong 128x192 has 4 stages with 4 buffers per warpgroup and 5 with 2.
    early_operands: epilogue operands of kind row / col (a bias per row or per column) are
      loaded into registers while the tile's mainloop runs, so the epilogue finds them
      there; False: one subtile ahead, inside the epilogue (about 1 % slower with a fused
      bias + gelu on the H100). Pingpong and stream-K tiles, and tiles of
      more than 128 accumulators per thread, load them in the epilogue either way.
    """

    tile_m: int = 128
    tile_n: int = 256
    tile_k: int = 64
    stages: int = 0
    cluster_m: int = 2
    cluster_n: int = 1
    raster: str = "m"
    swizzle: int = 8
    epi_n: int = 32
    pingpong: bool = False
    stream_k: bool = False
    store_overlap: bool = True
    epi_bufs: int = 0
    early_operands: bool = True
    stream_k_ends: bool = False

    @property
    def mma_wgs(self) -> int:
        """Warpgroups that share one tile's MMA (split along M)."""
        return 1 if self.tile_m == 64 or self.pingpong else 2

    @property
    def consumer_wgs(self) -> int:
        return 2 if self.pingpong else self.mma_wgs

    @property
    def epi_groups(self) -> int:
        """Independent epilogues (each with its own staging buffers)."""
        return 2 if self.pingpong else 1

    def epi_tile(self) -> tuple[int, int]:
        return (min(self.tile_m, 64 * self.mma_wgs), min(self.epi_n, self.tile_n))

    def epi_stages(self, out_bytes: int) -> int:
        """Staging buffers per epilogue group."""
        return self.epi_bufs or (4 if out_bytes <= 2 else 2)

    @property
    def acc_regs(self) -> int:
        """fp32 accumulator registers per consumer thread."""
        return self.tile_m * self.tile_n // (128 * self.mma_wgs)

    def holds_stores(self, out_bytes: int) -> bool:
        """Whether the kernel runs `store_overlap` (the converted tile held in registers:
        tile_m * tile_n / 256 of them at 16 bits, beside at most 128 accumulators)."""
        return self.store_overlap and not self.pingpong and out_bytes == 2 and self.acc_regs <= 128

    @property
    def loads_operands_early(self) -> bool:
        """Whether the kernel runs `early_operands`: cooperative tiles of at most 128
        accumulators (the row / col operands of a whole tile held beside them: tile_n / 4
        registers for a bias per column on a 128-row tile), without stream-K. Pingpong
        warpgroups run their epilogue under the other's mainloop already, and there the
        held operands made ptxas spill with a bias, C and a residual (128x128). Stream-K
        tiles would hold them across the partial-sum fixup: ptxas, 128x256 with a bias,
        144 bytes of spill against none loaded late; on the H100 the fused default at
        8192x28672x4096 ran 8-10 % behind the same tile loading its bias late on 32-wide
        subtiles."""
        return self.early_operands and not self.pingpong and not self.stream_k and self.acc_regs <= 128

    def smem_bytes(self, in_bytes: int, out_bytes: int, stages: int | None = None) -> int:
        s = self.stages if stages is None else stages
        em, en = self.epi_tile()
        ab = s * (self.tile_m + self.tile_n) * self.tile_k * in_bytes
        return ab + self.epi_groups * self.epi_stages(out_bytes) * em * en * out_bytes + BARRIER_BYTES

    def resolved_stages(self, in_bytes: int, out_bytes: int, limits: DeviceLimits) -> int:
        """`stages`, or (0) the most that fit next to the epilogue buffers."""
        if self.stages:
            return self.stages
        per_stage = (self.tile_m + self.tile_n) * self.tile_k * in_bytes
        rest = self.smem_bytes(in_bytes, out_bytes, stages=0)
        return max(1, (limits.smem_per_block - rest) // per_stage)

    @property
    def gated_ok(self) -> bool:
        """Whether the gated GEMM can run this tile: its output tile is tile_n / 2 wide, its
        subtiles must divide that, and each half-tile a cluster multicasts along M splits
        into whole 8-row swizzle atoms, one share per CTA."""
        half = self.tile_n // 2
        return self.tile_n % 32 == 0 and half % min(self.epi_n, half) == 0 and half % (8 * self.cluster_m) == 0

    def validate_gated(self) -> None:
        """Raise ValueError when the gated GEMM (two weights, one half of each B tile) cannot
        run this config; `validate` checks the rest."""
        if not self.gated_ok:
            raise ValueError(f"a gated GEMM needs tile_n a multiple of 32 whose half epi_n divides and "
                             f"cluster_m x 8 rows divide, got tile_n {self.tile_n}, epi_n {self.epi_n}, "
                             f"cluster_m {self.cluster_m}")

    def validate(self, in_bytes: int, out_bytes: int, limits: DeviceLimits) -> None:
        """Raise ValueError when this config cannot run on the device described by `limits`."""
        if limits.sm < 90:
            raise ValueError(f"GemmConfig needs sm_90 (wgmma/TMA), got sm_{limits.sm}")
        if self.tile_m not in (64, 128, 256):
            raise ValueError(f"tile_m must be 64, 128 or 256, got {self.tile_m}")
        if self.tile_n % 16 or not 16 <= self.tile_n <= 256:
            raise ValueError(f"tile_n must be a multiple of 16 in [16, 256], got {self.tile_n}")
        if self.tile_k != k_block(in_bytes):
            what = "16-bit inputs (4 wgmma k-steps of 16)" if in_bytes == 2 else "fp8 inputs (4 wgmma k-steps of 32)"
            raise ValueError(f"tile_k must be {k_block(in_bytes)} for {what}: one 128-byte swizzled K row, got {self.tile_k}")
        # Accumulator registers per consumer thread, within the 232 that setmaxnreg gives a
        # consumer warpgroup: ptxas assembles 192 (256x192, pingpong 128x192, plain or with
        # a fused bias + gelu) without a spill; 256 cannot fit.
        if self.pingpong and self.tile_m not in (64, 128):
            raise ValueError(f"pingpong needs tile_m 64 or 128 (one warpgroup per tile), got {self.tile_m}")
        if self.acc_regs > MAX_ACC_REGS:
            raise ValueError(f"tile {self.tile_m}x{self.tile_n} needs {self.acc_regs} accumulator registers per thread "
                             f"(max {MAX_ACC_REGS})")
        if not 0 <= self.epi_bufs <= 4:
            raise ValueError(f"epi_bufs must be 0 (the default) or 1..4, got {self.epi_bufs}")
        if self.epi_n not in (16, 32, 64) or self.tile_n % min(self.epi_n, self.tile_n):
            raise ValueError(f"epi_n must be 16, 32 or 64 and divide tile_n, got {self.epi_n}")
        for name, c in (("cluster_m", self.cluster_m), ("cluster_n", self.cluster_n)):
            if c not in (1, 2, 4):
                raise ValueError(f"{name} must be 1, 2 or 4, got {c}")
        if self.cluster_m * self.cluster_n > min(4, limits.max_cluster_size):
            raise ValueError(f"cluster {self.cluster_m}x{self.cluster_n} exceeds 4 CTAs")
        if self.raster not in RASTER_ORDERS:
            raise ValueError(f"raster must be one of {RASTER_ORDERS}, got {self.raster!r}")
        if self.swizzle < 1:
            raise ValueError(f"swizzle must be >= 1, got {self.swizzle}")
        if self.stream_k and self.pingpong:
            raise ValueError("stream_k needs the cooperative schedule (pingpong=False)")
        if self.stream_k_ends and not self.stream_k:
            raise ValueError("stream_k_ends cuts the last wave's tiles: it needs stream_k=True")
        stages = self.resolved_stages(in_bytes, out_bytes, limits)
        if stages < 2:
            raise ValueError(f"config {self} leaves room for {stages} pipeline stage(s); need >= 2")
        need = self.smem_bytes(in_bytes, out_bytes, stages)
        if need > limits.smem_per_block:
            raise ValueError(f"config {self} needs {need} B of shared memory; sm_{limits.sm} allows {limits.smem_per_block}")


def usable_tuned(tuned: object, in_bytes: int, out_bytes: int) -> GemmConfig | None:
    """A stored tuning result, or None when it is not a config this code can run (a store
    written by another version): the heuristic then decides instead of a failed build."""
    if not isinstance(tuned, GemmConfig):
        return None
    try:
        tuned.validate(in_bytes, out_bytes, limits_for("sm_90a"))
    except ValueError:
        return None
    return tuned


def k_block(in_bytes: int) -> int:
    """tile_k for inputs of `in_bytes` bytes (64 for 16-bit, 128 for fp8)."""
    return K_BLOCK_BYTES // in_bytes
