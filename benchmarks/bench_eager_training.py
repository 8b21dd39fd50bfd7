"""Host time of one warm eager training call, forward and backward, of the ops a patched
Llama layer calls (`silu_mul`, `rotary_embedding`, `rms_norm` with a weight that wants a
gradient), each three ways in one process on the same inputs:

- "cuteforge": the op as it runs (its C launch and C++ backward node where the layout
  has them);
- "python_path": the same op with its layout memo holding None for the layout, so it
  takes its Python path (a `torch.autograd.Function` launching from Python; for
  `rms_norm`, the forward launched from Python before the same C++ node); swapping the
  memo in costs ~0.1 us a call, counted against this contender;
- "torch": the torch expression the op replaces, with autograd.

Small shapes (host-bound: the GPU finishes each call before the host has issued the
next); `timing.host_us_interleaved` (loops interleaved, the GPU synchronized between
loops). A call clears the inputs' gradients, runs the forward and the backward with a
fixed incoming gradient.

    python benchmarks/bench_eager_training.py [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import cuteforge.ops as ops
from cuteforge.bench.report import results_header, write_results
from cuteforge.timing import events as timing

# the modules (cuteforge.ops re-exports functions under their names)
swiglu = importlib.import_module("cuteforge.ops.swiglu")
rotary = importlib.import_module("cuteforge.ops.rotary")
norm = importlib.import_module("cuteforge.ops.norm")

OUT = Path(__file__).with_name("results")


def _with_memo(module: Any, name: str, memo: dict[Any, Any], fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn with ``module.<name>`` (the op's layout memo) set to ``memo`` for the call."""
    def call() -> Any:
        saved = getattr(module, name)
        setattr(module, name, memo)
        try:
            return fn()
        finally:
            setattr(module, name, saved)
    return call


def _python_path(module: Any, name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn with every layout it met in the op's memo mapped to None: its Python path."""
    fn()  # the layout enters the memo
    return _with_memo(module, name, dict.fromkeys(getattr(module, name)), fn)


def _rows(dtype: torch.dtype) -> dict[str, dict[str, Callable[[], Any]]]:
    dev = "cuda"
    gate = torch.randn(64, 2816, device=dev, dtype=dtype, requires_grad=True)
    up = torch.randn(64, 2816, device=dev, dtype=dtype, requires_grad=True)
    g_mlp = torch.randn(64, 2816, device=dev, dtype=dtype)
    b, s, hq, hk, d = 1, 64, 16, 8, 64  # q and k as attention layers hand them over: (B, S, H, D) transposed
    q_base = torch.randn(b, s, hq * d, device=dev, dtype=dtype, requires_grad=True)
    k_base = torch.randn(b, s, hk * d, device=dev, dtype=dtype, requires_grad=True)
    cos, sin = torch.randn(1, s, d, device=dev, dtype=dtype), torch.randn(1, s, d, device=dev, dtype=dtype)
    gq = torch.randn(b, s, hq, d, device=dev, dtype=dtype).transpose(1, 2)
    gk = torch.randn(b, s, hk, d, device=dev, dtype=dtype).transpose(1, 2)
    x = torch.randn(64, 1024, device=dev, dtype=dtype, requires_grad=True)
    w = torch.ones(1024, device=dev, dtype=dtype, requires_grad=True)
    g_norm = torch.randn(64, 1024, device=dev, dtype=dtype)

    def silu_mul(f: Callable[..., Any]) -> Callable[[], Any]:
        def call() -> Any:
            gate.grad = up.grad = None
            torch.autograd.backward(f(gate, up), g_mlp)
        return call

    def rotary_embedding(f: Callable[..., Any]) -> Callable[[], Any]:
        def call() -> Any:
            q_base.grad = k_base.grad = None
            q = q_base.view(b, s, hq, d).transpose(1, 2)
            k = k_base.view(b, s, hk, d).transpose(1, 2)
            torch.autograd.backward(f(q, k, cos, sin), (gq, gk))
        return call

    def rms_norm(f: Callable[..., Any]) -> Callable[[], Any]:
        def call() -> Any:
            x.grad = w.grad = None
            torch.autograd.backward(f(x, w), g_norm)
        return call

    def rms(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(v, weight, 1e-6)

    return {
        "silu_mul (64, 2816)": {
            "cuteforge": silu_mul(ops.silu_mul),
            "python_path": _python_path(swiglu, "_C_PATHS", silu_mul(ops.silu_mul)),
            "torch": silu_mul(lambda a, c: F.silu(a) * c)},
        "rotary_embedding q (1, 16, 64, 64), k (1, 8, 64, 64)": {
            "cuteforge": rotary_embedding(ops.rotary_embedding),
            "python_path": _python_path(rotary, "_C_PATHS", rotary_embedding(ops.rotary_embedding)),
            "torch": rotary_embedding(lambda q, k, c, si: rotary._torch(q, k, c, si, 1))},
        "rms_norm (64, 1024)": {
            "cuteforge": rms_norm(rms),
            "python_path": _python_path(norm, "_GRAD_FORWARD", rms_norm(rms)),
            "torch": rms_norm(lambda v, weight: F.rms_norm(v, (v.shape[-1],), weight, 1e-6))},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(OUT / "h200-eager-training.json"))
    args = p.parse_args()
    out: dict[str, Any] = {**results_header(), "unit": "host us a forward and backward", "rows": {}}
    for name, fns in _rows(torch.bfloat16).items():
        us = timing.host_us_interleaved(fns)
        row = {k: round(v, 2) for k, v in us.items()}
        row["python_path / cuteforge"] = round(us["python_path"] / us["cuteforge"], 3)
        row["torch / cuteforge"] = round(us["torch"] / us["cuteforge"], 3)
        out["rows"][f"{name} bf16"] = row
        print(name, row, flush=True)
    write_results(args.out, out)


if __name__ == "__main__":
    main()
