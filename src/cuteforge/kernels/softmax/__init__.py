"""Softmax and log-softmax over the last dim, forward and backward (CuTe DSL)."""

from .config import (
    MODES,
    PATHS,
    SoftmaxConfig,
    candidate_configs,
    default_config,
    is_backward,
    longrow_candidates,
)
from .device import make_softmax

__all__ = [
    "MODES",
    "PATHS",
    "SoftmaxConfig",
    "candidate_configs",
    "default_config",
    "is_backward",
    "longrow_candidates",
    "make_softmax",
]

# Importing the family registers its kernels (spec) and their tuning problems (tune).
from . import spec, tune  # noqa: E402, F401
