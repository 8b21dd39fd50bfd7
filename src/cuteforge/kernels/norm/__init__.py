"""RMSNorm / LayerNorm kernels (CuTe DSL): forward with an optional fused residual add,
backward with dweight/dbias partials. See docs/kernels/norm.md."""

from .config import NormConfig, candidate_configs, default_config

__all__ = ["NormConfig", "candidate_configs", "default_config"]

# Importing the family registers its kernels (spec) and their tuning problems (tune).
from . import spec, tune  # noqa: E402, F401
