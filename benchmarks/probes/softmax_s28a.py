"""Session 28: the log_softmax backward at bf16 N = 1001 (M = 32768) flagged `correct: false`
in bench_membound (torch.allclose of our dx against torch's, rtol = atol = 2e-2). Each
backward's error against the exact (fp64) backward of the y it was handed, and how far
the two forwards' bf16 y differ: is the gap ours, or the two forwards rounding y apart?

    python benchmarks/probes/softmax_s28a.py
"""

from __future__ import annotations

import torch

import cuteforge.ops as ops

torch.manual_seed(0)
for mode in ("log_softmax", "softmax"):
    for n in (1001, 4096):
        x = torch.randn(32768, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        out = {}
        for name, fn in (("torch", getattr(torch, mode)), ("cuteforge", getattr(ops, mode))):
            xg = x.detach().requires_grad_(True)
            y = fn(xg, -1)
            (dx,) = torch.autograd.grad(y, xg, dy)
            yd, gd = y.detach().double(), dy.double()
            ref = gd - yd.exp() * gd.sum(-1, keepdim=True) if mode == "log_softmax" else yd * (gd - (gd * yd).sum(-1, keepdim=True))
            err = (dx.double() - ref).abs()
            out[name] = (y.detach(), dx)
            print(f"{mode} N={n} {name:9s}: max |dx - exact(y)| {err.max().item():.3g}, "
                  f"max rel to max|ref| {err.max().item() / ref.abs().max().item():.3g}", flush=True)
        (yt, dxt), (yc, dxc) = out["torch"], out["cuteforge"]
        dyv = (yt.float() - yc.float()).abs()
        print(f"{mode} N={n} y: elements that differ {(dyv > 0).sum().item()}, max |y_torch - y_ours| {dyv.max().item():.3g}; "
              f"allclose(dx, 2e-2) {torch.allclose(dxc.float(), dxt.float(), rtol=2e-2, atol=2e-2)}, "
              f"max |dx_ours - dx_torch| {(dxc.float() - dxt.float()).abs().max().item():.3g}", flush=True)
