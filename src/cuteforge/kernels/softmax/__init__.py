"""Softmax and log-softmax over the last dim, forward and backward (CuTe DSL)."""

from typing import Any

from .config import (
    MODES,
    PATHS,
    SoftmaxConfig,
    candidate_configs,
    default_config,
    is_backward,
    longrow_candidates,
)

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


def __getattr__(name: str) -> Any:
    """`make_softmax` loads with the device module (the DSL is imported only to compile)."""
    if name == "make_softmax":
        from .device import make_softmax

        return make_softmax
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Importing the family registers its kernels (spec) and their tuning problems (tune).
from . import spec, tune  # noqa: E402, F401
