"""The sm_90a GEMM's candidate configs: the short list the autotuner times (each validated
against the target first)."""

from __future__ import annotations

from dataclasses import replace

from .defaults import SHORT_K
from .knobs import GemmConfig, k_block


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
        # a nearly full last wave cut too (ahead with long ends, behind with short ones;
        # where the plan cuts nothing it runs whole tiles)
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
