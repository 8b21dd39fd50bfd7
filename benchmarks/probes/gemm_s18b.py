"""Session 18 probe 2: the fused epilogue's column operand (bias) loaded for every subtile
up front (v4.8) against one subtile ahead (CUTEFORGE_PROBE_OPERANDS_AHEAD=0, run in its
own process with its own CUTEFORGE_CACHE_DIR): plain, bias, bias + gelu, bias + silu on the
fused default's config and cuBLAS addmm + eager activation, rotated order, one pass.
Writes JSON to argv[1]."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import os
import sys

sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch
import torch.nn.functional as F

from cuteforge.kernels.gemm.sm90.config import default_config
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
out = {"command": "python benchmarks/probes/gemm_s18b.py OUT.json", "gpu": torch.cuda.get_device_name(),
       "operands_ahead": os.environ.get("CUTEFORGE_PROBE_OPERANDS_AHEAD", "1"), "rows": []}
for m, n, k in [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 28672)]:
    a, b = bg._inputs(m, n, k)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    cfg = default_config(m, n, k, sms, fused=True)
    fns = {
        "cublas": lambda: a @ b,
        "plain": lambda: gemm(a, b, config=cfg),
        "bias": lambda: gemm(a, b, bias=bias, config=cfg),
        "bias_gelu": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=cfg),
        "bias_silu": lambda: gemm(a, b, bias=bias, epilogue="silu", config=cfg),
        "eager_gelu": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
    }
    for fn in fns.values():
        fn()
    ms = bg.measure(fns)
    row = {"M": m, "N": n, "K": k, "config": repr(cfg),
           **{f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()},
           **{f"{x}_vs_plain": round(ms["plain"] / t, 4) for x, t in ms.items()},
           "bias_gelu_vs_eager": round(ms["eager_gelu"] / ms["bias_gelu"], 4)}
    out["rows"].append(row)
    print(json.dumps(row), flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
