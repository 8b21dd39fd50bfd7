"""The gated GEMM (`cuteforge.ops.gated_gemm`: silu(x @ Wg^T) * (x @ Wu^T), SwiGLU's gate and
up projections in one kernel) against what a model runs without it, in one process on
the same inputs, interleaved rounds. bf16, x (M, K) row-major, weights (N, K).

Forward ("forward" rows, TFLOP/s of the two products' 4 M N K flops):
- torch: F.silu(x @ Wg^T) * (x @ Wu^T), eager (two cuBLAS GEMMs, two pointwise kernels);
- silu_mul: the two cuBLAS GEMMs and `cuteforge.ops.silu_mul` (what `cuteforge.patch`'s
  default MLP runs);
- cat: one cuBLAS GEMM on the weights concatenated beforehand (2N, K) and silu_mul on its
  halves (the best a model can do around cuBLAS, at the cost of re-homing its weights);
- inductor: torch.compile of the torch expression;
- cuteforge: the gated GEMM.

Training ("training" rows): an MLP block's gate and up projections forward and backward
(x and both weights need gradients), ms a step, and the activation memory the forward
leaves for the backward: torch's expression, `cuteforge.nn.SwiGLUMLP`'s default path
(cuBLAS + silu_mul) and the gated GEMM (`ops.gated_gemm`, what `SwiGLUMLP(recompute=True)`
runs with grad; the backward recomputes both products).

    python benchmarks/bench_gated_gemm.py --out benchmarks/results/h200-gated-gemm.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cuteforge.bench.report import results_header, write_results
from cuteforge.ops import gated_gemm, silu_mul
from cuteforge.timing import events as timing

# (M tokens, N intermediate, K hidden): the model benchmark's two sizes, a longer batch, and
# prefill / decode-sized M at the large model's widths
FORWARD = [(4096, 2816, 1024), (4096, 14336, 4096), (8192, 14336, 4096), (512, 14336, 4096), (128, 14336, 4096)]
TRAINING = [(4096, 2816, 1024), (4096, 14336, 4096)]
ROUNDS = 5


def measure(fns: dict[str, Any], rounds: int = ROUNDS) -> dict[str, float]:
    """Median ms of each contender over interleaved rounds, each round starting at the next
    contender (each a `timing.bench` median, L2 flushed before each rep)."""
    names = list(fns)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(-(-rounds // len(names)) * len(names)):
        start = r % len(names)
        for name in names[start:] + names[:start]:
            times[name].append(timing.bench(fns[name], warmup_ms=10.0, rep_ms=60.0))
    return {k: statistics.median(v) for k, v in times.items()}


def _err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def forward_row(m: int, n: int, k: int) -> dict[str, Any]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wg, wu = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(2))
    w_cat = torch.cat([wg, wu])
    ref = F.silu(x.float() @ wg.float().t()) * (x.float() @ wu.float().t())
    compiled = torch.compile(lambda x, wg, wu: F.silu(x @ wg.t()) * (x @ wu.t()))

    def cat() -> torch.Tensor:
        z = x @ w_cat.t()
        return silu_mul(z[:, :n], z[:, n:])

    fns = {
        "torch": lambda: F.silu(x @ wg.t()) * (x @ wu.t()),
        "silu_mul": lambda: silu_mul(x @ wg.t(), x @ wu.t()),
        "cat": cat,
        "inductor": lambda: compiled(x, wg, wu),
        "cuteforge": lambda: gated_gemm(x, wg.t(), wu.t()),
    }
    row: dict[str, Any] = {"M": m, "N": n, "K": k, "dtype": "bfloat16"}
    with torch.no_grad():
        for name, fn in fns.items():
            row[f"{name}_rel_err"] = round(_err(fn(), ref), 5)
        ms = measure(fns)
    for name, t in ms.items():
        row[f"{name}_TFLOPs"] = round(4 * m * n * k / (t * 1e-3) / 1e12, 1)
    best = min(t for name, t in ms.items() if name != "cuteforge")
    row["vs_best_other"] = round(best / ms["cuteforge"], 3)
    row["vs_silu_mul"] = round(ms["silu_mul"] / ms["cuteforge"], 3)
    print(json.dumps(row), flush=True)
    return row


def training_row(m: int, n: int, k: int) -> dict[str, Any]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    wg, wu = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16).mul_(k ** -0.5).requires_grad_(True) for _ in range(2))
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

    def activation(x: torch.Tensor) -> torch.Tensor:  # SwiGLUMLP(gemm=False) without its down projection
        return silu_mul(F.linear(x, wg), F.linear(x, wu))

    forwards = {
        "torch": lambda: F.silu(F.linear(x, wg)) * F.linear(x, wu),
        "silu_mul": lambda: activation(x),
        "cuteforge": lambda: gated_gemm(x, wg.t(), wu.t()),
    }
    row: dict[str, Any] = {"M": m, "N": n, "K": k, "dtype": "bfloat16"}
    for name, fwd in forwards.items():
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        y = fwd()
        torch.cuda.synchronize()
        # what the forward keeps for the backward, beyond its output
        row[f"{name}_saved_MiB"] = round((torch.cuda.memory_allocated() - before - y.numel() * y.element_size()) / 2**20, 1)
        del y
    fns = {name: (lambda fwd=fwd: torch.autograd.grad(fwd(), (x, wg, wu), g)) for name, fwd in forwards.items()}
    ms = measure(fns)
    for name, t in ms.items():
        row[f"{name}_ms"] = round(t, 3)
    row["vs_silu_mul"] = round(ms["silu_mul"] / ms["cuteforge"], 3)
    row["vs_torch"] = round(ms["torch"] / ms["cuteforge"], 3)
    print(json.dumps(row), flush=True)
    return row


def _shapes(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]  # type: ignore[misc]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--forward", default=",".join("x".join(map(str, s)) for s in FORWARD), help="MxNxK shapes")
    p.add_argument("--training", default=",".join("x".join(map(str, s)) for s in TRAINING), help="MxNxK shapes")
    p.add_argument("--out")
    args = p.parse_args()
    name = torch.cuda.get_device_name().lower().replace("nvidia ", "").replace(" ", "-")
    out = Path(args.out or Path(__file__).parent / "results" / f"{name}-gated-gemm.json")
    t0 = time.time()
    result: dict[str, Any] = {
        **results_header(),
        "layout": "x (M, K) row-major; gate and up weights (N, K) as nn.Linear; bf16 in and out, fp32 accumulate",
        "timing": ("cuteforge.timing.events.bench: CUDA events, L2 flushed before each rep, median; the median of "
                   f"interleaved rounds (at least {ROUNDS}), each starting at the next contender"),
        "forward": [], "training": [],
    }
    for m, n, k in _shapes(args.forward):
        result["forward"].append(forward_row(m, n, k))
        write_results(out, result)
    for m, n, k in _shapes(args.training):
        result["training"].append(training_row(m, n, k))
        write_results(out, result)
    result["seconds"] = round(time.time() - t0, 1)
    write_results(out, result)
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
