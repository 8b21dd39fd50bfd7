"""Host cost of a small backward node, ours against torch's: torch.profiler with CPU
activity only (no CUPTI), the CPU time of the backward node and of what it calls, per
`torch.autograd.grad` call; and the back-to-back time of the same calls.

    python benchmarks/probes/norm_s21b.py OUT.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from cuteforge import timing
from cuteforge.library_bench import contenders, inputs

CELLS = [("rms_norm", 1, 256, torch.bfloat16), ("layer_norm", 1, 256, torch.bfloat16),
         ("layer_norm", 32768, 512, torch.bfloat16), ("rms_norm", 8, 4096, torch.float32),
         ("log_softmax", 1, 256, torch.float32)]


def grad_call(fn: Any, ins: tuple[torch.Tensor, ...], dy: torch.Tensor | None) -> tuple[Any, torch.Tensor]:
    x = ins[0].detach().requires_grad_(True)
    y = fn(x, *ins[1:])
    dy = torch.randn_like(y) if dy is None else dy
    return (lambda: torch.autograd.grad(y, x, dy, retain_graph=True)), dy


def cpu_profile(call: Any, n: int = 400) -> dict[str, float]:
    for _ in range(50):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(n):
            call()
            if i % 40 == 39:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    tot: dict[str, float] = defaultdict(float)
    for e in prof.events():
        tot[e.name[:70]] += e.cpu_time_total / n
    return {k: round(v, 2) for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:12]}


def main() -> None:
    out = sys.argv[1]
    rows = []
    for op, m, n, dtype in CELLS:
        ins = inputs(op, m, n, dtype)
        fns = contenders(op, False, with_quack=False)
        calls, dy = {}, None
        for name in ("torch", "cuteforge"):
            calls[name], dy = grad_call(fns[name], ins, dy)
        row: dict[str, Any] = {"op": op, "M": m, "N": n, "dtype": str(dtype).removeprefix("torch.")}
        row["stream_us"] = [{k: round(v * 1e3, 2) for k, v in timing.stream(calls, rounds=31).items()} for _ in range(3)]
        for name, call in calls.items():
            row[name] = cpu_profile(call)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(out, "w") as f:
            json.dump({"command": "python benchmarks/probes/norm_s21b.py " + out, "gpu": torch.cuda.get_device_name(),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
