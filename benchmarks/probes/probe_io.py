"""Shared by the session-29 softmax probes: time one forward kernel on (x, y) and write
the rows as JSON with the command, the GPU and the copy bandwidth (bytes/s)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import torch

from cuteforge import timing


def time_forward(fn: Callable[..., Any], x: torch.Tensor, y: torch.Tensor, ref: torch.Tensor, copy: float) -> dict:
    """fn(x, y) once into a NaN-filled y (an unwritten element shows as a NaN error), then
    its median time (L2 flushed): us, % of `copy` (x read, y written), max error."""
    y.fill_(float("nan"))
    fn(x, y)
    err = (y.float() - ref).abs().max().item()
    ms = timing.bench(lambda: fn(x, y))
    pct = 100 * 2 * x.numel() * x.element_size() / (ms * 1e-3) / copy
    return {"us": round(ms * 1e3, 1), "pct_copy": round(pct, 1), "max_err": err}


def dump(path: str | None, copy: float, rows: list[dict]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({"command": "python " + " ".join(sys.argv), "gpu": torch.cuda.get_device_name(),
                       "copy_Bps": copy, "rows": rows}, f, indent=1)
