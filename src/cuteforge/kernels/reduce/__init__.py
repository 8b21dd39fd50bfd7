"""Reduction kernels (CuTe DSL)."""

from .row import (
    LOAD_HINTS,
    OPS,
    RowReduceConfig,
    candidate_configs,
    default_config,
    make_row_reduce,
)

__all__ = [
    "LOAD_HINTS",
    "OPS",
    "RowReduceConfig",
    "candidate_configs",
    "default_config",
    "make_row_reduce",
]
