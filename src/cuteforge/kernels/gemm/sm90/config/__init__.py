"""Configs of the sm_90a GEMM: `knobs` (what a tile / pipeline choice is and whether the
device can run it), `schedule` (the persistent schedule and stream-K mirrored on the
host), `defaults` (the heuristic) and `candidates` (what the autotuner times)."""

from .candidates import candidate_configs
from .defaults import SHORT_K, SHORT_K_GAIN, SHORT_K_NARROW, default_config, gated_config
from .knobs import (
    BARRIER_BYTES,
    K_BLOCK_BYTES,
    MAX_ACC_REGS,
    RASTER_ORDERS,
    GemmConfig,
    k_block,
    usable_tuned,
)
from .schedule import (
    SK_END_COST,
    SK_ENDS_DEFAULT,
    SK_MAX_SPLIT,
    SK_MIN_ITERS,
    cluster_grid,
    fit_swizzle,
    scheduled_clusters,
    stream_k_ends_len,
    stream_k_flag_words,
    stream_k_split,
    stream_k_workspace_words,
    tile_efficiency,
)

__all__ = [
    "BARRIER_BYTES",
    "K_BLOCK_BYTES",
    "MAX_ACC_REGS",
    "RASTER_ORDERS",
    "SHORT_K",
    "SHORT_K_GAIN",
    "SHORT_K_NARROW",
    "SK_END_COST",
    "SK_ENDS_DEFAULT",
    "SK_MAX_SPLIT",
    "SK_MIN_ITERS",
    "GemmConfig",
    "candidate_configs",
    "cluster_grid",
    "default_config",
    "fit_swizzle",
    "gated_config",
    "k_block",
    "scheduled_clusters",
    "stream_k_ends_len",
    "stream_k_flag_words",
    "stream_k_split",
    "stream_k_workspace_words",
    "tile_efficiency",
    "usable_tuned",
]
