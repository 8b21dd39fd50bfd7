"""Reduction kernels (CuTe DSL)."""

from .col import ColReduceConfig, candidate_col_configs, default_col_config, make_col_reduce
from .row import (
    LOAD_HINTS,
    OPS,
    RowReduceConfig,
    candidate_configs,
    default_config,
    make_row_reduce,
)

__all__ = [
    "ColReduceConfig",
    "candidate_col_configs",
    "default_col_config",
    "make_col_reduce",
    "LOAD_HINTS",
    "OPS",
    "RowReduceConfig",
    "candidate_configs",
    "default_config",
    "make_row_reduce",
]

# Importing the family registers its kernels (spec) and their tuning problems (tune).
from . import spec, tune  # noqa: E402, F401
