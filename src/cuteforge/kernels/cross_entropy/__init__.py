"""Cross-entropy kernels (CuTe DSL): one streaming pass forward (per-row, or mean/sum in
the same launch), one backward."""

from typing import Any

__all__ = ["make_ce_bwd", "make_ce_fwd", "make_ce_fwd_reduce"]


def __getattr__(name: str) -> Any:
    """The builders load with the device module (the DSL is imported only to compile)."""
    if name in __all__:
        from . import device

        return getattr(device, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Importing the family registers its kernels (spec) and their tuning problems (tune).
from . import spec, tune  # noqa: E402, F401
