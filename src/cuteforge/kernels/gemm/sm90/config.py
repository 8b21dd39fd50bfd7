"""Configs of the sm_90a GEMM: what a tile/pipeline choice is, whether the device can run
it, the heuristic default and the autotuner's candidates.

Shared memory per CTA is `stages * (tile_m + tile_n) * tile_k * in_bytes` for the A/B
ring, plus `epi_stages * epi_m * epi_n * out_bytes` for the TMA-store staging buffers,
plus a few hundred bytes of mbarriers. sm_90 lets a block opt in to 227 KiB.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ....arch import DeviceLimits, limits_for

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
      H200, session 35 (gemm.md): ahead at 8192^3 (ends of 42 k-blocks; plain +0.8 %,
      fused +0.9 % mean), level at 2048x8192x28672 (48), behind where the ends are short
      (4096^3, 5: -9 %). The heuristic sets it where the ends are at least
      `SK_ENDS_DEFAULT` k-blocks (16-bit, a full wave before the last, both counted over
      the whole batch since session 36); it is a tuner candidate too.
    store_overlap: (cooperative tiles with a 16-bit output) the epilogue math runs as soon
      as a tile's accumulator is complete, but the converted tile stays in registers and
      its subtiles go out (st.matrix, barrier, TMA store) one per k-block under the next
      tile's first MMAs, so the tensor cores wait only for the math. False: the subtiles
      are stored before the next mainloop starts (v4.4). Tiles of more than 128
      accumulators per thread (256x192, pingpong 128x192) store as with False: the held
      tile would not fit beside them.
    epi_bufs: TMA-store staging buffers per epilogue group (each epi_m x epi_n); 0 takes
      4 for a 16-bit output and 2 for fp32. Fewer buffers leave room for another A/B
      stage: pingpong 128x192 has 4 stages with 4 buffers per warpgroup and 5 with 2
      (gemm.md v4.7).
    early_operands: epilogue operands of kind row / col (a bias per row or per column) are
      loaded into registers while the tile's mainloop runs, so the epilogue finds them
      there; False: one subtile ahead, inside the epilogue (about 1 % slower with a fused
      bias + gelu on the H100, gemm.md v4.10). Pingpong and stream-K tiles, and tiles of
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
        subtiles (gemm.md session 32)."""
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


def cluster_grid(cfg: GemmConfig, m: int, n: int) -> tuple[int, int]:
    """Clusters along (M, N) that hold real tiles (the last one may be partly outside)."""
    m_tiles, n_tiles = -(-m // cfg.tile_m), -(-n // cfg.tile_n)
    return -(-m_tiles // cfg.cluster_m), -(-n_tiles // cfg.cluster_n)


def scheduled_clusters(cfg: GemmConfig, m: int, n: int, batch: int = 1) -> int:
    """Clusters the persistent schedule counts as work, as the DSL's
    `PersistentTileSchedulerParams` computes it: with `swizzle` > 1 the cluster count
    along the swizzled dim (N for raster "m", M for "n") is rounded up to a multiple of
    `swizzle`, and every padding cluster runs a whole mainloop on zero-filled loads."""
    cm, cn = cluster_grid(cfg, m, n)
    if cfg.swizzle > 1:
        if cfg.raster == "m":
            cn = -(-cn // cfg.swizzle) * cfg.swizzle
        else:
            cm = -(-cm // cfg.swizzle) * cfg.swizzle
    return cm * cn * batch


# Stream-K policy (the kernel computes it on device from the runtime extents; the Python
# mirror below is what the CPU tests and the docs check it against).
SK_MAX_SPLIT = 8  # a tile is cut into at most this many runs (the owner adds the others)
SK_MIN_ITERS = 4  # k-blocks per run at least: a shorter run is mostly fixup
SK_ENDS_DEFAULT = 32  # default_config cuts a nearly full last wave only into ends this long
SK_END_COST = 2  # k-blocks' time a cut tile's end costs besides its MMAs (publishing a 128x256
#                  fp32 partial per CTA, or the owner adding it): ~128 KiB at ~64 B/clk


def stream_k_split(tiles: int, workers: int, k_tiles: int) -> tuple[int, int]:
    """(tiles split, clusters sharing them) for `tiles` scheduled clusters of work over
    `workers` persistent clusters with `k_tiles` k-blocks per tile; (0, 0): whole tiles
    only. The split tiles are the last `rem = tiles % workers` (the partly filled wave;
    all of them when tiles < workers), each cut into s = min(SK_MAX_SPLIT, workers //
    rem, k_tiles // SK_MIN_ITERS) runs of k-blocks, and only when s >= 2 (the wave is at
    most half full). Every run of every split tile then starts at the same k-block
    offsets as its neighbours' (runs of one tile are consecutive workers), so tiles that
    share A or B rows read the same k-blocks at about the same time, as whole tiles do:
    an earlier version spread a fuller wave's k-blocks evenly, which put every run at a
    different offset and cost 4-22 % at K >= 4096 (L2 misses) for ~1 % gained at 8192^3.
    Mirrors `Sm90Gemm.sk_plan` (device code)."""
    rem = tiles % workers
    if rem == 0:
        return 0, 0
    split = min(SK_MAX_SPLIT, workers // rem, k_tiles // SK_MIN_ITERS)
    return (rem, split * rem) if split >= 2 else (0, 0)


def stream_k_ends_len(tiles: int, workers: int, k_tiles: int) -> int:
    """`GemmConfig.stream_k_ends`: the k-blocks at the end of each tile of a last wave that
    `stream_k_split` leaves whole (more than half full), run by the idle clusters; 0: no
    cut. The wave's rem tiles keep their owners (workers 0..rem-1) for the first k_tiles
    - e k-blocks; idle cluster i (of h = workers - rem) runs the ends of tiles i, i + h,
    ..., at most c = ceil(rem / h) of them. Each end also costs SK_END_COST (its publish;
    the owner's add), so e = (k_tiles - (c - 1) * SK_END_COST) // (c + 1) makes the owners
    and the busiest idle cluster finish together. Cut only when c <= SK_MAX_SPLIT and
    e >= SK_MIN_ITERS. Mirrors `Sm90Gemm.sk_plan`."""
    rem = tiles % workers
    if rem == 0 or stream_k_split(tiles, workers, k_tiles)[0]:
        return 0
    per_idle = -(-rem // (workers - rem))
    ends = (k_tiles - (per_idle - 1) * SK_END_COST) // (per_idle + 1)
    return ends if per_idle <= SK_MAX_SPLIT and ends >= SK_MIN_ITERS else 0


def stream_k_flag_words(sms: int) -> int:
    """The flags at the start of the stream-K workspace: one int32 per SM (every CTA slot
    of any config's persistent grid is below sms), rounded up to 16 bytes (the partial
    tiles after them stay 16-byte aligned). The same for every config on a device: the
    configs' launches on one stream share one workspace, and a config whose flags ended
    earlier (4-CTA clusters capped at 30 of 4, 120 flags) would write its partial sums
    where another config's flags are."""
    return -(-sms // 4) * 4


def stream_k_workspace_words(cfg: GemmConfig, max_clusters: int, m: int, n: int, k: int, batch: int = 1, *,
                             sms: int) -> int:
    """int32 words of workspace the stream-K split of this problem needs: the flags,
    then one fp32 tile of partial sums per CTA of the clusters sharing the split tiles
    (with `stream_k_ends`, per CTA of each cut tile). 0 when nothing is split (no
    stream_k, or `stream_k_split` says whole tiles): the kernel then gets a one-word
    stand-in and runs whole tiles. The kernel computes the same split and checks the
    workspace's length before it splits."""
    if not cfg.stream_k:
        return 0
    k_tiles = -(-k // cfg.tile_k)
    tiles = scheduled_clusters(cfg, m, n, batch)
    _, workers = stream_k_split(tiles, max_clusters, k_tiles)
    if not workers and cfg.stream_k_ends and stream_k_ends_len(tiles, max_clusters, k_tiles):
        workers = tiles % max_clusters  # one slot per cut tile
    if not workers:
        return 0
    return stream_k_flag_words(sms) + workers * cfg.cluster_m * cfg.cluster_n * cfg.tile_m * cfg.tile_n


def fit_swizzle(cfg: GemmConfig, m: int, n: int) -> GemmConfig:
    """`cfg` with its swizzle group no wider than the problem: the clusters along the
    swizzled dim split into the fewest groups of at most `swizzle`, all of one size
    (g = ceil(count / swizzle) groups of ceil(count / g)). The schedule then pads that
    dim by fewer than g clusters instead of up to swizzle - 1 (N <= 256 with 128x256
    tiles and swizzle 8 was 8x the MMA work; now exact whenever count <= swizzle)."""
    if cfg.swizzle <= 1 or m <= 0 or n <= 0:
        return cfg
    cm, cn = cluster_grid(cfg, m, n)
    count = cn if cfg.raster == "m" else cm
    groups = -(-count // cfg.swizzle)
    size = -(-count // groups)
    return cfg if size == cfg.swizzle else replace(cfg, swizzle=size)


# Short K (<= 1024) with >= 4 waves of 128x128 tiles: pingpong 128x192 (192 accumulators a
# warpgroup), clusters walked along N, 2 staging buffers per warpgroup so the ring holds 5
# stages. H200, one run of two passes, balanced order (gemm.md v4.7, h200-gemm-shortk-v4.7.json),
# x cuBLAS against the pingpong 128x128 it replaces: 8192x8192x512 1.061 / 1.073 vs 0.999 /
# 1.005, 16384x16384x1024 1.079 / 1.067 vs 1.042 / 1.036, 8192x8192x1024 1.088 / 1.080 vs
# 1.031 / 1.029, 4096x16384x512 1.063 / 1.060 vs 1.000 / 0.991, 16384x4096x1024 1.036 /
# 1.035 vs 1.004 / 1.008 (4 stages, 4 buffers: +0.2 to +4 % only).
SHORT_K = GemmConfig(tile_n=192, pingpong=True, raster="n", epi_bufs=2)
SHORT_K_NARROW = GemmConfig(tile_n=128, pingpong=True, raster="n")  # the short-K tile before v4.7
# SHORT_K's speed over SHORT_K_NARROW at equal tile efficiency: the gains above are 3 to 7 %
# and track the two tiles' `tile_efficiency` ratio. Where 192-wide tiles fit the problem
# much worse (4096x4096x1024: 5.3 waves, ragged N; 4 stages measured 0.95-0.96x cuBLAS
# against 1.01-1.02 for 128x128), the narrow tile stays.
SHORT_K_GAIN = 1.04


def tile_efficiency(cfg: GemmConfig, m: int, n: int, sm_count: int) -> float:
    """The share of the MMA work the schedule runs that lands in the output: tiles cut by
    the problem's edge, the swizzle's padding clusters and the idle clusters of the last
    wave all lower it."""
    workers = max(1, sm_count // (cfg.cluster_m * cfg.cluster_n))
    waves = -(-scheduled_clusters(cfg, m, n) // workers)
    return m * n / (waves * workers * cfg.cluster_m * cfg.tile_m * cfg.cluster_n * cfg.tile_n)


def default_config(m: int | None, n: int | None, k: int | None, sm_count: int = 132, in_bytes: int = 2, *,
                   fused: bool = False, decode_split: bool = True, vector_operands: int = 0,
                   scale_operands: int = 0, full_operands: int = 0, cut_ends: bool = True,
                   batch: int = 1, whole_tiles: bool = False) -> GemmConfig:
    """The untuned heuristic (from the H200 config sweep in docs/kernels/gemm.md).

    Take the largest tile that still gives at least 3/4 of a wave of CTAs over the whole
    batch (128x256 is the most efficient per byte of shared memory; smaller tiles only buy
    parallelism), skinny M (<= 64, or <= 128 when 128-row tiles are too few) on
    one-warpgroup 64-row tiles. Cluster pairs go along M when there are two M tiles to
    pair (B multicast), else along N (A multicast). Short K (<= 1024)
    with many tiles goes pingpong: each tile's mainloop is short, so hiding its epilogue
    under the other warpgroup's mainloop pays (16384x16384x1024: 635 vs 611 TFLOP/s on
    128x128); since v4.7 on 128x192 tiles with a 5-stage ring (`SHORT_K`).
    `fused` (an epilogue with operands or an activation): the cooperative 128x256 tile
    stores 64-wide subtiles (`epi_n=64`, half the epilogue barriers; the staging buffers
    then cost the ring one stage): same-run sweeps measured +0.3 % to +3.7 %
    (h200-gemm-episweep.json, h200-gemm-biassweep.json; docs/kernels/gemm.md v3.1).
    v4.1-v4.4 ran gelu / silu (K <= 4096, >= 4 waves of 128x128 tiles) on pingpong 128x128
    c1x2 to hide the epilogue math; v4.5's store_overlap made the cooperative tile level
    to 4 % ahead there (docs/kernels/gemm.md v4.5), so every fused epilogue takes it.
    `decode_split`: M <= 32 with K >= 8192 on 64x64 tiles runs single CTAs with stream-K
    (v4.3; the fp8 path turns it off: measured on 16-bit inputs only).
    `vector_operands`: the epilogue's row / col operands; with three of them, or with
    `scale_operands` (fp8's per-row / per-column scales among them), the 128x256 tile
    stores 32-wide subtiles and loads the operands in the epilogue (see below).
    `full_operands`: the epilogue's full (M, N) operands (c, residual); the 128x256 tile
    then stores 32-wide subtiles (see below).
    `cut_ends`: a nearly full last wave with long ends runs `stream_k_ends` (see below;
    the fp8 path turns it off: measured on 16-bit inputs only). `batch`: the problem's
    batch count L. The ends rule and the full-wave test look at the whole batch's clusters
    (a batch's tiles share the last wave, and the device cuts that); the stream_k rule
    was measured and kept on one batch's clusters.
    `whole_tiles`: no stream-K of any kind (split-K decode, stream_k, stream_k_ends), for
    a caller with no zeroed workspace to give the kernel (the JAX path); the fused form
    is then the whole-tile one.
    """
    short_k = m is not None and n is not None and k is not None and k <= 1024 and m > 64 and (
        -(-m // 128) * -(-n // 128) >= 4 * sm_count)
    if in_bytes != 2:
        # fp8: the same tile choice (a stage holds the same bytes) with 128-deep k-blocks;
        # short K keeps the pingpong 128x128 tile there (128x192 was measured on bf16 only).
        if short_k:
            cfg = fit_swizzle(SHORT_K_NARROW, m, n)  # type: ignore[arg-type]
        else:
            cfg = default_config(m, n, k, sm_count, fused=fused, decode_split=False, vector_operands=vector_operands,
                                 scale_operands=scale_operands, full_operands=full_operands, cut_ends=False,
                                 batch=batch, whole_tiles=whole_tiles)
        return replace(cfg, tile_k=k_block(in_bytes))
    if m is None or n is None:
        return GemmConfig()
    if short_k:
        wide, narrow = fit_swizzle(SHORT_K, m, n), fit_swizzle(SHORT_K_NARROW, m, n)
        if SHORT_K_GAIN * tile_efficiency(wide, m, n, sm_count) >= tile_efficiency(narrow, m, n, sm_count):
            return wide
        return narrow
    if m <= 64:
        shapes: tuple[tuple[int, int], ...] = ((64, 256), (64, 128), (64, 64))
    elif m <= 128:
        # Two 64-row tiles share each B tile through a 2x1 cluster (128x4096x4096: 64x64
        # c2x1 230 TFLOP/s vs 128x64 c1x2 183 in the sweep).
        shapes = ((128, 256), (128, 128), (64, 128), (64, 64))
    else:
        shapes = ((128, 256), (128, 128), (128, 64))
    tm, tn = shapes[-1]
    # Tiles are counted over the whole batch: the schedule runs every batch's tiles in one
    # persistent grid. H200, same run, two passes (gemm.md session 36,
    # h200-gemm-s36-batched-tile.json): counted per batch, 8 x 1024x2048x4096 took 128x128
    # and 32 x 256x512x4096 128x64 pingpong (0.75-0.91x cuBLAS); 128x256 2x1 ran
    # 1.09-1.11x / 1.21-1.24x / 1.10x / 1.29-1.30x faster at 8 x 1024x2048x4096, 16 x
    # 512x1024x4096, 4 x 2048x1024x2048, 32 x 256x512x4096 (0.96-1.01x cuBLAS).
    for tm_, tn_ in shapes:
        if -(-m // tm_) * -(-n // tn_) * batch >= 0.75 * sm_count:
            tm, tn = tm_, tn_
            break
    m_tiles, n_tiles = -(-m // tm), -(-n // tn)
    cm, cn = (2, 1) if m_tiles >= 2 else ((1, 2) if n_tiles >= 2 else (1, 1))
    if decode_split and not whole_tiles and (tm, tn) == (64, 64) and m <= 32 and k is not None and k >= 8192:
        # Decode-sized M with long K: the weight streams through too few CTAs, and the
        # A multicast of a 1x2 pair buys nothing (A is 16-32 rows). Single CTAs with
        # stream-K (a sub-wave problem becomes split-K) put every SM on the weight.
        # H100, same run, x cuBLAS (L2 flushed / graph over rotated operands; gemm.md
        # v4.3, h100-gemm-small-m16-v4.3.json), 1x2 pair -> this: 16x4096x28672 0.897 /
        # 0.844 -> 0.967 / 0.947, 16x4096x14336 0.964 / 0.843 -> 0.973 / 0.925,
        # 32x2048x8192 0.859 / 0.738 -> 0.906 / 0.849, 16x8192x14336 (a full wave:
        # nothing split) 0.909 / 0.896 -> 0.952 / 0.956. At K = 4096 the pair stays
        # (16x4096x4096: 0.979 / 0.889 against 0.978 / 0.840); at M = 64 too (64x4096x14336:
        # 1.008 / 1.023 against 1.011 / 0.995).
        return fit_swizzle(GemmConfig(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1, stream_k=True), m, n)
    if (tm, tn) == (128, 64) and n_tiles >= 2:
        # Sub-wave problems are bound by L2->SM traffic: multicast the larger operand.
        # A's 128-row k-block (16 KiB) across an N pair leaves 16 KiB a CTA per k-block
        # against 20 KiB with B's shared across an M pair. H100, 1024^3, three runs (gemm.md
        # v4.2): +1 to +4 % under the graph timer; flushed, +7 % twice and level once
        # (the committed h100-gemm-small-sub.json: 0.886 / 0.820 against 0.889 / 0.805).
        cm, cn = 1, 2
    # 128x64 (sub-wave problems with M > 128) runs pingpong: in the H200 sweep
    # (h200-gemm.json) 128x64 c2x1 pingpong was >= cooperative at all 5 shapes measured
    # both ways in one run (1024^3: 213.7 vs 209.1 TFLOP/s; 2048x14336x4096 +2.2%).
    pingpong = (tm, tn) == (128, 64)
    # Three row / col epilogue operands (fp8's per-row and per-column scales with a bias)
    # held from the mainloop beside 64-wide subtiles spill: ptxas, 128x256, 328 bytes for
    # fp8 with bias + gelu, 244-484 for 16-bit; with 32-wide subtiles and the operands
    # loaded in the epilogue, none. H200, fp8 rowwise scales + bias + gelu, same run, four
    # timings each: 8192^3 1092-1183 -> 1267-1291 TFLOP/s, 4096^3 1016-1058 -> 1055-1101
    # (gemm.md session 30). Full operands (c, residual) spill either way.
    # Any fp8 per-row / per-column scale operand takes the same form (no spill either way,
    # so not for that): H200, same run, two passes, TFLOP/s held -> 32-wide late (gemm.md
    # session 31, h200-gemm-s31-rowwise-cfg.json), both scales: plain 8192^3 1280 / 1247 ->
    # 1307 / 1305, 4096^3 1245 / 1265 -> 1309 / 1285, 2048x8192x28672 1308 / 1296 -> 1337 /
    # 1340; + gelu 1253 / 1238 -> 1281 / 1271, 1182 / 1203 -> 1264 / 1116 (noisy), 1255 /
    # 1258 -> 1329 / 1337; one scale rowwise (-rowwise-single.json): ahead in all 8 pairs.
    narrow = fused and (vector_operands >= 3 or scale_operands > 0) and (tm, tn) == (128, 256)
    # A full operand (c, residual) is read one subtile ahead of its math; 32-wide subtiles
    # halve what that holds (ptxas, 8192^3, bias + gelu + residual: 56 bytes of spill on
    # 64-wide, none on 32). H100, three runs of six whole-tile shapes (gemm.md session 33,
    # h100-gemm-s33-residual*.json), 32- over 64-wide with the operands held as before: ahead
    # in 70 of 88 pairs, mean +1.1 % (bias + gelu + residual 27 / 32, +1.5 %; bias + silu +
    # residual 20 / 24, +1.2 %; residual alone 23 / 32, +0.7 %). fp8 with per-tensor scales
    # (ptxas: bias + gelu + residual 64 bytes -> 0), two runs of three shapes
    # (h100-gemm-s33-subtiles{,-fp8-2}.json): ahead in 18 of 24 pairs, mean +2.3 %.
    wide = not narrow and not full_operands
    epi_n = 64 if fused and (tm, tn) == (128, 256) and wide else 32
    # A fused epilogue on a cooperative tile walks the clusters along N first (raster "n"):
    # H200, two runs of bench_gemm.py --set raster (gemm.md v4.4), bias + gelu on 128x256 2x1
    # without stream-K, raster n over m in the same run: -1.6 to +4.0 %, mean +0.75 %, ahead
    # in 15 of 22 pairs (six shapes, 32- and 64-wide subtiles).
    raster = "n" if fused and not pingpong else "m"
    cfg = fit_swizzle(GemmConfig(tile_m=tm, tile_n=tn, cluster_m=cm, cluster_n=cn, pingpong=pingpong, epi_n=epi_n,
                                 raster=raster, early_operands=not narrow), m, n)
    # Cooperative tiles of a problem with at least one full wave split a last wave that
    # is at most half full along K (stream_k). H100 same-run sweep (h100-gemm-streamk.json):
    # 3072x3072x16384 0.809 -> 0.979x cuBLAS, 5120x5120x8192 0.895 -> 0.941x. Sub-wave
    # problems (split-K) measured slower (16x4096x14336 0.952 -> 0.910x, 1024^3 on 128x256
    # tiles 0.42x): the fixup costs more than the shorter runs save there, so the default
    # keeps whole tiles. Where the plan splits nothing (a last wave more than half full)
    # the stream-K kernel runs the same tiles but waits for the last wgmma batch before the
    # epilogue instead of issuing the first subtile's operand loads under it: level plain,
    # level to -4 % with a fused bias + gelu on the H200 (gemm.md v4.4). So it is set only
    # where the plan splits (with K unknown: wherever there is a full wave), or, with
    # stream_k_ends, where a nearly full last wave of a problem with a full wave before it
    # has long ends (below).
    clusters = scheduled_clusters(cfg, m, n)  # one batch's: the stream_k rule's measure
    total = scheduled_clusters(cfg, m, n, batch)  # the whole batch's: what the device plans over
    workers = sm_count // (cm * cn)
    k_tiles = None if k is None else -(-k // cfg.tile_k)
    if whole_tiles or pingpong or total < workers:
        pass  # sub-wave problems: split-K measured slower (above); ends measured with full waves only
    elif clusters >= workers and (k_tiles is None or stream_k_split(clusters, workers, k_tiles)[0]):
        cfg = replace(cfg, stream_k=True)
    elif cut_ends and k_tiles is not None and stream_k_ends_len(total, workers, k_tiles) >= SK_ENDS_DEFAULT:
        # A last wave more than half full, with ends of at least SK_ENDS_DEFAULT k-blocks,
        # is cut too (`stream_k_ends`). H200, same run, default -> ends (gemm.md session 35,
        # h200-gemm-s35-ends*.json): 8192^3 (ends of 42) plain +1.1 / +0.7 / +1.6 / +1.4 /
        # -0.8 %, bias + gelu on 32-wide subtiles +1.6 / +0.7 / +0.4 %; 2048x8192x28672
        # (48) plain +0.6 / -0.2 / +0.3 / -0.7 / +0.6 %, fused +0.7 / -0.5 / +0.8 %. Short
        # ends lost: 4096^3 (5) -9 to -10 %, 2048x14336x4096 (11) -1.5 to -4 %; 4096x14336x4096
        # (20) and 6144^3 (23) level to -1.6 %. Batched problems, cut over the whole batch's
        # last wave (gemm.md session 36, h200-gemm-s36-batched-ends.json, five shapes with
        # ends of 42-88, two passes): plain level (mean -0.05 %), bias + gelu on 32-wide
        # subtiles +1.45 % (ahead in 8 of 10 pairs), as unbatched.
        cfg = replace(cfg, stream_k=True, stream_k_ends=True)
    if cfg.stream_k and fused and (tm, tn) == (128, 256):
        # A stream-K tile loads its row / col operands in the epilogue (held from the
        # mainloop across the fixup they spilled; `loads_operands_early`), and with them
        # loaded there 32-wide subtiles lead: H100, same run, two passes, bias + gelu /
        # silu at six stream-K shapes (gemm.md session 32, h100-gemm-s32-streamk.json),
        # 32- over 64-wide, ahead in 23 of 24 pairs (-0.3 to +3.3 %).
        cfg = replace(cfg, epi_n=32, early_operands=False)
    return cfg


def candidate_configs(m: int | None, n: int | None, in_bytes: int = 2) -> list[GemmConfig]:
    """A short list the autotuner times; each is validated against the target first."""
    if in_bytes != 2:
        return [replace(c, tile_k=k_block(in_bytes)) for c in candidate_configs(m, n)]
    out = [
        GemmConfig(),
        GemmConfig(cluster_m=1, cluster_n=2),
        GemmConfig(cluster_m=1, cluster_n=1),
        GemmConfig(swizzle=4),
        GemmConfig(raster="n"),
        GemmConfig(tile_m=256, tile_n=128),
        GemmConfig(tile_n=128),
        GemmConfig(tile_n=128, cluster_m=1, cluster_n=2),
        GemmConfig(tile_n=64),
        GemmConfig(raster="n", swizzle=4),
        GemmConfig(tile_n=128, pingpong=True),
        GemmConfig(tile_n=128, pingpong=True, raster="n"),
        GemmConfig(tile_n=128, pingpong=True, cluster_m=1, cluster_n=2),
        GemmConfig(tile_m=64, tile_n=256, pingpong=True),
        GemmConfig(stream_k=True),
        GemmConfig(cluster_m=1, cluster_n=2, stream_k=True),
        GemmConfig(tile_n=128, stream_k=True),
        # a nearly full last wave cut too (session 35: ahead at 8192^3, level at
        # 2048x8192x28672, behind on short ends; where the plan cuts nothing it runs whole tiles)
        GemmConfig(stream_k=True, stream_k_ends=True),
        SHORT_K,
        replace(SHORT_K, raster="m"),
        GemmConfig(tile_n=128, pingpong=True, raster="n", epi_bufs=2),
        GemmConfig(tile_m=256, tile_n=192, raster="n"),
    ]
    if m is not None and m <= 128:
        out += [
            GemmConfig(tile_m=64, tile_n=128, cluster_m=1),
            GemmConfig(tile_m=64, tile_n=256, cluster_m=1, cluster_n=2),
            GemmConfig(tile_m=64, tile_n=64, cluster_m=1, cluster_n=2),
            GemmConfig(tile_m=64, tile_n=64, cluster_m=2),
            GemmConfig(tile_n=64, cluster_m=1, cluster_n=2),
            GemmConfig(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1),
            GemmConfig(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1, stream_k=True),
            GemmConfig(tile_m=64, tile_n=128, cluster_m=1, cluster_n=1, stream_k=True),
        ]
    seen: list[GemmConfig] = []
    for c in out:
        if c not in seen:
            seen.append(c)
    return seen
