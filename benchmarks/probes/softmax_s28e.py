"""Session 28: the fp32 backward past 163840 (V2_BWD_MAX_N when this ran; this probe
replaced that cap) stayed on the 512-thread `regs` path, where a realigned row (odd N)
takes 72-96 registers against 63-84 before the realignment (one 512-thread CTA per SM
over 64). Kernel alone, the ops' kernels (`kernel_params(..., same_heads=True)`), fp32,
M = 2^28 // N: regs(512, c16) against mbar(512, c16) and mbar(256, c16), both modes,
aligned and odd N.

    python benchmarks/probes/softmax_s28e.py
"""

from __future__ import annotations

import torch

from cuteforge import timing
from cuteforge.kernels.softmax import SoftmaxConfig
from cuteforge.kernels.softmax.spec import kernel_params, softmax_bwd

copy = timing.copy_bandwidth()
cfgs = [SoftmaxConfig(512, 512, 16, "regs"), SoftmaxConfig(512, 512, 16, "mbar"), SoftmaxConfig(256, 256, 16, "mbar")]
for n in (163841, 200000, 200001, 262143, 262144):
    m = (1 << 28) // n
    y = torch.softmax(2 * torch.randn(m, n, device="cuda"), -1)
    dy = torch.randn_like(y)
    dx = torch.empty_like(y)
    key = softmax_bwd.signature.bind((dy, y, dx))
    for mode in ("softmax_bwd", "log_softmax_bwd"):
        cells = []
        for cfg in cfgs:
            fn = softmax_bwd.get(key, kernel_params(mode, key, True), cfg)
            fn(dy, y, dx)
            ms = timing.bench(lambda fn=fn, a=(dy, y, dx): fn(*a))
            cells.append(f"{cfg.path}{cfg.threads} {100 * 3 * m * n * 4 / (ms * 1e-3) / copy:.1f}")
        print(f"n={n} {mode}: " + ", ".join(cells), flush=True)
