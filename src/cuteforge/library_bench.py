"""Measuring library ops against torch on the GPU at hand (`cuteforge bench`, `cuteforge
library` and benchmarks/).

Bandwidth counts the bytes a kernel must move (input read once, output written once)
and is compared with a device-to-device copy measured in the same run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import timing

REDUCTION_SHAPES = [(32768, 4096), (16384, 16384), (4096, 65536), (32768, 256), (32768, 1024), (8, 262144)]
QUICK_SHAPES = [(32768, 4096), (16384, 16384), (4096, 65536)]


def _contenders(op: str, compiled: bool) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    import cuteforge.ops as ops

    ref = {"sum": lambda x: torch.sum(x, dim=-1), "mean": lambda x: torch.mean(x, dim=-1),
           "amax": lambda x: torch.amax(x, dim=-1), "amin": lambda x: torch.amin(x, dim=-1),
           "argmax": lambda x: torch.argmax(x, dim=-1)}[op]
    out: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"cuteforge": getattr(ops, op), "torch": ref}
    if compiled:
        out["torch.compile"] = torch.compile(ref, dynamic=False)
    return out


def measure_reduction(op: str, shapes: list[tuple[int, int]], dtype: torch.dtype, copy_bps: float, compiled: bool = True) -> list[dict[str, Any]]:
    rows = []
    for m, n in shapes:
        # A fresh torch.compile per shape, after a reset: dynamo's recompile limit (8 per
        # function) would otherwise silently run later shapes eagerly.
        torch._dynamo.reset()
        contenders = _contenders(op, compiled)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        ref = contenders["torch"](x)
        got = contenders["cuteforge"](x)
        atol = 1e-2 * n**0.5 if dtype != torch.float32 else 1e-3 * n**0.5
        correct = bool(torch.allclose(got.float(), ref.float(), rtol=1e-2, atol=atol)) if op != "argmax" else bool((got == ref).all())
        nbytes = x.numel() * x.element_size() + m * ref.element_size()
        row: dict[str, Any] = {"op": op, "M": m, "N": n, "dtype": str(dtype).removeprefix("torch."), "correct": correct}
        for name, fn in contenders.items():
            ms = timing.bench(lambda fn=fn, x=x: fn(x))
            row[f"{name}_us"] = round(ms * 1e3, 2)
            row[f"{name}_GBps"] = round(nbytes / (ms * 1e-3) / 1e9, 1)
            row[f"{name}_pct_copy"] = round(100 * nbytes / (ms * 1e-3) / copy_bps, 1)
        rows.append(row)
        del x
    return rows
