"""Session 30: the fp8 GEMM with per-row scale_a and per-column scale_b (torch._scaled_mm's
rowwise mode) plus bias + gelu, three row/col epilogue operands. The fused default
(cooperative 128x256, 64-wide subtiles, operands loaded under the mainloop) spills 328
bytes there (ptxas); 32-wide subtiles with the operands loaded in the epilogue do not.
Both configs, order ABBA then BAAB, against torch._scaled_mm rowwise (+ eager gelu).

    python benchmarks/probes/gemm_s30_rowwise.py [--shapes 8192x8192x8192,4096x4096x4096] [--out F]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch
import torch.nn.functional as F

from cuteforge import timing
from cuteforge.kernels.gemm.sm90.config import default_config
from cuteforge.ops.gemm import gemm


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="8192x8192x8192,4096x4096x4096")
    p.add_argument("--out")
    args = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        rows.append(shape_row(m, n, k, sms))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python benchmarks/probes/gemm_s30_rowwise.py --shapes " + args.shapes,
                       "gpu": torch.cuda.get_device_name(0), "timing": "cuteforge.timing.bench (L2 flushed, median)",
                       "rows": rows}, f, indent=1)


def shape_row(m: int, n: int, k: int, sms: int) -> dict:
    """One shape: both configs and torch, rotated; TFLOP/s of each timing and errors."""
    fp8 = torch.float8_e4m3fn
    x, wt = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
    sa = (x.abs().amax(1, keepdim=True) / 448).float()
    sw = (wt.abs().amax(1, keepdim=True) / 448).float()
    a, b, sb = (x / sa).to(fp8), (wt / sw).to(fp8).t(), sw.t()
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    base = default_config(m, n, k, sms, 1, fused=True)
    cfgs = {"default": base, "epi32_late": replace(base, epi_n=32, early_operands=False)}
    fns = {name: (lambda c=c: gemm(a, b, scale_a=sa, scale_b=sb, bias=bias, epilogue="gelu", config=c))
           for name, c in cfgs.items()}
    fns["scaled_mm_fast+gelu"] = lambda: F.gelu(torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16,
                                                                 use_fast_accum=True), approximate="tanh")
    ref = (x.double() @ wt.double().t() + bias.double())
    row = {"M": m, "N": n, "K": k, "configs": {n_: repr(c) for n_, c in cfgs.items()}}
    for name, fn in fns.items():
        got = fn().double()
        pre = torch.nn.functional.gelu(ref, approximate="tanh")
        row[f"{name}_rel_err"] = float((got - pre).norm() / pre.norm())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for order in (["default", "epi32_late", "epi32_late", "default"], ["epi32_late", "default", "default", "epi32_late"]):
        for name in order:
            times[name].append(timing.bench(fns[name]))
        times["scaled_mm_fast+gelu"].append(timing.bench(fns["scaled_mm_fast+gelu"]))
    flops = 2 * m * n * k
    for name, ts in times.items():
        row[f"{name}_TFLOPs"] = [round(flops / (t * 1e-3) / 1e12, 1) for t in ts]
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    main()
