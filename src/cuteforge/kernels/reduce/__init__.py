"""Reduction kernels (CuTe DSL)."""

from typing import Any

from .config import (
    LOAD_HINTS,
    OPS,
    ColReduceConfig,
    RowReduceConfig,
    candidate_col_configs,
    candidate_configs,
    default_col_config,
    default_config,
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

# The device modules import the DSL: their builders load on first use (the DSL is imported
# only to compile).
_DEVICE = {"make_col_reduce": "col", "make_row_reduce": "row"}


def __getattr__(name: str) -> Any:
    if name in _DEVICE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_DEVICE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Importing the family registers its kernels (spec) and their tuning problems (tune).
from . import spec, tune  # noqa: E402, F401
