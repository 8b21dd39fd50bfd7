"""Session 28: the 16-bit backward at N = 151937 (rows not on 16 bytes, realigned) read
~61 % of copy on mbar(256, c16) where N = 151936 (aligned) read 85-90 %. What in the
realigned kernel costs it? Kernel alone (registered softmax_bwd, preallocated dx), bf16,
M = 1766, both N, softmax_bwd and log_softmax_bwd, and with SAME=1 the element-by-element
fallback compiled out (chunked.operand patched to claim dy / dx share y's head, true for
these contiguous inputs; since ef00cc6 the ops build that kernel themselves, the
`same_heads` parameter). Also fp32 at 200000 / 200001 / 262143 on the 512-thread regs
backward (TWO=0: without the two-CTA register budget of a realigned row, which 336e7c6
added and ef00cc6 dropped; after that the switch does nothing) against mbar.
Run each variant with its own CUTEFORGE_CACHE_DIR:

    CUTEFORGE_CACHE_DIR=/tmp/p0 python benchmarks/probes/softmax_s28b.py
    SAME=1 TWO=0 CUTEFORGE_CACHE_DIR=/tmp/p1 python benchmarks/probes/softmax_s28b.py
"""

from __future__ import annotations

import os

import torch

from cuteforge import timing
from cuteforge.kernels.softmax import SoftmaxConfig, chunked

if os.environ.get("SAME") == "1":
    def _same(row, h, elem_bytes):
        from cuteforge.kernels.row_split import realigned

        return realigned(row, elem_bytes)[0], row.iterator + h, True

    chunked.operand = _same

if os.environ.get("TWO") == "0":  # the realigned 512-thread regs backward without its 2-CTA budget
    from cuteforge.kernels.softmax import device

    device.REALIGNED_BWD_TWO_CTAS = False

from cuteforge.kernels.softmax.spec import softmax_bwd  # noqa: E402

copy = timing.copy_bandwidth()
bf16 = [SoftmaxConfig(256, 256, 16, "mbar"), SoftmaxConfig(512, 512, 16, "mbar")]
fp32 = [SoftmaxConfig(512, 512, 16, "regs"), *bf16]
cases = [(n, torch.bfloat16, bf16) for n in (151936, 151937, 50257, 50256)]
cases += [(n, torch.float32, fp32) for n in (200000, 200001, 262143)]
for n, dt, cfgs in cases:
    m = (1 << 28) // n
    y = torch.softmax(2 * torch.randn(m, n, device="cuda"), -1).to(dt)
    dy = torch.randn_like(y)
    dx = torch.empty_like(y)
    for mode in ("softmax_bwd", "log_softmax_bwd"):
        for cfg in cfgs:
            try:
                cfg.validate(n, 8 * y.element_size(), True)
            except ValueError:
                continue
            softmax_bwd(dy, y, dx, config=cfg, mode=mode)
            ms = timing.bench(lambda a=(dy, y, dx), cfg=cfg, mode=mode: softmax_bwd(*a, config=cfg, mode=mode))
            pct = 100 * 3 * m * n * y.element_size() / (ms * 1e-3) / copy
            flags = f"SAME={os.environ.get('SAME', '0')} TWO={os.environ.get('TWO', '1')}"
            print(f"{flags} n={n} {dt} {mode} {cfg}: {ms * 1e3:.1f} us, {pct:.1f} % of copy", flush=True)
