"""Session 31: where the fp8 GEMM with rowwise scales and no other epilogue loses to
torch._scaled_mm(use_fast_accum=True). Two things differ from the per-tensor call: the
scale operands (two fp32 loads and two multiplies per element), and the config (any
epilogue with operands takes the fused default: 64-wide subtiles, clusters walked along N).
Times per-tensor and rowwise on both configs, plus rowwise with the scales loaded in the
epilogue, against _scaled_mm rowwise with and without fast accumulation; balanced rounds
(bench_gemm.measure).

    python benchmarks/probes/gemm_s31_rowwise_plain.py [--shapes 8192x8192x8192,4096x4096x4096] [--out F]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_gemm import measure, tflops  # noqa: E402

from cuteforge.kernels.gemm.sm90.config import default_config  # noqa: E402
from cuteforge.ops.gemm import gemm  # noqa: E402


def shape_row(m: int, n: int, k: int, sms: int) -> dict:
    fp8 = torch.float8_e4m3fn
    x, wt = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
    sa = (x.abs().amax(1, keepdim=True) / 448).float()
    sw = (wt.abs().amax(1, keepdim=True) / 448).float()
    a, b, sb = (x / sa).to(fp8), (wt / sw).to(fp8).t(), sw.t()
    ta, tb = sa.max().reshape(()), sw.max().reshape(())
    at, bt = (x / ta).to(fp8), (wt / tb).to(fp8).t()
    plain = default_config(m, n, k, sms, 1)
    fused = default_config(m, n, k, sms, 1, fused=True, vector_operands=2)
    cfgs = {"plain_cfg": plain, "fused_cfg": fused,
            "plain_cfg_late": replace(plain, early_operands=False)}
    fns = {}
    for name, c in cfgs.items():
        if name != "plain_cfg_late":
            fns[f"tensor_{name}"] = lambda c=c: gemm(at, bt, scale_a=ta, scale_b=tb, out_dtype=torch.bfloat16, config=c)
        fns[f"rowwise_{name}"] = lambda c=c: gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, config=c)
    fns["scaled_mm_rowwise_fast"] = lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    fns["scaled_mm_rowwise"] = lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    ref = x.double() @ wt.double().t()
    reft = (at.double() * ta) @ (bt.double() * tb)
    row: dict = {"M": m, "N": n, "K": k, "configs": {n_: repr(c) for n_, c in cfgs.items()},
                 "default_rowwise_config": repr(fused)}
    for name, fn in fns.items():
        r = reft if name.startswith("tensor") else ref
        row[f"{name}_rel_err"] = float((fn().double() - r).norm() / r.norm())
    for rep in range(2):
        ms = measure(fns)
        row[f"TFLOPs_{rep}"] = {name: tflops(m, n, k, t) for name, t in ms.items()}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="8192x8192x8192,4096x4096x4096")
    p.add_argument("--out")
    args = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = [shape_row(*(int(v) for v in s.split("x")), sms) for s in args.shapes.split(",")]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python benchmarks/probes/gemm_s31_rowwise_plain.py --shapes " + args.shapes,
                       "gpu": torch.cuda.get_device_name(0),
                       "timing": "bench_gemm.measure (cuteforge.timing.bench, L2 flushed, balanced rounds)",
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
