"""The persistent schedule as the kernel runs it, mirrored on the host: the clusters a
problem schedules, the stream-K split of a last wave and its workspace, the swizzle group
fitted to the problem, and how much of the scheduled MMA work lands in the output."""

from __future__ import annotations

from dataclasses import replace

from .knobs import GemmConfig


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


def tile_efficiency(cfg: GemmConfig, m: int, n: int, sm_count: int) -> float:
    """The share of the MMA work the schedule runs that lands in the output: tiles cut by
    the problem's edge, the swizzle's padding clusters and the idle clusters of the last
    wave all lower it."""
    workers = max(1, sm_count // (cfg.cluster_m * cfg.cluster_n))
    waves = -(-scheduled_clusters(cfg, m, n) // workers)
    return m * n / (waves * workers * cfg.cluster_m * cfg.tile_m * cfg.cluster_n * cfg.tile_n)
