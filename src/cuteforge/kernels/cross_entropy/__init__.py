"""Cross-entropy kernels (CuTe DSL): one streaming pass forward (per-row, or mean/sum in
the same launch), one backward."""

from .device import make_ce_bwd, make_ce_fwd, make_ce_fwd_reduce

__all__ = ["make_ce_bwd", "make_ce_fwd", "make_ce_fwd_reduce"]

# Importing the family registers its kernels (spec) and their tuning problems (tune).
from . import spec, tune  # noqa: E402, F401
