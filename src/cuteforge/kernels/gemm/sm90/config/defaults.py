"""The sm_90a GEMM's untuned default: the tile, cluster, schedule and epilogue shape the
heuristic picks for a problem (measured on the H200 and H100 against cuBLAS; each rule
with a one-line why)."""

from __future__ import annotations

from dataclasses import replace

from .knobs import GemmConfig, k_block
from .schedule import (
    SK_ENDS_DEFAULT,
    fit_swizzle,
    scheduled_clusters,
    stream_k_ends_len,
    stream_k_split,
    tile_efficiency,
)

# Short K (<= 1024) with >= 4 waves of 128x128 tiles: pingpong 128x192 (192 accumulators a
# warpgroup), clusters walked along N, 2 staging buffers per warpgroup so the ring holds 5
# stages: 1.04-1.09x cuBLAS against 0.99-1.04x for pingpong 128x128.
SHORT_K = GemmConfig(tile_n=192, pingpong=True, raster="n", epi_bufs=2)
SHORT_K_NARROW = GemmConfig(tile_n=128, pingpong=True, raster="n")  # the short-K tile where 192 fits badly
# SHORT_K's speed over SHORT_K_NARROW at equal tile efficiency (its gains of 3 to 7 % track
# the two tiles' `tile_efficiency` ratio): where 192-wide tiles fit the problem much
# worse, the narrow tile stays.
SHORT_K_GAIN = 1.04
# Long K (>= 4096) whose pingpong 128x192 tiles fill one wave to at least LONG_K_FILL (a
# weight gradient: M, N = hidden sizes, K = tokens): one tile a CTA, its epilogue under
# the other warpgroup's mainloop. H200, dW layouts (A M-major): 0.88 / 1.01 / 0.97 / 1.00 /
# 0.83x cuBLAS at 1536^2 x 12288, 1024x2816x16384, 2816x1024x16384, 1024x2816x4096 and
# 2816x1024x4096 against 0.85 / 0.86 / 0.93 / 0.77 / 0.80x for the 128x128 stream-K
# default; at 48 tiles (1024^2) 0.48x and at 176-192 (1024x4096, 2048^2) 0.70-0.72x.
LONG_K = GemmConfig(tile_n=192, pingpong=True, epi_bufs=2)
LONG_K_FILL = 0.72
# One wave of CTAs takes as long as its widest tile: where LONG_K applies and 160-wide
# tiles still fit one wave, they run instead (1536^2 x 12288, dW layout: 0.96x cuBLAS in
# a probe and 0.955x in `bench_gemm.py --set backward`, against 0.88x for 192; widths
# that are not a multiple of 32, 144 and 176, ran at 0.45-0.94x). Only where LONG_K
# applies: elsewhere 160-wide tiles were not measured.
LONG_K_NARROW = 160


def default_config(m: int | None, n: int | None, k: int | None, sm_count: int = 132, in_bytes: int = 2, *,
                   fused: bool = False, decode_split: bool = True, vector_operands: int = 0,
                   scale_operands: int = 0, full_operands: int = 0, cut_ends: bool = True,
                   batch: int = 1, whole_tiles: bool = False) -> GemmConfig:
    """The untuned heuristic.

    Take the largest tile that still gives at least 3/4 of a wave of CTAs over the whole
    batch (128x256 is the most efficient per byte of shared memory; smaller tiles only buy
    parallelism), skinny M (<= 64, or <= 128 when 128-row tiles are too few) on
    one-warpgroup 64-row tiles. Cluster pairs go along M when there are two M tiles to
    pair (B multicast), else along N (A multicast). Short K (<= 1024) with many tiles goes
    pingpong on 128x192 tiles with a 5-stage ring (`SHORT_K`): each tile's mainloop is
    short, so hiding its epilogue under the other warpgroup's mainloop pays.
    `fused` (an epilogue with operands or an activation): the cooperative 128x256 tile
    stores 64-wide subtiles (`epi_n=64`, half the epilogue barriers; the staging buffers
    then cost the ring one stage), +0.3 to +3.7 %.
    `decode_split`: M <= 32 with K >= 8192 on 64x64 tiles runs single CTAs with stream-K
    (the fp8 path turns it off: measured on 16-bit inputs only).
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
    long_k_tiles = -(-m // LONG_K.tile_m) * -(-n // LONG_K.tile_n) * batch
    # (M or N <= 64: the rules below give 64-row or narrower tiles)
    if (not fused and k is not None and k >= 4096 and min(m, n) > 64
            and LONG_K_FILL * sm_count <= long_k_tiles <= sm_count):
        narrow_tiles = -(-m // LONG_K.tile_m) * -(-n // LONG_K_NARROW) * batch
        return fit_swizzle(LONG_K if narrow_tiles > sm_count else replace(LONG_K, tile_n=LONG_K_NARROW), m, n)
    if m <= 64:
        shapes: tuple[tuple[int, int], ...] = ((64, 256), (64, 128), (64, 64))
    elif m <= 128:
        # Two 64-row tiles share each B tile through a 2x1 cluster (128x4096x4096: 64x64
        # c2x1 230 TFLOP/s against 128x64 c1x2 183).
        shapes = ((128, 256), (128, 128), (64, 128), (64, 64))
    else:
        shapes = ((128, 256), (128, 128), (128, 64))
    tm, tn = shapes[-1]
    # Tiles are counted over the whole batch: the schedule runs every batch's tiles in one
    # persistent grid (counted per batch, small batched problems took tiles 1.09-1.30x slower).
    for tm_, tn_ in shapes:
        if -(-m // tm_) * -(-n // tn_) * batch >= 0.75 * sm_count:
            tm, tn = tm_, tn_
            break
    m_tiles, n_tiles = -(-m // tm), -(-n // tn)
    cm, cn = (2, 1) if m_tiles >= 2 else ((1, 2) if n_tiles >= 2 else (1, 1))
    if decode_split and not whole_tiles and (tm, tn) == (64, 64) and m <= 32 and k is not None and k >= 8192:
        # Decode-sized M with long K: the weight streams through too few CTAs, and the
        # A multicast of a 1x2 pair buys nothing (A is 16-32 rows). Single CTAs with
        # stream-K (a sub-wave problem becomes split-K) put every SM on the weight:
        # 0.91-0.97x cuBLAS against 0.74-0.96x for the pair (H100); at K = 4096 or M = 64
        # the pair stays.
        return fit_swizzle(GemmConfig(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1, stream_k=True), m, n)
    if (tm, tn) == (128, 64) and n_tiles >= 2:
        # Sub-wave problems are bound by L2->SM traffic: multicast the larger operand.
        # A's 128-row k-block (16 KiB) across an N pair leaves 16 KiB a CTA per k-block
        # against 20 KiB with B's shared across an M pair (+1 to +4 %, H100).
        cm, cn = 1, 2
    # 128x64 (sub-wave problems with M > 128) runs pingpong: at least as fast as
    # cooperative at every shape measured both ways (1024^3: 214 against 209 TFLOP/s).
    pingpong = (tm, tn) == (128, 64)
    # Three row / col epilogue operands (fp8's per-row and per-column scales with a bias)
    # held from the mainloop beside 64-wide subtiles spill (ptxas, 128x256: 244-484 bytes);
    # 32-wide subtiles with the operands loaded in the epilogue spill none (fp8 rowwise +
    # bias + gelu 8192^3: 1267-1291 against 1092-1183 TFLOP/s). Any fp8 per-row /
    # per-column scale operand takes the same form (no spill either way, but ahead in
    # every pair measured).
    narrow = fused and (vector_operands >= 3 or scale_operands > 0) and (tm, tn) == (128, 256)
    # A full operand (c, residual) is read one subtile ahead of its math; 32-wide subtiles
    # halve what that holds (no spill where 64-wide spilled 56 bytes): +1.1 % (16-bit) and
    # +2.3 % (fp8) on average over the 64-wide ones (H100).
    wide = not narrow and not full_operands
    epi_n = 64 if fused and (tm, tn) == (128, 256) and wide else 32
    # A fused epilogue on a cooperative tile walks the clusters along N first (raster "n"):
    # -1.6 to +4.0 %, mean +0.75 % over raster "m".
    raster = "n" if fused and not pingpong else "m"
    cfg = fit_swizzle(GemmConfig(tile_m=tm, tile_n=tn, cluster_m=cm, cluster_n=cn, pingpong=pingpong, epi_n=epi_n,
                                 raster=raster, early_operands=not narrow), m, n)
    # Cooperative tiles of a problem with at least one full wave split a last wave that
    # is at most half full along K (stream_k): 0.81 -> 0.98x cuBLAS at 3072x3072x16384
    # (H100). Sub-wave problems (split-K) measured slower, so the default keeps whole tiles
    # there. Where the plan splits nothing (a last wave more than half full) the stream-K
    # kernel waits for the last wgmma batch before the epilogue (level to -4 % fused), so
    # it is set only where the plan splits (with K unknown: wherever there is a full wave),
    # or, with stream_k_ends, where a nearly full last wave has long ends (below).
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
        # is cut too (`stream_k_ends`): +0.4 to +1.6 % at ends of 42-88 k-blocks, plain and
        # fused, batched or not; short ends lost (4096^3, ends of 5: -9 %).
        cfg = replace(cfg, stream_k=True, stream_k_ends=True)
    if cfg.stream_k and fused and (tm, tn) == (128, 256):
        # A stream-K tile loads its row / col operands in the epilogue (held from the
        # mainloop across the fixup they spilled; `loads_operands_early`), and with them
        # loaded there 32-wide subtiles lead (ahead in 23 of 24 pairs, H100).
        cfg = replace(cfg, epi_n=32, early_operands=False)
    return cfg


def gated_config(cfg: GemmConfig) -> GemmConfig:
    """`cfg` for the gated GEMM (its output tile is tile_n / 2 wide): a tile_n that is not a
    multiple of 32 becomes the next multiple down (at least 32); the widest subtile, up to
    cfg's, that divides the half tile; the largest cluster_m, up to cfg's, whose CTAs each
    get whole 8-row atoms of a multicast half-tile."""
    if cfg.tile_n % 32:
        cfg = replace(cfg, tile_n=max(32, cfg.tile_n // 32 * 32))
    half = cfg.tile_n // 2
    epi_n = next(w for w in (64, 32, 16) if w <= cfg.epi_n and half % w == 0)
    cluster_m = cfg.cluster_m
    while half % (8 * cluster_m):
        cluster_m //= 2
    return replace(cfg, epi_n=epi_n, cluster_m=cluster_m)
