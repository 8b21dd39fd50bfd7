"""RMSNorm / LayerNorm kernels (CuTe DSL): forward with an optional fused residual add,
backward with dweight/dbias partials. See docs/kernels/norm.md."""

from .config import NormConfig, candidate_configs, default_config

__all__ = ["NormConfig", "candidate_configs", "default_config"]
