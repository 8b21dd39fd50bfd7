"""Reduction kernels (CuTe DSL)."""
from .row import OPS, RowReduceConfig, candidate_configs, default_config, make_row_reduce

__all__ = ["OPS", "RowReduceConfig", "candidate_configs", "default_config", "make_row_reduce"]
