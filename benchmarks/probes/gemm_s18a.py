"""Session 18 probe 1: what the fused epilogue costs at compute-bound shapes, split into its
parts: plain, bias alone, relu, bias + relu, gelu, bias + gelu, bias + silu, all on the
fused default's config (cooperative 128x256, 2x1, raster n, epi_n 64), beside cuBLAS;
rotated order (bench_gemm.measure), two passes. Writes JSON to argv[1]."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import sys

sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch

from cuteforge.kernels.gemm.sm90.config import default_config
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
out = {"command": "python benchmarks/probes/gemm_s18a.py OUT.json", "gpu": torch.cuda.get_device_name(), "rows": []}
for rep in range(2):
    for m, n, k in [(8192, 8192, 8192), (4096, 4096, 4096)]:
        a, b = bg._inputs(m, n, k)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        cfg = default_config(m, n, k, sms, fused=True)
        fns = {
            "cublas": lambda: a @ b,
            "plain": lambda: gemm(a, b, config=cfg),
            "bias": lambda: gemm(a, b, bias=bias, config=cfg),
            "relu": lambda: gemm(a, b, epilogue="relu", config=cfg),
            "bias_relu": lambda: gemm(a, b, bias=bias, epilogue="relu", config=cfg),
            "gelu": lambda: gemm(a, b, epilogue="gelu", config=cfg),
            "bias_gelu": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=cfg),
            "bias_silu": lambda: gemm(a, b, bias=bias, epilogue="silu", config=cfg),
        }
        for fn in fns.values():
            fn()
        ms = bg.measure(fns)
        row = {"M": m, "N": n, "K": k, "rep": rep, "config": repr(cfg),
               **{f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()},
               **{f"{x}_vs_plain": round(ms["plain"] / t, 4) for x, t in ms.items()}}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
