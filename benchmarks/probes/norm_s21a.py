"""Where a small norm / log_softmax backward through autograd loses to torch's: per cell
of the small-shape bar that read below torch, the back-to-back time of
`torch.autograd.grad` (as `bench_membound.py --timer stream`), and from torch.profiler
the CPU time of the backward node and the kernels it launched with their GPU time.

    python benchmarks/probes/norm_s21a.py OUT.json
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

CELLS = [
    ("layer_norm", 8, 32768, torch.float32), ("layer_norm", 8, 32768, torch.bfloat16),
    ("layer_norm", 1, 4096, torch.float32), ("layer_norm", 128, 256, torch.float32),
    ("layer_norm", 8, 4096, torch.float32), ("rms_norm", 8, 32768, torch.float32),
    ("rms_norm", 8, 4096, torch.float32), ("rms_norm", 32768, 1024, torch.float32),
    ("layer_norm", 32768, 1024, torch.float32), ("layer_norm", 32768, 512, torch.bfloat16),
    ("log_softmax", 128, 256, torch.float32), ("log_softmax", 32768, 256, torch.float32),
]


def grad_call(fn: Any, ins: tuple[torch.Tensor, ...], dy: torch.Tensor | None) -> tuple[Any, torch.Tensor]:
    x = ins[0].detach().requires_grad_(True)
    y = fn(x, *ins[1:])
    dy = torch.randn_like(y) if dy is None else dy
    return (lambda: torch.autograd.grad(y, x, dy, retain_graph=True)), dy


def profiled(call: Any, n: int = 50) -> dict[str, Any]:
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    cpu: dict[str, float] = defaultdict(float)
    gpu: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            gpu[e.name[:80]] += e.device_time / n
            counts[e.name[:80]] += 1
        else:
            cpu[e.name[:80]] += e.cpu_time_total / n
    top_cpu = dict(sorted(cpu.items(), key=lambda kv: -kv[1])[:14])
    return {"cpu_us": {k: round(v, 2) for k, v in top_cpu.items()},
            "gpu_us": {k: round(v, 2) for k, v in gpu.items()},
            "launches_per_call": {k: c / n for k, c in counts.items()}}


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
        for rep in range(3):
            t = timing.stream(calls)
            row[f"stream_us_{rep}"] = {k: round(v * 1e3, 2) for k, v in t.items()}
        for name, call in calls.items():
            row[name] = profiled(call)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(out, "w") as f:
            json.dump({"command": "python benchmarks/probes/norm_s21a.py " + out, "gpu": torch.cuda.get_device_name(),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
