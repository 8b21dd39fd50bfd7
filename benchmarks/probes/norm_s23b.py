"""Session 23 probe: what the frozen-weight backward launches through autograd at
32768 x 1024 fp32 (rms / layer, cuteforge and torch), with each kernel's time from the
profiler: the kernel alone reads ~97 % of copy back to back (norm_s23a) but the op through
autograd ~94.5 %, level with torch. Writes JSON to argv[1]."""

import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import cuteforge.ops as ops

m, n = 32768, 1024
out = {"command": "python benchmarks/probes/norm_s23b.py OUT.json", "gpu": torch.cuda.get_device_name(), "rows": []}
x = torch.randn(m, n, device="cuda")
w = 1 + 0.1 * torch.randn(n, device="cuda")
b = torch.zeros(n, device="cuda")
dy = torch.randn(m, n, device="cuda")
for kind in ("rms", "layer"):
    for who in ("cuteforge", "torch"):
        xl = x.clone().requires_grad_()
        if who == "cuteforge":
            y = ops.rms_norm(xl, w) if kind == "rms" else ops.layer_norm(xl, w, b)
        elif kind == "rms":
            y = torch.nn.functional.rms_norm(xl, (n,), w, 1e-6)
        else:
            y = torch.nn.functional.layer_norm(xl, (n,), w, b, 1e-5)
        for _ in range(3):
            torch.autograd.grad(y, xl, dy, retain_graph=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                torch.autograd.grad(y, xl, dy, retain_graph=True)
            torch.cuda.synchronize()
        kernels = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                k = kernels.setdefault(e.name[:120], [0, 0.0])
                k[0] += 1
                k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        row = {"kind": kind, "who": who,
               "kernels": {k: {"calls": c, "us_per_call": round(t / max(c, 1), 2)} for k, (c, t) in kernels.items()}}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
