"""Dense GEMM on Hopper (sm_90a): TMA + WGMMA, warp-specialized, persistent, fused epilogues."""
