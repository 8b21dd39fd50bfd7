"""Session 28: does an evict-first load (``load_hint="cs"``, ``ld.global.cs``: lines
allocated evict-first in L1 and L2) take the write-back of the flush's dirty L2 lines
out of a row reduction's time? The bar's bf16 32768 x 4096 sum reads 88-89 % of copy
under the default flush (a zeroed 256 MiB buffer: L2 full of dirty lines) and 99 % under
the read flush (reduce.md). Kernel alone, registered row_reduce (op sum), the default
config against the same config with each load hint, both flush modes, copy measured under
each.

    python benchmarks/probes/reduce_s28d.py
"""

from __future__ import annotations

import dataclasses

import torch

from cuteforge import timing
from cuteforge.kernels.reduce.spec import row_reduce

SHAPES = [(32768, 4096, torch.bfloat16), (32768, 4096, torch.float32), (16384, 16384, torch.bfloat16),
          (4096, 65536, torch.bfloat16), (32768, 1024, torch.bfloat16)]
for flush in ("zero", "read"):
    timing.set_flush_mode(flush)
    copy = timing.copy_bandwidth()
    for m, n, dt in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=dt)
        out = torch.empty(m, device="cuda", dtype=dt)
        key = row_reduce.signature.bind((x, out))
        params = (("op", "sum"),)
        base = row_reduce.spec(key, params).config
        cells = []
        for hint in ("", "cs", "nc", "no_alloc"):
            cfg = dataclasses.replace(base, load_hint=hint)
            fn = row_reduce.get(key, params, cfg)
            ms = timing.bench(lambda fn=fn, a=(x, out): fn(*a))
            cells.append(f"{hint or 'plain'} {100 * x.numel() * x.element_size() / (ms * 1e-3) / copy:.1f}")
        print(f"flush={flush} copy {copy / 1e9:.0f} GB/s {m}x{n} {dt}: " + ", ".join(cells), flush=True)
