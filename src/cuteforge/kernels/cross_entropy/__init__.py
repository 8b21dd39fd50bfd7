"""Cross-entropy kernels (CuTe DSL): one streaming pass forward, one backward."""

from .kernels import make_ce_bwd, make_ce_fwd

__all__ = ["make_ce_bwd", "make_ce_fwd"]
