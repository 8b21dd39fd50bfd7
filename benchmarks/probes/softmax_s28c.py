"""Session 28: the 16-bit long-row forward, `async` (the default: the chunk staged in shared
memory by cp.async) against `mbar` (held in registers) at the default's cluster, both
modes, at powers of two and between (h200-softmax-longrow-s28.json had mbar ahead by
~3 points at 50257 / 100000 / 151937 for softmax). Kernel alone, registered softmax_fwd on
contiguous rows (the ops' same_heads kernels at odd N), M = 2^28 // N, L2 flushed.

    python benchmarks/probes/softmax_s28c.py [N,N,...]
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from cuteforge import timing
from cuteforge.kernels.softmax.spec import config_for, kernel_params, softmax_fwd

copy = timing.copy_bandwidth()
NS = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else [32768, 50257, 65536, 100000, 131072, 151937, 262144]
for n in NS:
    m = (1 << 28) // n
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    key = softmax_fwd.signature.bind((x, y))
    base = config_for("sm_90a", n, 16, False, m)
    for mode in ("softmax", "log_softmax"):
        params = kernel_params(mode, key, True)
        out = []
        for path in ("async", "mbar"):
            cfg = dataclasses.replace(base, path=path)
            fn = softmax_fwd.get(key, params, cfg)
            fn(x, y)
            ref = getattr(torch, mode)(x.float(), -1)
            err = (y.float() - ref).abs().max().item()
            ms = timing.bench(lambda fn=fn, a=(x, y): fn(*a))
            out.append(f"{path} {100 * 2 * m * n * 2 / (ms * 1e-3) / copy:.1f} (err {err:.2g})")
        print(f"n={n} {mode} c{base.cluster_n}: " + ", ".join(out), flush=True)
