"""Dense GEMM on Hopper (sm_90a): TMA + WGMMA, warp-specialized, persistent, fused epilogues."""

# Importing the family registers its kernels (spec) and their tuning problems (tune).
from . import spec, tune  # noqa: E402, F401
